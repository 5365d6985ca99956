// One rule for moving a tensor onto another mesh (layout_on_mesh, issue 39 item 1): placements
// follow axis names, Replicate where the source has no such axis, a Partial arrives as its
// values (Replicate); shard orders and explicit sizes stay where every splitting axis is carried.
#include <gtest/gtest.h>

#include <tessera/sharding/mesh_move.hpp>

using namespace tessera;

namespace {

const MeshSpec kDpTp(Shape{2, 3}, {"dp", "tp"});

Layout on(const MeshSpec& mesh, Placements p, ShardOrder order = {}, ShardSizes sizes = {}) {
  return Layout(Shape{12, 7}, DType::f32, mesh, std::move(p), std::move(order), std::move(sizes));
}

}  // namespace

TEST(MeshMove, PlacementsFollowAxisNames) {
  struct Row {
    const char* what;
    Layout src;
    MeshSpec dst;
    Placements want;
  };
  const std::vector<Row> rows = {
      {"same shape and names", on(kDpTp, {Shard{0}, Shard{1}}), MeshSpec(Shape{2, 3}, {"dp", "tp"}, {6, 7, 8, 9, 10, 11}),
       {Shard{0}, Shard{1}}},
      {"permuted axis names", on(kDpTp, {Shard{0}, Shard{1}}), MeshSpec(Shape{3, 2}, {"tp", "dp"}), {Shard{1}, Shard{0}}},
      {"fewer dims", on(kDpTp, {Shard{0}, Shard{1}}), MeshSpec(Shape{3}, {"tp"}), {Shard{1}}},
      {"more dims", on(kDpTp, {Shard{1}, Replicate{}}), MeshSpec(Shape{2, 2, 3}, {"pp", "dp", "tp"}),
       {Replicate{}, Shard{1}, Replicate{}}},
      {"no axis in common", on(kDpTp, {Shard{0}, Shard{1}}), MeshSpec(Shape{2, 3}, {"x", "y"}), {Replicate{}, Replicate{}}},
      {"a Partial arrives reduced", on(kDpTp, {Partial{}, Shard{0}}), MeshSpec(Shape{2, 3}, {"dp", "tp"}, {6, 7, 8, 9, 10, 11}),
       {Replicate{}, Shard{0}}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    const Layout moved = layout_on_mesh(row.src, row.dst);
    EXPECT_EQ(moved.mesh(), row.dst);
    EXPECT_EQ(moved.placements(), row.want) << moved.to_string();
    EXPECT_EQ(moved.global_shape(), row.src.global_shape());
    EXPECT_EQ(moved.dtype(), row.src.dtype());
  }
}

TEST(MeshMove, ShardOrdersAndExplicitSizesStayWhereEveryAxisIsCarried) {
  const Layout nested = on(kDpTp, {Shard{0}, Shard{0}}, ShardOrder{{0, {1, 0}}});
  // Permuted: the order names the same axes, renumbered.
  const Layout permuted = layout_on_mesh(nested, MeshSpec(Shape{3, 2}, {"tp", "dp"}));
  EXPECT_EQ(permuted.shard_order(0), (std::vector<int64_t>{0, 1}));
  for (int64_t p = 0; p < 6; ++p) EXPECT_EQ(permuted.piece_range(0, p), nested.piece_range(0, p));
  // One axis dropped: the dim is split by the other alone.
  const Layout dropped = layout_on_mesh(nested, MeshSpec(Shape{2}, {"dp"}));
  EXPECT_EQ(dropped.shard_order(0), (std::vector<int64_t>{0}));
  EXPECT_EQ(dropped.placements(), (Placements{Shard{0}}));

  const Layout sized = on(kDpTp, {Shard{0}, Replicate{}}, {}, ShardSizes{{0, {9, 3}}});
  const Layout kept = layout_on_mesh(sized, MeshSpec(Shape{2}, {"dp"}, {4, 5}));
  EXPECT_EQ(kept.piece_sizes(0), (std::vector<int64_t>{9, 3}));
  const Layout lost = layout_on_mesh(sized, MeshSpec(Shape{2}, {"pp"}));
  EXPECT_EQ(lost.placements(), (Placements{Replicate{}}));
  EXPECT_FALSE(lost.has_explicit_sizes(0));
}
