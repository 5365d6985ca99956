// Async forms (all_reduce_async, all_gather_async, reduce_scatter_async, all_to_all_v_async):
// Work::wait, is_completed, several outstanding in order, interleaved with blocking calls.
// The failure of an async op (Work rethrows) is in failure_test.cpp.
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

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) d[i + 1] = d[i] + counts[i];
  return d;
}

// The four async forms outstanding at once (plus a blocking call in the middle, which first
// waits for the async calls before it), waited in reverse order.
TEST(Async, SeveralOutstandingInterleavedWithBlocking) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    const auto cases = group_cases();
    for (size_t gi = 0; gi < cases.size(); ++gi) {
      const GroupCase& g = cases[gi];
      if (!g.comm) continue;
      const int r = g.comm->rank(), m = g.size();
      for (size_t di = 0; di < all_dtypes().size(); ++di) {
        if ((di + gi) % 4 != 0) continue;  // two dtypes per group, all of them over the groups
        const DType dtype = all_dtypes()[di];
        const std::string what = g.describe() + " " + std::string(name(dtype));
        const ReduceOp op = ReduceOp::max;
        const auto value = [&](int who, int64_t i) { return contribution(dtype, op, who, i); };
        // 1. all_reduce
        const int64_t ar_count = 9;
        Buffer ar = filled(dtype, ar_count, [&](int64_t i) { return value(me, i); });
        Work w1 = g.comm->all_reduce_async(ar.data(), ar_count, dtype, op);
        // 2. all_gather
        const int64_t ag_count = 3;
        const Buffer ag_send = filled(dtype, ag_count, [&](int64_t i) { return pattern(dtype, me, i, 1); });
        Buffer ag_recv(dtype, ag_count * m);
        Work w2 = g.comm->all_gather_async(ag_send.data(), ag_recv.data(), ag_count, dtype);
        // a blocking collective between async ones
        int64_t token = me;
        g.comm->all_reduce(&token, 1, DType::i64, ReduceOp::sum);
        EXPECT_TRUE(w1.is_completed()) << what << ": a blocking call waits for the async calls before it";
        EXPECT_TRUE(w2.is_completed()) << what;
        // 3. reduce_scatter
        const int64_t rs_count = 2;
        const Buffer rs_send = filled(dtype, rs_count * m, [&](int64_t i) { return value(me, i); });
        Buffer rs_recv(dtype, rs_count);
        Work w3 = g.comm->reduce_scatter_async(rs_send.data(), rs_recv.data(), rs_count, dtype, op);
        // 4. all_to_all_v: (r + p) % 3 elements from r to p
        std::vector<int64_t> sc, rc;
        for (int p = 0; p < m; ++p) {
          sc.push_back((r + p) % 3);
          rc.push_back((p + r) % 3);
        }
        const auto sd = displacements(sc), rd = displacements(rc);
        const Buffer a2a_send = filled(dtype, sd.back(), [&](int64_t i) { return pattern(dtype, me, i, 2); });
        Buffer a2a_recv(dtype, rd.back());
        Work w4 = g.comm->all_to_all_v_async(a2a_send.data(), sc, a2a_recv.data(), rc, dtype);

        for (Work* w : {&w4, &w3, &w2, &w1}) {
          w->wait();
          EXPECT_TRUE(w->is_completed()) << what;
          w->wait();  // waiting again returns at once
        }
        int64_t sum = 0;
        for (int who : g.members) sum += who;
        EXPECT_EQ(token, sum) << what;
        EXPECT_TRUE(same_bits(ar, filled(dtype, ar_count, [&](int64_t i) {
                                return reduce_expected(dtype, op, g.members, i, value);
                              }),
                              what + " all_reduce_async"));
        EXPECT_TRUE(same_bits(ag_recv, filled(dtype, ag_count * m, [&](int64_t i) {
                                return pattern(dtype, g.who(static_cast<int>(i / ag_count)), i % ag_count, 1);
                              }),
                              what + " all_gather_async"));
        EXPECT_TRUE(same_bits(rs_recv, filled(dtype, rs_count, [&](int64_t i) {
                                return reduce_expected(dtype, op, g.members, r * rs_count + i, value);
                              }),
                              what + " reduce_scatter_async"));
        Buffer want(dtype, rd.back());
        for (int p = 0; p < m; ++p) {
          std::vector<int64_t> peer;
          for (int d = 0; d < m; ++d) peer.push_back((p + d) % 3);
          const int64_t offset = displacements(peer)[static_cast<size_t>(r)];
          for (int64_t j = 0; j < rc[static_cast<size_t>(p)]; ++j)
            want.set(rd[static_cast<size_t>(p)] + j, pattern(dtype, g.who(p), offset + j, 2));
        }
        EXPECT_TRUE(same_bits(a2a_recv, want, what + " all_to_all_v_async"));
      }
    }
  });
}

