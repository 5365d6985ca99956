// Sharded convolution equals the unsharded one, values and gradients, over spatial sharding of
// one and two dims (uneven and empty pieces), batch sharding, strides, paddings, dilations,
// kernels and groups; and moves only halo rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

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
  return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape);
}

struct Case {
  std::vector<int64_t> kernel;
  int64_t stride, padding, dilation, groups;
  bool bias;
};

// conv on full tensors and on x laid out by `placements`, compared in value and gradient.
// `weight_placements` (default Replicate) shard the weight; the bias follows its output channels.
void expect_same_conv(const DeviceMesh& mesh, const Placements& placements, const Shape& x_shape, const Case& c,
                      Placements weight_placements = {}) {
  const int64_t channels = x_shape[1], out_channels = 2 * c.groups;
  std::vector<int64_t> w_shape{out_channels, channels / c.groups};
  w_shape.insert(w_shape.end(), c.kernel.begin(), c.kernel.end());
  const Tensor x = smooth(x_shape, 0.1), w = smooth(Shape(w_shape), 0.5), b = smooth({out_channels}, 0.9);
  const int64_t spatial = x_shape.size() - 2;
  using LocalConv = Tensor (*)(const Tensor&, const Tensor&, const std::optional<Tensor>&, std::vector<int64_t>,
                               std::vector<int64_t>, std::vector<int64_t>, int64_t);
  const LocalConv local_conv = spatial == 1   ? static_cast<LocalConv>(conv1d)
                               : spatial == 2 ? static_cast<LocalConv>(conv2d)
                                              : static_cast<LocalConv>(conv3d);
  Tensor xr = x.clone(), wr = w.clone(), br = b.clone();
  xr.requires_grad_();
  wr.requires_grad_();
  br.requires_grad_();
  const Tensor expected = local_conv(xr, wr, c.bias ? std::optional<Tensor>(br) : std::nullopt, {c.stride}, {c.padding},
                                     {c.dilation}, c.groups);
  const Tensor r = smooth(expected.shape(), 1.3);
  sum(expected * r).backward();

  const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
  if (weight_placements.empty()) weight_placements = replicate;
  Placements bias_placements = replicate;
  for (size_t m = 0; m < bias_placements.size(); ++m)
    if (is_shard(weight_placements[m], 0)) bias_placements[m] = Shard{0};
  DTensor xd = distribute_tensor(x, mesh, placements), wd = distribute_tensor(w, mesh, weight_placements),
          bd = distribute_tensor(b, mesh, bias_placements);
  xd.requires_grad_();
  wd.requires_grad_();
  bd.requires_grad_();
  using ShardedConv = DTensor (*)(const DTensor&, const DTensor&, const std::optional<DTensor>&, std::vector<int64_t>,
                                  std::vector<int64_t>, std::vector<int64_t>, int64_t);
  const ShardedConv sharded_conv = spatial == 1   ? static_cast<ShardedConv>(conv1d)
                                   : spatial == 2 ? static_cast<ShardedConv>(conv2d)
                                                  : static_cast<ShardedConv>(conv3d);
  const DTensor y = sharded_conv(xd, wd, c.bias ? std::optional<DTensor>(bd) : std::nullopt, {c.stride}, {c.padding},
                                 {c.dilation}, c.groups);
  std::string what = to_string(placements) + " x " + x_shape.to_string() + " weight " + to_string(weight_placements) +
                     " stride " + std::to_string(c.stride) +
                     " padding " + std::to_string(c.padding) + " dilation " + std::to_string(c.dilation) + " groups " +
                     std::to_string(c.groups);
  // The spatial sharding is kept; input channels split with the weight's give a Partial sum.
  for (size_t m = 0; m < placements.size(); ++m) {
    if (is_shard(placements[m]) && !is_shard(placements[m], 1)) {
      EXPECT_TRUE(is_shard(y.placements()[m])) << what;
    }
    if (c.groups == 1 && is_shard(placements[m], 1) && !is_shard(weight_placements[m], 0)) {
      EXPECT_TRUE(is_partial(y.placements()[m])) << what << " -> " << y.layout().to_string();
    }
  }
  EXPECT_TRUE(allclose(y.full_tensor(), expected, 1e-10, 1e-10)) << what << " -> " << y.layout().to_string();
  sum(y * distribute_tensor(r, mesh, replicate)).backward();
  EXPECT_TRUE(allclose(xd.grad().full_tensor(), xr.grad(), 1e-10, 1e-10)) << what << " (input gradient)";
  EXPECT_TRUE(allclose(wd.grad().full_tensor(), wr.grad(), 1e-10, 1e-10)) << what << " (weight gradient)";
  if (c.bias) {
    EXPECT_TRUE(allclose(bd.grad().full_tensor(), br.grad(), 1e-10, 1e-10)) << what << " (bias gradient)";
  }
}

