// Failure handling of the threads backend (failure injection would abort an MPI job, so these
// are skipped under mpirun): a rank that throws, a rank that skips a collective (timeout), ranks
// that call different collectives (desync), mismatched counts, failed groups, p2p timeouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

#include "comm_test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// What each rank caught, for checks on the caller after launch.
class Outcomes {
 public:
  explicit Outcomes(int n) : messages_(static_cast<size_t>(n)), caught_(static_cast<size_t>(n), false) {}

  // Runs f; records the CommError it throws (any other exception escapes to launch).
  template <class F>
  void record(F&& f) {
    try {
      f();
    } catch (const CommError& e) {
      std::lock_guard lock(mutex_);
      messages_[static_cast<size_t>(rank())] = e.what();
      caught_[static_cast<size_t>(rank())] = true;
    }
  }
  bool caught(int r) const { return caught_[static_cast<size_t>(r)]; }
  const std::string& message(int r) const { return messages_[static_cast<size_t>(r)]; }

  // Every rank in `ranks` caught a CommError containing every part.
  void expect(const std::vector<int>& ranks, const std::vector<std::string>& parts) const {
    for (int r : ranks) {
      EXPECT_TRUE(caught(r)) << "rank " << r << " caught no CommError";
      for (const std::string& part : parts)
        EXPECT_TRUE(contains(message(r), part)) << "rank " << r << ": \"" << message(r) << "\" lacks \"" << part << "\"";
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> messages_;
  std::vector<bool> caught_;
};

// --- a rank throws -------------------------------------------------------------------------------

// launch rethrows the first failure with its kind, naming the rank and the original message;
// the other ranks, blocked in a collective, are released at once (not by the 60 s timeout).
template <class Expected, class Throw>
void expect_rank_failure_rethrown(Throw throw_it, const std::string& original) {
  TimeoutGuard timeout(60);
  const int n = 4, bad = 2;
  Outcomes outcomes(n);
  const auto start = Clock::now();
  EXPECT_TRUE(throws_with<Expected>(
      [&] {
        launch(n, [&] {
          if (rank() == bad) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the others block first
            throw_it();
          }
          outcomes.record([] { world().barrier(); });
        });
      },
      {"rank 2 failed", original}));
  EXPECT_LT(seconds_since(start), 5.0) << "the other ranks were not released";
  outcomes.expect({0, 1, 3}, {"[barrier]", "aborted", "rank 2 failed", original});
}

TEST(Failure, RankThrowsValueErrorStaysValueError) {
  TESSERA_SKIP_UNDER_MPI();
  expect_rank_failure_rethrown<ValueError>([] { throw ValueError("[my_op] bad argument 7"); }, "[my_op] bad argument 7");
}

TEST(Failure, RankThrowsEveryKindKeepsItsKind) {
  TESSERA_SKIP_UNDER_MPI();
  expect_rank_failure_rethrown<ShardingError>([] { throw ShardingError("[layout] no fit"); }, "[layout] no fit");
  expect_rank_failure_rethrown<CommError>([] { throw CommError("[user] link down"); }, "[user] link down");
  expect_rank_failure_rethrown<InternalError>([] { throw InternalError("[core] invariant"); }, "[core] invariant");
  expect_rank_failure_rethrown<Error>([] { throw std::runtime_error("plain runtime_error"); }, "plain runtime_error");
  expect_rank_failure_rethrown<Error>([] { throw 42; }, "non-standard exception");
}

// A ValueError must not come back as a plain Error or as the CommError the others saw.
TEST(Failure, RethrownKindIsExact) {
  TESSERA_SKIP_UNDER_MPI();
  try {
    launch(3, [] {
      if (rank() == 1) throw ValueError("[op] precise");
      world().barrier();
    });
    ADD_FAILURE() << "launch did not throw";
  } catch (const ValueError& e) {
    EXPECT_TRUE(starts_with(e.what(), "rank 1 failed: [op] precise")) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << ": " << e.what();
  }
}

// Ranks blocked in every kind of wait are released when one rank throws: a collective on the
// world, one on a sub-group, recv, send, an async Work, a rank that has not yet called anything.
TEST(Failure, RankThrowsReleasesEveryKindOfWait) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  const int n = 7;
  Outcomes outcomes(n);
  const auto start = Clock::now();
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        launch(n, [&] {
          const int r = rank();
          auto pair = world().split(r == 0 || r == 5 ? 0 : -1, r);  // {0, 5}
          world().barrier();
          if (r == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            throw ValueError("[boom] rank zero gives up");
          }
          float x[4] = {1, 2, 3, 4};
          outcomes.record([&] {
            switch (r) {
              case 1:
                world().barrier();
                break;
              case 2:
                world().recv(x, 4, DType::f32, 0, 1);
                break;
              case 3:
                world().send(x, 4, DType::f32, 0, 1);
                break;
              case 4:
                world().all_reduce_async(x, 4, DType::f32, ReduceOp::sum).wait();
                break;
              case 5:
                pair->all_reduce(x, 4, DType::f32, ReduceOp::max);
                break;
              default:  // rank 6 arrives late, after the failure: refused at once
                std::this_thread::sleep_for(std::chrono::milliseconds(300));
                world().all_gather(x, x, 0, DType::f32);
                break;
            }
          });
        });
      },
      {"rank 0 failed", "[boom] rank zero gives up"}));
  EXPECT_LT(seconds_since(start), 5.0);
  outcomes.expect({1, 2, 3, 4, 5, 6}, {"rank 0 failed", "[boom] rank zero gives up"});
  EXPECT_TRUE(starts_with(outcomes.message(1), "[barrier]")) << outcomes.message(1);
  EXPECT_TRUE(starts_with(outcomes.message(2), "[recv]")) << outcomes.message(2);
  EXPECT_TRUE(starts_with(outcomes.message(3), "[send]")) << outcomes.message(3);
  EXPECT_TRUE(starts_with(outcomes.message(4), "[all_reduce]")) << outcomes.message(4);
  EXPECT_TRUE(starts_with(outcomes.message(5), "[all_reduce]")) << outcomes.message(5);
  EXPECT_TRUE(contains(outcomes.message(5), "group[0, 5]")) << outcomes.message(5);
  EXPECT_TRUE(starts_with(outcomes.message(6), "[all_gather]")) << outcomes.message(6);
}

