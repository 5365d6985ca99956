// Direct block exchange, checked by simulating it on index sets: every piece comes from a rank
// that holds it, every destination element arrives exactly once, and each rank receives
// exactly the lower bound (what it needs and does not hold).
#include <gtest/gtest.h>

#include <tessera/sharding/block_exchange.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

bool contains_block(const Block& outer, const Block& inner) {
  for (int64_t d = 0; d < outer.begin.size(); ++d)
    if (inner.begin[d] < outer.begin[d] || inner.end[d] > outer.end[d]) return false;
  return true;
}

// Every placement combination of R, S(0), S(1) for a mesh of ndim dims, plus the reversed
// shard order where two mesh dims shard the same tensor dim.
std::vector<std::pair<Placements, ShardOrder>> layouts_for(int64_t ndim) {
  std::vector<std::pair<Placements, ShardOrder>> out;
  int64_t combos = 1;
  for (int64_t i = 0; i < ndim; ++i) combos *= 3;
  for (int64_t c = 0; c < combos; ++c) {
    Placements p;
    int64_t rest = c;
    for (int64_t i = 0; i < ndim; ++i, rest /= 3)
      p.push_back(rest % 3 == 0 ? Placement{Replicate{}} : Placement{Shard{rest % 3 - 1}});
    out.push_back({p, {}});
    for (int64_t dim = 0; dim < 2; ++dim) {
      std::vector<int64_t> mesh_dims;
      for (int64_t m = 0; m < ndim; ++m)
        if (is_shard(p[static_cast<size_t>(m)], dim)) mesh_dims.push_back(m);
      if (mesh_dims.size() >= 2) out.push_back({p, ShardOrder{{dim, {mesh_dims.rbegin(), mesh_dims.rend()}}}});
    }
  }
  return out;
}

void check_exchange(const Layout& src, const Layout& dst) {
  SCOPED_TRACE(src.to_string() + " -> " + dst.to_string());
  const auto transfers = direct_exchange(src, dst);
  for (int d : dst.mesh().ranks()) {
    const Block want = dst.block_of_rank(d);
    std::vector<int> hits(static_cast<size_t>(want.numel()), 0);
    int64_t received = 0;
    for (const Transfer& t : transfers) {
      if (t.dst_rank != d) continue;
      ASSERT_TRUE(contains_block(src.block_of_rank(t.src_rank), t.block)) << t.to_string();
      ASSERT_TRUE(contains_block(want, t.block)) << t.to_string();
      if (t.src_rank != d) received += t.block.numel() * itemsize(dst.dtype());
      for (int64_t i = t.block.begin[0]; i < t.block.end[0]; ++i)
        for (int64_t j = t.block.begin[1]; j < t.block.end[1]; ++j)
          ++hits[static_cast<size_t>((i - want.begin[0]) * (want.end[1] - want.begin[1]) + (j - want.begin[1]))];
    }
    for (int h : hits) ASSERT_EQ(h, 1) << "rank " << d;
    EXPECT_EQ(received, receive_lower_bound(src, dst, d)) << "rank " << d;
  }
}

}  // namespace

TEST(BlockExchange, EveryPairOnManyMeshesReachesTheLowerBound) {
  const std::vector<MeshSpec> meshes = {
      MeshSpec(Shape{2}, {"x"}),          MeshSpec(Shape{3}, {"x"}),          MeshSpec(Shape{5}, {"x"}),
      MeshSpec(Shape{8}, {"x"}),          MeshSpec(Shape{2, 2}, {"a", "b"}), MeshSpec(Shape{2, 3}, {"a", "b"}),
      MeshSpec(Shape{4, 2}, {"a", "b"}), MeshSpec(Shape{2, 2, 2}, {"a", "b", "c"})};
  for (const MeshSpec& mesh : meshes) {
    const auto layouts = layouts_for(mesh.ndim());
    for (const Shape& shape : {Shape{8, 6}, Shape{7, 5}, Shape{3, 1}}) {
      for (const auto& [sp, so] : layouts)
        for (const auto& [dp, dord] : layouts)
          check_exchange(Layout(shape, DType::f32, mesh, sp, so), Layout(shape, DType::f32, mesh, dp, dord));
    }
  }
}

TEST(BlockExchange, DTensorTrapCasesMoveOnlyWhatIsNeeded) {
  const MeshSpec mesh(Shape{2, 2}, {"dp", "tp"});
  // (S(0), S(1)) -> (S(1), S(0)) on 2x2: each rank holds a quarter and needs another quarter,
  // except the two diagonal ranks whose blocks coincide. 16 x 16 f32: a quarter is 256 B x 4.
  const Layout a(Shape{16, 16}, DType::f32, mesh, {Shard{0}, Shard{1}});
  const Layout b(Shape{16, 16}, DType::f32, mesh, {Shard{1}, Shard{0}});
  EXPECT_EQ(receive_lower_bound(a, b, 0), 0);
  EXPECT_EQ(receive_lower_bound(a, b, 1), 64 * 4);
  EXPECT_EQ(receive_lower_bound(a, b, 2), 64 * 4);
  EXPECT_EQ(receive_lower_bound(a, b, 3), 0);
  check_exchange(a, b);
  // (S(0), S(0)) -> (R, S(0)): each rank needs its tp half of rows and holds a quarter of them.
  const Layout c(Shape{16, 4}, DType::f32, mesh, {Shard{0}, Shard{0}});
  const Layout d(Shape{16, 4}, DType::f32, mesh, {Replicate{}, Shard{0}});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(receive_lower_bound(c, d, r), r == 0 ? 4 * 4 * 4 : r == 3 ? 4 * 4 * 4 : 8 * 4 * 4);
  check_exchange(c, d);
}

TEST(BlockExchange, UnevenAndExplicitSizesAndOtherMeshes) {
  const MeshSpec line(Shape{3}, {"x"});
  const Layout src(Shape{10, 2}, DType::f64, line, {Shard{0}}, {}, ShardSizes{{0, {7, 0, 3}}});
  const Layout dst(Shape{10, 2}, DType::f64, line, {Shard{0}});
  check_exchange(src, dst);
  // to_mesh: from a 1-d mesh over ranks 0..3 to a 2x2 mesh over the same world in another order.
  const Layout from(Shape{6, 4}, DType::f32, MeshSpec(Shape{4}, {"x"}), {Shard{0}});
  const Layout to(Shape{6, 4}, DType::f32, MeshSpec(Shape{2, 2}, {"a", "b"}, {3, 2, 1, 0}), {Shard{1}, Replicate{}});
  check_exchange(from, to);
}

TEST(BlockExchange, Errors) {
  const MeshSpec mesh(Shape{2}, {"x"});
  const Layout partial(Shape{4}, DType::f32, mesh, {Partial{}});
  const Layout shard(Shape{4}, DType::f32, mesh, {Shard{0}});
  EXPECT_TRUE(throws_with<ShardingError>([&] { (void)direct_exchange(partial, shard); },
                                         {"[direct_exchange]", "Partial values", "P(sum)"}));
  EXPECT_TRUE(throws_with<ShardingError>([&] { (void)direct_exchange(shard, partial); },
                                         {"[direct_exchange]", "destination", "is Partial"}));
  const Layout other(Shape{5}, DType::f32, mesh, {Shard{0}});
  EXPECT_TRUE(throws_with<ShardingError>([&] { (void)receive_lower_bound(shard, other, 0); },
                                         {"[receive_lower_bound]", "global shapes differ"}));
}
