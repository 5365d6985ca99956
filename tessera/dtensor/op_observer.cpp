#include <tessera/dtensor/op_observer.hpp>

#include <algorithm>
#include <vector>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {
// Per thread: each rank of the threads backend dispatches on its own.
thread_local std::vector<OpObserver*> observers;
}  // namespace

void add_op_observer(OpObserver* observer) { observers.push_back(observer); }

void remove_op_observer(OpObserver* observer) {
  const auto it = std::find(observers.begin(), observers.end(), observer);
  TESSERA_CHECK(it != observers.end(), ValueError, "remove_op_observer",
                "the observer is not registered on this thread");
  observers.erase(it);
}

namespace detail {

bool op_observed() { return !observers.empty(); }

void notify_op(std::string_view op, std::span<const DTensor* const> inputs) {
  // A copy: an observer may register or unregister another while it is told.
  const std::vector<OpObserver*> now = observers;
  for (OpObserver* observer : now) observer->on_op(op, inputs);
}

}  // namespace detail
}  // namespace tessera