// A failed launch leaves nothing behind: the next launch works.
TEST(Failure, LaunchAfterAFailedLaunchWorks) {
  TESSERA_SKIP_UNDER_MPI();
  EXPECT_THROW(launch(3, [] {
                 if (rank() == 0) throw ValueError("[x] first");
                 world().barrier();
               }),
               ValueError);
  launch(3, [] {
    int64_t x = rank();
    world().all_reduce(&x, 1, DType::i64, ReduceOp::sum);
    EXPECT_EQ(x, 3);
  });
}

// --- a rank skips a collective (timeout) ---------------------------------------------------------

TEST(Failure, SkippedCollectiveTimesOutNamingCallSequenceGroupAndMissingRank) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(1);
  const int n = 3;
  Outcomes outcomes(n);
  std::atomic<int> timed_out{0};
  std::array<double, 3> elapsed{};
  launch(n, [&] {
    const int r = rank();
    world().barrier();
    world().barrier();
    float x[4] = {};
    if (r == 2) {  // skips all_reduce #2 until the others gave up, then calls it: refused
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (timed_out.load() < 2 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto start = Clock::now();
    outcomes.record([&] { world().all_reduce(x, 4, DType::f32, ReduceOp::sum); });
    elapsed[static_cast<size_t>(r)] = seconds_since(start);
    if (r != 2) timed_out.fetch_add(1);
  });
  outcomes.expect({0, 1}, {"[all_reduce]", "timeout after 1 s", "all_reduce(f32, count=4, op=sum) #2",
                           "group[0, 1, 2] (threads)", "world ranks [2] did not arrive"});
  for (int r : {0, 1}) {
    EXPECT_GE(elapsed[static_cast<size_t>(r)], 0.9) << "rank " << r;
    EXPECT_LT(elapsed[static_cast<size_t>(r)], 10.0) << "rank " << r;
  }
  // The late rank learns at once that the group failed, and why.
  outcomes.expect({2}, {"[all_reduce]", "failed earlier", "world ranks [2] did not arrive"});
  EXPECT_LT(elapsed[2], 0.9) << "refused at once, not after a timeout of its own";
}

// A rank whose program ended never comes: the rank waiting for it fails at once (not after the
// timeout), naming it, and launch rethrows that as a CommError naming the rank it happened on.
TEST(Failure, SkippedCollectiveOfARankThatEndedFailsAtOnce) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(30);
  const auto start = Clock::now();
  EXPECT_TRUE(throws_with<CommError>(
      [] {
        launch(2, [] {
          if (rank() == 0) world().barrier();  // rank 1 ends its program instead
        });
      },
      {"rank 0 failed", "[barrier] world rank 1 ended its program while world rank 0 waits in barrier() #0 on group[0, 1] (threads)"}));
  EXPECT_LT(seconds_since(start), 5.0) << "not released before the timeout";
}

