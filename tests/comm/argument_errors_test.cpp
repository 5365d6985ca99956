// Argument errors of every communication call (STYLE.md §8d): ValueError "[op] ... on
// group[...]" thrown on the calling rank before anything is communicated, so the communicator
// stays usable. Every rank makes the same mistake (errors checked only on a root use a
// one-rank group), so the tests run unchanged under mpirun.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

#include "comm_test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// The communicator still works and agrees on sequence numbers after the rejected calls.
void expect_still_usable(Communicator& comm) {
  comm.barrier();
  int64_t x = 1;
  comm.all_reduce(&x, 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(x, comm.size()) << comm.to_string();
}

TEST(ArgumentErrors, NegativeCounts) {
  for_each_world(world_sizes(), [] {
    Communicator& c = world();
    const std::string g = c.to_string();
    float buf[64] = {};
    const std::vector<int64_t> counts(static_cast<size_t>(c.size()), 1);
    std::vector<int64_t> negative = counts;
    negative.back() = -2;
    EXPECT_TRUE(value_error([&] { c.all_reduce(buf, -1, DType::f32, ReduceOp::sum); }, {"[all_reduce]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.all_gather(buf, buf, -1, DType::f32); }, {"[all_gather]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter(buf, buf, -3, DType::f32, ReduceOp::sum); },
                            {"[reduce_scatter]", "negative recv_count -3", g}));
    EXPECT_TRUE(value_error([&] { c.all_to_all(buf, buf, -1, DType::f32); }, {"[all_to_all]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.broadcast(buf, -1, DType::f32, 0); }, {"[broadcast]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.reduce(buf, buf, -1, DType::f32, ReduceOp::sum, 0); }, {"[reduce]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.gather(buf, buf, -1, DType::f32, 0); }, {"[gather]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.scatter(buf, buf, -1, DType::f32, 0); }, {"[scatter]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.all_gather_v(buf, buf, negative, DType::f32); },
                            {"[all_gather_v]", "negative recv_counts -2", g}));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_v(buf, buf, negative, DType::f32, ReduceOp::sum); },
                            {"[reduce_scatter_v]", "negative counts -2", g}));
    EXPECT_TRUE(value_error([&] { c.all_to_all_v(buf, negative, buf, counts, DType::f32); },
                            {"[all_to_all_v]", "negative send_counts -2", g}));
    EXPECT_TRUE(value_error([&] { c.all_to_all_v(buf, counts, buf, negative, DType::f32); },
                            {"[all_to_all_v]", "negative recv_counts -2", g}));
    EXPECT_TRUE(value_error([&] { c.all_reduce_async(buf, -1, DType::f32, ReduceOp::sum); },
                            {"[all_reduce_async]", "negative count -1", g}));
    EXPECT_TRUE(value_error([&] { c.all_gather_async(buf, buf, -1, DType::f32); }, {"[all_gather_async]", "negative count", g}));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_async(buf, buf, -1, DType::f32, ReduceOp::sum); },
                            {"[reduce_scatter_async]", "negative recv_count", g}));
    EXPECT_TRUE(value_error([&] { c.all_to_all_v_async(buf, negative, buf, counts, DType::f32); },
                            {"[all_to_all_v_async]", "negative send_counts -2", g}));
    if (c.size() > 1) {
      const int peer = (c.rank() + 1) % c.size();
      EXPECT_TRUE(value_error([&] { c.send(buf, -1, DType::f32, peer); }, {"[send]", "negative count -1", g}));
      EXPECT_TRUE(value_error([&] { c.recv(buf, -1, DType::f32, peer); }, {"[recv]", "negative count -1", g}));
    }
    expect_still_usable(c);
  });
}

TEST(ArgumentErrors, RootAndPeerOutOfRange) {
  for_each_world(world_sizes(), [] {
    Communicator& c = world();
    const std::string g = c.to_string();
    const std::string n = std::to_string(c.size());
    int32_t buf[64] = {};
    for (int bad : {-1, c.size(), c.size() + 5}) {
      const std::string root = "root " + std::to_string(bad) + " out of range";
      EXPECT_TRUE(value_error([&] { c.broadcast(buf, 1, DType::i32, bad); }, {"[broadcast]", root, g, "expected [0, " + n + ")"}));
      EXPECT_TRUE(value_error([&] { c.reduce(buf, buf, 1, DType::i32, ReduceOp::sum, bad); }, {"[reduce]", root, g}));
      EXPECT_TRUE(value_error([&] { c.gather(buf, buf, 1, DType::i32, bad); }, {"[gather]", root, g}));
      EXPECT_TRUE(value_error([&] { c.scatter(buf, buf, 1, DType::i32, bad); }, {"[scatter]", root, g}));
      const std::string peer = "peer " + std::to_string(bad) + " out of range";
      EXPECT_TRUE(value_error([&] { c.send(buf, 1, DType::i32, bad); }, {"[send]", peer, g, "expected [0, " + n + ")"}));
      EXPECT_TRUE(value_error([&] { c.recv(buf, 1, DType::i32, bad, 3); }, {"[recv]", peer, g}));
    }
    // A sub-group's ranges are its own: in a group of one, only rank 0 exists.
    auto single = c.split(c.rank(), 0);
    const std::string s = single->to_string();
    EXPECT_TRUE(value_error([&] { single->broadcast(buf, 1, DType::i32, 1); }, {"[broadcast]", "root 1 out of range", s, "[0, 1)"}));
    EXPECT_TRUE(value_error([&] { single->send(buf, 1, DType::i32, 1); }, {"[send]", "peer 1 out of range", s}));
    expect_still_usable(*single);
    expect_still_usable(c);
  });
}

