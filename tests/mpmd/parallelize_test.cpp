// parallelize picks the plan that is known to be right where it is: data parallel when
// activations dwarf the parameters, tensor parallel when parameters dwarf the activations, a
// sharded plan when replicated parameters overflow the budget; it refuses an impossible budget;
// the plan it applies trains to the unsharded model's loss. The unsharded step time and the cost
// model are given, so the choice depends on neither timing nor backend.
#include <gtest/gtest.h>

#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/parallelize.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/ops/random.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using namespace tessera::mpmd;

namespace {

nn::TransformerConfig config(int64_t dim, int64_t hidden, int64_t vocab, int64_t seq) {
  nn::TransformerConfig c;
  c.vocab = vocab;
  c.dim = dim;
  c.heads = 2;
  c.layers = 2;
  c.max_seq = seq;
  c.hidden = hidden;
  return c;
}

ParallelizeOptions shapes(int64_t batch, int64_t seq) {
  ParallelizeOptions o;
  o.batch = batch;
  o.seq = seq;
  o.print = false;
  o.unsharded_step_us = 1000;
  o.cost = CostModel::threads();  // the same choice on every backend
  return o;
}

}  // namespace

TEST(Parallelize, ChoosesTheObviousPlan) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    {
      // 16384 tokens of width 8 against a few hundred parameters: data parallel.
      nn::TransformerLM model(mesh, config(8, 16, 8, 64));
      const ParallelPlan plan = plan_parallelism(model, 0, shapes(256, 64));
      EXPECT_EQ(plan.chosen.name, "ddp(x)") << plan.to_string();
      EXPECT_EQ(plan.data, (Placements{Shard{0}}));
    }
    {
      // 2 tokens against 100k parameters: tensor parallel.
      nn::TransformerLM model(mesh, config(64, 256, 64, 4));
      const ParallelPlan plan = plan_parallelism(model, 0, shapes(1, 2));
      EXPECT_EQ(plan.chosen.name, "tp(x)") << plan.to_string();
      EXPECT_EQ(plan.data, (Placements{Replicate{}}));
      // Replicated parameters and moments over the budget: a sharded plan, within it.
      int64_t ddp_memory = 0;
      for (const PlanEstimate& e : plan.candidates)
        if (e.name == "ddp(x)") ddp_memory = e.memory_bytes;
      const ParallelPlan tight = plan_parallelism(model, ddp_memory - 1, shapes(8, 4));
      EXPECT_NE(tight.chosen.name, "ddp(x)") << tight.to_string();
      EXPECT_LE(tight.chosen.memory_bytes, ddp_memory - 1);
      EXPECT_TRUE(throws_with<ValueError>([&] { plan_parallelism(model, 1, shapes(8, 4)); },
                                          {"[parallelize]", "no plan fits the memory budget", "the smallest"}));
    }
  });
}

// The applied plan computes what the unsharded model computes.
TEST(Parallelize, AppliesThePlanItChose) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"dp", "tp"});
    const nn::TransformerConfig c = config(16, 32, 16, 8);
    manual_seed(7);
    nn::TransformerLM model(mesh, c);
    manual_seed(7);
    nn::TransformerLM reference(mesh, c);
    const ParallelPlan plan = parallelize(model, mesh, 0, shapes(4, 8));
    EXPECT_FALSE(plan.chosen.name.empty());
    std::vector<int64_t> ids(32), next(32);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 16), next[i] = static_cast<int64_t>(i * 3 % 16);
    const Tensor tokens = from_vector(ids, Shape{4, 8}), targets = from_vector(next, Shape{4, 8});
    const DTensor loss = model.loss(distribute_tensor(tokens, mesh, plan.data), distribute_tensor(targets, mesh, plan.data));
    const Placements whole{Replicate{}, Replicate{}};
    const DTensor expected = reference.loss(distribute_tensor(tokens, mesh, whole), distribute_tensor(targets, mesh, whole));
    EXPECT_NEAR(loss.full_tensor().item<double>(), expected.full_tensor().item<double>(), 1e-5) << plan.to_string();
    // Applying again refuses: the model is sharded now (unless the plan left it replicated).
    if (!plan.chosen.tp_axis.empty() || plan.chosen.fsdp) {
      EXPECT_TRUE(sharding_error([&] { parallelize(model, mesh, 0, shapes(4, 8)); }, {"[parallelize]", "already"}));
    }
    const DeviceMesh other({n}, {"x"});
    EXPECT_TRUE(sharding_error([&] { parallelize(reference, other, 0, shapes(4, 8)); }, {"[parallelize]", "the model lives on"}));
  });
}
