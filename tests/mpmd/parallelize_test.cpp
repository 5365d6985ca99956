// parallelize picks the plan that is known to be right where it is: data parallel when
// activations dwarf the parameters, tensor parallel when parameters dwarf the activations, a
// sharded plan when replicated parameters overflow the budget; it refuses an impossible budget;
// the plan it applies trains to the unsharded model's loss. The unsharded step time and the cost
// model are given, so the choice depends on neither timing nor backend.
#include <gtest/gtest.h>

#include <limits>

#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/parallelize.hpp>
#include <tessera/nn/parallel.hpp>
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

bool sequence_parallel(const PlanEstimate& e) { return e.strategy.tensor && e.strategy.tensor->sequence_parallel; }

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
      EXPECT_EQ(plan.chosen.name(), "ddp(x)") << plan.to_string();
      EXPECT_EQ(plan.data, (Placements{Shard{0}}));
    }
    {
      // 2 tokens against 100k parameters: tensor parallel.
      nn::TransformerLM model(mesh, config(64, 256, 64, 4));
      const ParallelPlan plan = plan_parallelism(model, 0, shapes(1, 2));
      EXPECT_EQ(plan.chosen.name(), "tp(x)") << plan.to_string();
      EXPECT_EQ(plan.data, (Placements{Replicate{}}));
      // Replicated parameters and moments over the budget: a sharded plan, within it.
      int64_t ddp_memory = 0;
      for (const PlanEstimate& e : plan.candidates)
        if (e.name() == "ddp(x)") ddp_memory = e.memory_bytes;
      const ParallelPlan tight = plan_parallelism(model, ddp_memory - 1, shapes(8, 4));
      EXPECT_NE(tight.chosen.name(), "ddp(x)") << tight.to_string();
      EXPECT_LE(tight.chosen.memory_bytes, ddp_memory - 1);
      EXPECT_TRUE(throws_with<ValueError>([&] { plan_parallelism(model, 1, shapes(8, 4)); },
                                          {"[parallelize]", "no plan fits the memory budget", "the smallest"}));
    }
  });
}

// Under a budget between DDP's footprint and FSDP's, FSDP covers only the layers it must (the
// rest DDP): it fits, moves less than sharding everything, and computes the unsharded loss.
TEST(Parallelize, FullyShardsOnlyTheLayersItMust) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const nn::TransformerConfig c = config(64, 256, 64, 16);
    manual_seed(3);
    nn::TransformerLM model(mesh, c);
    const ParallelPlan free = plan_parallelism(model, 0, shapes(32, 16));
    const PlanEstimate* ddp = nullptr;
    const PlanEstimate* fsdp = nullptr;
    for (const PlanEstimate& e : free.candidates) {
      if (e.name() == "ddp(x)") ddp = &e;
      if (e.name() == "fsdp(x)") fsdp = &e;
    }
    ASSERT_TRUE(ddp && fsdp) << free.to_string();
    const int64_t budget = (ddp->memory_bytes + fsdp->memory_bytes) / 2;
    const ParallelPlan plan = plan_parallelism(model, budget, shapes(32, 16));
    const PlanEstimate* mixed = nullptr;
    for (const PlanEstimate& e : plan.candidates)
      if (e.strategy.data.sharded && !e.strategy.data.sharded_modules.empty() && !e.strategy.tensor) mixed = &e;
    ASSERT_TRUE(mixed) << plan.to_string();
    EXPECT_TRUE(mixed->fits);
    EXPECT_LE(mixed->memory_bytes, budget);
    EXPECT_LT(mixed->comm_us, fsdp->comm_us) << plan.to_string();
    EXPECT_NE(mixed->name().find("fsdp(x)["), std::string::npos);
    EXPECT_NE(mixed->name().find("] + ddp(x)"), std::string::npos);
    // Applied: the chosen modules sharded, the others replicated; the loss is the unsharded one.
    manual_seed(3);
    nn::TransformerLM reference(mesh, c);
    apply_plan(model, mixed->strategy);
    int64_t sharded = 0;
    for (const auto& [path, p] : model.named_parameters()) sharded += p->layout().is_replicated() ? 0 : 1;
    EXPECT_GT(sharded, 0);
    EXPECT_LT(sharded, static_cast<int64_t>(model.named_parameters().size()));
    std::vector<int64_t> ids(64), next(64);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 64), next[i] = static_cast<int64_t>(i * 3 % 64);
    const Tensor tokens = from_vector(ids, Shape{4, 16}), targets = from_vector(next, Shape{4, 16});
    const DTensor loss = model.loss(distribute_tensor(tokens, mesh, {Shard{0}}), distribute_tensor(targets, mesh, {Shard{0}}));
    const DTensor expected =
        reference.loss(distribute_tensor(tokens, mesh, {Replicate{}}), distribute_tensor(targets, mesh, {Replicate{}}));
    EXPECT_NEAR(loss.full_tensor().item<double>(), expected.full_tensor().item<double>(), 1e-5);
  });
}

