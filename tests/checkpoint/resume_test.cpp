// Resuming training from a checkpoint of the module and its AdamW state (nn::get_state_dict,
// checkpoint::save / load, nn::set_state_dict): on the same mesh and plan it continues
// bit-identically to a run that never stopped; on another mesh and plan (one rank, DDP, TP x FSDP
// the other way round) it continues as the unsharded run does, to rounding.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include <tessera/checkpoint/checkpoint.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/nn/state_dict.hpp>
#include <tessera/ops/ops.hpp>

#include "checkpoint/checkpoint_test_util.hpp"
#include "nn/tiny_lm.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// A model, its parallel plan and its optimizer; the batch's placements on the plan's mesh.
struct Training {
  DeviceMesh mesh;
  Placements data;
  std::unique_ptr<nn::TransformerLM> model;
  std::unique_ptr<nn::Optimizer> optimizer;
};

using ParallelPlan = std::function<void(nn::TransformerLM&)>;

// AdamW, or SGD with momentum and weight decay.
Training make_run(const DeviceMesh& mesh, const Placements& data, const ParallelPlan& plan, uint64_t seed,
                  bool sgd = false) {
  manual_seed(seed);
  Training run{mesh, data, std::make_unique<nn::TransformerLM>(mesh, tiny()), nullptr};
  plan(*run.model);
  if (sgd) run.optimizer = std::make_unique<nn::SGD>(run.model->parameters(), 0.05, 0.9, 0.01);
  else run.optimizer = std::make_unique<nn::AdamW>(run.model->parameters(), 0.01, 0.9, 0.99, 1e-8, 0.01);
  return run;
}

void train(Training& run, int first_step, int steps) {
  for (int step = first_step; step < first_step + steps; ++step) {
    const auto [ids, next] = batch(tiny().vocab, step);
    run.model->zero_grad();
    const DTensor loss =
        run.model->loss(distribute_tensor(ids, run.mesh, run.data), distribute_tensor(next, run.mesh, run.data));
    loss.backward();
    nn::clip_grad_norm_(run.model->parameters(), 1.0);
    run.optimizer->step();
  }
}

void fsdp_per_block(nn::TransformerLM& m, const std::string& axis) {
  for (int64_t i = 0; i < m.config().layers; ++i) nn::fully_shard(m.submodule("blocks." + std::to_string(i)), axis);
  nn::fully_shard(m, axis);
}

int64_t adamw_steps(const Training& run) { return dynamic_cast<const nn::AdamW&>(*run.optimizer).steps(); }

// The plan a test saves under: TP x FSDP on a 2 x n/2 mesh when the world allows, else FSDP.
Training saving_run(uint64_t seed, bool sgd = false) {
  const int n = world_size();
  if (n % 2 == 0 && n >= 4) {
    return make_run(DeviceMesh({2, n / 2}, {"dp", "tp"}), {Shard{0}, Replicate{}},
                    [](nn::TransformerLM& m) {
                      nn::parallelize_module(m, "tp", nn::transformer_tp_plan(true));
                      fsdp_per_block(m, "dp");
                    },
                    seed, sgd);
  }
  return make_run(DeviceMesh({n}, {"dp"}), {Shard{0}}, [](nn::TransformerLM& m) { fsdp_per_block(m, "dp"); }, seed,
                  sgd);
}

void save_run(const std::string& dir, Training& run) { checkpoint::save(dir, nn::get_state_dict(*run.model, *run.optimizer)); }

void load_run(const std::string& dir, Training& run) {
  std::map<std::string, DTensor> state = nn::get_state_dict(*run.model, *run.optimizer);
  checkpoint::load(dir, state);
  nn::set_state_dict(*run.model, *run.optimizer, state);
}

}  // namespace

// Two steps, a checkpoint, a fresh model and optimizer (other initial values) loaded from it, two
// more steps: every parameter and optimizer state (AdamW's moments and step, SGD's momentum)
// equals, bit for bit, those of four steps without a stop.
TEST(Resume, ContinuesBitIdenticallyOnTheSameMeshAndPlan) {
  for_each_world({2, 3, 4, 6}, [] {
    for (const bool sgd : {false, true}) {  // AdamW (moments, step), SGD (momentum buffers)
      SCOPED_TRACE(sgd ? "SGD" : "AdamW");
      const std::string dir = shared_dir("resume-same");
      Training straight = saving_run(7, sgd);
      train(straight, 0, 4);

      Training first = saving_run(7, sgd);
      train(first, 0, 2);
      save_run(dir, first);
      Training resumed = saving_run(99, sgd);  // other initial parameters: everything must come from the file
      load_run(dir, resumed);
      if (!sgd) {
        EXPECT_EQ(adamw_steps(resumed), 2);
      }
      train(resumed, 2, 2);

      const auto expected = nn::get_state_dict(*straight.model, *straight.optimizer);
      const auto got = nn::get_state_dict(*resumed.model, *resumed.optimizer);
      ASSERT_EQ(got.size(), expected.size());
      for (const auto& [key, value] : expected) {
        ASSERT_TRUE(got.count(key)) << key;
        EXPECT_TRUE(equal(got.at(key).full_tensor(), value.full_tensor())) << key << " differs after resuming";
      }
      if (sgd) {
        EXPECT_TRUE(got.count("optim.blocks.0.mlp.fc1.weight.momentum_buffer"));
      }
      remove_shared(dir);
    }
  });
}

