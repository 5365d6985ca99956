// The redistribute planner, checked by running every plan on index sets: each rank holds, per
// element of its block, how many times each Partial contribution has been summed into it. A plan
// is valid when every destination rank ends with exactly its block and every element holds each
// contribution exactly once. Bytes are compared with a brute-force lower bound.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <optional>

#include <tessera/sharding/plan.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Per world rank: linear global index -> contribution counts (one slot per Partial coordinate).
using Contents = std::map<int64_t, std::vector<int>>;

int64_t linear(const Shape& shape, const DimVector& index) {
  int64_t at = 0;
  for (int64_t d = 0; d < shape.size(); ++d) at = at * shape[d] + index[d];
  return at;
}

template <class F>
void for_each_index(const Block& block, F&& f) {
  if (block.numel() == 0) return;
  DimVector index = block.begin;
  while (true) {
    f(index);
    int64_t d = index.size() - 1;
    while (d >= 0 && ++index[d] == block.end[d]) index[d] = block.begin[d], --d;
    if (d < 0) return;
  }
}

std::vector<int64_t> partial_dims(const Layout& layout) {
  std::vector<int64_t> dims;
  for (int64_t m = 0; m < layout.mesh().ndim(); ++m)
    if (is_partial(layout.placements()[static_cast<size_t>(m)])) dims.push_back(m);
  return dims;
}

std::map<int, Contents> initial_contents(const Layout& src) {
  const auto pdims = partial_dims(src);
  int64_t slots = 1;
  for (int64_t m : pdims) slots *= src.mesh().shape()[m];
  std::map<int, Contents> held;
  for (int r : src.mesh().ranks()) {
    const auto coordinate = src.mesh().coordinate_of(r);
    int64_t slot = 0;
    for (int64_t m : pdims) slot = slot * src.mesh().shape()[m] + coordinate[static_cast<size_t>(m)];
    std::vector<int> counts(static_cast<size_t>(slots), 0);
    counts[static_cast<size_t>(slot)] = 1;
    for_each_index(src.block_of_rank(r), [&](const DimVector& i) { held[r][linear(src.global_shape(), i)] = counts; });
  }
  return held;
}

// The ranks differing from `coordinate` only along `dims` (a step's group).
std::vector<int> group_along(const MeshSpec& mesh, const std::vector<int64_t>& coordinate,
                             const std::vector<int64_t>& dims) {
  std::vector<int> group;
  for (int r : mesh.ranks()) {
    const auto c = mesh.coordinate_of(r);
    bool same = true;
    for (int64_t m = 0; m < mesh.ndim(); ++m)
      if (std::find(dims.begin(), dims.end(), m) == dims.end() && c[static_cast<size_t>(m)] != coordinate[static_cast<size_t>(m)])
        same = false;
    if (same) group.push_back(r);
  }
  return group;
}

const Contents& of(const std::map<int, Contents>& held, int rank) {
  static const Contents nothing;
  auto it = held.find(rank);
  return it == held.end() ? nothing : it->second;
}