// Sequence parallelism keeps the norms' activations on sequence shards: of the plans the
// smallest are tp+sp with FSDP, and a budget of their footprint admits nothing else.
TEST(Parallelize, SequenceParallelWhereOnlyItFits) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2 || n < 4) return;  // both axes of at least 2 ranks
    const DeviceMesh mesh({2, n / 2}, {"dp", "tp"});
    nn::TransformerLM model(mesh, config(64, 256, 64, 64));
    const ParallelPlan all = plan_parallelism(model, 0, shapes(8, 64));
    int64_t smallest = std::numeric_limits<int64_t>::max();
    for (const PlanEstimate& e : all.candidates) smallest = std::min(smallest, e.memory_bytes);
    for (const PlanEstimate& e : all.candidates) {
      if (e.memory_bytes == smallest) {
        EXPECT_TRUE(sequence_parallel(e) && e.strategy.data.sharded) << e.name() << "\n" << all.to_string();
      }
      // The same plan without sequence parallelism holds more.
      if (!sequence_parallel(e)) continue;
      for (const PlanEstimate& f : all.candidates) {
        // f: the same tensor parallel plan without sequence parallelism (a candidate without
        // tensor parallelism has no axis to compare).
        if (!sequence_parallel(f) && f.strategy.tensor && f.strategy.tensor->axis == e.strategy.tensor->axis &&
            f.strategy.data == e.strategy.data) {
          EXPECT_LT(e.memory_bytes, f.memory_bytes) << e.name();
        }
      }
    }
    const ParallelPlan tight = plan_parallelism(model, smallest, shapes(8, 64));
    EXPECT_TRUE(sequence_parallel(tight.chosen) && tight.chosen.strategy.data.sharded) << tight.to_string();
  });
}

// Every candidate, applied, computes what the unsharded model computes.
TEST(Parallelize, EveryCandidateComputesTheUnshardedLoss) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"dp", "tp"});
    const nn::TransformerConfig c = config(16, 32, 16, 8);
    manual_seed(5);
    nn::TransformerLM reference(mesh, c);
    std::vector<int64_t> ids(40), next(40);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 16), next[i] = static_cast<int64_t>(i * 3 % 16);
    const Tensor tokens = from_vector(ids, Shape{5, 8}), targets = from_vector(next, Shape{5, 8});
    const Placements whole{Replicate{}, Replicate{}};
    const double expected =
        reference.loss(distribute_tensor(tokens, mesh, whole), distribute_tensor(targets, mesh, whole)).full_tensor().item<double>();
    const ParallelPlan plan = plan_parallelism(reference, 0, shapes(5, 8));
    EXPECT_EQ(plan.candidates.size(), 9u) << plan.to_string();
    for (const PlanEstimate& e : plan.candidates) {
      manual_seed(5);
      nn::TransformerLM model(mesh, c);
      apply_plan(model, e.strategy);
      Placements data = whole;
      for (const auto& a : e.strategy.data.axes) data[static_cast<size_t>(mesh.spec().dim_of(a))] = Shard{0};
      const DTensor loss = model.loss(distribute_tensor(tokens, mesh, data), distribute_tensor(targets, mesh, data));
      EXPECT_NEAR(loss.full_tensor().item<double>(), expected, 1e-5) << e.name();
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
    EXPECT_FALSE(plan.chosen.name().empty());
    std::vector<int64_t> ids(32), next(32);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 16), next[i] = static_cast<int64_t>(i * 3 % 16);
    const Tensor tokens = from_vector(ids, Shape{4, 8}), targets = from_vector(next, Shape{4, 8});
    const DTensor loss = model.loss(distribute_tensor(tokens, mesh, plan.data), distribute_tensor(targets, mesh, plan.data));
    const Placements whole{Replicate{}, Replicate{}};
    const DTensor expected = reference.loss(distribute_tensor(tokens, mesh, whole), distribute_tensor(targets, mesh, whole));
    EXPECT_NEAR(loss.full_tensor().item<double>(), expected.full_tensor().item<double>(), 1e-5) << plan.to_string();
    // Applying again refuses: the model is sharded now (unless the plan left it replicated).
    if (plan.chosen.strategy.tensor || plan.chosen.strategy.data.sharded) {
      EXPECT_TRUE(sharding_error([&] { parallelize(model, mesh, 0, shapes(4, 8)); }, {"[parallelize]", "already"}));
    }
    const DeviceMesh other({n}, {"x"});
    EXPECT_TRUE(sharding_error([&] { parallelize(reference, other, 0, shapes(4, 8)); }, {"[parallelize]", "the model lives on"}));
  });
}

