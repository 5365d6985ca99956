// multimesh.jax's compiler contexts: ignore_transforms makes tasks, microbatch and
// with_sharding_constraint no-ops, so the program runs as plain SPMD code with the same results;
// context(...) sets several at once. Settings nest and are restored however a block ends.
#include <gtest/gtest.h>

#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/contexts.hpp>
#include <tessera/mpmd/logical_axes.hpp>
#include <tessera/mpmd/microbatch.hpp>
#include <tessera/mpmd/multimesh.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using namespace tessera::mpmd;

namespace {

// Calls of the test's functions on this rank, and the rules in force inside the latest one.
thread_local int calls = 0;
thread_local size_t rules_inside = 0;

std::vector<DTensor> twice(const std::vector<DTensor>& in) {
  ++calls;
  rules_inside = current_logical_rules().size();
  return {in[0] * Scalar(2.0)};
}

}  // namespace

TEST(IgnoreTransforms, ATaskRunsWhereItsInputsLive) {
  for_each_world({2, 4}, [] {
    const int n = world_size();
    MultiMesh mm({2, n / 2}, {"pp", "dp"});
    const DeviceMesh world = line_mesh();
    const DeviceMesh stage = mm.slice({{"pp", 1}});
    const Task on_stage = task("twice", stage, twice, {{"batch", {"dp"}}});
    const Tensor a = data({2 * n + 1, 3}, 4);  // uneven rows
    const DTensor x = distribute_tensor(a, world, {Shard{0}});

    // As built: the stage's ranks run it on its mesh, under its rules; the others get a handle.
    calls = 0;
    const DTensor moved = on_stage({x})[0];
    EXPECT_EQ(calls, stage.is_member() ? 1 : 0);
    EXPECT_TRUE(moved.layout().mesh() == stage.spec());
    if (stage.is_member()) {
      EXPECT_EQ(rules_inside, 1u);
      EXPECT_TRUE(same(moved.full_tensor(), mul(a, Scalar(2.0))));
    }

    // Ignored: every rank runs it where x lives, without its rules, and the result stays there.
    calls = 0;
    const DTensor plain = ignore_transforms([&] { return on_stage({x})[0]; });
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(rules_inside, 0u);
    EXPECT_TRUE(plain.layout() == x.layout());
    EXPECT_TRUE(same(plain.full_tensor(), mul(a, Scalar(2.0))));
    // launch alike: resolved at once on every rank.
    TaskFuture future = ignore_transforms([&] { return on_stage.launch({x}); });
    EXPECT_TRUE(future.ready());
    EXPECT_TRUE(same(future.get()[0].full_tensor(), mul(a, Scalar(2.0))));

    // A registered task (built per match) is ignored the same way.
    mm.register_task("^stage_(\\d)$", [&](const std::string& index, bool) {
      return Task().mesh_slice({{"pp", std::stoll(index)}});
    });
    const Task registered = mm.task(twice, "stage_0");
    calls = 0;
    const DTensor r = ignore_transforms([&] { return registered({x})[0]; });
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(r.layout() == x.layout());

    // Outside the scope, the task moves its inputs again.
    EXPECT_FALSE(transforms_ignored());
    EXPECT_TRUE(on_stage({x})[0].layout().mesh() == stage.spec());
  });
}

