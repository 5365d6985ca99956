// scaled_dot_product_attention with the sequence sharded runs as ring attention: equal to the
// unsharded attention in value and gradient (causal or not, uneven pieces, batch and heads split
// over a second mesh dim), and no rank ever receives more than one k/v block at a time.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor smooth(const Shape& shape, double seed, DType dtype) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape).to(dtype);
}

void expect_ring_equals_unsharded(const DeviceMesh& mesh, const Placements& placements, const Shape& q_shape,
                                  int64_t kv_length, bool causal, DType dtype) {
  Shape kv_shape = q_shape;
  kv_shape[q_shape.size() - 2] = kv_length;
  const Tensor q = smooth(q_shape, 0.1, dtype), k = smooth(kv_shape, 0.4, dtype), v = smooth(kv_shape, 0.9, dtype);
  Tensor qr = q.clone(), kr = k.clone(), vr = v.clone();
  for (Tensor* t : {&qr, &kr, &vr}) t->requires_grad_();
  const Tensor expected = scaled_dot_product_attention(qr, kr, vr, std::nullopt, 0.0, causal);
  const Tensor r = smooth(expected.shape(), 1.7, dtype);
  sum(expected * r).backward();

  DTensor qd = distribute_tensor(q, mesh, placements), kd = distribute_tensor(k, mesh, placements),
          vd = distribute_tensor(v, mesh, placements);
  for (DTensor* t : {&qd, &kd, &vd}) t->requires_grad_();
  CommDebugMode debug;
  const DTensor y = scaled_dot_product_attention(qd, kd, vd, std::nullopt, 0.0, causal);
  const std::string what = to_string(placements) + " q " + q_shape.to_string() + " kv " + std::to_string(kv_length) +
                           (causal ? " causal " : " ") + std::string(name(dtype));
  // Never gathered: only single-block messages around the ring (all_to_all_v, one peer).
  EXPECT_EQ(debug.count(CollectiveKind::all_gather), 0) << what;
  const int64_t block_bytes = (kv_length + mesh.size(0) - 1) / mesh.size(0) * (kv_shape.numel() / kv_length) * itemsize(dtype);
  for (const CollectiveCall& call : debug.calls()) EXPECT_LE(call.bytes_received, block_bytes) << what;
  EXPECT_EQ(y.placements(), qd.placements()) << what;
  const double tol = dtype == DType::f64 ? 1e-10 : 2e-5;
  EXPECT_TRUE(allclose(y.full_tensor(), expected, tol, tol)) << what;
  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
  sum(y * distribute_tensor(r, mesh, replicate).redistribute(mesh, y.layout())).backward();
  EXPECT_TRUE(allclose(qd.grad().full_tensor(), qr.grad(), tol, tol)) << what << " (dq)";
  EXPECT_TRUE(allclose(kd.grad().full_tensor(), kr.grad(), tol, tol)) << what << " (dk)";
  EXPECT_TRUE(allclose(vd.grad().full_tensor(), vr.grad(), tol, tol)) << what << " (dv)";
}

}  // namespace

TEST(RingAttention, SequenceShardedEqualsUnsharded) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    for (bool causal : {false, true})
      for (DType dtype : {DType::f64, DType::f32}) {
        expect_ring_equals_unsharded(mesh, {Shard{2}}, {2, 3, 4 * n, 8}, 4 * n, causal, dtype);
        expect_ring_equals_unsharded(mesh, {Shard{2}}, {1, 2, 3 * n + 2, 4}, 3 * n + 2, causal, dtype);  // uneven
        expect_ring_equals_unsharded(mesh, {Shard{1}}, {2, 2 * n + 1, 4}, 2 * n + 1, causal, dtype);       // [B, L, E]
      }
    // Cross attention: as many keys as queries is not needed.
    expect_ring_equals_unsharded(mesh, {Shard{2}}, {1, 2, 2 * n, 4}, 3 * n + 1, false, DType::f64);
  });
}

TEST(RingAttention, HeadsSplitOverAnotherMeshDim) {
  for_each_world({4}, [] {
    if (world_size() != 4) return;
    const DeviceMesh mesh({2, 2}, {"cp", "tp"});
    for (bool causal : {false, true}) {
      expect_ring_equals_unsharded(mesh, {Shard{2}, Shard{1}}, {1, 4, 9, 8}, 9, causal, DType::f64);
      expect_ring_equals_unsharded(mesh, {Shard{2}, Replicate{}}, {2, 2, 8, 4}, 8, causal, DType::f64);
    }
  });
}
