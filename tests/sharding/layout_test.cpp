// Pure tables: placements and layouts -> local blocks, with no ranks (STYLE.md §8b).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include <tessera/sharding/layout.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

MeshSpec mesh_1d(int64_t n) { return MeshSpec(Shape{n}, {"x"}); }
MeshSpec mesh_2d(int64_t a, int64_t b) { return MeshSpec(Shape{a, b}, {"dp", "tp"}); }

// Rows (begin, length) of dim 0 for every rank, in mesh row-major order.
std::vector<std::pair<int64_t, int64_t>> rows(const Layout& layout) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int r : layout.mesh().ranks()) {
    const Block b = layout.block_of_rank(r);
    out.emplace_back(b.begin[0], b.end[0] - b.begin[0]);
  }
  return out;
}

}  // namespace

TEST(Placement, TextForms) {
  EXPECT_EQ(to_string(Placement{Shard{0}}), "S(0)");
  EXPECT_EQ(to_string(Placement{Replicate{}}), "R");
  EXPECT_EQ(to_string(Placement{Partial{ReduceOp::max}}), "P(max)");
  EXPECT_EQ(to_string(Placements{Shard{1}, Replicate{}, Partial{}}), "(S(1), R, P(sum))");
  EXPECT_EQ(parse_placements("(S(0), R, P(avg))"), (Placements{Shard{0}, Replicate{}, Partial{ReduceOp::avg}}));
  EXPECT_EQ(parse_placement(" S(-1) "), Placement{Shard{-1}});
  EXPECT_EQ(parse_placement("P"), Placement{Partial{ReduceOp::sum}});
  EXPECT_TRUE(sharding_error([] { parse_placement("Q(0)"); }, {"[parse_placement]", "'Q(0)'"}));
  EXPECT_TRUE(sharding_error([] { parse_placement("S(x)"); }, {"[parse_placement]", "'S(x)'"}));
  EXPECT_TRUE(sharding_error([] { parse_placement("P(mean)"); }, {"[parse_placement]", "'P(mean)'"}));
}

TEST(Layout, ChunkSemanticsOneDim) {
  // 5 rows over 4 ranks -> [2, 2, 1, 0] at offsets 0, 2, 4, 5.
  const Layout layout(Shape{5, 3}, DType::f32, mesh_1d(4), {Shard{0}});
  EXPECT_EQ(rows(layout), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 2}, {4, 1}, {5, 0}}));
  EXPECT_EQ(layout.local_shape({3}), (Shape{0, 3}));
  EXPECT_EQ(layout.global_offset({2}), (DimVector{4, 0}));
  EXPECT_EQ(chunk_sizes(5, {4}), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(chunk_sizes(3, {4}), (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(chunk_sizes(0, {3}), (std::vector<int64_t>{0, 0, 0}));
}

TEST(Layout, NestedShardingOfOneDim) {
  // (18, 2) on 4x2 as (S(0), S(0)): dp 0..2 hold 3 rows at 5*dp and 2 rows at 5*dp+3; dp 3
  // holds 2 rows at 15 and 1 row at 17.
  const Layout layout(Shape{18, 2}, DType::f32, MeshSpec(Shape{4, 2}, {"dp", "tp"}), {Shard{0}, Shard{0}});
  EXPECT_EQ(rows(layout), (std::vector<std::pair<int64_t, int64_t>>{
                              {0, 3}, {3, 2}, {5, 3}, {8, 2}, {10, 3}, {13, 2}, {15, 2}, {17, 1}}));
  // 4 rows on 2x3 as (S(0), S(0)) -> [1, 1, 0, 1, 1, 0]: not the flat split [1, 1, 1, 1, 0, 0].
  const Layout nested(Shape{4}, DType::f32, mesh_2d(2, 3), {Shard{0}, Shard{0}});
  std::vector<int64_t> sizes;
  for (const auto& [begin, length] : rows(nested)) sizes.push_back(length);
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 1, 0, 1, 1, 0}));
}

TEST(Layout, ShardOrderOtherThanLeftToRight) {
  // tp splits first, then dp (PyTorch needs _StridedShard for this): piece = tp * 2 + dp.
  const Layout layout(Shape{8}, DType::f32, mesh_2d(2, 2), {Shard{0}, Shard{0}}, ShardOrder{{0, {1, 0}}});
  EXPECT_EQ(layout.shard_order(0), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(rows(layout), (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {4, 2}, {2, 2}, {6, 2}}));
  EXPECT_EQ(layout.to_string(), "[8] f32 on mesh[dp=2, tp=2] as (S(0), S(0)) order {0: [1, 0]}");
  EXPECT_NE(layout, Layout(Shape{8}, DType::f32, mesh_2d(2, 2), {Shard{0}, Shard{0}}));
}