// Runs one step on the index sets; fails the test on any element taken from a rank lacking it.
std::map<int, Contents> simulate(const PlanStep& step, const std::map<int, Contents>& held) {
  std::map<int, Contents> next;
  const Shape& shape = step.after.global_shape();
  if (step.kind == StepKind::exchange) {
    for (const Transfer& t : direct_exchange(step.before, step.after))
      for_each_index(t.block, [&](const DimVector& i) {
        const int64_t e = linear(shape, i);
        const auto& from = of(held, t.src_rank);
        EXPECT_TRUE(from.count(e)) << t.to_string();
        EXPECT_FALSE(next[t.dst_rank].count(e)) << "element sent twice: " << t.to_string();
        if (from.count(e)) next[t.dst_rank][e] = from.at(e);
      });
    return next;
  }
  const MeshSpec& mesh = step.after.mesh();
  for (int r : mesh.ranks()) {
    const auto coordinate = mesh.coordinate_of(r);
    const auto group = group_along(mesh, coordinate, step.mesh_dims);
    auto& mine = next[r];
    for_each_index(step.after.block(coordinate), [&](const DimVector& i) {
      const int64_t e = linear(shape, i);
      switch (step.kind) {
        case StepKind::local_chunk:
        case StepKind::to_partial:
          EXPECT_TRUE(of(held, r).count(e)) << "rank " << r << " lacks element " << e;
          if (of(held, r).count(e)) mine[e] = of(held, r).at(e);
          if (step.kind == StepKind::to_partial && step.op == ReduceOp::sum && coordinate[step.mesh_dim] != 0)
            std::fill(mine[e].begin(), mine[e].end(), 0);
          break;
        case StepKind::all_gather:
        case StepKind::all_to_all: {
          int found = 0;
          for (int j : group)
            if (of(held, j).count(e)) mine[e] = of(held, j).at(e), ++found;
          EXPECT_EQ(found, 1) << "element " << e << " on rank " << r;
          break;
        }
        case StepKind::reduce_scatter:
        case StepKind::all_reduce:
          for (int j : group) {
            EXPECT_TRUE(of(held, j).count(e)) << "rank " << j << " lacks element " << e;
            if (!of(held, j).count(e)) continue;
            const auto& theirs = of(held, j).at(e);
            auto& sum = mine[e];
            if (sum.empty()) sum.assign(theirs.size(), 0);
            for (size_t s = 0; s < sum.size(); ++s) sum[s] += theirs[s];
          }
          break;
        case StepKind::exchange:
          break;
      }
    });
  }
  return next;
}

// Runs the plan and checks the final state; returns false (with test failures) when invalid.
void check_valid(const Plan& p) {
  SCOPED_TRACE(explain(p));
  auto held = initial_contents(p.src);
  Layout at = p.src;
  const auto cap = [](const Layout& l) {
    int64_t most = 0;
    for (int r : l.mesh().ranks()) most = std::max(most, l.block_of_rank(r).numel());
    return most;
  };
  const int64_t memory_cap = std::max(cap(p.src), cap(p.dst));
  for (const PlanStep& step : p.steps) {
    ASSERT_EQ(step.before, at);
    held = simulate(step, held);
    at = step.after;
    EXPECT_LE(cap(at), memory_cap) << "an intermediate layout holds more than src or dst";
  }
  ASSERT_EQ(at, p.dst);
  for (int r : p.dst.mesh().ranks()) {
    int64_t expected = 0;
    for_each_index(p.dst.block_of_rank(r), [&](const DimVector& i) {
      const int64_t e = linear(p.dst.global_shape(), i);
      ++expected;
      ASSERT_TRUE(held[r].count(e)) << "rank " << r << " lacks element " << e;
      if (p.dst.has_partial()) return;
      for (int c : held[r].at(e)) ASSERT_EQ(c, 1) << "rank " << r << " element " << e;
    });
    EXPECT_EQ(static_cast<int64_t>(held[r].size()), expected) << "rank " << r << " holds extra elements";
  }
}

// What rank r must receive: elements of its destination block outside its source block.
int64_t brute_force_bound(const Layout& src, const Layout& dst, int r) {
  if (!dst.mesh().contains(r)) return 0;
  const Block mine = src.mesh().contains(r) ? src.block_of_rank(r) : Block{};
  int64_t missing = 0;
  for_each_index(dst.block_of_rank(r), [&](const DimVector& i) {
    bool inside = src.mesh().contains(r);
    for (int64_t d = 0; inside && d < i.size(); ++d) inside = i[d] >= mine.begin[d] && i[d] < mine.end[d];
    missing += inside ? 0 : 1;
  });
  return missing * itemsize(dst.dtype());
}

// Placements from `choices` on every mesh dim, plus reversed shard orders.
std::vector<Layout> layouts_on(const MeshSpec& mesh, const Shape& shape, const std::vector<Placement>& choices) {
  std::vector<Layout> out;
  int64_t combos = 1;
  const int64_t n = static_cast<int64_t>(choices.size());
  for (int64_t i = 0; i < mesh.ndim(); ++i) combos *= n;
  for (int64_t c = 0; c < combos; ++c) {
    Placements p;
    for (int64_t i = 0, rest = c; i < mesh.ndim(); ++i, rest /= n) p.push_back(choices[static_cast<size_t>(rest % n)]);
    out.emplace_back(shape, DType::f32, mesh, p);
    for (int64_t dim = 0; dim < shape.size(); ++dim) {
      const auto& order = out.back().shard_order(dim);
      if (order.size() >= 2) {
        out.emplace_back(shape, DType::f32, mesh, p, ShardOrder{{dim, {order.rbegin(), order.rend()}}});
        break;
      }
    }
  }
  return out;
}

