// Optimizers against hand-computed updates, on sharded and replicated parameters; clipping by
// the global norm across shards; the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/fused_optim.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor seq(int64_t n, double scale) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<double>(i + 1);
  return from_vector(v, Shape{n});
}

// A leaf parameter holding `values` with `placements`, and its gradient set to `grad`.
DTensor param_with_grad(const Tensor& values, const Tensor& grad, const DeviceMesh& mesh, const Placements& placements) {
  DTensor p = distribute_tensor(values, mesh, placements);
  p.requires_grad_();
  p.set_grad(distribute_tensor(grad, mesh, placements));
  return p;
}

}  // namespace

TEST(Optimizers, SgdMomentumMatchesTheFormulaOnEveryShard) {
  for_each_world({3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    for (const Placements& placements : {Placements{Shard{0}}, Placements{Replicate{}}}) {
      const Tensor w0 = seq(7, 1.0), g = seq(7, 0.1);
      DTensor p = param_with_grad(w0, g, mesh, placements);
      nn::SGD sgd({&p}, 0.5, 0.9, 0.01);
      sgd.step();  // buf = g + wd w0; w1 = w0 - lr buf
      const Tensor buf1 = add(g, mul(w0, Scalar(0.01)));
      const Tensor w1 = sub(w0, mul(buf1, Scalar(0.5)));
      EXPECT_TRUE(allclose(p.full_tensor(), w1, 1e-12, 1e-12));
      p.set_grad(distribute_tensor(g, mesh, placements));
      sgd.step();  // buf = 0.9 buf + g + wd w1
      const Tensor buf2 = add(mul(buf1, Scalar(0.9)), add(g, mul(w1, Scalar(0.01))));
      EXPECT_TRUE(allclose(p.full_tensor(), sub(w1, mul(buf2, Scalar(0.5))), 1e-12, 1e-12));
      EXPECT_EQ(p.placements(), placements);
      EXPECT_TRUE(p.is_leaf());
    }
  });
}

TEST(Optimizers, AdamWMatchesTheFormula) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Tensor w0 = seq(5, 1.0), g = seq(5, -0.2);
    DTensor p = param_with_grad(w0, g, mesh, {Shard{0}});
    nn::AdamW adam({&p}, 0.1, 0.9, 0.99, 1e-8, 0.1);
    adam.step();
    // Step 1: m = 0.1 g, v = 0.01 g^2; m_hat = g, v_hat = g^2: update = g / (|g| + eps).
    const Tensor update = div(g, add(abs(g), Scalar(1e-8)));
    const Tensor expected = sub(mul(w0, Scalar(1 - 0.1 * 0.1)), mul(update, Scalar(0.1)));
    EXPECT_TRUE(allclose(p.full_tensor(), expected, 1e-12, 1e-12));
  });
}

TEST(Optimizers, ClipGradNormUsesTheNormOverAllShards) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({2, world_size() / 2}, {"dp", "tp"});
    const Tensor g1 = seq(6, 1.0), g2 = seq(3, 2.0);
    DTensor a = param_with_grad(zeros({6}, DType::f64), g1, mesh, {Shard{0}, Shard{0}});
    DTensor b = param_with_grad(zeros({3}, DType::f64), g2, mesh, {Replicate{}, Shard{0}});
    const double norm = std::sqrt(sum(mul(g1, g1)).item() + sum(mul(g2, g2)).item());
    EXPECT_NEAR(nn::clip_grad_norm_({&a, &b}, 1e6), norm, 1e-9);  // below the limit: unchanged
    EXPECT_TRUE(allclose(a.grad().full_tensor(), g1));
    EXPECT_NEAR(nn::clip_grad_norm_({&a, &b}, 1.0), norm, 1e-9);
    const double clipped = std::sqrt(sum(mul(a.grad(), a.grad())).full_tensor().item() +
                                     sum(mul(b.grad(), b.grad())).full_tensor().item());
    EXPECT_NEAR(clipped, 1.0, 1e-5);
    EXPECT_TRUE(allclose(b.grad().full_tensor(), mul(g2, Scalar(1.0 / (norm + 1e-6))), 1e-9, 1e-12));
  });
}

