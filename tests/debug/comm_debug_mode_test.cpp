// CommDebugMode: exact counts and bytes of the calls a rank makes inside a scope (STYLE.md §8c),
// on threads worlds of several sizes or the MPI world.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// The communicator's byte accounting, restated here so the tests do not read it back from the
// code under test: all_reduce moves the ring lower bound, all_gather every other rank's block.
int64_t all_reduce_bytes(int64_t count, int64_t itemsize, int64_t n) { return count * itemsize * 2 * (n - 1) / n; }
int64_t all_gather_bytes(int64_t count, int64_t itemsize, int64_t n) { return count * itemsize * (n - 1); }

}  // namespace

TEST(CommDebugMode, CountsCallsAndBytesByKind) {
  for_each_world({1, 2, 4}, [] {
    const int64_t n = world_size();
    CommDebugMode mode;
    std::vector<float> buf(6, 1.0f);
    world().all_reduce(buf.data(), 6, DType::f32, ReduceOp::sum);
    std::vector<double> send(3, 1.0), recv(static_cast<size_t>(3 * n));
    world().all_gather(send.data(), recv.data(), 3, DType::f64);
    world().all_reduce(buf.data(), 6, DType::f32, ReduceOp::max);
    world().barrier();

    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 2);
    EXPECT_EQ(mode.count(CollectiveKind::all_gather), 1);
    EXPECT_EQ(mode.count(CollectiveKind::barrier), 1);
    EXPECT_EQ(mode.count(CollectiveKind::broadcast), 0);
    EXPECT_EQ(mode.total_count(), 4);
    EXPECT_EQ(mode.counts(), (std::map<CollectiveKind, int64_t>{
                                 {CollectiveKind::all_reduce, 2}, {CollectiveKind::all_gather, 1}, {CollectiveKind::barrier, 1}}));

    EXPECT_EQ(mode.bytes_sent(CollectiveKind::all_reduce), 2 * all_reduce_bytes(6, 4, n));
    EXPECT_EQ(mode.bytes_received(CollectiveKind::all_reduce), 2 * all_reduce_bytes(6, 4, n));
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::all_gather), all_gather_bytes(3, 8, n));
    EXPECT_EQ(mode.bytes_received(CollectiveKind::all_gather), all_gather_bytes(3, 8, n));
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::barrier), 0);
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::broadcast), 0);
    EXPECT_EQ(mode.total_bytes_sent(), 2 * all_reduce_bytes(6, 4, n) + all_gather_bytes(3, 8, n));
    EXPECT_EQ(mode.total_bytes_received(), mode.total_bytes_sent());
    if (n == 4) {  // the numbers spelled out once: 6 f32 on 4 ranks is 36 B, 3 f64 gathered is 72 B
      EXPECT_EQ(mode.bytes_sent(CollectiveKind::all_reduce), 72);
      EXPECT_EQ(mode.bytes_sent(CollectiveKind::all_gather), 72);
    }

    // calls(): every call in issue order, with the world communicator's consecutive sequence numbers.
    const std::vector<CollectiveCall>& calls = mode.calls();
    ASSERT_EQ(calls.size(), 4u);
    EXPECT_EQ(calls[0].kind, CollectiveKind::all_reduce);
    EXPECT_EQ(calls[0].op, ReduceOp::sum);
    EXPECT_EQ(calls[1].kind, CollectiveKind::all_gather);
    EXPECT_EQ(calls[1].dtype, DType::f64);
    EXPECT_EQ(calls[2].op, ReduceOp::max);
    EXPECT_EQ(calls[3].kind, CollectiveKind::barrier);
    for (size_t i = 1; i < calls.size(); ++i) EXPECT_EQ(calls[i].sequence, calls[0].sequence + i);
  });
}

TEST(CommDebugMode, RootedCollectivesCountBytesByRole) {
  for_each_world({1, 2, 4}, [] {
    const int64_t n = world_size();
    const bool root = rank() == 0;
    CommDebugMode mode;
    std::vector<int32_t> buf(5, 7);
    world().broadcast(buf.data(), 5, DType::i32, 0);
    std::vector<int32_t> out(5);
    world().reduce(buf.data(), out.data(), 5, DType::i32, ReduceOp::sum, 0);
    // broadcast: the root sends to every other rank; reduce: the root receives from every other rank.
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::broadcast), root ? 20 * (n - 1) : 0);
    EXPECT_EQ(mode.bytes_received(CollectiveKind::broadcast), root ? 0 : 20);
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::reduce), root ? 0 : 20);
    EXPECT_EQ(mode.bytes_received(CollectiveKind::reduce), root ? 20 * (n - 1) : 0);
    EXPECT_EQ(mode.calls()[0].root, 0);
  });
}

