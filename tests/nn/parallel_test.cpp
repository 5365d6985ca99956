// Parallel training equals single-device training: a small transformer LM built after the same
// seed, once unsharded (every tensor whole on every rank: no collective runs) and once under each
// parallel style (tensor parallel, sequence parallel, data parallel, fully sharded, and dp x tp on
// a 2-d mesh), gives the same loss, the same gradient for every parameter and, after a few
// AdamW steps with clipping, the same parameters. Sizes divide unevenly on purpose.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"
#include "tiny_lm.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Placements all(const DeviceMesh& mesh, Placement p) { return Placements(static_cast<size_t>(mesh.ndim()), p); }

struct Setup {
  std::string name;
  std::function<void(nn::TransformerLM&)> parallelize;
  Placements data;  // placements of the token batch
};

// Trains `steps` steps of AdamW with clipping; returns the losses.
std::vector<double> train(nn::TransformerLM& model, const Placements& data, int steps) {
  nn::AdamW optimizer(model.parameters(), 0.01, 0.9, 0.99, 1e-8, 0.01);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const auto [ids, next] = batch(model.config().vocab, step);
    const DTensor tokens = distribute_tensor(ids, model.mesh(), data), targets = distribute_tensor(next, model.mesh(), data);
    model.zero_grad();
    const DTensor loss = model.loss(tokens, targets);
    losses.push_back(loss.full_tensor().item());
    loss.backward();
    nn::clip_grad_norm_(model.parameters(), 1.0);
    optimizer.set_lr(nn::warmup_cosine_lr(step, 1, steps, 0.01));
    optimizer.step();
  }
  return losses;
}

void check_equivalence(const DeviceMesh& mesh, const Setup& setup) {
  SCOPED_TRACE(setup.name + " on " + mesh.to_string());
  manual_seed(7);
  nn::TransformerLM reference(mesh, tiny());
  manual_seed(7);
  nn::TransformerLM model(mesh, tiny());
  setup.parallelize(model);

  // One step's loss and gradients.
  const auto [ids, next] = batch(tiny().vocab, 0);
  const Placements whole = all(mesh, Replicate{});
  const DTensor ref_loss = reference.loss(distribute_tensor(ids, mesh, whole), distribute_tensor(next, mesh, whole));
  ref_loss.backward();
  const DTensor loss = model.loss(distribute_tensor(ids, mesh, setup.data), distribute_tensor(next, mesh, setup.data));
  loss.backward();
  EXPECT_NEAR(loss.full_tensor().item(), ref_loss.full_tensor().item(), 1e-10);
  const auto ref_params = reference.named_parameters(), params = model.named_parameters();
  ASSERT_EQ(ref_params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(params[i].first, ref_params[i].first);
    const DTensor g = params[i].second->grad();
    ASSERT_TRUE(g.defined()) << params[i].first;
    EXPECT_TRUE(g.layout() == params[i].second->layout()) << params[i].first << ": gradient " << g.layout().to_string()
                                                          << " for parameter " << params[i].second->layout().to_string();
    EXPECT_TRUE(allclose(g.full_tensor(), ref_params[i].second->grad().full_tensor(), 1e-8, 1e-10))
        << params[i].first << " in " << params[i].second->layout().to_string();
  }

  // A few optimizer steps: the same losses and parameters.
  const auto ref_losses = train(reference, whole, 3), losses = train(model, setup.data, 3);
  for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], ref_losses[s], 1e-9) << "step " << s;
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(allclose(params[i].second->full_tensor(), ref_params[i].second->full_tensor(), 1e-8, 1e-10))
        << params[i].first << " after training";
}

}  // namespace

TEST(ParallelTraining, TensorAndSequenceParallelOnOneAxis) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    const Placements whole{Replicate{}};
    check_equivalence(mesh, {"tensor parallel", [](nn::TransformerLM& m) { nn::parallelize_module(m, "tp", nn::transformer_tp_plan(false)); }, whole});
    check_equivalence(mesh, {"sequence parallel", [](nn::TransformerLM& m) { nn::parallelize_module(m, "tp", nn::transformer_tp_plan(true)); }, whole});
  });
}

