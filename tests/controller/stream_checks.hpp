#pragma once
// Stream concurrency, checked without timing (shared by the threads and the MPI tests): a remote
// function on the main stream blocks on a latch that only a later remote function on another
// stream opens. Were the streams run in issue order, the first would wait forever (it gives up
// after 30 s and fails its result). Both functions also run a collective, each on its stream's
// own communicators, while the other stream is in the middle of its work.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace stream_checks {

// Per worker rank (each worker is a thread of this process, or this process).
struct Latch {
  std::mutex mutex;
  std::condition_variable opened_cv;
  std::map<int, bool> opened;
};

inline Latch& latch() {
  static Latch l;
  return l;
}

inline tessera::DTensor gathered(const tessera::DeviceMesh& mesh, const tessera::DTensor& x) {
  return x.redistribute(mesh, tessera::Placements(static_cast<size_t>(mesh.ndim()), tessera::Replicate{}));
}

/// Registers "stream_checks.wait" and "stream_checks.open" (before controller::run; once).
inline void register_remotes() {
  using namespace tessera;
  static std::once_flag once;
  std::call_once(once, [] {
  controller::register_remote("stream_checks.wait", [](const DeviceMesh& mesh, const std::vector<DTensor>& in) {
    const DTensor before = gathered(mesh, in.at(0));
    Latch& l = latch();
    std::unique_lock<std::mutex> lock(l.mutex);
    if (!l.opened_cv.wait_for(lock, std::chrono::seconds(30), [&] { return l.opened[rank()]; }))
      throw ValueError("the latch was never opened: the other stream did not run while this one waited");
    l.opened[rank()] = false;
    lock.unlock();
    return std::vector<DTensor>{before + gathered(mesh, in.at(0))};
  });
  controller::register_remote("stream_checks.open", [](const DeviceMesh& mesh, const std::vector<DTensor>& in) {
    const DTensor whole = gathered(mesh, in.at(0));
    Latch& l = latch();
    {
      std::lock_guard<std::mutex> lock(l.mutex);
      l.opened[rank()] = true;
    }
    l.opened_cv.notify_all();
    return std::vector<DTensor>{whole};
  });
  controller::register_remote("stream_checks.fail_on_first", [](const DeviceMesh& mesh, const std::vector<DTensor>& in) {
    if (rank() == mesh.spec().ranks().front()) throw ValueError("the first worker refuses");
    return std::vector<DTensor>{gathered(mesh, in.at(0))};  // the others wait for the first
  });
  });
}

/// Inside a controller body: main blocks until stream 'side' opens the latch; both read x
/// (side through an immutable borrow) and their results equal x's whole value.
inline void check_streams_run_concurrently() {
  using namespace tessera;
  const controller::WorkerMesh mesh({controller::num_workers()}, {"x"});
  const auto x = controller::randn({controller::num_workers() * 2 + 1, 3}, mesh, {Shard{0}});
  const Tensor whole = controller::fetch_full(x).get();
  controller::Stream side("side");
  controller::Borrow lent = side.borrow(x);
  const auto waited = controller::call_remote("stream_checks.wait", mesh, {x})[0];
  controller::RemoteTensor opened;
  {
    auto on_side = side.activate();
    opened = controller::call_remote("stream_checks.open", mesh, {x})[0];
    EXPECT_TRUE(allclose(controller::fetch_full(opened).get(), whole, 0, 0));
  }
  EXPECT_TRUE(allclose(controller::fetch_full(waited).get(), whole * Scalar(2.0), 0, 0));
  lent.drop();
  // The main stream again owns x alone: it writes it.
  controller::add_(x, x);
  EXPECT_TRUE(allclose(controller::fetch_full(x).get(), whole * Scalar(2.0), 0, 0));
}

/// Inside a controller body (2 or more workers; it spends the main stream's mesh, so call it
/// last): a remote function that throws on the first worker while the others wait for it in a
/// collective releases them with its error after the desync grace period (not the timeout's).
/// Later collectives on that mesh and stream fail alike; a new stream has fresh communicators
/// and works.
inline void check_partial_failure_releases_the_others() {
  using namespace tessera;
  const int n = controller::num_workers();
  const controller::WorkerMesh mesh({n}, {"x"});
  const auto x = controller::full({2 * n, 2}, 1.5, mesh, {Shard{0}});
  const auto r = controller::call_remote("stream_checks.fail_on_first", mesh, {x})[0];
  for (int64_t w = 0; w < n; ++w) {
    bool failed = false;
    try {
      (void)controller::fetch_shard(r, {w}).get();
    } catch (const CommError& e) {
      failed = std::string(e.what()).find("the first worker refuses") != std::string::npos;
      EXPECT_TRUE(failed) << e.what();
    }
    EXPECT_TRUE(failed) << "worker " << w;
  }
  EXPECT_THROW((void)controller::fetch_full(controller::redistribute(x, {Replicate{}})).get(), CommError);
  controller::Stream fresh("fresh");
  controller::Borrow lent = fresh.borrow(x);
  auto on_fresh = fresh.activate();
  EXPECT_TRUE(allclose(controller::fetch_full(controller::redistribute(x, {Replicate{}})).get(), full({2 * n, 2}, 1.5), 0, 0));
}

}  // namespace stream_checks