// In a sub-group the missing rank is named by its world rank (the one the program knows).
TEST(Failure, SkippedCollectiveInSubgroupNamesItsMissingRank) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(1);
  const int n = 4;
  Outcomes outcomes(n);
  launch(n, [&] {
    const int r = rank();
    auto col = world().split(r % 2, r / 2);  // 2x2 columns: {0, 2} and {1, 3}
    int32_t x = 1;
    if (r != 3) outcomes.record([&] { col->all_reduce(&x, 1, DType::i32, ReduceOp::sum); });
    if (r == 0 || r == 2) {
      EXPECT_EQ(x, 2);
    }
  });
  outcomes.expect({1}, {"[all_reduce]", "world rank 3 ended its program while world rank 1 waits in",
                        "all_reduce(i32, count=1, op=sum) #0", "group[1, 3] (threads)"});  // group rank 1 is world rank 3
  EXPECT_FALSE(outcomes.caught(0));
  EXPECT_FALSE(outcomes.caught(2));
}

// --- desync: different collectives, signatures, counts -------------------------------------------

// Two ranks call different collectives: every rank of the group gets a CommError naming both
// signatures (kind, dtype, count, op, root) and their sequence numbers.
void expect_desync(int n, int odd_rank, const std::function<void(Communicator&)>& common,
                   const std::function<void(Communicator&)>& odd, const std::vector<std::string>& parts) {
  Outcomes outcomes(n);
  launch(n, [&] {
    Communicator& w = world();
    outcomes.record([&] { rank() == odd_rank ? odd(w) : common(w); });
  });
  std::vector<int> all;
  for (int r = 0; r < n; ++r) all.push_back(r);
  std::vector<std::string> with_group = parts;
  with_group.push_back("collective mismatch on group[");
  outcomes.expect(all, with_group);
}

