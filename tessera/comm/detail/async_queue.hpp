#pragma once
// A FIFO of communication calls run by one worker thread, so async calls overlap the caller's
// compute while keeping this rank's call order (which every rank of a group must agree on).
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace tessera::detail {

struct WorkState {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
  // Point-to-point requests finish only as their backend drives them (MPI progresses inside MPI
  // calls; a threads wait must watch for timeouts and failed peers), so Work::wait and
  // Work::is_completed call these when set, instead of sleeping on done_cv. `wait` blocks until
  // done (throwing CommError on timeout); `poll` makes one non-blocking pass.
  std::function<void()> wait;
  std::function<void()> poll;
  // Work::keep_alive: the buffer's owner, released with the state. The backends hold the state
  // of a posted transfer until it completed or can no longer touch the buffer.
  std::shared_ptr<const void> keep_alive;

  /// Marks the state finished (with error, if any) and wakes its waiters.
  void finish(std::exception_ptr failure = nullptr) {
    {
      std::lock_guard lock(mutex);
      done = true;
      error = std::move(failure);
    }
    done_cv.notify_all();
  }
};

class AsyncQueue {
 public:
  AsyncQueue() = default;
  ~AsyncQueue();
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  /// Queues body; its completion (or exception) is reported through the returned state.
  std::shared_ptr<WorkState> push(std::function<void()> body);
  /// Blocks until every queued body has run.
  void drain();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<WorkState>>> tasks_;
  int64_t pending_ = 0;  // queued or running
  bool stopping_ = false;
  std::thread worker_;  // started on first push
};

}  // namespace tessera::detail