TEST(Layout, TwoDimsShardedReplicatedAndPartial) {
  const Layout layout(Shape{8, 6}, DType::f32, mesh_2d(2, 2), {Shard{0}, Shard{1}});
  EXPECT_EQ(layout.block({1, 0}).to_string(), "[4:8, 0:3]");
  EXPECT_EQ(layout.to_string(), "[8, 6] f32 on mesh[dp=2, tp=2] as (S(0), S(1))");
  const Layout partial(Shape{8, 6}, DType::bf16, mesh_2d(2, 2), {Partial{}, Shard{-1}});
  EXPECT_EQ(partial.placements()[1], Placement{Shard{1}});  // normalised
  EXPECT_EQ(partial.block({1, 1}).to_string(), "[0:8, 3:6]");
  EXPECT_TRUE(partial.has_partial());
  EXPECT_FALSE(partial.is_replicated());
  const Layout replicated(Shape{3}, DType::i64, mesh_1d(3), {Replicate{}});
  EXPECT_TRUE(replicated.is_replicated());
  EXPECT_EQ(replicated.block({2}).to_string(), "[0:3]");
}

TEST(Layout, ExplicitSizes) {
  const Layout layout(Shape{10, 2}, DType::f32, mesh_1d(3), {Shard{0}}, {}, ShardSizes{{0, {5, 0, 5}}});
  EXPECT_TRUE(layout.has_explicit_sizes(0));
  EXPECT_EQ(rows(layout), (std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 0}, {5, 5}}));
  EXPECT_EQ(layout.to_string(), "[10, 2] f32 on mesh[x=3] as (S(0)) sizes {0: [5, 0, 5]}");
  // Sizes that equal chunk semantics are the default layout.
  const Layout same(Shape{10, 2}, DType::f32, mesh_1d(3), {Shard{0}}, {}, ShardSizes{{0, {4, 4, 2}}});
  EXPECT_FALSE(same.has_explicit_sizes(0));
  EXPECT_EQ(same, Layout(Shape{10, 2}, DType::f32, mesh_1d(3), {Shard{0}}));
  // Nested with explicit sizes: one entry per piece in splitting order.
  const Layout nested(Shape{6}, DType::f32, mesh_2d(2, 2), {Shard{0}, Shard{0}}, {}, ShardSizes{{0, {1, 2, 3, 0}}});
  EXPECT_EQ(rows(nested), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {3, 3}, {6, 0}}));
}

TEST(Layout, WithPlacementsKeepsWhatStillApplies) {
  const Layout layout(Shape{10, 4}, DType::f32, mesh_2d(2, 2), {Shard{0}, Replicate{}}, {}, ShardSizes{{0, {7, 3}}});
  const Layout moved = layout.with_placements({Shard{0}, Shard{1}});
  EXPECT_TRUE(moved.has_explicit_sizes(0));
  EXPECT_EQ(moved.block({0, 1}).to_string(), "[0:7, 2:4]");
  const Layout replicated = layout.with_placements({Replicate{}, Replicate{}});
  EXPECT_EQ(replicated.block({1, 1}).to_string(), "[0:10, 0:4]");
}

TEST(Layout, BlocksTileTheTensorExactlyOnce) {
  // Over meshes and uneven shapes: the blocks of the ranks of one replica group cover every
  // element exactly once.
  for (const auto& mesh : {mesh_1d(1), mesh_1d(3), mesh_1d(8), mesh_2d(2, 3), mesh_2d(4, 2),
                           MeshSpec(Shape{2, 2, 2}, {"a", "b", "c"})}) {
    for (const Shape& shape : {Shape{7, 5}, Shape{1, 9}, Shape{0, 4}, Shape{16, 3}}) {
      for (int64_t d0 = 0; d0 < 2; ++d0) {
        Placements placements(static_cast<size_t>(mesh.ndim()), Replicate{});
        for (int64_t m = 0; m < mesh.ndim(); ++m) placements[static_cast<size_t>(m)] = Shard{(m + d0) % 2};
        const Layout layout(shape, DType::f32, mesh, placements);
        std::vector<int> hits(static_cast<size_t>(shape.numel()), 0);
        for (int r : mesh.ranks()) {
          const Block b = layout.block_of_rank(r);
          for (int64_t i = b.begin[0]; i < b.end[0]; ++i)
            for (int64_t j = b.begin[1]; j < b.end[1]; ++j) ++hits[static_cast<size_t>(i * shape[1] + j)];
        }
        for (int h : hits) ASSERT_EQ(h, 1) << layout.to_string();
      }
    }
  }
}

