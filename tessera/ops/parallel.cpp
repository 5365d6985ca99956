// The intra-op thread pool (ops/detail/parallel.hpp): blas_threads() - 1 threads started on the
// first parallel call, waiting for one job at a time. A job is a count of chunks taken by an
// atomic counter, so the caller and the pool threads share them however they are scheduled.
#include <tessera/ops/detail/parallel.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <tessera/ops/linalg.hpp>

namespace tessera::detail {

namespace {

struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, chunks = 0;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  // Takes chunks until none is left.
  void run_chunks() {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      try {
        (*fn)(n * c / chunks, n * (c + 1) / chunks);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1);
    }
  }
};

class Pool {
 public:
  // Holds the pool for one job; false while another thread's job holds it.
  bool try_acquire() { return busy_.try_lock(); }
  void release() { busy_.unlock(); }

  // Runs `job` on the caller and the pool threads (started or added as needed) and waits until
  // every chunk has run and no pool thread still holds the job.
  void run(Job& job, int threads) {
    {
      std::lock_guard lock(mutex_);
      while (static_cast<int>(workers_.size()) < threads - 1) workers_.emplace_back([this] { work(); });
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    job.run_chunks();
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return job.done.load() == job.chunks && holders_ == 0; });
    job_ = nullptr;
  }

 private:
  void work() {
    uint64_t seen = 0;
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
        if (!job) continue;
        ++holders_;
      }
      job->run_chunks();
      {
        std::lock_guard lock(mutex_);
        --holders_;
      }
      finished_.notify_all();
    }
  }

  std::mutex busy_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::vector<std::thread> workers_;  // never joined: the pool lives as long as the process
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int holders_ = 0;
};

// Never destroyed: its threads wait for work for the life of the process.
Pool& pool() {
  static auto* instance = new Pool();
  return *instance;
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // A parallel_for inside a chunk of the caller's own job runs inline (the pool is taken).
  thread_local bool holds_pool = false;
  const int threads = blas_threads();
  const int64_t chunks = std::min<int64_t>(threads, n / std::max<int64_t>(grain, 1));
  if (chunks < 2 || holds_pool || !pool().try_acquire()) {
    fn(0, n);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunks = chunks;
  holds_pool = true;
  pool().run(job, threads);
  holds_pool = false;
  pool().release();
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tessera::detail
