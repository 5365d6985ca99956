// cumsum, cumprod and topk along a dim sharded by several mesh dims, in either shard order and
// with uneven or explicit piece sizes (empty pieces included): the sharded result (values,
// indices, gradients) equals the unsharded one, and only the pieces' totals or k candidates per
// piece move, never the dim.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Tensor dim 1 split over every mesh dim of `mesh_shape`, in `order`, by chunk semantics or by
// explicit `sizes` (one per piece, in splitting order).
struct NestedSplit {
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> order;
  std::vector<int64_t> sizes = {};
};

// The splits a world of n ranks can hold: 1-d, then 2 x n/2 in both orders, then explicit sizes
// with empty pieces in the middle of the dim.
std::vector<NestedSplit> splits_of(int64_t n) {
  std::vector<NestedSplit> out{{{n}, {0}}};
  if (n < 4 || n % 2 != 0) return out;
  out.push_back({{2, n / 2}, {0, 1}});
  out.push_back({{2, n / 2}, {1, 0}});
  std::vector<int64_t> sizes(static_cast<size_t>(n), 1);  // 7 rows: [2, 0, 3, 0, 1, 1] on 6 pieces
  sizes[0] = 2, sizes[1] = 0, sizes[2] = 3, sizes[3] = 0;
  if (n == 4) sizes[3] = 2;  // [2, 0, 3, 2]
  out.push_back({{2, n / 2}, {1, 0}, sizes});
  return out;
}

Layout layout_of(const Shape& shape, const DeviceMesh& mesh, const NestedSplit& split) {
  const Placements placements(split.mesh_shape.size(), Shard{1});
  ShardSizes sizes;
  if (!split.sizes.empty()) sizes[1] = split.sizes;
  return Layout(shape, DType::f32, mesh.spec(), placements, {{1, split.order}}, sizes);
}

// The calling rank's block of `global` in `layout`, as a DTensor.
DTensor piece_of_global(const Tensor& global, const DeviceMesh& mesh, const Layout& layout) {
  return DTensor(block_of(global, layout.block(mesh.coordinate())), mesh, layout.with_dtype(global.dtype()));
}

// The gradient of the unsharded `op` at `global` for the output gradient `weights`.
template <class Op>
Tensor reference_grad(const Tensor& global, const Tensor& weights, Op op) {
  Tensor x = global.clone();
  x.requires_grad_();
  op(x).backward(weights);
  return x.grad();
}

// The sharded gradient of `op` at x (a leaf) for `weights` laid out as the output.
template <class Op>
Tensor sharded_grad(const Tensor& global, const DeviceMesh& mesh, const Layout& layout, const Tensor& weights, Op op) {
  DTensor x = piece_of_global(global, mesh, layout);
  x.requires_grad_();
  const DTensor y = op(x);
  y.backward(piece_of_global(weights, mesh, y.layout()));
  return x.grad().full_tensor();
}

std::string where(const DeviceMesh& mesh, const Layout& layout) {
  return mesh.to_string() + " " + layout.to_string() + " (rank " + std::to_string(rank()) + ")";
}

TEST(NestedShardScan, CumsumAndCumprodEqualTheUnshardedScan) {
  for_each_world({4, 6}, [] {
    for (const NestedSplit& split : splits_of(world_size())) {
      const DeviceMesh mesh(split.mesh_shape, split.mesh_shape.size() == 1 ? std::vector<std::string>{"x"}
                                                                           : std::vector<std::string>{"a", "b"});
      for (int64_t length : {7, 4, 2}) {
        if (!split.sizes.empty() && length != 7) continue;  // the explicit sizes add up to 7
        const Tensor global = data({3, length}, 1);
        const Tensor factors = global / 40.0 + 1.0;
        const Tensor weights = data({3, length}, 2);
        const Layout layout = layout_of(global.shape(), mesh, split);
        const std::string at = where(mesh, layout);
        const DTensor running = cumsum(piece_of_global(global, mesh, layout), 1);
        EXPECT_EQ(running.layout().to_string(), layout.to_string()) << at;
        EXPECT_TRUE(allclose(running.full_tensor(), cumsum(global, 1), 1e-6, 1e-6)) << at;
        const DTensor product = cumprod(piece_of_global(factors, mesh, layout), 1);
        EXPECT_EQ(product.layout().to_string(), layout.to_string()) << at;
        EXPECT_TRUE(allclose(product.full_tensor(), cumprod(factors, 1), 1e-5, 1e-6)) << at;
        const auto scan_sum = [](const auto& x) { return cumsum(x, 1); };
        const auto scan_product = [](const auto& x) { return cumprod(x, 1); };
        EXPECT_TRUE(allclose(sharded_grad(global, mesh, layout, weights, scan_sum),
                             reference_grad(global, weights, scan_sum), 1e-5, 1e-5))
            << at;
        EXPECT_TRUE(allclose(sharded_grad(factors, mesh, layout, weights, scan_product),
                             reference_grad(factors, weights, scan_product), 1e-4, 1e-5))
            << at;
      }
    }
  });
}