TEST(Failure, DifferentCollectivesNameBothSignatures) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  // Each rank uses its own buffers (nothing moves: the mismatch is found first).
  const auto all_reduce = [](Communicator& c) {
    float buf[8] = {};
    c.all_reduce(buf, 4, DType::f32, ReduceOp::sum);
  };
  expect_desync(2, 1, all_reduce,
                [](Communicator& c) {
                  float send[4] = {}, recv[8] = {};
                  c.all_gather(send, recv, 4, DType::f32);
                },
                {"rank 0 called all_reduce(f32, count=4, op=sum) #0", "rank 1 called all_gather(f32, count=4) #0"});
  // Only the last of four ranks differs: it is the one named.
  expect_desync(4, 3, all_reduce, [](Communicator& c) { c.barrier(); },
                {"rank 0 called all_reduce(f32, count=4, op=sum) #0", "rank 3 called barrier() #0"});
  // The same kind with a different signature: count, dtype, op, root.
  expect_desync(2, 1, all_reduce,
                [](Communicator& c) {
                  float buf[8] = {};
                  c.all_reduce(buf, 5, DType::f32, ReduceOp::sum);
                },
                {"[all_reduce]", "all_reduce(f32, count=4, op=sum)", "all_reduce(f32, count=5, op=sum)"});
  expect_desync(2, 1, all_reduce,
                [](Communicator& c) {
                  int32_t buf[8] = {};
                  c.all_reduce(buf, 4, DType::i32, ReduceOp::sum);
                },
                {"[all_reduce]", "all_reduce(f32, count=4, op=sum)", "all_reduce(i32, count=4, op=sum)"});
  expect_desync(3, 2, all_reduce,
                [](Communicator& c) {
                  float buf[8] = {};
                  c.all_reduce(buf, 4, DType::f32, ReduceOp::max);
                },
                {"[all_reduce]", "all_reduce(f32, count=4, op=sum)", "rank 2 called all_reduce(f32, count=4, op=max)"});
  const auto broadcast_from = [](int root) {
    return [root](Communicator& c) {
      double buf[2] = {};
      c.broadcast(buf, 2, DType::f64, root);
    };
  };
  expect_desync(2, 0, broadcast_from(1), broadcast_from(0),
                {"[broadcast]", "broadcast(f64, count=2, root=1)", "broadcast(f64, count=2, root=0)"});
  // A rank that skipped one collective meets the next one: the sequence numbers show it.
  Outcomes outcomes(2);
  launch(2, [&] {
    outcomes.record([&] {
      float buf[4] = {};
      if (rank() == 0) world().all_reduce(buf, 4, DType::f32, ReduceOp::sum);
      world().barrier();
    });
  });
  outcomes.expect({0, 1}, {"rank 0 called all_reduce(f32, count=4, op=sum) #0", "rank 1 called barrier() #0"});
}

// In a subgroup the mismatch names world ranks: in the column {1, 3} of a 2x2 world, world rank
// 3 (its group rank 1) is the odd one.
TEST(Failure, DesyncInASubgroupNamesWorldRanks) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  Outcomes outcomes(4);
  launch(4, [&] {
    const int r = rank();
    auto col = world().split(r % 2, r / 2);  // {0, 2} and {1, 3}
    float buf[4] = {};
    outcomes.record([&] { r == 3 ? col->barrier() : col->all_reduce(buf, 4, DType::f32, ReduceOp::sum); });
  });
  outcomes.expect({1, 3}, {"collective mismatch on group[1, 3]", "world rank 1 called all_reduce(f32, count=4, op=sum) #0",
                           "world rank 3 called barrier() #0"});
  EXPECT_FALSE(outcomes.caught(0));
  EXPECT_FALSE(outcomes.caught(2));
}

TEST(Failure, MismatchedVCountsAreCommErrors) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  const int n = 3;
  {  // all_gather_v: rank 2 disagrees on the counts
    Outcomes outcomes(n);
    launch(n, [&] {
      std::vector<int64_t> counts = {1, 2, 3};
      if (rank() == 2) counts = {1, 2, 4};
      float send[8] = {}, recv[16] = {};
      outcomes.record([&] { world().all_gather_v(send, recv, counts, DType::f32); });
    });
    outcomes.expect({0, 1, 2}, {"[all_gather_v]", "counts differ between ranks", "[1, 2, 4]", "[1, 2, 3]", "group[0, 1, 2]"});
  }
  {  // reduce_scatter_v
    Outcomes outcomes(n);
    launch(n, [&] {
      std::vector<int64_t> counts = {2, 0, 1};
      if (rank() == 0) counts = {2, 1, 0};
      float send[8] = {}, recv[8] = {};
      outcomes.record([&] { world().reduce_scatter_v(send, recv, counts, DType::f32, ReduceOp::sum); });
    });
    outcomes.expect({0, 1, 2}, {"[reduce_scatter_v]", "counts differ between ranks", "[2, 1, 0]", "[2, 0, 1]"});
  }
  {  // all_to_all_v: rank 1 expects 2 elements from rank 0, which sends it 1
    Outcomes outcomes(n);
    launch(n, [&] {
      std::vector<int64_t> send_counts(3, 1), recv_counts(3, 1);
      if (rank() == 1) recv_counts[0] = 2;
      float send[8] = {}, recv[8] = {};
      outcomes.record([&] { world().all_to_all_v(send, send_counts, recv, recv_counts, DType::f32); });
    });
    outcomes.expect({0, 1, 2}, {"[all_to_all_v]", "counts disagree", "rank 0 sends 1 elements to rank 1, which expects 2"});
  }
}