const std::vector<Case>& cases_2d() {
  static const std::vector<Case> cases{
      {{3, 3}, 1, 1, 1, 1, true},  {{3, 3}, 1, 0, 1, 1, false}, {{3, 3}, 2, 1, 1, 1, true},
      {{5, 3}, 1, 2, 1, 2, true},  {{3, 3}, 1, 2, 2, 1, false}, {{1, 1}, 1, 0, 1, 1, true},
      {{4, 2}, 3, 1, 1, 1, true},
  };
  return cases;
}

}  // namespace

TEST(ShardedConv, OneSpatialDimShardedUnevenly) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    for (const Case& c : cases_2d())
      for (int64_t h : {int64_t{11}, int64_t{3 * world_size()}}) {
        expect_same_conv(mesh, {Shard{2}}, {2, 4, h, 7}, c);
        expect_same_conv(mesh, {Shard{3}}, {1, 2, 5, h}, c);
      }
  });
}

TEST(ShardedConv, TwoSpatialDimsAsTilesAndBatchSharding) {
  for_each_world({4}, [] {
    if (world_size() != 4) return;
    const DeviceMesh mesh({2, 2}, {"a", "b"});
    for (const Case& c : cases_2d()) {
      expect_same_conv(mesh, {Shard{2}, Shard{3}}, {1, 2, 9, 10}, c);   // 2x2 spatial tiles (corners)
      expect_same_conv(mesh, {Shard{0}, Shard{2}}, {3, 2, 8, 6}, c);    // batch x rows
      expect_same_conv(mesh, {Shard{2}, Shard{2}}, {1, 2, 13, 5}, c);   // rows split twice
      expect_same_conv(mesh, {Shard{1}, Shard{3}}, {1, 4, 6, 11}, c);   // channels gathered first
    }
  });
}

TEST(ShardedConv, OneAndThreeSpatialDims) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh = line_mesh();
    for (const Case& c : {Case{{3}, 1, 1, 1, 1, true}, Case{{5}, 2, 2, 1, 1, true}, Case{{3}, 1, 0, 3, 1, false}})
      expect_same_conv(mesh, {Shard{2}}, {2, 2, 17}, c);
    for (const Case& c : {Case{{3, 3, 3}, 1, 1, 1, 1, true}, Case{{3, 1, 3}, 2, 1, 1, 1, false}})
      expect_same_conv(mesh, {Shard{2}}, {1, 2, 7, 4, 5}, c);
  });
}

TEST(ShardedConv, MovesOnlyHaloRows) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int64_t rows = 64, cols = 32, channels = 8;
    const DTensor x = distribute_tensor(data({1, channels, rows, cols}, 1), mesh, {Shard{2}});
    const DTensor w = distribute_tensor(data({channels, channels, 3, 3}, 2), mesh, {Replicate{}});
    CommDebugMode debug;
    conv2d(x, w, std::nullopt, {1}, {1});
    // A 3x3 "same" convolution needs one row from each neighbour; the edges get zeros.
    const int r = rank(), n = world_size();
    const int64_t halo_rows = (r > 0 ? 1 : 0) + (r < n - 1 ? 1 : 0);
    EXPECT_EQ(debug.total_bytes_received(), halo_rows * channels * cols * 4);
  });
}