TEST(ArgumentErrors, SendToSelf) {
  for_each_world(world_sizes(), [] {
    Communicator& c = world();
    const std::string g = c.to_string();
    int64_t buf[4] = {};
    const std::string me = "rank " + std::to_string(c.rank());
    EXPECT_TRUE(value_error([&] { c.send(buf, 4, DType::i64, c.rank()); }, {"[send]", me, "itself", g}));
    EXPECT_TRUE(value_error([&] { c.recv(buf, 4, DType::i64, c.rank(), 9); }, {"[recv]", me, "itself", g}));
    EXPECT_TRUE(value_error([&] { c.send(buf, 0, DType::i64, c.rank()); }, {"[send]", "itself"}));
    expect_still_usable(c);
  });
}

TEST(ArgumentErrors, CountsVectorOfWrongLength) {
  for_each_world(world_sizes(), [] {
    Communicator& c = world();
    const std::string g = c.to_string();
    const std::string expected = "expected " + std::to_string(c.size());
    float buf[64] = {};
    const std::vector<int64_t> good(static_cast<size_t>(c.size()), 1);
    for (size_t length : {size_t{0}, good.size() - 1, good.size() + 1}) {
      const std::vector<int64_t> bad(length, 1);
      const std::string entries = "has " + std::to_string(length) + " entries";
      EXPECT_TRUE(value_error([&] { c.all_gather_v(buf, buf, bad, DType::f32); },
                              {"[all_gather_v]", "recv_counts " + entries, g, expected}));
      EXPECT_TRUE(value_error([&] { c.reduce_scatter_v(buf, buf, bad, DType::f32, ReduceOp::sum); },
                              {"[reduce_scatter_v]", "counts " + entries, g, expected}));
      EXPECT_TRUE(value_error([&] { c.all_to_all_v(buf, bad, buf, good, DType::f32); },
                              {"[all_to_all_v]", "send_counts " + entries, g, expected}));
      EXPECT_TRUE(value_error([&] { c.all_to_all_v(buf, good, buf, bad, DType::f32); },
                              {"[all_to_all_v]", "recv_counts " + entries, g, expected}));
      EXPECT_TRUE(value_error([&] { c.all_to_all_v_async(buf, good, buf, bad, DType::f32); },
                              {"[all_to_all_v_async]", "recv_counts " + entries, g}));
    }
    expect_still_usable(c);
  });
}