// --- failed groups -------------------------------------------------------------------------------

// After a desync on a sub-group, every later call on it throws at once (a failed group is not
// reused), while the world and the other sub-groups keep working.
TEST(Failure, FailedGroupRefusesEveryLaterCall) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  const int n = 4;
  launch(n, [&] {
    const int r = rank();
    auto row = world().split(r / 2, r % 2);  // {0, 1} and {2, 3}
    float buf[16] = {};
    if (r < 2) {  // row {0, 1} desyncs
      EXPECT_THROW(r == 0 ? row->barrier() : row->all_reduce(buf, 1, DType::f32, ReduceOp::sum), CommError);
      const std::vector<int64_t> ones(2, 1);
      const int peer = 1 - row->rank();
      const auto refused = [&](const char* op, const std::function<void()>& f) {
        const auto start = Clock::now();
        EXPECT_TRUE(throws_with<CommError>(f, {std::string("[") + op + "]", "group[0, 1]", "failed earlier",
                                               "collective mismatch"}));
        EXPECT_LT(seconds_since(start), 1.0) << op;
      };
      refused("barrier", [&] { row->barrier(); });
      refused("all_reduce", [&] { row->all_reduce(buf, 2, DType::f32, ReduceOp::sum); });
      refused("all_gather", [&] { row->all_gather(buf, buf + 4, 2, DType::f32); });
      refused("all_gather_v", [&] { row->all_gather_v(buf, buf + 4, ones, DType::f32); });
      refused("reduce_scatter", [&] { row->reduce_scatter(buf, buf + 4, 1, DType::f32, ReduceOp::sum); });
      refused("reduce_scatter_v", [&] { row->reduce_scatter_v(buf, buf + 4, ones, DType::f32, ReduceOp::sum); });
      refused("all_to_all", [&] { row->all_to_all(buf, buf + 4, 1, DType::f32); });
      refused("all_to_all_v", [&] { row->all_to_all_v(buf, ones, buf + 4, ones, DType::f32); });
      refused("broadcast", [&] { row->broadcast(buf, 2, DType::f32, 0); });
      refused("reduce", [&] { row->reduce(buf, buf + 4, 2, DType::f32, ReduceOp::sum, 0); });
      refused("gather", [&] { row->gather(buf, buf + 4, 2, DType::f32, 0); });
      refused("scatter", [&] { row->scatter(buf, buf + 4, 1, DType::f32, 0); });
      refused("send", [&] { row->send(buf, 2, DType::f32, peer); });
      refused("recv", [&] { row->recv(buf, 2, DType::f32, peer); });
      refused("split", [&] { row->split(0, 0); });
      refused("all_reduce", [&] { row->all_reduce_async(buf, 2, DType::f32, ReduceOp::sum).wait(); });
      refused("all_gather", [&] { row->all_gather_async(buf, buf + 4, 2, DType::f32).wait(); });
      refused("reduce_scatter", [&] { row->reduce_scatter_async(buf, buf + 4, 1, DType::f32, ReduceOp::sum).wait(); });
      refused("all_to_all_v", [&] { row->all_to_all_v_async(buf, ones, buf + 4, ones, DType::f32).wait(); });
    } else {  // row {2, 3} is fine
      int32_t x = 1;
      row->all_reduce(&x, 1, DType::i32, ReduceOp::sum);
      EXPECT_EQ(x, 2);
    }
    int32_t y = 1;
    world().all_reduce(&y, 1, DType::i32, ReduceOp::sum);
    EXPECT_EQ(y, n);
  });
}

