// Sharded conv_transpose2d and adaptive_avg_pool2d equal the unsharded ops, values and
// gradients, over one and two sharded spatial dims (uneven and empty pieces), batch and channel
// sharding, strides, paddings, output paddings, dilations and groups; the halo they fetch is only
// the rows their outputs read.
#include <gtest/gtest.h>

#include <algorithm>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/domain/spatial.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor smooth(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.41 + seed).reshape(shape);
}

struct TransposeCase {
  int64_t kernel, stride, padding, output_padding, dilation, groups;
  bool bias;
};

std::string describe(const TransposeCase& c) {
  return "kernel " + std::to_string(c.kernel) + " stride " + std::to_string(c.stride) + " padding " +
         std::to_string(c.padding) + " output_padding " + std::to_string(c.output_padding) + " dilation " +
         std::to_string(c.dilation) + " groups " + std::to_string(c.groups);
}

// Value and gradients (x, weight, bias) of the sharded op against the unsharded one.
void expect_same_transpose(const DeviceMesh& mesh, const Placements& placements, const Shape& x_shape,
                           const TransposeCase& c) {
  const int64_t channels = x_shape[1];
  const Tensor x = smooth(x_shape, 0.2), w = smooth({channels, 3, c.kernel, c.kernel - 1 > 0 ? c.kernel - 1 : 1}, 0.6),
               b = smooth({3 * c.groups}, 1.1);
  Tensor xr = x.clone(), wr = w.clone(), br = b.clone();
  xr.requires_grad_();
  wr.requires_grad_();
  br.requires_grad_();
  const Tensor expected = conv_transpose2d(xr, wr, c.bias ? std::optional<Tensor>(br) : std::nullopt, {c.stride},
                                           {c.padding}, {c.output_padding}, c.groups, {c.dilation});
  const Tensor r = smooth(expected.shape(), 1.7);
  sum(expected * r).backward();

  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
  DTensor xd = distribute_tensor(x, mesh, placements), wd = distribute_tensor(w, mesh, replicate),
          bd = distribute_tensor(b, mesh, replicate);
  xd.requires_grad_();
  wd.requires_grad_();
  bd.requires_grad_();
  const DTensor y = conv_transpose2d(xd, wd, c.bias ? std::optional<DTensor>(bd) : std::nullopt, {c.stride},
                                     {c.padding}, {c.output_padding}, c.groups, {c.dilation});
  const std::string what = describe(c) + " on " + to_string(placements) + " " + x_shape.to_string();
  ASSERT_EQ(y.shape(), expected.shape()) << what;
  EXPECT_TRUE(allclose(y.full_tensor(), expected, 1e-12, 1e-12)) << what << " -> " << y.layout().to_string();
  sum(y * distribute_tensor(r, mesh, replicate)).backward();
  EXPECT_TRUE(allclose(xd.grad().full_tensor(), xr.grad(), 1e-12, 1e-12)) << what << " (x gradient)";
  EXPECT_TRUE(allclose(wd.grad().full_tensor(), wr.grad(), 1e-12, 1e-12)) << what << " (weight gradient)";
  if (c.bias) {
    EXPECT_TRUE(allclose(bd.grad().full_tensor(), br.grad(), 1e-12, 1e-12)) << what << " (bias gradient)";
  }
}

const std::vector<TransposeCase>& transpose_cases() {
  static const std::vector<TransposeCase> cases{
      {2, 2, 0, 0, 1, 1, true},   // the U-Net upsampling: no halo
      {4, 2, 1, 0, 1, 1, true},   // DCGAN's: one row each side
      {3, 1, 1, 0, 1, 2, false},  // a "same" transposed conv, grouped
      {3, 3, 0, 2, 1, 1, true},   // output padding: trailing rows of bias only
      {3, 2, 2, 1, 2, 1, true},   // dilation and padding
      {1, 3, 0, 0, 1, 1, true},   // gaps between the rows' footprints
  };
  return cases;
}

// Adaptive pooling's value and gradient against the unsharded op.
void expect_same_adaptive(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                          const std::vector<int64_t>& size) {
  const Tensor x = smooth(shape, 0.3);
  Tensor xr = x.clone();
  xr.requires_grad_();
  const Tensor expected = adaptive_avg_pool2d(xr, size);
  const Tensor r = smooth(expected.shape(), 0.8);
  sum(expected * r).backward();
  DTensor xd = distribute_tensor(x, mesh, placements);
  xd.requires_grad_();
  const DTensor y = adaptive_avg_pool2d(xd, size);
  const std::string what = "adaptive " + Shape(size).to_string() + " on " + to_string(placements) + " " + shape.to_string();
  ASSERT_EQ(y.shape(), expected.shape()) << what;
  EXPECT_TRUE(allclose(y.full_tensor(), expected, 1e-12, 1e-12)) << what << " -> " << y.layout().to_string();
  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
  sum(y * distribute_tensor(r, mesh, replicate)).backward();
  EXPECT_TRUE(allclose(xd.grad().full_tensor(), xr.grad(), 1e-12, 1e-12)) << what << " (gradient)";
}

}  // namespace