// One block of every gradient counts once, whatever its placements (uneven shards, replicas,
// Partial sums), over one all_reduce; fully replicated gradients need none.
TEST(Optimizers, ClipGradNormCountsEveryBlockOnceInOneCollective) {
  for_each_world({4, 6}, [] {
    const DeviceMesh mesh({2, world_size() / 2}, {"dp", "tp"});
    const Tensor g1 = seq(7, 1.0), g2 = seq(5, -0.5), g3 = seq(4, 0.25);
    DTensor a = param_with_grad(zeros({7}, DType::f64), g1, mesh, {Replicate{}, Shard{0}});  // uneven over tp
    DTensor b = param_with_grad(zeros({5}, DType::f64), g2, mesh, {Shard{0}, Replicate{}});
    // c's gradient is a Partial sum over dp: each dp rank holds half of it.
    DTensor c = param_with_grad(zeros({4}, DType::f64), g3, mesh, {Replicate{}, Replicate{}});
    c.set_grad(DTensor::from_local(mul(g3, Scalar(0.5)), mesh, {Partial{}, Replicate{}}));
    const double norm = std::sqrt(sum(mul(g1, g1)).item() + sum(mul(g2, g2)).item() + sum(mul(g3, g3)).item());
    {
      CommDebugMode mode;
      EXPECT_NEAR(nn::clip_grad_norm_({&a, &b}, 1e6), std::sqrt(sum(mul(g1, g1)).item() + sum(mul(g2, g2)).item()), 1e-9);
      EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 1);
    }
    EXPECT_NEAR(nn::clip_grad_norm_({&a, &b, &c}, 1e6), norm, 1e-9);
    // Replicated gradients: every rank has the total already.
    DTensor r = param_with_grad(zeros({3}, DType::f64), g2.narrow(0, 0, 3), mesh, {Replicate{}, Replicate{}});
    CommDebugMode mode;
    EXPECT_NEAR(nn::clip_grad_norm_({&r}, 1e6), std::sqrt(sum(mul(g2.narrow(0, 0, 3), g2.narrow(0, 0, 3))).item()), 1e-12);
    EXPECT_EQ(mode.total_count(), 0);
  });
}

// The fused f32 update equals the formula computed op by op in f64, to f32 rounding; a gradient
// in another layout than its parameter is brought to the parameter's first.
TEST(Optimizers, AdamWFusedF32AndGradientsInOtherLayouts) {
  for_each_world({3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Tensor w0 = seq(8, 0.5), g = seq(8, -0.3);
    DTensor p = param_with_grad(w0.to(DType::f32), g.to(DType::f32), mesh, {Shard{0}});
    DTensor q = param_with_grad(w0.to(DType::f32), g.to(DType::f32), mesh, {Shard{0}});
    q.set_grad(distribute_tensor(g.to(DType::f32), mesh, {Replicate{}}));
    nn::AdamW adam({&p, &q}, 0.1, 0.9, 0.99, 1e-8, 0.1);
    adam.step();
    const Tensor update = div(g, add(abs(g), Scalar(1e-8)));
    const Tensor expected = sub(mul(w0, Scalar(1 - 0.1 * 0.1)), mul(update, Scalar(0.1)));
    EXPECT_TRUE(allclose(p.full_tensor().to(DType::f64), expected, 1e-6, 1e-6));
    EXPECT_TRUE(allclose(q.full_tensor().to(DType::f64), expected, 1e-6, 1e-6));
    EXPECT_EQ(q.placements(), (Placements{Shard{0}}));
  });
  EXPECT_TRUE(throws_with<ValueError>(
      [] {
        Tensor p = zeros({4}), m = zeros({4}), v = zeros({3}), g = zeros({4});
        adamw_update_(p, m, v, g, AdamWStep{});
      },
      {"[adamw_update_]", "[3]", "one shape"}));
}

TEST(Optimizers, WarmupCosineSchedule) {
  EXPECT_DOUBLE_EQ(nn::warmup_cosine_lr(0, 4, 20, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(nn::warmup_cosine_lr(3, 4, 20, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(nn::warmup_cosine_lr(4, 4, 20, 1.0), 1.0);
  EXPECT_NEAR(nn::warmup_cosine_lr(12, 4, 20, 1.0, 0.1), 0.55, 1e-12);  // half way: the midpoint
  EXPECT_DOUBLE_EQ(nn::warmup_cosine_lr(20, 4, 20, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(nn::warmup_cosine_lr(50, 4, 20, 1.0, 0.1), 0.1);
}

TEST(Optimizers, Errors) {
  EXPECT_TRUE(throws_with<ValueError>([] { nn::SGD({}, -1.0); }, {"[SGD]", "-1"}));
  EXPECT_TRUE(throws_with<ValueError>([] { nn::AdamW({}, 1e-3, 1.5); }, {"[AdamW]", "betas"}));
}
