// Redistribution equivalence: for every pair of layouts (R, S(0), S(1), reversed shard orders,
// Partial sources) on every mesh a world of n ranks can form, the redistributed local block
// equals the same block of the unsharded tensor, in f32, bf16 and i64.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::vector<std::vector<int64_t>> mesh_shapes_for(int n) {
  switch (n) {
    case 4: return {{4}, {2, 2}};
    case 6: return {{6}, {2, 3}};
    case 8: return {{8}, {4, 2}, {2, 2, 2}};
    default: return {{n}};
  }
}

DeviceMesh make_mesh(const std::vector<int64_t>& shape) {
  static const std::vector<std::string> names = {"a", "b", "c"};
  return DeviceMesh(shape, std::vector<std::string>(names.begin(), names.begin() + static_cast<long>(shape.size())));
}

// Small integers: exact in every dtype tested, and distinct enough to catch misplaced elements.
Tensor global_of(const Shape& shape, DType dtype) {
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(static_cast<int64_t>(i * 7 % 23) - 11);
  return from_vector(values, shape).to(dtype);
}

// This rank's contribution to a Partial layout: the parts over the Partial mesh dims reduce to
// the block of `global` under the layout's reduction.
Tensor part_of(const Tensor& global, const Layout& layout, const DeviceMesh& mesh) {
  const auto coordinate = mesh.coordinate();
  Tensor value = block_of(global, layout.block(coordinate));
  int64_t k = 1, c = 0;
  ReduceOp op = ReduceOp::sum;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!is_partial(layout.placements()[static_cast<size_t>(m)])) continue;
    op = std::get<Partial>(layout.placements()[static_cast<size_t>(m)]).op;
    c = c * mesh.size(m) + coordinate[static_cast<size_t>(m)];
    k *= mesh.size(m);
  }
  switch (op) {
    case ReduceOp::sum: return c == 0 ? value - (k - 1) : ones_like(value);
    case ReduceOp::avg: return c == 0 ? value + (k - 1) : value - 1;
    case ReduceOp::max: return value - c;
    case ReduceOp::min: return value + c;
    default: return value;
  }
}

std::vector<Layout> layouts_on(const MeshSpec& mesh, const Shape& shape, DType dtype,
                               const std::vector<Placement>& choices) {
  std::vector<Layout> out;
  const int64_t n = static_cast<int64_t>(choices.size());
  int64_t combos = 1;
  for (int64_t i = 0; i < mesh.ndim(); ++i) combos *= n;
  for (int64_t c = 0; c < combos; ++c) {
    Placements p;
    for (int64_t i = 0, rest = c; i < mesh.ndim(); ++i, rest /= n) p.push_back(choices[static_cast<size_t>(rest % n)]);
    // One Partial reduction per layout (mixing sum and max over mesh dims is not a value).
    int kinds = 0;
    std::optional<ReduceOp> seen;
    for (const auto& q : p)
      if (is_partial(q) && (!seen || *seen != std::get<Partial>(q).op)) seen = std::get<Partial>(q).op, ++kinds;
    if (kinds > 1) continue;
    out.emplace_back(shape, dtype, mesh, p);
    for (int64_t dim = 0; dim < shape.size(); ++dim) {
      const auto& order = out.back().shard_order(dim);
      if (order.size() >= 2) {
        out.emplace_back(shape, dtype, mesh, p, ShardOrder{{dim, {order.rbegin(), order.rend()}}});
        break;
      }
    }
  }
  return out;
}

// Redistributes every source to every destination and compares each rank's block.
void check_pairs(const DeviceMesh& mesh, const Shape& shape, DType dtype, const std::vector<Placement>& sources,
                 const std::vector<Placement>& destinations) {
  const Tensor global = global_of(shape, dtype);
  const auto dests = layouts_on(mesh.spec(), shape, dtype, destinations);
  for (const Layout& src : layouts_on(mesh.spec(), shape, dtype, sources)) {
    const DTensor input(part_of(global, src, mesh), mesh, src);
    for (const Layout& dst : dests) {
      const DTensor out = input.redistribute(mesh, dst);
      ASSERT_EQ(out.layout(), dst);
      const Tensor expected = block_of(global, dst.block(mesh.coordinate()));
      ASSERT_TRUE(equal(out.to_local(), expected))
          << src.to_string() << " -> " << dst.to_string() << " on rank " << rank() << "\n"
          << explain(*cached_plan(src, dst)) << "got " << out.to_local() << "\nexpected " << expected;
    }
  }
}

const std::vector<Placement> kPlain = {Replicate{}, Shard{0}, Shard{1}};

}  // namespace

TEST(Redistribute, EveryPairOnEveryMeshEqualsTheUnshardedTensor) {
  for_each_world({1, 2, 3, 4, 5, 6, 8}, [] {
    for (const auto& shape : mesh_shapes_for(world_size())) {
      const DeviceMesh mesh = make_mesh(shape);
      for (const Shape& tensor : {Shape{7, 5}, Shape{8, 6}}) check_pairs(mesh, tensor, DType::f32, kPlain, kPlain);
    }
  });
}