const std::vector<MeshSpec>& test_meshes() {
  static const std::vector<MeshSpec> meshes = {
      MeshSpec(Shape{2}, {"x"}),          MeshSpec(Shape{3}, {"x"}),          MeshSpec(Shape{4}, {"x"}),
      MeshSpec(Shape{5}, {"x"}),          MeshSpec(Shape{6}, {"x"}),          MeshSpec(Shape{7}, {"x"}),
      MeshSpec(Shape{8}, {"x"}),          MeshSpec(Shape{2, 2}, {"a", "b"}), MeshSpec(Shape{2, 3}, {"a", "b"}),
      MeshSpec(Shape{4, 2}, {"a", "b"}), MeshSpec(Shape{2, 2, 2}, {"a", "b", "c"})};
  return meshes;
}

const PlanOptions bytes_only{.cost = CostModel::bytes_only()};

}  // namespace

TEST(Plan, EveryNonPartialPairIsValidAndReceivesExactlyTheLowerBound) {
  int64_t plans = 0;
  for (const MeshSpec& mesh : test_meshes())
    for (const Shape& shape : {Shape{8, 6}, Shape{7, 5}, Shape{3, 1}}) {
      const auto layouts = layouts_on(mesh, shape, {Replicate{}, Shard{0}, Shard{1}});
      for (const Layout& src : layouts)
        for (const Layout& dst : layouts) {
          SCOPED_TRACE(src.to_string() + " -> " + dst.to_string());
          const Plan p = plan(src, dst, bytes_only);
          check_valid(p);
          for (int r : mesh.ranks()) ASSERT_EQ(p.bytes_received(r), brute_force_bound(src, dst, r)) << explain(p);
          ++plans;
        }
    }
  EXPECT_GT(plans, 5000);
}

TEST(Plan, DefaultCostModelStaysValidAndReachesTheBoundOnLargeTensors) {
  for (const MeshSpec& mesh : test_meshes()) {
    const Shape shape{4099, 1031};  // bytes dominate the message term; uneven everywhere
    const auto layouts = layouts_on(mesh, shape, {Replicate{}, Shard{0}, Shard{1}});
    for (const Layout& src : layouts)
      for (const Layout& dst : layouts) {
        const Plan p = plan(src, dst);
        EXPECT_EQ(p.max_bytes_received(), plan_lower_bound(src, dst)) << explain(p);
      }
  }
  for (const MeshSpec& mesh : {MeshSpec(Shape{2, 2}, {"a", "b"}), MeshSpec(Shape{2, 3}, {"a", "b"})})
    for (const Layout& src : layouts_on(mesh, Shape{7, 5}, {Replicate{}, Shard{0}, Shard{1}}))
      for (const Layout& dst : layouts_on(mesh, Shape{7, 5}, {Replicate{}, Shard{0}, Shard{1}})) check_valid(plan(src, dst));
}

TEST(Plan, PartialSourcesReduceOnceOverEveryMeshAndPlacement) {
  for (const MeshSpec& mesh : test_meshes())
    for (const Shape& shape : {Shape{8, 6}, Shape{7, 5}}) {
      if (mesh.ndim() == 3 && shape[0] == 8) continue;  // the slowest mesh: the uneven shape only
      const auto sources = layouts_on(mesh, shape, {Partial{}, Replicate{}, Shard{0}, Shard{1}});
      const auto dests = layouts_on(mesh, shape, {Replicate{}, Shard{0}, Shard{1}});
      for (const Layout& src : sources) {
        if (!src.has_partial()) continue;
        for (const Layout& dst : dests) {
          SCOPED_TRACE(src.to_string() + " -> " + dst.to_string());
          check_valid(plan(src, dst, bytes_only));
          check_valid(plan(src, dst));
        }
      }
    }
}