TEST(ParallelTraining, DataParallelAndFullyShardedOnOneAxis) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Placements sharded{Shard{0}};
    check_equivalence(mesh, {"data parallel", [](nn::TransformerLM&) {}, sharded});
    check_equivalence(mesh, {"fully_shard", [](nn::TransformerLM& m) { nn::fully_shard(m, "dp"); }, sharded});
  });
}

TEST(ParallelTraining, DataTimesTensorParallelOnTwoDims) {
  for_each_world({4, 6}, [] {
    const DeviceMesh mesh({2, world_size() / 2}, {"dp", "tp"});
    const Placements data{Shard{0}, Replicate{}};
    check_equivalence(mesh, {"ddp x tp", [](nn::TransformerLM& m) { nn::parallelize_module(m, "tp", nn::transformer_tp_plan(false)); }, data});
    check_equivalence(mesh, {"fsdp x tp", [](nn::TransformerLM& m) {
                               nn::parallelize_module(m, "tp", nn::transformer_tp_plan(false));
                               nn::fully_shard(m, "dp");
                             }, data});
  });
}

TEST(ParallelTraining, GradientsReduceWhereTheStyleSays) {
  for_each_world({4}, [] {
    // DDP: Replicate parameters, sharded batch: the gradients arrive by all_reduce, no reduce_scatter.
    const DeviceMesh mesh({world_size()}, {"dp"});
    manual_seed(7);
    nn::TransformerLM model(mesh, tiny());
    const auto [ids, next] = batch(tiny().vocab, 0);
    const DTensor loss = model.loss(distribute_tensor(ids, mesh, {Shard{0}}), distribute_tensor(next, mesh, {Shard{0}}));
    {
      CommDebugMode mode;
      loss.backward();
      // One bucket for every gradient, and nothing else (the loss's count was reduced in forward).
      EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 1) << mode.to_string();
      EXPECT_EQ(mode.total_count(), 1) << mode.to_string();
    }
    // FSDP: the gradients are reduce-scattered into the Shard(0) parameters.
    manual_seed(7);
    nn::TransformerLM sharded(mesh, tiny());
    nn::fully_shard(sharded, "dp");
    for (const auto& [name, p] : sharded.named_parameters()) EXPECT_EQ(p->placements()[0], Placement(Shard{0})) << name;
    const DTensor loss2 = sharded.loss(distribute_tensor(ids, mesh, {Shard{0}}), distribute_tensor(next, mesh, {Shard{0}}));
    CommDebugMode mode;
    loss2.backward();
    EXPECT_GT(mode.count(CollectiveKind::reduce_scatter) + mode.count(CollectiveKind::reduce_scatter_v) +
                  mode.count(CollectiveKind::all_to_all) + mode.count(CollectiveKind::all_to_all_v),
              0);
  });
}

TEST(ParallelTraining, StateDictLoadsAcrossParallelPlans) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({2, world_size() / 2}, {"dp", "tp"});
    manual_seed(3);
    nn::TransformerLM source(mesh, tiny());  // unsharded
    manual_seed(4);
    nn::TransformerLM target(mesh, tiny());  // other values, tp x fsdp
    nn::parallelize_module(target, "tp", nn::transformer_tp_plan());
    nn::fully_shard(target, "dp");
    const auto state = source.state_dict();
    EXPECT_EQ(state.size(), source.named_parameters().size());
    target.load_state_dict(state);
    for (const auto& [name, p] : target.named_parameters()) {
      EXPECT_TRUE(allclose(p->full_tensor(), state.at(name).full_tensor(), 0, 0)) << name;
      EXPECT_TRUE(p->is_leaf() && p->requires_grad()) << name;
      EXPECT_EQ(p->placements()[0], Placement(Shard{0})) << name;  // the layout stays the target's
    }
    auto missing = state;
    missing.erase("head.weight");
    EXPECT_TRUE(throws_with<ValueError>([&] { target.load_state_dict(missing); },
                                        {"[Module::load_state_dict]", "missing", "head.weight"}));
    auto extra = state;
    extra.emplace("nothing", state.at("head.weight"));
    EXPECT_TRUE(
        throws_with<ValueError>([&] { target.load_state_dict(extra); }, {"[Module::load_state_dict]", "'nothing'"}));
    auto wrong = state;
    wrong.at("head.weight") = state.at("norm.weight");
    EXPECT_TRUE(throws_with<ValueError>([&] { target.load_state_dict(wrong); },
                                        {"[Module::load_state_dict]", "head.weight", "[12]", "[10, 12]"}));
  });
}