// The Work of a failing async op rethrows its CommError from wait(); later calls on the group,
// async or blocking, are refused.
TEST(Failure, WorkOfFailingAsyncOpRethrows) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  launch(2, [&] {
    float buf[8] = {};
    world().barrier();
    world().barrier();
    const int64_t count = rank() == 0 ? 4 : 5;
    Work w = world().all_reduce_async(buf, count, DType::f32, ReduceOp::sum);
    // The error names the async call's own sequence number (#2, after two barriers).
    EXPECT_TRUE(throws_with<CommError>([&] { w.wait(); }, {"[all_reduce]", "collective mismatch",
                                                          "all_reduce(f32, count=4, op=sum) #2",
                                                          "all_reduce(f32, count=5, op=sum) #2"}));
    EXPECT_TRUE(w.is_completed());
    EXPECT_THROW(w.wait(), CommError);  // every wait rethrows
    Work later = world().all_gather_async(buf, buf + 2, 1, DType::f32);
    EXPECT_TRUE(throws_with<CommError>([&] { later.wait(); }, {"[all_gather]", "failed earlier"}));
    EXPECT_TRUE(throws_with<CommError>([&] { world().barrier(); }, {"[barrier]", "failed earlier"}));
  });
}

// An async op in flight when a peer fails: its Work rethrows the abort.
TEST(Failure, WorkInFlightWhenAPeerFails) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  Outcomes outcomes(2);
  EXPECT_THROW(launch(2, [&] {
                 if (rank() == 1) {
                   std::this_thread::sleep_for(std::chrono::milliseconds(20));
                   throw ShardingError("[plan] rank one fails");
                 }
                 double x[3] = {};
                 Work w = world().reduce_scatter_async(x, x + 2, 1, DType::f64, ReduceOp::sum);
                 outcomes.record([&] { w.wait(); });
               }),
               ShardingError);
  outcomes.expect({0}, {"[reduce_scatter]", "aborted", "rank 1 failed", "[plan] rank one fails"});
}

// --- point to point ------------------------------------------------------------------------------

TEST(Failure, SendRecvCountOrDtypeMismatch) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  for (const bool dtype_differs : {false, true}) {
    Outcomes outcomes(2);
    launch(2, [&] {
      float buf[8] = {};
      outcomes.record([&] {
        if (rank() == 0) world().send(buf, 4, DType::f32, 1, 7);
        else world().recv(buf, dtype_differs ? 2 : 5, dtype_differs ? DType::f64 : DType::f32, 0, 7);
      });
    });
    const std::string expects = dtype_differs ? "expects 2 f64" : "expects 5 f32";
    outcomes.expect({0, 1}, {"send/recv mismatch", "group[0, 1]", "rank 0 sent 4 f32", "rank 1 " + expects, "tag 7"});
    EXPECT_TRUE(starts_with(outcomes.message(0), "[send]")) << outcomes.message(0);
    EXPECT_TRUE(starts_with(outcomes.message(1), "[recv]")) << outcomes.message(1);
  }
}

// A recv with no sender (and a send with no receiver) times out naming the call, its sequence
// number, the group and the peer; the group then counts as failed (timeouts fail a group).
TEST(Failure, PointToPointTimeouts) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(1);
  for (const bool receiver_waits : {true, false}) {
    Outcomes outcomes(3);
    double elapsed = 0;
    std::atomic<bool> gave_up{false};
    launch(3, [&] {
      float buf[2] = {};
      const int r = rank();
      if (r == 1) {
        const auto start = Clock::now();
        outcomes.record([&] {
          world().barrier();  // a collective first: p2p calls are numbered apart from collectives
          if (receiver_waits) world().recv(buf, 2, DType::f32, 0, 3);
          else world().send(buf, 2, DType::f32, 2, 3);
        });
        elapsed = seconds_since(start);
        gave_up.store(true);
        EXPECT_TRUE(throws_with<CommError>([&] { world().barrier(); }, {"[barrier]", "failed earlier"}));
      } else {
        world().barrier();
        // The others come back after rank 1 gave up: the group is refused to them as well.
        while (!gave_up.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        outcomes.record([&] { world().all_reduce(buf, 2, DType::f32, ReduceOp::sum); });
      }
    });
    if (receiver_waits)
      outcomes.expect({1}, {"[recv] timeout after 1 s", "recv(f32, count=2, peer=0) #0", "group[0, 1, 2] (threads)",
                            "no matching send from rank 0"});
    else
      outcomes.expect({1}, {"[send] timeout after 1 s", "send(f32, count=2, peer=2) #0", "group[0, 1, 2] (threads)",
                            "no matching recv on rank 2"});
    EXPECT_GE(elapsed, 0.9);
    EXPECT_LT(elapsed, 10.0);
    outcomes.expect({0, 2}, {"[all_reduce]", "failed earlier"});
  }
}

}  // namespace