namespace {

// This rank's stage mesh of a pp x x mesh.
DeviceMesh my_stage(const DeviceMesh& mesh) { return mesh.slice({{"pp", mesh.coordinate("pp")}}); }

ParallelizeOptions pipelined(int64_t batch, int64_t seq, int64_t microbatches, std::vector<double> unit_us) {
  ParallelizeOptions o = shapes(batch, seq);
  o.pipeline_axis = "pp";
  o.microbatches = microbatches;
  o.unit_us = std::move(unit_us);
  o.ranks_per_core = 1;  // the same estimate on every machine
  return o;
}

}  // namespace

// Stage boundaries balance the stages' measured times: equal blocks split evenly; a head as heavy
// as three blocks gets a stage of its own.
TEST(Parallelize, ChoosesStageBoundariesThatBalanceTheStages) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"pp", "x"});
    nn::TransformerConfig c = config(8, 16, 8, 8);
    c.layers = 4;
    nn::TransformerLM model(my_stage(mesh), c);
    // Unit times dwarf this small model's communication, so they decide.
    const ParallelPlan even = plan_parallelism(model, mesh, 0, pipelined(8, 8, 4, {100, 1e4, 1e4, 1e4, 1e4, 100}));
    EXPECT_EQ(even.chosen.strategy.pipeline->modules,
              (std::vector<std::vector<std::string>>{{"tok", "pos", "blocks.0", "blocks.1"},
                                                     {"blocks.2", "blocks.3", "norm", "head"}}))
        << even.to_string();
    EXPECT_EQ(even.stage_meshes.size(), 2u);
    EXPECT_NE(even.chosen.name().find("pp(pp)[emb-b1|b2-head]"), std::string::npos) << even.to_string();
    // (n - 1 + S) microbatch slots of the slowest stage: 5 x ~20.1 ms / ways.
    const double ways = static_cast<double>(n / 2);
    EXPECT_NEAR(even.chosen.compute_us, 5 * 20100 / ways, 1.0) << even.to_string();
    // Four ranks to a core: the host's work over its cores, 4 x 4 microbatches x 20.1 ms / ways
    // per rank, bounds the step instead.
    ParallelizeOptions crowded = pipelined(8, 8, 4, {100, 1e4, 1e4, 1e4, 1e4, 100});
    crowded.ranks_per_core = 4;
    EXPECT_NEAR(plan_parallelism(model, mesh, 0, crowded).chosen.compute_us, 4 * 4 * 20100 / ways, 1.0);
    const ParallelPlan heavy_head =
        plan_parallelism(model, mesh, 0, pipelined(8, 8, 4, {100, 1e4, 1e4, 1e4, 1e4, 3.5e4}));
    EXPECT_EQ(heavy_head.chosen.strategy.pipeline->modules,
              (std::vector<std::vector<std::string>>{{"tok", "pos", "blocks.0", "blocks.1", "blocks.2", "blocks.3"},
                                                     {"norm", "head"}}))
        << heavy_head.to_string();
    // 1F1B's first stage holds two microbatches' activations, GPipe's all four: a budget between
    // the two fits only 1F1B.
    ParallelizeOptions gpipe = pipelined(8, 8, 4, {100, 1e4, 1e4, 1e4, 1e4, 100});
    gpipe.schedule = Schedule::gpipe;
    const ParallelPlan all_held = plan_parallelism(model, mesh, 0, gpipe);
    for (size_t i = 0; i < even.candidates.size(); ++i)
      EXPECT_LT(even.candidates[i].memory_bytes, all_held.candidates[i].memory_bytes) << even.candidates[i].name();
  });
}

