// Plans at scale (issue 34): what every rank keeps of its block when a layout becomes another,
// found by joining each tensor dim's overlapping pieces (detail::kept_by_join), or for even
// splits by counting coordinates digit by digit (detail::kept_by_digits), instead of visiting
// ranks, equals what each rank, visited one by one, keeps: on 1-d to 4-d meshes, uneven
// shapes, explicit piece sizes and reversed shard orders, over all tensor dims and each alone;
// and on a 128 x 128 mesh, where crossing shard orders list 16,384 coordinates, the join lists
// only those that keep something; on 32 x 32 x 16, a mesh dim only held splits, innermost, is
// folded into each class of ranks rather than listed.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include <tessera/sharding/detail/kept_pieces.hpp>
#include <tessera/sharding/detail/rank_classes.hpp>
#include <tessera/sharding/detail/step_cost.hpp>
#include <tessera/sharding/layout.hpp>

#include "layout_sweep.hpp"

using namespace tessera;
using detail::KeptFigures;

namespace {

using Range = std::pair<int64_t, int64_t>;

int64_t overlap(Range a, Range b) { return std::max<int64_t>(0, std::min(a.second, b.second) - std::max(a.first, b.first)); }

// Held pieces of `dim` overlapping `w`, counted by visiting every piece.
int64_t held_pieces_overlapping(const Layout& held, int64_t dim, Range w) {
  if (held.shard_order(dim).empty()) return overlap({0, held.global_shape()[dim]}, w) > 0 ? 1 : 0;
  int64_t n = 0;
  for (int64_t p = 0; p < held.piece_count(dim); ++p) n += overlap(held.piece_range(dim, p), w) > 0 ? 1 : 0;
  return n;
}

// The figures rank by rank. Source blocks are counted among the distinct held blocks (restricted
// to `dims`) of every rank, or, with `by_dims` (large meshes), as the product over dims of the
// held pieces each wanted piece overlaps (a held block is one piece per dim).
KeptFigures every_rank(const Layout& held, const Layout& want, const std::vector<int64_t>& dims, bool by_dims = false) {
  const MeshSpec& mesh = want.mesh();
  std::set<std::vector<Range>> held_blocks;
  for (int r : mesh.ranks()) {
    if (by_dims) break;
    std::vector<Range> block;
    for (int64_t d : dims) block.push_back(detail::dim_range(held, d, mesh.coordinate_of(r)));
    held_blocks.insert(block);
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> sources;  // (dim, wanted piece) -> held pieces
  KeptFigures out;
  out.least_kept = std::numeric_limits<int64_t>::max();
  for (int r : mesh.ranks()) {
    const auto& c = mesh.coordinate_of(r);
    int64_t wanted = 1, kept = 1;
    std::vector<Range> w;
    for (int64_t d : dims) {
      w.push_back(detail::dim_range(want, d, c));
      wanted *= w.back().second - w.back().first;
      kept *= overlap(detail::dim_range(held, d, c), w.back());
    }
    int64_t blocks = 0;
    if (by_dims) {
      blocks = wanted > 0 ? 1 : 0;
      for (size_t i = 0; i < dims.size(); ++i) {
        // Ranks share wanted pieces: count each one's held pieces once (16,384 pieces each).
        const auto key = std::make_tuple(dims[i], w[i].first, w[i].second);
        auto known = sources.find(key);
        if (known == sources.end()) known = sources.emplace(key, held_pieces_overlapping(held, dims[i], w[i])).first;
        blocks *= known->second;
      }
    }
    for (const auto& h : held_blocks) {
      int64_t common = wanted > 0 ? 1 : 0;
      for (size_t i = 0; i < h.size(); ++i) common *= overlap(h[i], w[i]);
      blocks += common > 0 ? 1 : 0;
    }
    out.least_kept = std::min(out.least_kept, kept);
    out.most_lacking = std::max(out.most_lacking, wanted - kept);
    out.kept_sum += kept;
    out.wanted_sum += wanted;
    int64_t& most = kept > 0 ? out.keeping_blocks : out.empty_blocks;
    most = std::max(most, blocks);
  }
  return out;
}

void expect_equal(const KeptFigures& joined, const KeptFigures& oracle) {
  EXPECT_EQ(joined.least_kept, oracle.least_kept);
  EXPECT_EQ(joined.most_lacking, oracle.most_lacking);
  EXPECT_EQ(joined.kept_sum, oracle.kept_sum);
  EXPECT_EQ(joined.wanted_sum, oracle.wanted_sum);
  EXPECT_EQ(joined.keeping_blocks, oracle.keeping_blocks);
  EXPECT_EQ(joined.empty_blocks, oracle.empty_blocks);
}

const auto sweep = tessera::testing::layout_sweep;

using KeptAnswer = std::function<std::optional<KeptFigures>(const Layout& held, const Layout& want,
                                                            const std::vector<int64_t>& dims)>;

// Every pair of the sweep's layouts of `shapes` on 1-d to 4-d meshes, over all tensor dims and
// each alone: where `answer` answers, its figures are every rank's. (asked, answered).
std::pair<int64_t, int64_t> against_every_rank(const std::vector<Shape>& shapes, const KeptAnswer& answer) {
  const std::vector<Placement> choices{Replicate{}, Shard{0}, Shard{1}};
  const std::vector<MeshSpec> meshes{MeshSpec(Shape{4}, {"x"}), MeshSpec(Shape{2, 3}, {"a", "b"}),
                                     MeshSpec(Shape{3, 4}, {"a", "b"}), MeshSpec(Shape{4, 2}, {"a", "b"}),
                                     MeshSpec(Shape{2, 2, 3}, {"a", "b", "c"}),
                                     MeshSpec(Shape{2, 1, 3, 2}, {"a", "b", "c", "d"})};
  int64_t asked = 0, answered = 0;
  for (const MeshSpec& mesh : meshes)
    for (const Shape& shape : shapes) {
      const auto layouts = sweep(mesh, shape, choices);
      for (const Layout& held : layouts)
        for (const Layout& want : layouts)
          for (const std::vector<int64_t>& dims : {std::vector<int64_t>{0, 1}, {0}, {1}}) {
            SCOPED_TRACE(held.to_string() + " -> " + want.to_string() + " over " + std::to_string(dims.size()) +
                         " dims from " + std::to_string(dims[0]));
            ++asked;
            const auto figures = answer(held, want, dims);
            if (!figures) continue;
            ++answered;
            expect_equal(*figures, every_rank(held, want, dims));
            if (::testing::Test::HasFailure()) return {asked, answered};
          }
    }
  return {asked, answered};
}

TEST(KeptPieces, JoinEqualsEveryRankOnSmallMeshes) {
  const auto [asked, answered] = against_every_rank({Shape{12, 6}, Shape{7, 5}, Shape{3, 1}}, [](const auto&... a) {
    return detail::kept_by_join(a..., std::numeric_limits<int32_t>::max());
  });
  // With no budget it always answers.
  EXPECT_GT(asked, 20000);
  EXPECT_EQ(answered, asked);
}

// Even splits whose piece lengths divide one another: the keepers counted digit by digit
// (detail::kept_by_digits) are every rank's figures.
TEST(KeptPieces, DigitsEqualEveryRankOnSmallMeshes) {
  const auto [asked, answered] = against_every_rank({Shape{24, 12}, Shape{36, 8}, Shape{7, 5}}, [](const auto&... a) {
    return detail::kept_by_digits(a..., std::numeric_limits<int32_t>::max());
  });
  // Uneven shapes, explicit sizes and lengths that do not divide each other are declined.
  EXPECT_GT(answered, asked / 4) << answered << " of " << asked;
  EXPECT_LT(answered, asked);
}

// A dim split by every mesh dim in one order, from layouts that split it (and the other dim) by
// some of them in other orders: the count visits a few digits per mesh dim, not one per rank
// (the same budget on 1,024 and 16,384 ranks), and equals every rank's figures; an exchange
// priced through it too.
TEST(KeptPieces, DigitsCountTheKeepersOfThousandsOfRanksWithinASmallBudget) {
  for (const MeshSpec& mesh : {MeshSpec(Shape{8, 4, 4, 8}, {"a", "b", "c", "d"}), MeshSpec(Shape{16, 8, 8, 16}, {"a", "b", "c", "d"})}) {
    const Shape shape{16384, 16384};
    const Layout want(shape, DType::f32, mesh, {Shard{0}, Shard{0}, Shard{0}, Shard{0}});
    const std::vector<Layout> helds = {
        Layout(shape, DType::f32, mesh, {Replicate{}, Shard{0}, Replicate{}, Replicate{}}),
        Layout(shape, DType::f32, mesh, {Shard{0}, Shard{0}, Shard{0}, Shard{0}}, ShardOrder{{0, {1, 0, 3, 2}}}),
        Layout(shape, DType::f32, mesh, {Shard{0}, Shard{0}, Shard{1}, Shard{1}}, ShardOrder{{0, {1, 0}}, {1, {3, 2}}}),
        Layout(shape, DType::f32, mesh, {Shard{1}, Shard{1}, Shard{1}, Shard{1}}, ShardOrder{{1, {0, 3, 2, 1}}})};
    for (const Layout& held : helds) {
      SCOPED_TRACE(held.to_string() + " -> " + want.to_string());
      const auto counted = detail::kept_by_digits(held, want, {0, 1}, /*budget=*/256);
      ASSERT_TRUE(counted.has_value());
      if (mesh.size() > 1024) continue;  // the oracle visits every rank and every held piece
      const KeptFigures oracle = every_rank(held, want, {0, 1}, /*by_dims=*/true);
      expect_equal(*counted, oracle);
      const PlanStep step = detail::exchange_step(held, want);
      EXPECT_EQ(step.max_received, oracle.most_lacking * 4);
      EXPECT_EQ(step.total_received, (oracle.wanted_sum - oracle.kept_sum) * 4);
      EXPECT_EQ(step.messages, std::max<int64_t>({0, oracle.keeping_blocks - 1, oracle.empty_blocks}));
    }
  }
}

TEST(KeptPieces, CrossingShardOrdersOn16384RanksListOnlyTheKeepers) {
  const MeshSpec mesh(Shape{128, 128}, {"a", "b"});
  for (const Shape& shape : {Shape{1024, 512}, Shape{1000, 777}}) {
    const Layout held(shape, DType::f32, mesh, {Shard{0}, Shard{1}});
    const Layout want(shape, DType::f32, mesh, {Shard{1}, Shard{0}});
    SCOPED_TRACE(held.to_string() + " -> " + want.to_string());
    // Visiting classes would list every coordinate; the join, far fewer than that.
    EXPECT_EQ(detail::listed_coordinates(mesh, {&held, &want}, {true, true}, 1 << 20), mesh.size());
    const auto joined = detail::kept_by_join(held, want, {0, 1}, /*budget=*/8 * 128);
    ASSERT_TRUE(joined.has_value());
    const KeptFigures oracle = every_rank(held, want, {0, 1}, /*by_dims=*/true);
    expect_equal(*joined, oracle);
    // An exchange step priced through it equals the figures rank by rank.
    const PlanStep step = detail::exchange_step(held, want);
    EXPECT_EQ(step.max_received, oracle.most_lacking * 4);
    EXPECT_EQ(step.total_received, (oracle.wanted_sum - oracle.kept_sum) * 4);
    EXPECT_EQ(step.messages, std::max<int64_t>({0, oracle.keeping_blocks - 1, oracle.empty_blocks}));
  }
}

// A mesh dim that splits a dim in held only, innermost, moves a rank's held piece among the
// chunks of one parent and nothing else: classes of ranks fold it rather than list it. On
// 32x32x16 the pair below listed all 16,384 coordinates (the join refuses: 16,384 held pieces);
// folding `a` lists 512. Uneven shapes leave short and empty chunks at the ends of parents.
TEST(KeptPieces, AnInnermostHeldOnlyMeshDimIsFoldedNotListed) {
  const MeshSpec mesh(Shape{32, 32, 16}, {"a", "b", "c"});
  for (const Shape& shape : {Shape{16381, 16383}, Shape{1024, 16384}, Shape{100, 16000}}) {
    const Layout held(shape, DType::f32, mesh, {Shard{1}, Shard{1}, Shard{1}}, ShardOrder{{1, {2, 1, 0}}});
    const Layout want(shape, DType::f32, mesh, {Replicate{}, Shard{1}, Shard{0}});
    SCOPED_TRACE(held.to_string() + " -> " + want.to_string());
    EXPECT_EQ(detail::listed_coordinates(mesh, {&held, &want}, {false, true, true}, 1 << 20), 512);
    const KeptFigures oracle = every_rank(held, want, {0, 1}, /*by_dims=*/true);
    const PlanStep step = detail::exchange_step(held, want);
    EXPECT_EQ(step.max_received, oracle.most_lacking * 4);
    EXPECT_EQ(step.total_received, (oracle.wanted_sum - oracle.kept_sum) * 4);
    EXPECT_EQ(step.messages, std::max<int64_t>({0, oracle.keeping_blocks - 1, oracle.empty_blocks}));
    // The search's bound visits the same classes, so it is exact too, not a sample.
    const detail::Lacking bound = detail::lacking(held, want, /*bound_only=*/true);
    EXPECT_EQ(bound.most, oracle.most_lacking);
    EXPECT_EQ(bound.total, oracle.wanted_sum - oracle.kept_sum);
  }
}

TEST(KeptPieces, ExchangeStepsPricedByTheJoinEqualEveryRank) {
  // Meshes whose crossing orders list more coordinates than the join is tried from (64).
  const std::vector<MeshSpec> meshes{MeshSpec(Shape{8, 12}, {"a", "b"}), MeshSpec(Shape{4, 4, 6}, {"a", "b", "c"})};
  const std::vector<Placement> choices{Replicate{}, Shard{0}, Shard{1}};
  int64_t pairs = 0;
  for (const MeshSpec& mesh : meshes)
    for (const Shape& shape : {Shape{96, 48}, Shape{50, 31}}) {
      const auto layouts = sweep(mesh, shape, choices);
      for (size_t i = 0; i < layouts.size(); i += 3)
        for (size_t j = 1; j < layouts.size(); j += 3) {
          const Layout& held = layouts[i];
          const Layout& want = layouts[j];
          SCOPED_TRACE(held.to_string() + " -> " + want.to_string());
          const PlanStep step = detail::exchange_step(held, want);
          const KeptFigures oracle = every_rank(held, want, {0, 1});
          EXPECT_EQ(step.max_received, oracle.most_lacking * 4);
          EXPECT_EQ(step.total_received, (oracle.wanted_sum - oracle.kept_sum) * 4);
          EXPECT_EQ(step.messages, std::max<int64_t>({0, oracle.keeping_blocks - 1, oracle.empty_blocks}));
          ++pairs;
          if (::testing::Test::HasFailure()) return;
        }
    }
  EXPECT_GT(pairs, 200);
}

}  // namespace