TEST(CommDebugMode, SendRecvSplitAndAsyncCallsCount) {
  for_each_world({2, 4}, [] {
    const int r = rank();
    CommDebugMode mode;
    std::vector<int64_t> buf(5, r);
    if (r == 0) world().send(buf.data(), 5, DType::i64, 1);
    if (r == 1) world().recv(buf.data(), 5, DType::i64, 0);
    // A sub-communicator's calls count too: the scope observes the thread, not one communicator.
    std::shared_ptr<Communicator> pair = world().split(r / 2, r);
    float x = 1.0f;
    pair->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    // Async calls count when issued, before they complete.
    Work work = world().all_reduce_async(&x, 1, DType::f32, ReduceOp::sum);
    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 2);
    work.wait();

    EXPECT_EQ(mode.count(CollectiveKind::send), r == 0 ? 1 : 0);
    EXPECT_EQ(mode.count(CollectiveKind::recv), r == 1 ? 1 : 0);
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::send), r == 0 ? 40 : 0);
    EXPECT_EQ(mode.bytes_received(CollectiveKind::recv), r == 1 ? 40 : 0);
    EXPECT_EQ(mode.count(CollectiveKind::split), 1);
    EXPECT_EQ(mode.total_count(), (r <= 1 ? 1 : 0) + 3);
    EXPECT_EQ(mode.bytes_sent(CollectiveKind::all_reduce), 4 + all_reduce_bytes(1, 4, world_size()));
  });
}

TEST(CommDebugMode, NestedScopesBothCount) {
  for_each_world({1, 2, 4}, [] {
    float x = 1.0f;
    CommDebugMode outer;
    world().all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    {
      CommDebugMode inner;
      std::vector<float> recv(static_cast<size_t>(world_size()));
      world().all_gather(&x, recv.data(), 1, DType::f32);
      EXPECT_EQ(inner.total_count(), 1);
      EXPECT_EQ(inner.count(CollectiveKind::all_gather), 1);
      EXPECT_EQ(inner.count(CollectiveKind::all_reduce), 0);  // issued before the inner scope opened
      EXPECT_EQ(outer.total_count(), 2);
    }
    world().barrier();
    EXPECT_EQ(outer.counts(), (std::map<CollectiveKind, int64_t>{
                                  {CollectiveKind::all_reduce, 1}, {CollectiveKind::all_gather, 1}, {CollectiveKind::barrier, 1}}));
  });
}

TEST(CommDebugMode, CallsAfterTheScopeClosesAreNotCounted) {
  for_each_world({1, 2}, [] {
    std::optional<CommDebugMode> mode;
    mode.emplace();
    world().barrier();
    EXPECT_EQ(mode->total_count(), 1);
    mode.reset();  // unregisters: the calls below must not reach the destroyed scope
    float x = 1.0f;
    world().all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    world().barrier();
    mode.emplace();
    EXPECT_EQ(mode->total_count(), 0);
    world().barrier();
    EXPECT_EQ(mode->total_count(), 1);
  });
}

TEST(CommDebugMode, ResetForgetsCallsAndKeepsRecording) {
  for_each_world({1, 2}, [] {
    CommDebugMode mode;
    float x = 1.0f;
    world().all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    mode.reset();
    EXPECT_EQ(mode.total_count(), 0);
    EXPECT_EQ(mode.total_bytes_sent(), 0);
    EXPECT_TRUE(mode.calls().empty());
    EXPECT_TRUE(mode.counts().empty());
    EXPECT_EQ(mode.to_string(), "no communication");
    world().barrier();
    EXPECT_EQ(mode.counts(), (std::map<CollectiveKind, int64_t>{{CollectiveKind::barrier, 1}}));
  });
}

TEST(CommDebugMode, TimesBlockingCallsIncludingTheWaitForPeers) {
  for_each_world({2}, [] {
    CommDebugMode mode;
    EXPECT_EQ(mode.total_seconds(), 0.0);
    // Rank 0 arrives late: rank 1's all_reduce waits for it, and that wait is communication time.
    if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    float x = 1.0f;
    world().all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    EXPECT_GT(mode.seconds(CollectiveKind::all_reduce), 0.0);
    EXPECT_EQ(mode.seconds(CollectiveKind::all_gather), 0.0);
    EXPECT_EQ(mode.total_seconds(), mode.seconds(CollectiveKind::all_reduce));
    if (rank() == 1) {
      EXPECT_GE(mode.total_seconds(), 0.04);  // it waited for rank 0
    }
    mode.reset();
    EXPECT_EQ(mode.total_seconds(), 0.0);
  });
}