// Saved under TP x FSDP (or FSDP), loaded on one rank, as DDP over every rank, and as TP x FSDP
// with the mesh dims swapped (3 x 2 from 2 x 3): two more steps give the parameters that four
// unsharded steps give.
TEST(Resume, ContinuesOnAnotherMeshAndPlan) {
  for_each_world({2, 4, 6}, [] {
    const int n = world_size();
    const std::string dir = shared_dir("resume-other");
    const DeviceMesh all({n}, {"x"});
    Training reference = make_run(all, {Replicate{}}, [](nn::TransformerLM&) {}, 7);
    train(reference, 0, 4);
    Training first = saving_run(7);
    train(first, 0, 2);
    save_run(dir, first);

    struct Target {
      std::string name;
      DeviceMesh mesh;
      Placements data;
      ParallelPlan plan;
    };
    std::vector<Target> targets = {
        {"one rank", DeviceMesh({1}, {"x"}, {0}), {Replicate{}}, [](nn::TransformerLM&) {}},
        {"ddp", DeviceMesh({n}, {"dp"}), {Shard{0}}, [](nn::TransformerLM&) {}},
    };
    if (n % 2 == 0 && n >= 4)
      targets.push_back({"tp x fsdp, dims swapped", DeviceMesh({n / 2, 2}, {"dp", "tp"}), {Shard{0}, Replicate{}},
                         [](nn::TransformerLM& m) {
                           nn::parallelize_module(m, "tp", nn::transformer_tp_plan(true));
                           fsdp_per_block(m, "dp");
                         }});
    for (const Target& target : targets) {
      SCOPED_TRACE(target.name);
      if (!target.mesh.is_member()) {  // outside the one-rank mesh: no module; load is collective
        std::map<std::string, DTensor> nothing;
        checkpoint::load(dir, nothing);
        continue;
      }
      Training resumed = make_run(target.mesh, target.data, target.plan, 99);
      load_run(dir, resumed);
      EXPECT_EQ(adamw_steps(resumed), 2);
      train(resumed, 2, 2);
      const auto expected = reference.model->named_parameters();
      const auto got = resumed.model->named_parameters();
      for (size_t i = 0; i < expected.size(); ++i)
        EXPECT_TRUE(allclose(got[i].second->full_tensor(), expected[i].second->full_tensor(), 1e-8, 1e-10))
            << got[i].first;
    }
    remove_shared(dir);
  });
}

// A state that does not fit the module or its optimizer is refused before anything is written.
TEST(Resume, SetStateDictNamesWhatIsWrong) {
  for_each_world({2}, [] {
    Training run = saving_run(7);
    const auto good = nn::get_state_dict(*run.model, *run.optimizer);
    const Tensor before = run.model->named_parameters().front().second->full_tensor();
    auto missing = good;
    missing.erase("optim.blocks.0.attn.q.weight.exp_avg");
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::set_state_dict(*run.model, *run.optimizer, missing); },
                                        {"[set_state_dict]", "missing entry 'optim.blocks.0.attn.q.weight.exp_avg'"}));
    auto extra = good;
    extra.emplace("optim.blocks.0.attn.q.weight.momentum_buffer", good.at("optim.blocks.0.attn.q.weight.exp_avg"));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::set_state_dict(*run.model, *run.optimizer, extra); },
                                        {"unexpected entry 'optim.blocks.0.attn.q.weight.momentum_buffer'"}));
    auto misshapen = good;
    misshapen.at("model.head.weight") = distribute_tensor(zeros({3, 3}, DType::f64), run.mesh,
                                                          Placements(static_cast<size_t>(run.mesh.ndim()), Replicate{}));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::set_state_dict(*run.model, *run.optimizer, misshapen); },
                                        {"entry 'model.head.weight' has shape [3, 3]"}));
    EXPECT_TRUE(equal(run.model->named_parameters().front().second->full_tensor(), before));
    nn::Linear stranger(run.mesh, 2, 2, true, DType::f64);
    nn::AdamW foreign(stranger.parameters(), 0.01);
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::get_state_dict(*run.model, foreign); },
                                        {"[get_state_dict]", "is not a parameter of the module"}));
  });
}