// The pipeline parallelize builds computes the unsplit model's loss and gradients (its unit
// times measured here, so whatever boundaries it picks).
TEST(Parallelize, PipelinePlanTrainsLikeTheUnsplitModel) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"pp", "x"});
    const nn::TransformerConfig c = config(16, 32, 16, 8);
    manual_seed(11);
    nn::TransformerLM model(my_stage(mesh), c);
    manual_seed(11);
    nn::TransformerLM reference(mesh, c);
    const ParallelPlan plan = parallelize(model, mesh, 0, pipelined(4, 8, 2, {}));
    ASSERT_TRUE(plan.chosen.strategy.pipeline) << plan.to_string();
    ASSERT_EQ(plan.chosen.strategy.pipeline->modules.size(), 2u) << plan.to_string();
    Pipeline pipeline = make_pipeline(model, plan);
    std::vector<int64_t> ids(32), next(32);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 16), next[i] = static_cast<int64_t>(i * 3 % 16);
    const Tensor tokens = from_vector(ids, Shape{4, 8}), targets = from_vector(next, Shape{4, 8});
    const double loss = pipeline.step(distribute_tensor(tokens, plan.stage_meshes.front(), plan.data),
                                      distribute_tensor(targets, plan.stage_meshes.back(), plan.data));
    const Placements whole{Replicate{}, Replicate{}};
    const DTensor expected = reference.loss(distribute_tensor(tokens, mesh, whole), distribute_tensor(targets, mesh, whole));
    expected.backward();
    EXPECT_NEAR(loss, expected.full_tensor().item<double>(), 1e-5) << plan.to_string();
    const std::vector<DTensor*> mine = stage_parameters(model, plan);
    EXPECT_FALSE(mine.empty());
    for (const auto& [path, p] : model.named_parameters()) {
      if (std::find(mine.begin(), mine.end(), p) == mine.end()) continue;
      const DTensor* ref = nullptr;
      for (const auto& [ref_path, q] : reference.named_parameters())
        if (ref_path == path) ref = q;
      ASSERT_TRUE(ref && p->grad().defined()) << path;
      EXPECT_TRUE(allclose(p->grad().full_tensor(), ref->grad().full_tensor(), 1e-4, 1e-5)) << path;
    }
  });
}

TEST(Parallelize, PipelineAxisErrors) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"pp", "x"});
    nn::TransformerLM whole_model(mesh, config(8, 16, 8, 8));
    EXPECT_TRUE(sharding_error([&] { plan_parallelism(whole_model, mesh, 0, pipelined(8, 8, 2, {})); },
                               {"[parallelize]", "this rank's stage mesh"}));
    nn::TransformerLM model(my_stage(mesh), config(8, 16, 8, 8));
    ParallelizeOptions unknown = pipelined(8, 8, 2, {});
    unknown.pipeline_axis = "stages";
    EXPECT_TRUE(sharding_error([&] { plan_parallelism(model, mesh, 0, unknown); }, {"parallelize", "stages"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { plan_parallelism(model, mesh, 0, pipelined(8, 8, 2, {1, 2})); },
                                        {"[parallelize]", "unit_us has 2 times", "4 units"}));
    // n stages of 1-layer models: 3 units cannot fill 4 or more stages.
    if (n >= 4) {
      const DeviceMesh tall({n, 1}, {"pp", "x"});
      nn::TransformerConfig one = config(8, 16, 8, 8);
      one.layers = 1;
      nn::TransformerLM small(my_stage(tall), one);
      EXPECT_TRUE(sharding_error([&] { plan_parallelism(small, tall, 0, pipelined(8, 8, 2, {})); },
                                 {"[parallelize]", "needs at least as many units"}));
    }
    const ParallelPlan flat = plan_parallelism(whole_model, 0, shapes(8, 8));
    EXPECT_TRUE(throws_with<ValueError>([&] { make_pipeline(whole_model, flat); }, {"[make_pipeline]", "no pipeline axis"}));
  });
}