TEST(Plan, PartialOnOneDimLowersToOneCollectiveAtTheBound) {
  for (int64_t k : {2, 3, 4, 8}) {
    const MeshSpec mesh(Shape{k}, {"x"});
    // Large enough that bytes, not the message term, decide.
    const Layout partial(Shape{8 * k, 256}, DType::f32, mesh, {Partial{}});
    const Plan to_r = plan(partial, partial.with_placements({Replicate{}}));
    ASSERT_EQ(to_r.steps.size(), 1u) << explain(to_r);
    EXPECT_EQ(to_r.steps[0].kind, StepKind::all_reduce);
    EXPECT_EQ(to_r.max_bytes_received(), plan_lower_bound(to_r.src, to_r.dst));
    EXPECT_EQ(to_r.max_bytes_received(), 2 * (k - 1) * 8 * 256 * 4);
    const Plan to_s = plan(partial, partial.with_placements({Shard{0}}));
    ASSERT_EQ(to_s.steps.size(), 1u);
    EXPECT_EQ(to_s.steps[0].kind, StepKind::reduce_scatter);
    EXPECT_EQ(to_s.max_bytes_received(), plan_lower_bound(to_s.src, to_s.dst));
    const Layout max_partial(Shape{8 * k, 256}, DType::f32, mesh, {Partial{ReduceOp::max}});
    const Plan to_max = plan(max_partial, max_partial.with_placements({Shard{1}}));
    EXPECT_EQ(to_max.steps.at(0).op, ReduceOp::max);
  }
  // Reduce first, then gather: [P, S(0)] -> [R, R] on 2x2 reduces the small shard, not the whole
  // (all_reduce over a then all_gather over b, or reduce_scatter over a then one all_gather over
  // both: the same bytes, calls and messages).
  const MeshSpec mesh(Shape{2, 2}, {"a", "b"});
  const Layout src(Shape{16, 4}, DType::f32, mesh, {Partial{}, Shard{0}});
  const Plan p = plan(src, src.with_placements({Replicate{}, Replicate{}}));
  ASSERT_EQ(p.steps.size(), 2u) << explain(p);
  EXPECT_EQ(p.steps[0].mesh_dims, (std::vector<int64_t>{0})) << explain(p);
  EXPECT_TRUE(p.steps[0].kind == StepKind::all_reduce || p.steps[0].kind == StepKind::reduce_scatter) << explain(p);
  EXPECT_EQ(p.steps[1].kind, StepKind::all_gather);
  EXPECT_EQ(p.max_bytes_received(), 2 * 8 * 4 * 4) << explain(p);  // 2x the 8x4 f32 block
}

TEST(Plan, BeatsTheGreedyPlannerTraps) {
  const MeshSpec mesh(Shape{2, 2}, {"a", "b"});
  // DTensor moves 4x the needed bytes here (gather both dims, then chunk).
  const Layout swap_src(Shape{8, 8}, DType::f32, mesh, {Shard{0}, Shard{1}});
  const Plan swap = plan(swap_src, swap_src.with_placements({Shard{1}, Shard{0}}));
  EXPECT_EQ(swap.max_bytes_received(), plan_lower_bound(swap.src, swap.dst)) << explain(swap);
  EXPECT_EQ(swap.max_bytes_received(), 16 * 4);  // the off-diagonal ranks swap their 4x4 blocks
  // DTensor moves 2x here.
  const Layout nested(Shape{8, 8}, DType::f32, mesh, {Shard{0}, Shard{0}});
  const Plan rs = plan(nested, nested.with_placements({Replicate{}, Shard{0}}));
  EXPECT_EQ(rs.max_bytes_received(), plan_lower_bound(rs.src, rs.dst)) << explain(rs);
  // Uneven all_to_all without padding: 7 rows over 3 ranks to 5 columns over 3 ranks.
  const Layout rows(Shape{7, 5}, DType::f32, MeshSpec(Shape{3}, {"x"}), {Shard{0}});
  const Plan a2a = plan(rows, rows.with_placements({Shard{1}}));
  ASSERT_EQ(a2a.steps.size(), 1u);
  EXPECT_EQ(a2a.steps[0].kind, StepKind::all_to_all);
  EXPECT_EQ(a2a.max_bytes_received(), plan_lower_bound(a2a.src, a2a.dst));
}