TEST(ParallelTraining, Errors) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    manual_seed(1);
    nn::TransformerLM model(mesh, tiny());
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::parallelize_module(model, "tp", {{"blocks.*.nothing", nn::ColwiseParallel{}}}); },
                                        {"[parallelize_module]", "blocks.*.nothing"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::parallelize_module(model, "tp", {{"norm", nn::ColwiseParallel{}}}); },
                                        {"[parallelize_module]", "ColwiseParallel", "'norm'"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::parallelize_module(model, "pp", {{"head", nn::ColwiseParallel{}}}); },
                                        {"[parallelize_module]", "'pp'"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::MultiheadAttention(mesh, 10, 3); }, {"[MultiheadAttention]", "10", "3"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)model.submodule("blocks.9"); }, {"[Module::submodule]", "blocks.9"}));
  });
}

// PyTorch's distribute_module: partition_fn lays out each submodule's parameters (here fc1
// column-wise and fc2 row-wise, by hand), input_fn and output_fn wrap forward. The result and
// the gradients equal the module's with every parameter replicated.
TEST(DistributeModule, PartitionFnAndForwardHooks) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    manual_seed(3);
    nn::MLP reference(mesh, 6, 10);
    manual_seed(3);
    nn::MLP model(mesh, 6, 10);
    std::vector<std::string> visited;
    int inputs = 0, outputs = 0;
    nn::distribute_module(
        model, mesh,
        [&](const std::string& path, nn::Module& module, const DeviceMesh& m) {
          visited.push_back(path);
          if (path == "fc1") {
            module.set_parameter_layout("weight", module.parameter("weight").layout().with_placements({Shard{0}}));
            module.set_parameter_layout("bias", module.parameter("bias").layout().with_placements({Shard{0}}));
          } else if (path == "fc2") {
            module.set_parameter_layout("weight", module.parameter("weight").layout().with_placements({Shard{1}}));
          }
          EXPECT_TRUE(m.spec() == mesh.spec());
        },
        [&](nn::Module&, const DTensor& x, const DeviceMesh& m) {
          ++inputs;
          return x.redistribute(m, {Replicate{}});  // the batch comes sharded; the layers take it whole
        },
        [&](nn::Module&, const DTensor& y, const DeviceMesh& m) {
          ++outputs;
          return y.redistribute(m, {Shard{0}});  // hand the rows back sharded
        });
    EXPECT_EQ(visited, (std::vector<std::string>{"", "fc1", "fc2"}));
    EXPECT_EQ(model.submodule("fc1").parameter("weight").placements(), (Placements{Shard{0}}));
    EXPECT_EQ(model.submodule("fc2").parameter("weight").placements(), (Placements{Shard{1}}));

    std::vector<float> values(30);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
    const Tensor x = from_vector(values, {5, 6});
    const DTensor expected = reference.forward(distribute_tensor(x, mesh, {Replicate{}}));
    const DTensor got = model.forward(distribute_tensor(x, mesh, {Shard{0}}));
    EXPECT_EQ(inputs, 1);
    EXPECT_EQ(outputs, 1);
    EXPECT_EQ(got.placements(), (Placements{Shard{0}}));
    EXPECT_TRUE(allclose(got.full_tensor(), expected.full_tensor(), 1e-5, 1e-6));
    sum(mul(got, got)).backward();
    sum(mul(expected, expected)).backward();
    const auto params = model.named_parameters(), ref_params = reference.named_parameters();
    ASSERT_EQ(params.size(), ref_params.size());
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(
          allclose(params[i].second->grad().full_tensor(), ref_params[i].second->grad().full_tensor(), 1e-4, 1e-5))
          << params[i].first;

    const DeviceMesh other({world_size()}, {"dp"});
    EXPECT_TRUE(value_error([&] { nn::distribute_module(model, other); },
                            {"[distribute_module]", "the module lives on mesh[tp=", "the mesh given is mesh[dp="}));
  });
}