TEST(IgnoreTransforms, MicrobatchRunsTheStepOnceWithTheSameLossAndGradients) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh = line_mesh();
    const int64_t rows = 4 * world_size() + 1;
    const Tensor input = data({rows, 4}, 2), target = data({rows, 3}, 6), w = data({4, 3}, 8);
    for (const MicrobatchLoss kind : {MicrobatchLoss::mean, MicrobatchLoss::sum}) {
      const auto run = [&](bool ignore) {
        DTensor wd = distribute_tensor(w, mesh, {Replicate{}}).requires_grad_();
        calls = 0;
        const auto step = [&](const std::vector<DTensor>& in) {
          ++calls;
          const DTensor err = sub(matmul(in[1], in[0]), in[2]);
          return kind == MicrobatchLoss::mean ? mean(mul(err, err)) : sum(mul(err, err));
        };
        // argnums {1, 2}: the weight goes whole to every microbatch.
        const auto body = [&] {
          return microbatch(step, 0, 3, {1, 2}, kind)(
              {wd, distribute_tensor(input, mesh, {Shard{0}}), distribute_tensor(target, mesh, {Shard{0}})});
        };
        const DTensor loss = ignore_transforms(ignore, body);
        return std::make_tuple(loss.full_tensor(), wd.grad().full_tensor(), calls);
      };
      const auto [split_loss, split_grad, split_calls] = run(false);
      const auto [whole_loss, whole_grad, whole_calls] = run(true);
      EXPECT_EQ(split_calls, 3);
      EXPECT_EQ(whole_calls, 1);
      EXPECT_FALSE(whole_loss.requires_grad());
      EXPECT_TRUE(allclose(whole_loss, split_loss, 1e-5, 1e-5)) << static_cast<int>(kind);
      EXPECT_TRUE(allclose(whole_grad, split_grad, 1e-5, 1e-5)) << static_cast<int>(kind);
    }
    // Bad argnums are still refused, naming the call.
    EXPECT_TRUE(value_error(
        [&] {
          ignore_transforms([&] {
            return microbatch([](const std::vector<DTensor>& in) { return sum(in[0]); },
                              {distribute_tensor(input, mesh, {Shard{0}})}, 0, 2, std::vector<int64_t>{3});
          });
        },
        {"[microbatch]", "argnum 3 is out of range for 1 inputs"}));
  });
}

TEST(IgnoreTransforms, WithShardingConstraintReturnsItsInput) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const DTensor x = distribute_tensor(data({6, 2}, 1), mesh, {Replicate{}});
    const LogicalAxes rules(LogicalRules{{"batch", {"dp"}}});
    EXPECT_EQ(mpmd::with_sharding_constraint(x, {"batch", ""}).placements(), (Placements{Shard{0}}));
    const DTensor kept = ignore_transforms([&] { return mpmd::with_sharding_constraint(x, {"batch", ""}); });
    EXPECT_EQ(kept.placements(), (Placements{Replicate{}}));
    EXPECT_TRUE(same(kept.full_tensor(), x.full_tensor()));
    // Its own error still names the call.
    EXPECT_TRUE(sharding_error([&] { ignore_transforms([&] { return mpmd::with_sharding_constraint(x, {"batch"}); }); },
                               {"[with_sharding_constraint]", "1 logical dim names for [6, 2] f32"}));
  });
}

TEST(IgnoreTransforms, ScopesNestAndRestoreHoweverTheyEnd) {
  for_each_world({2}, [] {
    EXPECT_FALSE(transforms_ignored());
    ignore_transforms([] {
      EXPECT_TRUE(transforms_ignored());
      // ignore_transforms(false) leaves an outer scope's setting, as multimesh.jax's does.
      ignore_transforms(false, [] { EXPECT_TRUE(transforms_ignored()); });
      context({}, [] { EXPECT_TRUE(transforms_ignored()); });
      EXPECT_TRUE(transforms_ignored());
    });
    EXPECT_FALSE(transforms_ignored());
    ignore_transforms(std::nullopt, [] { EXPECT_FALSE(transforms_ignored()); });
    // context(...) sets it with the others; a value comes back through it.
    EXPECT_EQ(context({.ignore_transforms = true}, [] { return transforms_ignored() ? 7 : 0; }), 7);
    EXPECT_FALSE(transforms_ignored());
    // A throw out of the block restores the setting before it.
    EXPECT_TRUE(
        value_error([] { ignore_transforms([]() -> int { throw ValueError("[body] stop"); }); }, {"[body] stop"}));
    EXPECT_FALSE(transforms_ignored());
  });
}