namespace {

// A rank fails while the others are between the two rendezvous of an all_gather, copying from
// each other's buffers. A rank must not leave (and free or reuse its buffers) while a slower
// peer still reads them. Each rank "reuses" its send buffer as soon as its call throws
// (writes -1 into it) and later looks for -1 in what it received: finding one means a peer had
// left early (under TSan the write would also race with the late read). The failing rank's
// sleep sweeps the moment of failure across the collective.
TEST(Failure, PeerFailureDuringDataMovementFreesNothingInUse) {
  TESSERA_SKIP_UNDER_MPI();
  TimeoutGuard timeout(60);
  const int n = 8;
#ifdef TESSERA_SANITIZED  // instrumented copies are slow and rarely hit the window: keep it cheap there
  const int64_t count = 1 << 16;
  const int trials = 4;
#else
  const int64_t count = 1 << 19;  // 2 MiB per rank
  const int trials = 16;
#endif
  const auto size = static_cast<size_t>(count);
  std::vector<float> failing_send(size, 100.f), failing_recv(size * n);  // outlive launch, as Work requires
  std::vector<std::vector<float>> sends(n, std::vector<float>(size)), recvs(n, std::vector<float>(size * n));
  // How long the rank that will fail waits for its collective when nobody fails (sanitizer
  // builds are many times slower): the sweep spreads the failures over 1.5 times that.
  double clean_seconds = 0;
  launch(n, [&] {
    const int r = rank();
    std::vector<float>& send = sends[static_cast<size_t>(r)];
    std::vector<float>& recv = recvs[static_cast<size_t>(r)];
    world().barrier();
    const auto start = Clock::now();
    world().all_gather(send.data(), recv.data(), count, DType::f32);
    if (r == n - 1) clean_seconds = seconds_since(start);
  });
  std::atomic<int> poisoned{0};
  for (int trial = 0; trial < trials; ++trial) {
    std::fill(failing_recv.begin(), failing_recv.end(), 0.f);
    const auto delay = std::chrono::duration<double>(1.5 * clean_seconds * trial / trials);
    EXPECT_THROW(launch(n, [&] {
                   const int r = rank();
                   if (r == n - 1) {
                     Work w = world().all_gather_async(failing_send.data(), failing_recv.data(), count, DType::f32);
                     std::this_thread::sleep_for(delay);
                     throw ValueError("[trial] fails mid-collective");
                   }
                   std::vector<float>& send = sends[static_cast<size_t>(r)];
                   std::vector<float>& recv = recvs[static_cast<size_t>(r)];
                   std::fill(send.begin(), send.end(), static_cast<float>(r + 1));
                   std::fill(recv.begin(), recv.end(), 0.f);
                   try {
                     world().all_gather(send.data(), recv.data(), count, DType::f32);
                   } catch (const CommError&) {
                     std::fill(send.begin(), send.end(), -1.f);
                     std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let slow peers copy
                     if (std::find(recv.begin(), recv.end(), -1.f) != recv.end()) poisoned.fetch_add(1);
                     throw;
                   }
                 }),
                 ValueError);
    if (std::find(failing_recv.begin(), failing_recv.end(), -1.f) != failing_recv.end()) poisoned.fetch_add(1);
  }
  EXPECT_EQ(poisoned.load(), 0) << "ranks read a peer's buffer after the peer had left the collective";
}

}  // namespace