namespace {

void expect_same_pool(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                      const std::vector<int64_t>& kernel, const std::vector<int64_t>& stride,
                      const std::vector<int64_t>& padding) {
  const Tensor x = smooth(shape, 0.2);
  for (bool max : {true, false}) {
    Tensor xr = x.clone();
    xr.requires_grad_();
    const Tensor expected = max ? max_pool2d(xr, kernel, stride, padding) : avg_pool2d(xr, kernel, stride, padding);
    const Tensor r = smooth(expected.shape(), 0.8);
    sum(expected * r).backward();
    DTensor xd = distribute_tensor(x, mesh, placements);
    xd.requires_grad_();
    const DTensor y = max ? max_pool2d(xd, kernel, stride, padding) : avg_pool2d(xd, kernel, stride, padding);
    const std::string what = std::string(max ? "max" : "avg") + " pool " + to_string(placements) + " " +
                             shape.to_string() + " kernel " + std::to_string(kernel[0]) + " stride " +
                             std::to_string(stride.empty() ? kernel[0] : stride[0]) + " padding " +
                             std::to_string(padding[0]);
    EXPECT_TRUE(allclose(y.full_tensor(), expected, 1e-12, 1e-12)) << what;
    const Placements replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
    sum(y * distribute_tensor(r, mesh, replicate).redistribute(mesh, y.layout())).backward();
    EXPECT_TRUE(allclose(xd.grad().full_tensor(), xr.grad(), 1e-12, 1e-12)) << what << " (gradient)";
  }
}

}  // namespace

TEST(ShardedPool, MaxAndAveragePoolingOverShardedSpatialDims) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    for (const auto& [kernel, stride, padding] :
         std::vector<std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>>>{
             {{2}, {}, {0}}, {{3}, {1}, {1}}, {{3}, {2}, {1}}, {{3, 2}, {2, 1}, {1, 0}}, {{5}, {3}, {2}}}) {
      expect_same_pool(mesh, {Shard{2}}, {2, 3, 13, 8}, kernel, stride, padding);
      expect_same_pool(mesh, {Shard{3}}, {1, 2, 6, 4 * world_size() + 1}, kernel, stride, padding);
      expect_same_pool(mesh, {Shard{1}}, {1, 2 * world_size(), 7, 6}, kernel, stride, padding);  // channels stay
    }
  });
}

TEST(ShardedInterpolate, NearestAndBilinearGrowEveryPiece) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    for (const std::string mode : {"nearest", "bilinear"})
      for (const auto& [placements, shape, size] : std::vector<std::tuple<Placements, Shape, std::vector<int64_t>>>{
               {{Shard{2}}, {2, 3, 2 * n + 1, 5}, {2 * (2 * n + 1), 7}},
               {{Shard{3}}, {1, 2, 4, 3 * n - 1}, {9, 3 * (3 * n - 1)}},
               {{Shard{2}}, {1, 1, n - 1, 4}, {3 * (n - 1), 8}},  // an empty piece
               {{Shard{1}}, {1, 2 * n, 3, 3}, {6, 5}}}) {          // channels: all local
        if (shape[2] == 0) continue;
        const Tensor x = smooth(shape, 0.4);
        Tensor xr = x.clone();
        xr.requires_grad_();
        const Tensor expected = interpolate(xr, size, mode);
        const Tensor r = smooth(expected.shape(), 0.6);
        sum(expected * r).backward();
        DTensor xd = distribute_tensor(x, mesh, placements);
        xd.requires_grad_();
        const DTensor y = interpolate(xd, size, mode);
        const std::string what = mode + " " + to_string(placements) + " " + shape.to_string();
        EXPECT_TRUE(allclose(y.full_tensor(), expected, 1e-12, 1e-12)) << what;
        sum(y * distribute_tensor(r, mesh, {Replicate{}}).redistribute(mesh, y.layout())).backward();
        EXPECT_TRUE(allclose(xd.grad().full_tensor(), xr.grad(), 1e-12, 1e-12)) << what << " (gradient)";
      }
    const DTensor x = distribute_tensor(smooth({1, 1, 2 * n, 3}, 0.1), mesh, {Shard{2}});
    EXPECT_TRUE(sharding_error([&] { interpolate(x, {2 * n + 1, 3}, "nearest"); },
                               {"[interpolate]", "is not a whole multiple"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { interpolate(x, {4 * n, 6}, "bicubic"); }, {"[interpolate]", "bicubic"}));
  });
}