TEST(ShardedConvTranspose, OneSpatialDimShardedUnevenlyWithEmptyPieces) {
  for_each_world({2, 3, 6}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    for (const TransposeCase& c : transpose_cases()) {
      expect_same_transpose(mesh, {Shard{2}}, {1, 2 * c.groups, 2 * n + 1, 3}, c);
      expect_same_transpose(mesh, {Shard{3}}, {2, 2 * c.groups, 3, std::max(n - 1, 2)}, c);  // empty pieces
    }
  });
}

TEST(ShardedConvTranspose, TilesBatchAndChannelSharding) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"a", "b"});
    for (const TransposeCase& c : transpose_cases()) {
      expect_same_transpose(mesh, {Shard{2}, Shard{3}}, {1, 2 * c.groups, 5, 4}, c);
      expect_same_transpose(mesh, {Shard{0}, Shard{2}}, {2, 2 * c.groups, 5, 3}, c);
      expect_same_transpose(mesh, {Shard{1}, Shard{2}}, {1, 2 * c.groups, 5, 3}, c);
    }
  });
}

// The U-Net upsampling (kernel 2, stride 2) reads only each piece's own rows; DCGAN's (kernel 4,
// stride 2, padding 1) one row from each neighbour.
TEST(ShardedConvTranspose, FetchesOnlyTheRowsItsOutputsRead) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int r = rank(), n = world_size();
    const DTensor x = distribute_tensor(smooth({1, 2, 4 * n, 5}, 0.1).to(DType::f32), mesh, {Shard{2}});
    const DTensor w2 = distribute_tensor(smooth({2, 3, 2, 2}, 0.2).to(DType::f32), mesh, {Replicate{}});
    const DTensor w4 = distribute_tensor(smooth({2, 3, 4, 4}, 0.2).to(DType::f32), mesh, {Replicate{}});
    {
      CommDebugMode debug;
      const DTensor y = conv_transpose2d(x, w2, std::nullopt, {2});
      EXPECT_EQ(debug.total_count(), 0);
      EXPECT_EQ(y.to_local().shape()[2], 8);  // twice the rows, every piece
    }
    CommDebugMode debug;
    const DTensor y = conv_transpose2d(x, w4, std::nullopt, {2}, {1});
    const int neighbours = (r > 0) + (r < n - 1);
    const int64_t row_bytes = 2 * 5 * 4;
    EXPECT_EQ(debug.total_bytes_received(), neighbours * row_bytes);
    EXPECT_EQ(debug.total_bytes_sent(), neighbours * row_bytes);
    EXPECT_EQ(y.to_local().shape()[2], 8);
  });
}

TEST(ShardedAdaptivePool, DivisibleUnevenGlobalAndTiles) {
  for_each_world({2, 3, 6}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    for (const auto& size : std::vector<std::vector<int64_t>>{{3, 2}, {5, 3}, {1, 1}, {7, 1}, {2 * n + 1, 4}}) {
      expect_same_adaptive(mesh, {Shard{2}}, {1, 2, 2 * n + 1, 5}, size);
      expect_same_adaptive(mesh, {Shard{3}}, {2, 1, 3, n - 1 > 0 ? n - 1 : 1}, size);  // an empty piece
      expect_same_adaptive(mesh, {Shard{2}}, {1, 2, 6 * n, 4}, size);
    }
  });
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"a", "b"});
    for (const auto& size : std::vector<std::vector<int64_t>>{{2, 3}, {1, 1}, {3, 1}})
      expect_same_adaptive(mesh, {Shard{2}, Shard{3}}, {1, 2, 7, 6}, size);
  });
}

TEST(ShardedConvTranspose, ErrorsNameTheCall) {
  for_each_world({2}, [] {
    const DeviceMesh mesh = line_mesh();
    const DTensor x = distribute_tensor(smooth({1, 2, 6, 5}, 0.1), mesh, {Shard{2}});
    const DTensor w = distribute_tensor(smooth({2, 3, 3, 3}, 0.2), mesh, {Replicate{}});
    EXPECT_TRUE(throws_with<ValueError>([&] { conv_transpose2d(x, w, std::nullopt, {2}, {0}, {2}); },
                                        {"[conv_transpose2d]", "output_padding 2", "gives no valid output"}));
    EXPECT_TRUE(throws_with<ValueError>(
        [&] {
          conv_transpose2d(x, w, std::nullopt, {1, 1, 1});
        },
        {"[conv_transpose2d]", "stride [1, 1, 1] has 3 values; expected 1 or 2"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { adaptive_avg_pool2d(x, {0, 2}); },
                                        {"[adaptive_avg_pool2d]", "output size 0"}));
  });
}
