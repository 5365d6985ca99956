// Many in-process ranks (issue 34): the training step of a tiny transformer LM, tensor parallel x
// fully sharded on a dp x tp mesh of 64 (8 x 8) and 256 (16 x 16) thread ranks, gives the losses
// and parameters of the same model trained on one device. tessera_many_ranks_bench times it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// 16 heads, so that tp = 16 still gives every rank a head; f64, so that sharded and unsharded
// runs agree to 1e-10.
nn::TransformerConfig config() {
  nn::TransformerConfig c;
  c.vocab = 32;
  c.dim = 32;
  c.heads = 16;
  c.layers = 1;
  c.max_seq = 4;
  c.hidden = 32;
  c.dtype = DType::f64;
  return c;
}

constexpr int64_t kBatch = 16;  // one sequence per rank on dp = 16
constexpr int kSteps = 2;

// Token ids [kBatch, max_seq] and their next-token targets, different for each step.
std::pair<Tensor, Tensor> batch(int step) {
  const int64_t n = kBatch * config().max_seq, vocab = config().vocab;
  std::vector<int64_t> ids(static_cast<size_t>(n)), next(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = (i * 7 + 3 + step * 5) % vocab;
    next[static_cast<size_t>(i)] = (i * 7 + 10 + step * 5) % vocab;
  }
  return {from_vector(ids, Shape{kBatch, config().max_seq}), from_vector(next, Shape{kBatch, config().max_seq})};
}

struct Trained {
  std::vector<double> losses;
  Tensor head;  // the output head's weight after the last step
};

// kSteps of AdamW with clipping on a dp x tp mesh of the whole world (tp plan and fully_shard on
// meshes of more than one rank); rank 0's losses and head weight.
Trained train(int64_t dp, int64_t tp) {
  Trained result;
  launch(static_cast<int>(dp * tp), [&] {
    const DeviceMesh mesh({dp, tp}, {"dp", "tp"});
    manual_seed(7);
    nn::TransformerLM model(mesh, config());
    if (dp * tp > 1) {
      nn::parallelize_module(model, "tp", nn::transformer_tp_plan(false));
      nn::fully_shard(model, "dp");
    }
    nn::AdamW optimizer(model.parameters(), 0.01, 0.9, 0.99, 1e-8, 0.01);
    const Placements data{Shard{0}, Replicate{}};
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) {
      const auto [ids, next] = batch(step);
      model.zero_grad();
      const DTensor loss = model.loss(distribute_tensor(ids, mesh, data), distribute_tensor(next, mesh, data));
      losses.push_back(loss.full_tensor().item());
      loss.backward();
      nn::clip_grad_norm_(model.parameters(), 1.0);
      optimizer.step();
    }
    const Tensor head = model.submodule("head").parameter("weight").full_tensor();
    if (rank() != 0) return;
    result.losses = losses;
    result.head = head;
  });
  return result;
}

}  // namespace

TEST(ManyRanks, TrainingStepOn64And256RanksEqualsOneDevice) {
  TESSERA_SKIP_UNDER_MPI();
  // Sanitizer runs cap the thread worlds (TESSERA_TEST_MAX_WORLD); this test is about large ones.
  std::vector<int> worlds;
  for (int n : worlds_to_run({1, 64, 256}))
    if (n > 1) worlds.push_back(n);
  if (worlds.empty()) GTEST_SKIP() << "thread worlds capped below 64 ranks (TESSERA_TEST_MAX_WORLD)";
  set_comm_timeout_seconds(60);  // a hang fails in a minute instead of five
  const Trained reference = train(1, 1);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_NE(reference.losses[0], reference.losses[1]);  // the steps train
  for (int ranks : worlds) {
    const int64_t side = ranks == 64 ? 8 : 16;
    SCOPED_TRACE("mesh " + std::to_string(side) + " x " + std::to_string(side));
    const Trained trained = train(side, side);
    ASSERT_EQ(trained.losses.size(), reference.losses.size());
    for (size_t s = 0; s < trained.losses.size(); ++s)
      EXPECT_NEAR(trained.losses[s], reference.losses[s], 1e-10) << "step " << s;
    EXPECT_TRUE(allclose(trained.head, reference.head, 1e-8, 1e-10));
  }
}
