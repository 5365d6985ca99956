#include <tessera/dtensor/op_observer.hpp>

#include <vector>

#include <tessera/core/internal/thread_observers.hpp>

namespace tessera {

namespace {
// Per thread: each rank of the threads backend dispatches on its own.
thread_local std::vector<OpObserver*> observers;
}  // namespace

void add_op_observer(OpObserver* observer) { observers.push_back(observer); }

void remove_op_observer(OpObserver* observer) { detail::remove_observer(observers, observer, "remove_op_observer"); }

namespace detail {

bool op_observed() { return !observers.empty(); }

void notify_op(std::string_view op, std::span<const DTensor* const> inputs) {
  // A copy: an observer may register or unregister another while it is told.
  const std::vector<OpObserver*> now = observers;
  for (OpObserver* observer : now) observer->on_op(op, inputs);
}

}  // namespace detail
}  // namespace tessera