TEST(Plan, CommonTransitionsLowerToTheExpectedCollective) {
  const MeshSpec mesh(Shape{4}, {"x"});
  const Layout s0(Shape{16, 8}, DType::f32, mesh, {Shard{0}});
  EXPECT_EQ(plan(s0, s0.with_placements({Replicate{}})).steps.at(0).kind, StepKind::all_gather);
  const Plan chunk = plan(s0.with_placements({Replicate{}}), s0);
  ASSERT_EQ(chunk.steps.size(), 1u);
  EXPECT_EQ(chunk.steps[0].kind, StepKind::local_chunk);
  EXPECT_EQ(chunk.max_bytes_received(), 0);
  EXPECT_NE(explain(chunk).find("no communication"), std::string::npos);
  EXPECT_TRUE(plan(s0, s0).steps.empty());
  EXPECT_NE(explain(plan(s0, s0)).find("nothing to do"), std::string::npos);
  const std::string text = explain(plan(s0, s0.with_placements({Replicate{}})));
  EXPECT_TRUE(contains(text, "all_gather over x (mesh dim 0, 4 ranks): (S(0)) -> (R)")) << text;
  EXPECT_TRUE(contains(text, "lower bound 384 B")) << text;
}

TEST(Plan, ExplicitSizesAndMovesBetweenMeshes) {
  const MeshSpec three(Shape{3}, {"x"});
  const Layout uneven(Shape{8, 4}, DType::f32, three, {Shard{0}}, {}, ShardSizes{{0, {3, 0, 5}}});
  for (const Placements& to : {Placements{Shard{0}}, Placements{Shard{1}}, Placements{Replicate{}}}) {
    const Layout dst(Shape{8, 4}, DType::f32, three, to);
    const Plan p = plan(uneven, dst, bytes_only);
    check_valid(p);
    for (int r : three.ranks()) EXPECT_EQ(p.bytes_received(r), brute_force_bound(uneven, dst, r)) << explain(p);
    check_valid(plan(dst, uneven));
  }
  // 2x2 over ranks 0-3 to a 1-d mesh over ranks 2-5 of a world of 6 (Monarch to_mesh).
  const MeshSpec square(Shape{2, 2}, {"a", "b"});
  const MeshSpec line(Shape{4}, {"y"}, {2, 3, 4, 5});
  for (const Layout& src : layouts_on(square, Shape{7, 6}, {Partial{}, Replicate{}, Shard{0}, Shard{1}}))
    for (const Layout& dst : layouts_on(line, Shape{7, 6}, {Replicate{}, Shard{0}, Shard{1}})) {
      SCOPED_TRACE(src.to_string() + " -> " + dst.to_string());
      const Plan p = plan(src, dst, bytes_only);
      check_valid(p);
      if (src.has_partial()) continue;
      for (int r = 0; r < 6; ++r) EXPECT_EQ(p.bytes_received(r), brute_force_bound(src, dst, r)) << explain(p);
    }
}

TEST(Plan, PartialDestinationsOnlyWhenAllowed) {
  const MeshSpec mesh(Shape{2, 2}, {"a", "b"});
  const Layout r(Shape{4, 4}, DType::f32, mesh, {Replicate{}, Shard{0}});
  const Layout p(Shape{4, 4}, DType::f32, mesh, {Partial{}, Shard{0}});
  EXPECT_TRUE(throws_with<ShardingError>([&] { plan(r, p); }, {"cannot redistribute to Partial"}));
  const Plan allowed = plan(r, p, {.allow_partial_destination = true});
  ASSERT_EQ(allowed.steps.size(), 1u);
  EXPECT_EQ(allowed.steps[0].kind, StepKind::to_partial);
  check_valid(allowed);
  // Sharded source: gather over a, then mark Partial.
  const Layout s(Shape{4, 4}, DType::f32, mesh, {Shard{1}, Shard{0}});
  check_valid(plan(s, p, {.allow_partial_destination = true}));
  const Layout pmax(Shape{4, 4}, DType::f32, mesh, {Partial{ReduceOp::max}, Shard{0}});
  EXPECT_TRUE(throws_with<ShardingError>([&] { plan(pmax, p, {.allow_partial_destination = true}); },
                                         {"cannot turn P(max) into P(sum)"}));
}