TEST(Layout, Errors) {
  EXPECT_TRUE(sharding_error([] { Layout(Shape{4}, DType::f32, mesh_2d(2, 2), {Shard{0}}); },
                             {"[Layout]", "[4] f32 on mesh[dp=2, tp=2] as (S(0))", "1 placements for a mesh of 2 dims"}));
  EXPECT_TRUE(sharding_error([] { Layout(Shape{4}, DType::f32, mesh_1d(2), {Shard{1}}); },
                             {"[Layout]", "shard dim 1", "out of range", "1 dims"}));
  EXPECT_TRUE(sharding_error([] { Layout(Shape{4}, DType::f32, mesh_1d(2), {Shard{0}}, {}, ShardSizes{{0, {1, 2}}}); },
                             {"[Layout]", "add up to 3 but the dim has size 4"}));
  EXPECT_TRUE(sharding_error([] { Layout(Shape{4}, DType::f32, mesh_1d(2), {Shard{0}}, {}, ShardSizes{{0, {4}}}); },
                             {"[Layout]", "1 entries; expected 2"}));
  EXPECT_TRUE(sharding_error([] { Layout(Shape{4}, DType::f32, mesh_1d(2), {Replicate{}}, {}, ShardSizes{{0, {2, 2}}}); },
                             {"[Layout]", "not sharded"}));
  EXPECT_TRUE(sharding_error([] { Layout(Shape{4}, DType::f32, mesh_2d(2, 2), {Shard{0}, Replicate{}}, ShardOrder{{0, {0, 1}}}); },
                             {"[Layout]", "must list exactly the mesh dims sharding it"}));
  const Layout layout(Shape{4}, DType::f32, mesh_1d(2), {Shard{0}});
  EXPECT_TRUE(sharding_error([&] { (void)layout.block({2}); }, {"[Layout::block]", "out of range"}));
  EXPECT_TRUE(sharding_error([&] { (void)layout.block_of_rank(5); }, {"[DeviceMesh]", "world rank 5 is not in"}));
}

// Issue 12: the empty-piece offset convention holds in every shard order. global_offset is what
// PyTorch's compute_local_shape_and_global_offset gives when it walks the mesh dims in shard
// order: each level chunks the piece so far, and a piece empty at any level sits at the dim
// size. The blocks themselves keep an empty piece at its parent's end (views need in-bounds
// positions); both are checked here against an independent walk.
TEST(Layout, EmptyPiecesSitAtTheDimSizeInEveryShardOrder) {
  struct Walk {
    int64_t offset, length, parent_end;
  };
  const auto walk = [](int64_t size, const std::vector<int64_t>& splits, const std::vector<int64_t>& index) {
    int64_t offset = 0, length = size, begin = 0;
    for (size_t level = 0; level < splits.size(); ++level) {
      const int64_t chunk = (length + splits[level] - 1) / splits[level];
      const int64_t start = std::min(chunk * index[level], length);
      const int64_t piece = std::min(length, start + chunk) - start;
      begin += start;  // the block: an empty chunk at its parent's end
      offset = piece == 0 ? size : offset + start;  // PyTorch: an empty shard at the dim size
      length = piece;
    }
    return Walk{offset, length, begin};
  };
  int64_t empty = 0;
  for (const MeshSpec& mesh : {MeshSpec(Shape{2, 2}, {"a", "b"}), MeshSpec(Shape{2, 3}, {"a", "b"}),
                               MeshSpec(Shape{3, 2, 2}, {"a", "b", "c"}), MeshSpec(Shape{4}, {"a"})})
    for (int64_t size : {0, 1, 2, 3, 5}) {
      std::vector<int64_t> order(static_cast<size_t>(mesh.ndim()));
      std::iota(order.begin(), order.end(), 0);
      do {
        const Layout layout(Shape{size, 2}, DType::f32, mesh, Placements(order.size(), Shard{0}), ShardOrder{{0, order}});
        std::vector<int64_t> splits;
        for (int64_t m : order) splits.push_back(mesh.shape()[m]);
        for (int r : mesh.ranks()) {
          const auto coordinate = mesh.coordinate_of(r);
          std::vector<int64_t> index;
          for (int64_t m : order) index.push_back(coordinate[static_cast<size_t>(m)]);
          const Walk expected = walk(size, splits, index);
          const Block block = layout.block(coordinate);
          SCOPED_TRACE(layout.to_string() + " rank " + std::to_string(r));
          EXPECT_EQ(block.end[0] - block.begin[0], expected.length);
          EXPECT_EQ(block.begin[0], expected.parent_end);
          EXPECT_EQ(layout.global_offset(coordinate)[0], expected.offset);
          EXPECT_EQ(layout.global_offset(coordinate)[1], 0);  // not sharded: 0 as in PyTorch
          empty += expected.length == 0;
        }
      } while (std::next_permutation(order.begin(), order.end()));
    }
  EXPECT_GT(empty, 50);
}