TEST(NestedShardScan, TopkEqualsTheUnshardedTopk) {
  for_each_world({4, 6}, [] {
    for (const NestedSplit& split : splits_of(world_size())) {
      const DeviceMesh mesh(split.mesh_shape, split.mesh_shape.size() == 1 ? std::vector<std::string>{"x"}
                                                                           : std::vector<std::string>{"a", "b"});
      for (int64_t length : {7, 4, 2}) {
        if (!split.sizes.empty() && length != 7) continue;
        const Tensor global = data({3, length}, 3);
        const Layout layout = layout_of(global.shape(), mesh, split);
        const DTensor x = piece_of_global(global, mesh, layout);
        for (int64_t k = 1; k <= std::min<int64_t>(3, length); ++k)
          for (bool largest : {true, false}) {
            const std::string at =
                where(mesh, layout) + " k " + std::to_string(k) + (largest ? " largest" : " smallest");
            const auto best = topk(x, k, 1, largest);
            const auto expected = topk(global, k, 1, largest);
            EXPECT_TRUE(same(best.values.full_tensor(), expected.values)) << at;
            EXPECT_TRUE(same(best.indices.full_tensor(), expected.indices)) << at;
            const Tensor weights = data({3, k}, 4);
            const auto pick = [k, largest](const auto& t) { return topk(t, k, 1, largest).values; };
            EXPECT_TRUE(same(sharded_grad(global, mesh, layout, weights, pick), reference_grad(global, weights, pick)))
                << at;
          }
      }
    }
  });
}

// The case: arange(1024) as [1, 1024] cut into four pieces. On 2x2 with (S(1), S(1)), in
// either order, topk moves what it moves on [4] with (S(1)): one candidate per piece (an f32 value
// and an i64 index from each of the 3 other pieces); cumsum moves one f64 total per piece.
TEST(NestedShardScan, FourPiecesMoveTheSameBytesOnAnyMesh) {
  for_each_world({4}, [] {
    if (world_size() != 4) GTEST_SKIP() << "the pieces of the issue's case are four ranks'";
    const Tensor global = arange(1024).to(DType::f32).reshape({1, 1024});
    for (const NestedSplit& split : splits_of(4)) {
      if (!split.sizes.empty()) continue;
      const DeviceMesh mesh(split.mesh_shape, split.mesh_shape.size() == 1 ? std::vector<std::string>{"x"}
                                                                           : std::vector<std::string>{"a", "b"});
      const Layout layout = layout_of(global.shape(), mesh, split);
      const DTensor x = piece_of_global(global, mesh, layout);
      const std::string at = where(mesh, layout);
      CommDebugMode pick;
      const auto best = topk(x, 1, 1);
      EXPECT_EQ(pick.count(CollectiveKind::all_gather), 2) << at;  // values and indices
      EXPECT_EQ(pick.total_count(), 2) << at;
      EXPECT_EQ(pick.total_bytes_received(), 3 * (4 + 8)) << at;
      EXPECT_TRUE(same(best.values.full_tensor(), topk(global, 1, 1).values)) << at;
      EXPECT_TRUE(same(best.indices.full_tensor(), topk(global, 1, 1).indices)) << at;
      CommDebugMode scan;
      const DTensor running = cumsum(x, 1);
      EXPECT_EQ(scan.total_count(), 1) << at;
      EXPECT_EQ(scan.total_bytes_received(), 3 * 8) << at;
      EXPECT_TRUE(allclose(running.full_tensor(), cumsum(global, 1))) << at;
    }
  });
}

}  // namespace
