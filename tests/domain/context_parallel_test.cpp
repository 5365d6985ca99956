// context_parallel: q, k, v split along the sequence for a block of code (contiguous or
// load-balanced zig-zag), attention inside by the ring, unsplit after: equal to unsharded
// attention in value and gradient, over uneven and empty chunks; buffers restored; bad input named.
#include <gtest/gtest.h>

#include <stdexcept>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/domain/context_parallel.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor smooth(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape);
}

void expect_context_parallel_equals_unsharded(const DeviceMesh& mesh, int64_t cp, const Placements& placements,
                                              const Shape& shape, bool causal, bool load_balance) {
  const Tensor q = smooth(shape, 0.1), k = smooth(shape, 0.4), v = smooth(shape, 0.9);
  Tensor qr = q.clone(), kr = k.clone(), vr = v.clone();
  for (Tensor* t : {&qr, &kr, &vr}) t->requires_grad_();
  const Tensor expected = scaled_dot_product_attention(qr, kr, vr, std::nullopt, 0.0, causal);
  const Tensor r = smooth(expected.shape(), 1.7);
  sum(expected * r).backward();

  DTensor qd = distribute_tensor(q, mesh, placements), kd = distribute_tensor(k, mesh, placements),
          vd = distribute_tensor(v, mesh, placements);
  for (DTensor* t : {&qd, &kd, &vd}) t->requires_grad_();
  const DTensor q_leaf = qd, k_leaf = kd, v_leaf = vd;
  const ContextParallelOptions options{load_balance, cp};
  const int64_t seq = static_cast<int64_t>(shape.size()) - 2;
  DTensor y;
  CommDebugMode debug;
  context_parallel(mesh, {&qd, &kd, &vd}, {seq, seq, seq}, [&] {
    EXPECT_EQ(debug.total_count(), 0);  // splitting a replicated buffer moves nothing
    EXPECT_TRUE(is_shard(qd.placements()[static_cast<size_t>(cp)], seq));
    y = scaled_dot_product_attention(qd, kd, vd, std::nullopt, 0.0, causal);
  }, options);
  const std::string what = to_string(placements) + " " + shape.to_string() + (causal ? " causal" : "") +
                           (load_balance ? " load-balanced" : " contiguous");
  EXPECT_EQ(debug.count(CollectiveKind::all_gather), 0) << what;  // the ring never gathers
  // Restored: the buffers are the replicated leaves again.
  EXPECT_EQ(qd.placements(), placements) << what;
  const DTensor full = context_parallel_unshard(mesh, {y}, {seq}, options)[0];
  EXPECT_TRUE(allclose(full.full_tensor(), expected, 1e-10, 1e-10)) << what;
  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
  sum(full * distribute_tensor(r, mesh, replicate).redistribute(mesh, full.layout())).backward();
  EXPECT_TRUE(allclose(q_leaf.grad().full_tensor(), qr.grad(), 1e-10, 1e-10)) << what << " (dq)";
  EXPECT_TRUE(allclose(k_leaf.grad().full_tensor(), kr.grad(), 1e-10, 1e-10)) << what << " (dk)";
  EXPECT_TRUE(allclose(v_leaf.grad().full_tensor(), vr.grad(), 1e-10, 1e-10)) << what << " (dv)";
}

}  // namespace

TEST(ContextParallel, RingAttentionInsideEqualsUnsharded) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    // 12 splits evenly in 2n chunks for n = 2, 3; 13 and 5 leave uneven and empty chunks.
    for (int64_t length : {12, 13, 5})
      for (bool causal : {true, false})
        for (bool load_balance : {true, false})
          expect_context_parallel_equals_unsharded(mesh, 0, {Replicate{}}, {2, 2, length, 4}, causal, load_balance);
  });
}

TEST(ContextParallel, HeadsSplitOverAnotherMeshDim) {
  for_each_world({4}, [] {
    const int n = world_size();
    const DeviceMesh mesh({2, n / 2}, {"heads", "cp"});
    expect_context_parallel_equals_unsharded(mesh, 1, {Shard{1}, Replicate{}}, {1, 4, 11, 3}, true, true);
  });
}

TEST(ContextParallel, NoRestoreKeepsTheSplitAndErrorsAreNamed) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    const Tensor x = smooth({3, 10}, 0.2);
    DTensor a = distribute_tensor(x, mesh, {Replicate{}}), b = a;
    context_parallel(mesh, {&a, &b}, {1, 1}, [] {}, {}, {&b});
    EXPECT_EQ(a.placements(), Placements{Replicate{}});
    EXPECT_EQ(b.placements(), Placements{Shard{1}});
    // b holds the zig-zag order: unsharding gives x back exactly.
    EXPECT_TRUE(allclose(context_parallel_unshard(mesh, {b}, {1})[0].full_tensor(), x, 0, 0));
    // A throwing body leaves the buffers (and the load-balanced order) as they were.
    EXPECT_THROW(context_parallel(mesh, {&a}, {1}, [] { throw std::runtime_error("body"); }), std::runtime_error);
    EXPECT_EQ(a.placements(), Placements{Replicate{}});
    // Bad input.
    DTensor split = distribute_tensor(x, mesh, {Shard{1}});
    EXPECT_TRUE(sharding_error([&] { context_parallel(mesh, {&split}, {1}, [] {}); },
                               {"[context_parallel]", "buffer 0", "must be replicated on mesh dim 0"}));
    EXPECT_TRUE(sharding_error([&] { context_parallel(mesh, {&a}, {2}, [] {}); },
                               {"[context_parallel]", "sequence dim 2 of buffer 0 is out of range"}));
    EXPECT_TRUE(value_error([&] { context_parallel(mesh, {&a}, {1, 1}, [] {}); },
                            {"[context_parallel]", "1 buffers but 2 sequence dims"}));
    EXPECT_TRUE(value_error([&] { context_parallel(mesh, {&a}, {1}, [] {}, {}, {&split}); },
                            {"[context_parallel]", "no_restore"}));
    EXPECT_TRUE(sharding_error([&] { context_parallel_unshard(mesh, {a}, {1}); },
                               {"[context_parallel_unshard]", "is not split along dim 1"}));
    // Inside a load-balanced scope, causal attention on blocks that are not the zig-zag ones is
    // an error, not a silently wrong mask (5 rows on 4 ranks: contiguous 2,2,1,0; zig-zag 1,1,1,2).
    if (n == 4) {
      const DTensor q = distribute_tensor(smooth({1, 1, 5, 2}, 0.3), mesh, {Shard{2}});
      DTensor unused = a;
      context_parallel(mesh, {&unused}, {1}, [&] {
        EXPECT_TRUE(sharding_error(
            [&] { scaled_dot_product_attention(q, q, q, std::nullopt, 0.0, true); },
            {"[scaled_dot_product_attention]", "under load-balanced context_parallel", "should hold"}));
      });
    }
  });
}