TEST(CommDebugMode, ToStringTable) {
  for_each_world({1, 2, 4}, [] {
    CommDebugMode mode;
    EXPECT_EQ(mode.to_string(), "no communication");
    std::vector<float> buf(6, 1.0f);
    world().all_reduce(buf.data(), 6, DType::f32, ReduceOp::sum);
    std::vector<double> send(3, 1.0), recv(static_cast<size_t>(3 * world_size()));
    world().all_gather(send.data(), recv.data(), 3, DType::f64);
    world().barrier();
    const std::string text = mode.to_string();
    for (const char* part : {"kind", "count", "bytes sent", "bytes received", "all_reduce", "all_gather", "barrier", "total"})
      EXPECT_TRUE(contains(text, part)) << text;
    EXPECT_FALSE(contains(text, "broadcast")) << text;  // only kinds with calls
    if (world_size() == 2) {
      // Rows in the X-macro order; names left-aligned, numbers right-aligned.
      EXPECT_EQ(text,
                "kind        count  bytes sent  bytes received\n"
                "all_reduce      1          24              24\n"
                "all_gather      1          24              24\n"
                "barrier         1           0               0\n"
                "total           3          48              48");
    }
  });
}

// all_ranks: every rank's totals, gathered, so a rank sees what the others did. Even ranks do one
// all_reduce more (on their own sub-communicator); each rank checks every other rank's figures
// from that arithmetic, the split's bytes read off its own scope (every rank's split is alike).
TEST(CommDebugMode, AllRanksSeesEveryRanksTotals) {
  for_each_world({1, 2, 4}, [] {
    const int r = rank(), n = world_size();
    CommDebugMode outer;
    CommDebugMode mode;
    std::vector<float> buf(6, 1.0f);
    world().all_reduce(buf.data(), 6, DType::f32, ReduceOp::sum);
    std::shared_ptr<Communicator> parity = world().split(r % 2, r);
    if (r % 2 == 0) parity->all_reduce(buf.data(), 3, DType::f32, ReduceOp::sum);
    const int64_t split_sent = mode.bytes_sent(CollectiveKind::split);
    const int64_t split_received = mode.bytes_received(CollectiveKind::split);
    const int64_t own_calls = mode.total_count();

    const std::vector<CommDebugMode::RankFigures> every = mode.all_ranks(world());
    ASSERT_EQ(static_cast<int>(every.size()), n);
    const int evens = (n + 1) / 2;
    for (int q = 0; q < n; ++q) {
      const bool even = q % 2 == 0;
      const int64_t reduced = all_reduce_bytes(6, 4, n) + (even ? all_reduce_bytes(3, 4, evens) : 0);
      EXPECT_EQ(every[static_cast<size_t>(q)],
                (CommDebugMode::RankFigures{q, even ? 3 : 2, reduced + split_sent, reduced + split_received}))
          << "rank " << q << " seen from rank " << r;
    }
    EXPECT_EQ(every[static_cast<size_t>(r)].bytes_sent, mode.total_bytes_sent());
    // The gather is not this scope's communication; the scope around it sees it.
    EXPECT_EQ(mode.total_count(), own_calls);
    EXPECT_EQ(outer.count(CollectiveKind::all_gather), 1);
    // Recording goes on after it.
    world().barrier();
    EXPECT_EQ(mode.count(CollectiveKind::barrier), 1);

    // The table: a header, a row per rank, the total; numbers right-aligned, so every line is as
    // long as the header.
    const std::vector<CommDebugMode::RankFigures> now = mode.all_ranks(world());
    const std::string text = mode.all_ranks_table(world());
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    ASSERT_EQ(static_cast<int>(lines.size()), n + 2) << text;
    EXPECT_EQ(lines[0], "rank   count  bytes sent  bytes received") << text;
    const auto words = [](const std::string& line) {
      std::istringstream w(line);
      std::vector<std::string> out;
      for (std::string x; w >> x;) out.push_back(x);
      return out;
    };
    int64_t calls = 0, sent = 0, received = 0;
    for (int q = 0; q < n; ++q) {
      const CommDebugMode::RankFigures& f = now[static_cast<size_t>(q)];
      EXPECT_EQ(words(lines[static_cast<size_t>(q) + 1]),
                (std::vector<std::string>{std::to_string(q), std::to_string(f.calls), std::to_string(f.bytes_sent),
                                          std::to_string(f.bytes_received)}))
          << text;
      calls += f.calls, sent += f.bytes_sent, received += f.bytes_received;
    }
    EXPECT_EQ(words(lines.back()), (std::vector<std::string>{"total", std::to_string(calls), std::to_string(sent),
                                                             std::to_string(received)}))
        << text;
    for (const std::string& line : lines) EXPECT_EQ(line.size(), lines[0].size()) << text;
  });
}
