#pragma once
// The per-thread observer lists (comm's CommObserver, dtensor's OpObserver, nn's
// ForwardObserver): each rank of the threads backend registers its own, and removing one that is
// not there is the caller's error, named after the caller's call.
#include <algorithm>
#include <vector>

#include <tessera/core/error.hpp>

namespace tessera::detail {

/// Removes `observer` from `observers`. Throws ValueError naming `call` if it is not there.
template <class Observer>
void remove_observer(std::vector<Observer*>& observers, Observer* observer, const char* call) {
  const auto it = std::find(observers.begin(), observers.end(), observer);
  TESSERA_CHECK(it != observers.end(), ValueError, call, "the observer is not registered on this thread");
  observers.erase(it);
}

}  // namespace tessera::detail