TEST(ArgumentErrors, NullBufferWithElements) {
  for_each_world(world_sizes(), [] {
    Communicator& c = world();
    const std::string g = c.to_string();
    const int n = c.size();
    double buf[64] = {};
    const std::vector<int64_t> ones(static_cast<size_t>(n), 1);
    const auto null_for = [&](const char* op, const char* which, int64_t count) {
      return std::vector<std::string>{std::string("[") + op + "]",
                                      std::string(which) + " buffer is null for " + std::to_string(count) + " elements", g};
    };
    EXPECT_TRUE(value_error([&] { c.all_reduce(nullptr, 3, DType::f64, ReduceOp::sum); }, null_for("all_reduce", "data", 3)));
    EXPECT_TRUE(value_error([&] { c.all_gather(nullptr, buf, 2, DType::f64); }, null_for("all_gather", "send", 2)));
    EXPECT_TRUE(value_error([&] { c.all_gather(buf, nullptr, 2, DType::f64); }, null_for("all_gather", "recv", 2 * n)));
    EXPECT_TRUE(value_error([&] { c.all_gather_v(nullptr, buf, ones, DType::f64); }, null_for("all_gather_v", "send", 1)));
    EXPECT_TRUE(value_error([&] { c.all_gather_v(buf, nullptr, ones, DType::f64); }, null_for("all_gather_v", "recv", n)));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter(nullptr, buf, 1, DType::f64, ReduceOp::sum); },
                            null_for("reduce_scatter", "send", n)));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter(buf, nullptr, 1, DType::f64, ReduceOp::sum); },
                            null_for("reduce_scatter", "recv", 1)));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_v(nullptr, buf, ones, DType::f64, ReduceOp::sum); },
                            null_for("reduce_scatter_v", "send", n)));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_v(buf, nullptr, ones, DType::f64, ReduceOp::sum); },
                            null_for("reduce_scatter_v", "recv", 1)));
    EXPECT_TRUE(value_error([&] { c.all_to_all(nullptr, buf, 1, DType::f64); }, null_for("all_to_all", "send", n)));
    EXPECT_TRUE(value_error([&] { c.all_to_all(buf, nullptr, 1, DType::f64); }, null_for("all_to_all", "recv", n)));
    EXPECT_TRUE(value_error([&] { c.all_to_all_v(nullptr, ones, buf, ones, DType::f64); }, null_for("all_to_all_v", "send", n)));
    EXPECT_TRUE(value_error([&] { c.all_to_all_v(buf, ones, nullptr, ones, DType::f64); }, null_for("all_to_all_v", "recv", n)));
    EXPECT_TRUE(value_error([&] { c.broadcast(nullptr, 4, DType::f64, 0); }, null_for("broadcast", "data", 4)));
    EXPECT_TRUE(value_error([&] { c.reduce(nullptr, buf, 4, DType::f64, ReduceOp::sum, 0); }, null_for("reduce", "send", 4)));
    EXPECT_TRUE(value_error([&] { c.gather(nullptr, buf, 4, DType::f64, 0); }, null_for("gather", "send", 4)));
    EXPECT_TRUE(value_error([&] { c.scatter(buf, nullptr, 4, DType::f64, 0); }, null_for("scatter", "recv", 4)));
    EXPECT_TRUE(value_error([&] { c.all_reduce_async(nullptr, 3, DType::f64, ReduceOp::sum); },
                            null_for("all_reduce_async", "data", 3)));
    EXPECT_TRUE(value_error([&] { c.all_gather_async(buf, nullptr, 1, DType::f64); }, null_for("all_gather_async", "recv", n)));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_async(nullptr, buf, 1, DType::f64, ReduceOp::sum); },
                            null_for("reduce_scatter_async", "send", n)));
    EXPECT_TRUE(value_error([&] { c.all_to_all_v_async(nullptr, ones, buf, ones, DType::f64); },
                            null_for("all_to_all_v_async", "send", n)));
    if (n > 1) {
      const int peer = (c.rank() + 1) % n;
      EXPECT_TRUE(value_error([&] { c.send(nullptr, 2, DType::f64, peer); }, null_for("send", "data", 2)));
      EXPECT_TRUE(value_error([&] { c.recv(nullptr, 2, DType::f64, peer); }, null_for("recv", "data", 2)));
    }
    // The buffers that matter only on a root: checked there (a group of one, so no rank waits).
    auto single = c.split(c.rank(), 0);
    const std::string s = single->to_string();
    EXPECT_TRUE(value_error([&] { single->reduce(buf, nullptr, 4, DType::f64, ReduceOp::sum, 0); },
                            {"[reduce]", "recv buffer is null for 4 elements", s}));
    EXPECT_TRUE(value_error([&] { single->gather(buf, nullptr, 4, DType::f64, 0); },
                            {"[gather]", "recv buffer is null for 4 elements", s}));
    EXPECT_TRUE(value_error([&] { single->scatter(nullptr, buf, 4, DType::f64, 0); },
                            {"[scatter]", "send buffer is null for 4 elements", s}));
    expect_still_usable(*single);
    expect_still_usable(c);
  });
}

TEST(ArgumentErrors, AvgOnB8) {
  for_each_world(world_sizes(), [] {
    Communicator& c = world();
    const std::string g = c.to_string();
    bool buf[64] = {};
    const std::vector<int64_t> ones(static_cast<size_t>(c.size()), 1);
    const std::vector<std::string> parts_tail = {"avg is not defined for b8", g};
    const auto parts = [&](const char* op) {
      std::vector<std::string> p = {std::string("[") + op + "]"};
      p.insert(p.end(), parts_tail.begin(), parts_tail.end());
      return p;
    };
    EXPECT_TRUE(value_error([&] { c.all_reduce(buf, 2, DType::b8, ReduceOp::avg); }, parts("all_reduce")));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter(buf, buf, 1, DType::b8, ReduceOp::avg); }, parts("reduce_scatter")));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_v(buf, buf, ones, DType::b8, ReduceOp::avg); }, parts("reduce_scatter_v")));
    EXPECT_TRUE(value_error([&] { c.reduce(buf, buf, 2, DType::b8, ReduceOp::avg, 0); }, parts("reduce")));
    EXPECT_TRUE(value_error([&] { c.all_reduce_async(buf, 2, DType::b8, ReduceOp::avg); }, parts("all_reduce_async")));
    EXPECT_TRUE(value_error([&] { c.reduce_scatter_async(buf, buf, 1, DType::b8, ReduceOp::avg); },
                            parts("reduce_scatter_async")));
    // Even with nothing to reduce: avg of b8 would never work.
    EXPECT_TRUE(value_error([&] { c.all_reduce(nullptr, 0, DType::b8, ReduceOp::avg); }, parts("all_reduce")));
    expect_still_usable(c);
  });
}

TEST(ArgumentErrors, TimeoutMustBePositive) {
  const double saved = comm_timeout_seconds();
  EXPECT_TRUE(value_error([] { set_comm_timeout_seconds(0); }, {"[set_comm_timeout_seconds]", "must be positive"}));
  EXPECT_TRUE(value_error([] { set_comm_timeout_seconds(-1); }, {"[set_comm_timeout_seconds]"}));
  EXPECT_EQ(comm_timeout_seconds(), saved);
}

}  // namespace
