#pragma once
// OpObserver: told of every DTensor op the calling rank dispatches (the op table's ops and user
// ops with a registered rule), with its inputs as they come, before anything moves. Debugging
// tools build on it (CommDebugMode's per-module op tracing, PyTorch's __torch_dispatch__ view of
// DTensor ops). No observer: one thread-local test per op.
#include <span>
#include <string_view>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

class DTensor;

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  /// `op`: the op's name ("matmul", "add", a user op's name); `inputs`: its DTensor inputs.
  virtual void on_op(std::string_view op, std::span<const DTensor* const> inputs) = 0;
};

/// Registers an observer for the calling thread (rank); every registered one sees every op.
void add_op_observer(OpObserver* observer);
/// Unregisters it. Throws ValueError if it was not registered on this thread.
void remove_op_observer(OpObserver* observer);

namespace detail {
/// Whether the calling thread has an observer (the dispatcher's one test).
bool op_observed();
/// Tells the calling thread's observers of an op.
void notify_op(std::string_view op, std::span<const DTensor* const> inputs);
}  // namespace detail

}  // namespace tessera