// Any module, with the tensor parallel plan its author gives (here an MLP, fc1 column- and fc2
// row-parallel): the obvious plans where they are known, FSDP of one layer only under a budget
// between DDP's and FSDP's, the applied plan computing the unsharded output, and the errors.
TEST(Parallelize, AnyModuleWithItsTensorParallelPlan) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    constexpr int64_t kDim = 32, kSeq = 4;
    manual_seed(9);
    nn::MLP mlp(mesh, kDim, 512);
    manual_seed(9);
    nn::MLP reference(mesh, kDim, 512);
    const auto input = [&](int64_t rows, const Placements& placements) {
      const Tensor values = sin(arange(rows * kSeq * kDim).to(DType::f32) * 0.37).reshape({rows, kSeq, kDim});
      return distribute_tensor(values, mesh, placements);
    };
    ParallelizeOptions options = shapes(1, kSeq);
    options.tp_plan = {{"fc1", nn::ColwiseParallel{}}, {"fc2", nn::RowwiseParallel{}}};
    options.loss = [&](int64_t rows) { return sum(mlp.forward(input(rows, {Replicate{}}))); };
    // Four tokens against 33k parameters: tensor parallel; 16k tokens: data parallel.
    EXPECT_EQ(plan_parallelism(mlp, 0, options).chosen.name(), "tp(x)")
        << plan_parallelism(mlp, 0, options).to_string();
    ParallelizeOptions many = options;
    many.batch = 4096;
    EXPECT_EQ(plan_parallelism(mlp, 0, many).chosen.name(), "ddp(x)") << plan_parallelism(mlp, 0, many).to_string();
    // The step timed by the module's own loss (no given time): every candidate priced.
    ParallelizeOptions timed = options;
    timed.unsharded_step_us = 0;
    const ParallelPlan measured = plan_parallelism(mlp, 0, timed);
    ASSERT_EQ(measured.candidates.size(), 3u) << measured.to_string();
    for (const PlanEstimate& e : measured.candidates) EXPECT_GT(e.compute_us, 0) << e.name();
    // Each module owning parameters is a unit: under a budget a quarter of the way from DDP's
    // footprint to FSDP's (sharding one layer saves half of the difference, less its gather),
    // FSDP covers one of the two layers.
    ParallelizeOptions mid = many;
    mid.tp_plan.clear();
    const ParallelPlan free = plan_parallelism(mlp, 0, mid);
    const int64_t budget = free.candidates[0].memory_bytes - (free.candidates[0].memory_bytes - free.candidates[1].memory_bytes) / 4;
    const ParallelPlan tight = plan_parallelism(mlp, budget, mid);
    EXPECT_EQ(tight.chosen.strategy.data.sharded_modules.size(), 1u) << tight.to_string();
    EXPECT_LE(tight.chosen.memory_bytes, budget);
    // Applied (tensor parallel here): the output equals the unsharded module's.
    const ParallelPlan applied = parallelize(mlp, mesh, 0, options);
    EXPECT_EQ(applied.chosen.name(), "tp(x)");
    EXPECT_FALSE(mlp.submodule("fc1").parameter("weight").layout().is_replicated());
    EXPECT_TRUE(allclose(mlp.forward(input(3, applied.data)).full_tensor(),
                         reference.forward(input(3, {Replicate{}})).full_tensor(), 1e-5, 1e-6));
    // Errors: no way to time the step; a pipeline axis on a module that is not cut into units.
    nn::MLP fresh(mesh, kDim, 64);
    ParallelizeOptions untimed = options;
    untimed.unsharded_step_us = 0;
    untimed.loss = nullptr;
    EXPECT_TRUE(throws_with<ValueError>([&] { plan_parallelism(fresh, 0, untimed); }, {"[parallelize]", "ParallelizeOptions::loss"}));
    ParallelizeOptions piped = options;
    piped.pipeline_axis = "x";
    EXPECT_TRUE(throws_with<ValueError>([&] { plan_parallelism(fresh, 0, piped); }, {"[parallelize]", "TransformerLM"}));
  });
}