TEST(Redistribute, Bf16AndI64) {
  for_each_world({2, 4}, [] {
    for (const auto& shape : mesh_shapes_for(world_size())) {
      const DeviceMesh mesh = make_mesh(shape);
      for (DType dtype : {DType::bf16, DType::i64}) check_pairs(mesh, Shape{5, 7}, dtype, kPlain, kPlain);
    }
  });
}

TEST(Redistribute, PartialSourcesReduceExactlyOnce) {
  for_each_world({2, 3, 4, 6, 8}, [] {
    for (const auto& shape : mesh_shapes_for(world_size())) {
      const DeviceMesh mesh = make_mesh(shape);
      check_pairs(mesh, Shape{7, 5}, DType::f32, {Partial{}, Replicate{}, Shard{0}}, kPlain);
      check_pairs(mesh, Shape{6, 4}, DType::f32, {Partial{ReduceOp::max}, Shard{1}}, kPlain);
      if (shape.size() <= 2) {
        check_pairs(mesh, Shape{5, 3}, DType::i64, {Partial{}, Shard{1}}, kPlain);
        check_pairs(mesh, Shape{5, 3}, DType::bf16, {Partial{ReduceOp::min}, Shard{0}}, kPlain);
        check_pairs(mesh, Shape{5, 3}, DType::f32, {Partial{ReduceOp::avg}, Replicate{}}, kPlain);
      }
    }
  });
}

TEST(Redistribute, FullTensorAndEmptyShards) {
  for_each_world({1, 3, 4}, [] {
    const DeviceMesh mesh = make_mesh({world_size()});
    for (const Shape& shape : {Shape{2, 3}, Shape{0, 4}, Shape{1, 1}}) {
      const Tensor global = global_of(shape, DType::f32);
      for (const Placements& p : {Placements{Shard{0}}, Placements{Shard{1}}, Placements{Replicate{}}}) {
        const Layout layout(shape, DType::f32, mesh.spec(), p);
        const DTensor t(block_of(global, layout.block(mesh.coordinate())), mesh, layout);
        ASSERT_TRUE(equal(t.full_tensor(), global)) << layout.to_string();
      }
    }
  });
}

TEST(Redistribute, BetweenMeshesOfOneWorld) {
  for_each_world({4, 6}, [] {
    if (world_size() < 4) GTEST_SKIP();
    const int n = world_size();
    // Every world rank constructs every mesh (construction is collective over the world).
    const DeviceMesh pair({2}, {"p"}, {0, 1});
    const DeviceMesh square({2, 2}, {"a", "b"}, {n - 4, n - 3, n - 2, n - 1});
    const DeviceMesh line({n}, {"x"});
    const Tensor global = global_of(Shape{7, 6}, DType::f32);
    const auto make = [&](const DeviceMesh& mesh, const Layout& layout) {
      return DTensor(mesh.is_member() ? part_of(global, layout, mesh) : Tensor(), mesh, layout);
    };
    for (const DeviceMesh* from : {&pair, &square, &line})
      for (const DeviceMesh* to : {&pair, &square, &line}) {
        if (from == to) continue;
        for (const Layout& src : layouts_on(from->spec(), Shape{7, 6}, DType::f32, {Partial{}, Replicate{}, Shard{0}, Shard{1}}))
          for (const Layout& dst : layouts_on(to->spec(), Shape{7, 6}, DType::f32, kPlain)) {
            const DTensor out = make(*from, src).redistribute(*to, dst);
            if (!to->is_member()) {
              ASSERT_EQ(out.to_local().numel(), 0);
              continue;
            }
            ASSERT_TRUE(equal(out.to_local(), block_of(global, dst.block(to->coordinate()))))
                << src.to_string() << " -> " << dst.to_string() << " on rank " << rank();
          }
      }
  });
}

TEST(Redistribute, CommDebugModeSeesExactlyThePlannedCollectivesAndBytes) {
  for_each_world({4, 6, 8}, [] {
    for (const auto& shape : mesh_shapes_for(world_size())) {
      if (shape.size() > 2) continue;  // 2x2x2 runs in the equivalence tests; here it only costs time
      const DeviceMesh mesh = make_mesh(shape);
      const Tensor global = global_of(Shape{9, 7}, DType::f32);
      const auto layouts = layouts_on(mesh.spec(), Shape{9, 7}, DType::f32, {Partial{}, Replicate{}, Shard{0}, Shard{1}});
      for (const Layout& src : layouts)
        for (const Layout& dst : layouts) {
          if (dst.has_partial()) continue;
          const DTensor input(part_of(global, src, mesh), mesh, src);
          const Plan& p = *cached_plan(src, dst);
          int64_t calls = 0;
          for (const PlanStep& step : p.steps)
            calls += step.kind == StepKind::local_chunk || step.kind == StepKind::to_partial ? 0 : 1;
          CommDebugMode mode;
          (void)input.redistribute(mesh, dst);
          ASSERT_EQ(mode.total_count(), calls) << explain(p) << mode.to_string();
          ASSERT_EQ(mode.total_bytes_received(), p.bytes_received(rank())) << explain(p) << mode.to_string();
          ASSERT_EQ(mode.total_bytes_sent(), p.bytes_sent(rank())) << explain(p) << mode.to_string();
        }
    }
  });
}