// 2-d tiles: each tile receives exactly the grid points around it that a 3x3 window reads (the
// 1-ring inside the domain, corners included), nothing beyond the edges.
TEST(ShardedConv, TilesReceiveExactlyTheWindowBound) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"h", "w"});
    const int64_t rows = 13, cols = 11, channels = 3;
    const DTensor x = distribute_tensor(data({1, channels, rows, cols}, 1), mesh, {Shard{2}, Shard{3}});
    const DTensor w = distribute_tensor(data({2, channels, 3, 3}, 2), mesh, {Replicate{}, Replicate{}});
    const Block tile = x.layout().block(mesh.coordinate());
    int64_t ring = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const bool inside = i >= tile.begin[2] && i < tile.end[2] && j >= tile.begin[3] && j < tile.end[3];
        const bool near = i >= tile.begin[2] - 1 && i <= tile.end[2] && j >= tile.begin[3] - 1 && j <= tile.end[3];
        ring += near && !inside;
      }
    CommDebugMode debug;
    const DTensor y = conv2d(x, w, std::nullopt, {1}, {1});
    EXPECT_EQ(debug.total_bytes_received(), ring * channels * 4) << x.layout().to_string();
    EXPECT_TRUE(allclose(y.full_tensor(), conv2d(data({1, channels, rows, cols}, 1), data({2, channels, 3, 3}, 2),
                                                  std::nullopt, {1}, {1}),
                         1e-5, 1e-5));
  });
}

// Channel sharding as DTensor's linear: input channels split with the weight's dim 1 give a
// Partial(sum) output and the forward moves nothing (rowwise); the weight's output channels split
// with x whole give the output's channels sharded, again moving nothing (colwise). Grouped
// convolutions, and x split on a mesh dim the weight splits otherwise, fall back to whole
// channels. Uneven and empty channel pieces; a second mesh dim splitting rows.
TEST(ShardedConv, ChannelShardingAsRowwiseAndColwise) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    const Case same{{3, 3}, 1, 1, 1, 1, true}, grouped{{3, 3}, 1, 1, 1, 2, true};
    const auto silent = [&](const Placements& xp, const Shape& shape, const Placements& wp) {
      const DTensor x = distribute_tensor(smooth(shape, 0.1), mesh, xp);
      const DTensor w = distribute_tensor(smooth({4, shape[1], 3, 3}, 0.5), mesh, wp);
      const DTensor b = distribute_tensor(smooth({4}, 0.9), mesh, is_shard(wp[0], 0) ? Placements{Shard{0}} : Placements{Replicate{}});
      CommDebugMode debug;
      const DTensor y = conv2d(x, w, b, {1}, {1});
      EXPECT_EQ(debug.total_count(), 0) << to_string(xp) << " weight " << to_string(wp) << " -> " << y.layout().to_string();
      return y.placements();
    };
    EXPECT_EQ(silent({Shard{1}}, {2, n + 1, 5, 4}, {Shard{1}}), (Placements{Partial{}}));
    EXPECT_EQ(silent({Shard{1}}, {2, n - 1, 5, 4}, {Replicate{}}), (Placements{Partial{}}));  // an empty piece
    EXPECT_EQ(silent({Replicate{}}, {2, 3, 5, 4}, {Shard{0}}), (Placements{Shard{1}}));
    EXPECT_EQ(silent({Replicate{}}, {2, 3, 5, 4}, {Shard{1}}), (Placements{Partial{}}));
    for (const auto& [xp, wp] : std::vector<std::pair<Placements, Placements>>{{{Shard{1}}, {Shard{1}}},
                                                                             {{Shard{1}}, {Replicate{}}},
                                                                             {{Replicate{}}, {Shard{0}}},
                                                                             {{Replicate{}}, {Shard{1}}},
                                                                             {{Shard{1}}, {Shard{0}}}}) {
      expect_same_conv(mesh, xp, {2, 2 * n + 1, 5, 4}, same, wp);
      expect_same_conv(mesh, xp, {1, std::max(n - 1, 1), 6, 3}, same, wp);
    }
    expect_same_conv(mesh, {Shard{1}}, {1, 4, 5, 4}, grouped, {Replicate{}});
    if (n % 2 == 0) {
      const DeviceMesh grid({2, n / 2}, {"rows", "channels"});
      expect_same_conv(grid, {Shard{2}, Shard{1}}, {2, 5, 7, 4}, same, {Replicate{}, Shard{1}});
      expect_same_conv(grid, {Shard{2}, Replicate{}}, {2, 5, 7, 4}, same, {Replicate{}, Shard{0}});
      expect_same_conv(grid, {Shard{1}, Shard{1}}, {1, 7, 5, 4}, same, {Shard{1}, Shard{1}});
    }
  });
}