TEST(Plan, MismatchedLayoutsAreErrorsNamingBoth) {
  const MeshSpec mesh(Shape{2}, {"x"});
  const Layout a(Shape{4, 4}, DType::f32, mesh, {Shard{0}});
  EXPECT_TRUE(throws_with<ShardingError>([&] { plan(a, Layout(Shape{4, 5}, DType::f32, mesh, {Shard{0}})); },
                                         {"global shapes differ: [4, 4] f32 on mesh[x=2] as (S(0)) -> [4, 5]"}));
  EXPECT_TRUE(throws_with<ShardingError>([&] { plan(a, Layout(Shape{4, 4}, DType::f64, mesh, {Shard{0}})); },
                                         {"dtypes differ"}));
}

// plan_cost_lower_bound guides the search (A*) and lets the dispatcher skip strategies: it must
// never exceed what the plan costs, for every pair (Partial sources and destinations included)
// under both cost models, and be exact when nothing moves.
TEST(Plan, CostLowerBoundNeverExceedsThePlannedCost) {
  PlanOptions partial_ok;
  partial_ok.allow_partial_destination = true;
  PlanOptions bytes_partial_ok = bytes_only;
  bytes_partial_ok.allow_partial_destination = true;
  int64_t pairs = 0;
  std::vector<MeshSpec> meshes = test_meshes();
  meshes.push_back(MeshSpec(Shape{1, 1, 1}, {"a", "b", "c"}));
  meshes.push_back(MeshSpec(Shape{2, 1, 2}, {"a", "b", "c"}));
  for (const MeshSpec& mesh : meshes) {
    const auto layouts = layouts_on(mesh, Shape{7, 5}, {Partial{}, Replicate{}, Shard{0}, Shard{1}});
    for (const Layout& src : layouts)
      for (const Layout& dst : layouts) {
        if (mesh.ndim() == 3 && (pairs++ % 7) != 0) continue;  // a sample of the 3-d pairs
        for (const PlanOptions& options : {partial_ok, bytes_partial_ok}) {
          std::optional<Plan> p;
          try {
            p = plan(src, dst, options);
          } catch (const ShardingError&) {
            continue;  // P(sum) -> another Partial: refused, nothing to bound
          }
          const double bound = plan_cost_lower_bound(src, dst, options);
          ASSERT_LE(bound, p->cost) << explain(*p);
          if (src == dst) {
            ASSERT_EQ(bound, 0.0);
          }
          else ASSERT_GT(bound, 0.0);
        }
      }
  }
}

// A mesh dim of one rank holds the same data under every placement: the plan changes it only to
// the destination's placement, and costs what the same move costs on the mesh without that dim,
// plus at most the tie-break of one extra step (the search skips every other placement there).
TEST(Plan, UnitMeshDimsCostOnlyTheirTieBreak) {
  const MeshSpec square(Shape{2, 2}, {"a", "c"});
  const MeshSpec padded(Shape{2, 1, 2}, {"a", "b", "c"});
  std::vector<Layout> layouts;  // the default shard order: pad() keeps the placements only
  for (const Layout& l : layouts_on(square, Shape{7, 5}, {Partial{}, Replicate{}, Shard{0}, Shard{1}}))
    if (l == Layout(l.global_shape(), l.dtype(), square, l.placements())) layouts.push_back(l);
  const std::vector<Placement> middles = {Replicate{}, Shard{0}, Shard{1}};
  for (const Layout& src : layouts)
    for (const Layout& dst : layouts) {
      if (dst.has_partial() && !(src.placements() == dst.placements())) continue;
      for (const Placement& from : middles)
        for (const Placement& to : middles) {
          const auto pad = [&](const Layout& l, const Placement& middle) {
            return Layout(l.global_shape(), l.dtype(), padded, {l.placements()[0], middle, l.placements()[1]});
          };
          const Layout a = pad(src, from), b = pad(dst, to);
          SCOPED_TRACE(a.to_string() + " -> " + b.to_string());
          const Plan flat = plan(src, dst), unit = plan(a, b);
          check_valid(unit);
          // Every flat plan is a unit-mesh plan plus at most one step, and every unit-mesh plan
          // without its unit-dim steps is a flat plan.
          EXPECT_LE(unit.cost, flat.cost + 0.5 + 1e-9) << explain(flat) << explain(unit);
          EXPECT_GE(unit.cost, flat.cost - 1e-9) << explain(flat) << explain(unit);
          for (const PlanStep& step : unit.steps) {
            if (step.mesh_dim == 1) {
              EXPECT_EQ(step.after.placements()[1], to) << explain(unit);
            }
          }
        }
    }
}