// Many async all_reduces in flight on one buffer each run in issue order: the k-th sees the
// result of the (k-1)-th (x -> x * n on every rank each time is only right in order).
TEST(Async, OutstandingCallsRunInIssueOrder) {
  for_each_world(world_sizes(), [] {
    const int n = world_size();
    std::vector<int64_t> v(4, 1);
    std::vector<Work> works;
    for (int k = 0; k < 6; ++k) works.push_back(world().all_reduce_async(v.data(), 4, DType::i64, ReduceOp::sum));
    // Also a long chain on a second buffer, waited only through synchronize().
    std::vector<double> d(3, 1.0);
    for (int k = 0; k < 5; ++k) world().all_reduce_async(d.data(), 3, DType::f64, ReduceOp::sum);
    works.back().wait();
    int64_t want = 1;
    for (int k = 0; k < 6; ++k) want *= n;
    for (const Work& w : works) EXPECT_TRUE(w.is_completed());
    EXPECT_EQ(v, std::vector<int64_t>(4, want));
    world().synchronize();
    double dwant = 1;
    for (int k = 0; k < 5; ++k) dwant *= n;
    EXPECT_EQ(d, std::vector<double>(3, dwant));
  });
}

// Large async all_reduce takes the split path like the blocking one; async forms on zero counts.
TEST(Async, LargeAndEmpty) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    const int64_t count = 64 * 1024 / 4 + 5;
    Buffer buf = filled(DType::f32, count, [&](int64_t i) { return contribution(DType::f32, ReduceOp::sum, me, i); });
    Work w = world().all_reduce_async(buf.data(), count, DType::f32, ReduceOp::sum);
    Work empty_ar = world().all_reduce_async(nullptr, 0, DType::f32, ReduceOp::sum);
    Work empty_ag = world().all_gather_async(nullptr, nullptr, 0, DType::u8);
    Work empty_rs = world().reduce_scatter_async(nullptr, nullptr, 0, DType::bf16, ReduceOp::avg);
    Work empty_a2a = world().all_to_all_v_async(nullptr, std::vector<int64_t>(static_cast<size_t>(n), 0), nullptr,
                                                std::vector<int64_t>(static_cast<size_t>(n), 0), DType::b8);
    for (const Work& x : {empty_a2a, empty_rs, empty_ag, empty_ar, w}) x.wait();
    std::vector<int> all(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) all[static_cast<size_t>(k)] = k;
    const auto value = [&](int who, int64_t i) { return contribution(DType::f32, ReduceOp::sum, who, i); };
    EXPECT_TRUE(same_bits(buf, filled(DType::f32, count, [&](int64_t i) {
                            return reduce_expected(DType::f32, ReduceOp::sum, all, i, value);
                          }),
                          "large all_reduce_async"));
  });
}

// An async call cannot complete before every rank of the group issued it: rank 0 sees its Work
// pending, then lets rank 1 issue its call (a message on the world), then waits.
TEST(Async, IsCompletedIsFalseUntilEveryRankJoined) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    auto dup = world().split(0, me);  // async traffic apart from the world's point to point
    int32_t x = me + 1;
    if (n >= 2 && me == 1) {
      int32_t go = 0;
      world().recv(&go, 1, DType::i32, 0, 5);
      EXPECT_EQ(go, 42);
    }
    Work w = dup->all_reduce_async(&x, 1, DType::i32, ReduceOp::sum);
    if (n >= 2 && me == 0) {
      EXPECT_FALSE(w.is_completed()) << "rank 1 has not issued its all_reduce yet";
      const int32_t go = 42;
      world().send(&go, 1, DType::i32, 1, 5);
    }
    w.wait();
    EXPECT_TRUE(w.is_completed());
    EXPECT_EQ(x, n * (n + 1) / 2);
  });
}

// An async call is numbered in issue order like a blocking one, so the async form on some
// ranks meets the blocking form on the others (threads backend: on MPI a nonblocking
// collective need not match a blocking one).
TEST(Async, AsyncAndBlockingFormsOfOneCallMeet) {
  TESSERA_SKIP_UNDER_MPI();
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    Communicator& w = world();
    w.barrier();
    for (int round = 0; round < 3; ++round) {
      int64_t x = me;
      if ((me + round) % 2 == 0) w.all_reduce_async(&x, 1, DType::i64, ReduceOp::sum).wait();
      else w.all_reduce(&x, 1, DType::i64, ReduceOp::sum);
      EXPECT_EQ(x, int64_t{n} * (n - 1) / 2);
      std::vector<int32_t> all(static_cast<size_t>(n));
      const int32_t mine = me;
      if ((me + round) % 3 == 0) w.all_gather_async(&mine, all.data(), 1, DType::i32).wait();
      else w.all_gather(&mine, all.data(), 1, DType::i32);
      for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<size_t>(k)], k);
    }
  });
}

TEST(Async, DefaultWorkIsCompleteAndCopiesShareState) {
  const Work none;
  EXPECT_TRUE(none.is_completed());
  none.wait();
  for_each_world(world_sizes(), [] {
    int64_t x = 2;
    Work w = world().all_reduce_async(&x, 1, DType::i64, ReduceOp::product);
    const Work copy = w;
    copy.wait();
    EXPECT_TRUE(w.is_completed());
    w.wait();
    EXPECT_EQ(x, int64_t{1} << world_size());
  });
}

}  // namespace
