#include <tessera/core/grad_mode.hpp>

namespace tessera::autograd {

namespace {
// Per thread: each rank of the threads backend records (or not) on its own.
thread_local bool grad_enabled = true;
}  // namespace

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

}  // namespace tessera::autograd
