#pragma once
// The controller's futures: a worker's answer (a tensor, a layout, or why it failed) arrives in a
// FutureState, which Future<T> reads. Health carries the failure of the workers themselves, so a
// future whose answer will never come fails instead of waiting forever.
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace tessera::controller::detail {

/// Whether the workers are still serving: the first failure outside an op (a worker's loop
/// itself, the worker world) is kept here, and every future still waiting fails with it.
struct Health {
  std::mutex mutex;
  std::string failure;
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure.empty()) failure = what;
  }
  std::string get() {
    std::lock_guard<std::mutex> lock(mutex);
    return failure;
  }
};

template <class T>
struct FutureState {
  explicit FutureState(std::shared_ptr<Health> health = nullptr) : health(std::move(health)) {}
  std::mutex mutex;
  std::condition_variable ready_cv;
  std::optional<T> value;
  std::string error;  // set instead of value on failure
  bool done = false;
  std::shared_ptr<Health> health;
  /// With workers in other processes: receives the reply (get() calls it, outside the lock).
  std::function<void(FutureState&)> pull;

  void set(T v) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (done) return;
      value = std::move(v);
      done = true;
    }
    ready_cv.notify_all();
  }
  void fail(std::string message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (done) return;
      error = std::move(message);
      done = true;
    }
    ready_cv.notify_all();
  }
};

}  // namespace tessera::controller::detail