// Item 9 of issue 12: plan_lower_bound summed a bound per Partial mesh dim, more than the plan
// achieves for [P, P] -> [R, R]. It must be a bound for every pair (checked against the
// bytes-optimal plan of every Partial source), and exact where the collectives are optimal.
TEST(Plan, LowerBoundHoldsForMultiDimPartialSources) {
  int64_t pairs = 0, at_bound = 0;
  double worst = 1;
  for (const MeshSpec& mesh : test_meshes())
    for (const Shape& shape : {Shape{7, 5}, Shape{8, 6}}) {
      if (mesh.ndim() == 3 && shape[0] == 8) continue;
      const auto sources = layouts_on(mesh, shape, {Partial{}, Replicate{}, Shard{0}, Shard{1}});
      const auto dests = layouts_on(mesh, shape, {Replicate{}, Shard{0}, Shard{1}});
      for (const Layout& src : sources) {
        if (!src.has_partial()) continue;
        for (const Layout& dst : dests) {
          const Plan p = plan(src, dst, bytes_only);
          const int64_t bound = plan_lower_bound(src, dst);
          ASSERT_LE(bound, p.max_bytes_received()) << explain(p);
          ++pairs;
          at_bound += bound == p.max_bytes_received();
          if (bound > 0) worst = std::max(worst, static_cast<double>(p.max_bytes_received()) / static_cast<double>(bound));
        }
      }
    }
  EXPECT_GT(pairs, 2000);
  std::cout << "[          ] multi-dim Partial: " << pairs << " pairs, " << at_bound << " at the bound, worst plan/bound "
            << worst << "\n";
  // All-reduce over every mesh dim at once: (K - 1)/K reduce-scattered then gathered, 2 (K - 1)/K.
  for (const MeshSpec& mesh : {MeshSpec(Shape{2, 2}, {"a", "b"}), MeshSpec(Shape{2, 2, 2}, {"a", "b", "c"})}) {
    const Placements all_partial(static_cast<size_t>(mesh.ndim()), Partial{});
    const Layout src(Shape{64, 32}, DType::f32, mesh, all_partial);
    const Layout dst = src.with_placements(Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
    const int64_t k = mesh.size(), bytes = 64 * 32 * 4;
    EXPECT_EQ(plan_lower_bound(src, dst), 2 * (k - 1) * bytes / k);
    EXPECT_EQ(plan(src, dst, bytes_only).max_bytes_received(), plan_lower_bound(src, dst)) << explain(plan(src, dst, bytes_only));
  }
}

// Item 7 of issue 12: (P, P) -> (R, R) lowered to reduce_scatter + all_reduce + all_gather, and
// (P, P, P) -> (R, R, R) to three or more calls. One call over the group of several mesh dims
// (a flattened communicator) does it where one suffices: all_reduce, all_gather, reduce_scatter.
TEST(Plan, SeveralMeshDimsMoveInOneCallWhereOneSuffices) {
  const MeshSpec square(Shape{2, 2}, {"a", "b"}), cube(Shape{2, 2, 2}, {"a", "b", "c"});
  struct Case {
    MeshSpec mesh;
    Placements from, to;
    StepKind kind;
  };
  const std::vector<Case> cases = {
      {square, {Partial{}, Partial{}}, {Replicate{}, Replicate{}}, StepKind::all_reduce},
      {cube, {Partial{}, Partial{}, Partial{}}, {Replicate{}, Replicate{}, Replicate{}}, StepKind::all_reduce},
      {cube, {Partial{}, Partial{}, Shard{1}}, {Replicate{}, Replicate{}, Shard{1}}, StepKind::all_reduce},
      {square, {Shard{0}, Shard{1}}, {Replicate{}, Replicate{}}, StepKind::all_gather},
      {cube, {Shard{0}, Shard{1}, Shard{0}}, {Replicate{}, Replicate{}, Replicate{}}, StepKind::all_gather},
      {square, {Partial{}, Partial{}}, {Shard{0}, Shard{1}}, StepKind::reduce_scatter},
      {square, {Partial{}, Partial{}}, {Shard{0}, Shard{0}}, StepKind::reduce_scatter},
      {square, {Partial{ReduceOp::max}, Partial{ReduceOp::max}}, {Replicate{}, Replicate{}}, StepKind::all_reduce},
  };
  for (const Case& c : cases)
    for (const Shape& shape : {Shape{8, 8}, Shape{7, 5}, Shape{64, 48}}) {
      const Layout src(shape, DType::f32, c.mesh, c.from), dst(shape, DType::f32, c.mesh, c.to);
      const Plan p = plan(src, dst);
      SCOPED_TRACE(explain(p));
      check_valid(p);
      ASSERT_EQ(p.calls(), 1);
      ASSERT_EQ(p.steps.size(), 1u);
      EXPECT_EQ(p.steps[0].kind, c.kind);
      EXPECT_GE(p.steps[0].mesh_dims.size(), 2u);
      EXPECT_EQ(p.steps[0].mesh_dim, -1);
      if (!src.has_partial()) {
        EXPECT_EQ(p.max_bytes_received(), plan_lower_bound(src, dst));
      }
    }
  // Replicate -> Shard on both dims is one local step; explain names the group.
  const Layout r(Shape{8, 8}, DType::f32, square, {Replicate{}, Replicate{}});
  const Plan chunk = plan(r, r.with_placements({Shard{0}, Shard{1}}));
  ASSERT_EQ(chunk.steps.size(), 1u);
  EXPECT_EQ(chunk.steps[0].kind, StepKind::local_chunk);
  EXPECT_EQ(chunk.calls(), 0);
  const std::string text = explain(plan(r.with_placements({Partial{}, Partial{}}), r));
  EXPECT_TRUE(contains(text, "all_reduce(sum) over a+b (mesh dims 0, 1; 4 ranks): (P(sum), P(sum)) -> (R, R)")) << text;
  EXPECT_TRUE(contains(text, "1 call, est.")) << text;
}

// Item 8 of issue 12: on small uneven tensors the model preferred reduce_scatter + all_gather
// (more bytes, two calls) to one all_reduce. The model is now time: per call + per message +
// bytes, with per-backend constants; one call wins where the bytes are small.
TEST(Plan, OneAllReduceBeatsTwoCallsOnSmallTensors) {
  for (const std::string backend : {"threads", "mpi"}) {
    const PlanOptions options{.cost = CostModel::for_backend(backend)};
    for (int64_t k = 2; k <= 8; ++k)
      for (const Shape& shape : {Shape{3, 5}, Shape{16, 8}, Shape{7}, Shape{1, 2, 3}}) {
        const Layout p(shape, DType::f32, MeshSpec(Shape{k}, {"x"}), {Partial{}});
        const Plan to_r = plan(p, p.with_placements({Replicate{}}), options);
        SCOPED_TRACE(backend + ": " + explain(to_r));
        ASSERT_EQ(to_r.steps.size(), 1u);
        EXPECT_EQ(to_r.steps[0].kind, StepKind::all_reduce);
        EXPECT_NEAR(to_r.estimated_us, options.cost.microseconds(to_r.cost), 1e-9);
        EXPECT_GT(to_r.estimated_us, options.cost.call_us);
      }
  }
  EXPECT_THROW(CostModel::for_backend("nccl"), ValueError);
  EXPECT_TRUE(contains(CostModel::threads().to_string(), "us/msg")) << CostModel::threads().to_string();
}
