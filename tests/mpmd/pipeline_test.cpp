// Pipeline parallelism and microbatching equal the unsplit step: an MLP of four layers, its
// layers split into 2-4 stages (uneven stage sizes) on the submeshes of a pp x dp MultiMesh, run
// by GPipe and 1F1B over several microbatch counts; the loss and every layer's gradient match
// the single-device computation (f64, 1e-12). Also the schedules' shape, and a stage that throws.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/microbatch.hpp>
#include <tessera/mpmd/multimesh.hpp>
#include <tessera/mpmd/pipeline.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using namespace tessera::mpmd;

namespace {

constexpr int64_t kWidth = 6, kLayers = 4, kBatch = 10;

Tensor smooth(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.61 + seed).reshape(shape) * 0.7;
}

// Layer k: x -> tanh(x W_k + b_k) (the last without tanh).
Tensor reference_layer(const Tensor& x, const Tensor& w, const Tensor& b, bool last) {
  const Tensor y = matmul(x, w) + b;
  return last ? y : tanh(y);
}
DTensor layer(const DTensor& x, const DTensor& w, const DTensor& b, bool last) {
  const DTensor y = matmul(x, w) + b;
  return last ? y : tanh(y);
}

struct Reference {
  double loss;
  std::vector<Tensor> weight_grads, bias_grads;
};

Reference unsplit(const Tensor& input, const Tensor& target) {
  std::vector<Tensor> ws, bs;
  Tensor x = input;
  for (int64_t k = 0; k < kLayers; ++k) {
    ws.push_back(smooth({kWidth, kWidth}, 0.3 * static_cast<double>(k)).requires_grad_());
    bs.push_back(smooth({kWidth}, 1.0 + static_cast<double>(k)).requires_grad_());
    x = reference_layer(x, ws.back(), bs.back(), k + 1 == kLayers);
  }
  const Tensor loss = mse_loss(x, target);
  loss.backward();
  Reference r{loss.item<double>(), {}, {}};
  for (int64_t k = 0; k < kLayers; ++k) {
    r.weight_grads.push_back(ws[static_cast<size_t>(k)].grad());
    r.bias_grads.push_back(bs[static_cast<size_t>(k)].grad());
  }
  return r;
}

// The MLP's layers [first, first + count) as one stage on `mesh` (parameters Replicate there).
struct StageParams {
  std::vector<DTensor> weights, biases;
  std::vector<int64_t> layers;
};

// Runs the MLP's layers split `sizes` over stages on `meshes` and compares with the unsplit step.
void expect_equal_to_unsplit(const std::vector<DeviceMesh>& meshes, const std::vector<int64_t>& sizes,
                             Schedule schedule, int64_t microbatches, const std::string& what) {
  const Tensor input = smooth({kBatch, kWidth}, 0.2), target = smooth({kBatch, kWidth}, 2.9);
  const Reference expected = unsplit(input, target);
  const size_t pp = meshes.size();
  std::vector<StageParams> params(pp);
  std::vector<Stage> stages;
  int64_t next_layer = 0;
  for (size_t s = 0; s < pp; ++s) {
    StageParams& p = params[s];
    const Placements whole(static_cast<size_t>(meshes[s].ndim()), Replicate{});
    for (int64_t i = 0; i < sizes[s]; ++i, ++next_layer) {
      const int64_t k = next_layer;
      p.layers.push_back(k);
      p.weights.push_back(distribute_tensor(smooth({kWidth, kWidth}, 0.3 * static_cast<double>(k)), meshes[s], whole).requires_grad_());
      p.biases.push_back(distribute_tensor(smooth({kWidth}, 1.0 + static_cast<double>(k)), meshes[s], whole).requires_grad_());
    }
    stages.push_back({meshes[s], [&p](const DTensor& x) {
                        DTensor y = x;
                        for (size_t i = 0; i < p.layers.size(); ++i)
                          y = layer(y, p.weights[i], p.biases[i], p.layers[i] + 1 == kLayers);
                        return y;
                      }});
  }
  Pipeline pipeline(stages, [](const DTensor& y, const DTensor& t) { return mse_loss(y, t); },
                    {schedule, microbatches, 0});
  // The batch split over each stage's first mesh dim.
  const auto batch_split = [](const DeviceMesh& mesh) {
    Placements p(static_cast<size_t>(mesh.ndim()), Replicate{});
    p[0] = Shard{0};
    return p;
  };
  const DTensor x = distribute_tensor(input, meshes.front(), batch_split(meshes.front()));
  const DTensor t = distribute_tensor(target, meshes.back(), batch_split(meshes.back()));
  const double loss = pipeline.step(x, t);
  EXPECT_NEAR(loss, expected.loss, 1e-12 * std::abs(expected.loss)) << what;
  if (pipeline.my_stages().empty()) return;  // a rank in no stage
  for (int64_t s : pipeline.my_stages()) {
    const StageParams& mine = params[static_cast<size_t>(s)];
    for (size_t i = 0; i < mine.layers.size(); ++i) {
      const auto k = static_cast<size_t>(mine.layers[i]);
      EXPECT_TRUE(allclose(mine.weights[i].grad().full_tensor(), expected.weight_grads[k], 1e-12, 1e-13))
          << what << ": layer " << k << " weight gradient";
      EXPECT_TRUE(allclose(mine.biases[i].grad().full_tensor(), expected.bias_grads[k], 1e-12, 1e-13))
          << what << ": layer " << k << " bias gradient";
    }
  }
  EXPECT_GT(pipeline.stats().bytes_sent + pipeline.stats().bytes_received, 0) << what;
  // (P - 1) / (v n + P - 1) over P meshes running v stages each.
  const auto P = static_cast<double>(pipeline.meshes()), v = static_cast<double>(pp) / P;
  EXPECT_EQ(pipeline.stages_per_mesh() * pipeline.meshes(), pipeline.stages());
  EXPECT_NEAR(pipeline.stats().ideal_bubble, (P - 1) / (v * static_cast<double>(microbatches) + P - 1), 1e-15);
}

// Every pp x dp factorisation of the world with pp >= 2, uneven layer splits.
void expect_pipeline_equals_unsplit(Schedule schedule, int64_t microbatches) {
  const int n = world_size();
  for (int pp = 2; pp <= std::min(n, 4); ++pp) {
    if (n % pp) continue;
    const int dp = n / pp;
    const MultiMesh mm({pp, dp}, {"pp", "dp"});
    // Uneven stages: the first stage takes the remainder of the layers.
    std::vector<int64_t> sizes(static_cast<size_t>(pp), kLayers / pp);
    sizes.front() += kLayers % pp;
    if (pp == 2) sizes = {1, 3};
    expect_equal_to_unsplit(mm.split("pp"), sizes, schedule, microbatches,
                            "pp " + std::to_string(pp) + " x dp " + std::to_string(dp) + ", " +
                                std::to_string(microbatches) + " microbatches, " +
                                (schedule == Schedule::gpipe ? "GPipe" : "1F1B"));
  }
}

}  // namespace

TEST(Pipeline, GPipeEqualsTheUnsplitStep) {
  for_each_world({2, 4, 6}, [] {
    for (int64_t microbatches : {1, 3, 4}) expect_pipeline_equals_unsplit(Schedule::gpipe, microbatches);
  });
}

TEST(Pipeline, OneFOneBEqualsTheUnsplitStep) {
  for_each_world({2, 4, 6}, [] {
    for (int64_t microbatches : {1, 3, 4, 7}) expect_pipeline_equals_unsplit(Schedule::one_f_one_b, microbatches);
  });
}

// 1F1B: stage s runs S - 1 - s forwards ahead, then alternates; every microbatch's F precedes
// its B, each appears once, and the last stage alternates from the start.
TEST(Pipeline, ScheduleShapes) {
  for (int64_t stages : {1, 2, 4})
    for (int64_t n : {1, 2, 4, 8})
      for (int64_t s = 0; s < stages; ++s) {
        const auto actions = schedule_actions(Schedule::one_f_one_b, s, stages, n);
        ASSERT_EQ(static_cast<int64_t>(actions.size()), 2 * n);
        std::vector<int> forward_at(static_cast<size_t>(n), -1), backward_at(static_cast<size_t>(n), -1);
        int in_flight = 0, most = 0;
        for (size_t a = 0; a < actions.size(); ++a) {
          EXPECT_EQ(actions[a].stage, s);
          auto& at = actions[a].forward ? forward_at : backward_at;
          EXPECT_EQ(at[static_cast<size_t>(actions[a].microbatch)], -1);
          at[static_cast<size_t>(actions[a].microbatch)] = static_cast<int>(a);
          in_flight += actions[a].forward ? 1 : -1;
          most = std::max(most, in_flight);
        }
        for (int64_t i = 0; i < n; ++i) EXPECT_LT(forward_at[static_cast<size_t>(i)], backward_at[static_cast<size_t>(i)]);
        // 1F1B's point: at most S - s microbatches' activations held, against n for GPipe.
        EXPECT_LE(most, std::min(stages - s, n));
        if (s == stages - 1 && n > 1) {
          EXPECT_FALSE(actions[1].forward);
        }
      }
  const auto gpipe = schedule_actions(Schedule::gpipe, 0, 3, 3);
  EXPECT_TRUE(gpipe[0].forward && gpipe[2].forward && !gpipe[3].forward);
}

namespace {

// A rank's schedule as torch.distributed.pipelining prints it: "0F0 0F1 0B0 ...".
std::string schedule_string(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const PipelineAction& a : actions) out.append(out.empty() ? "" : " ").append(a.to_string());
  return out;
}

}  // namespace

// Golden schedules, as torch's Schedule1F1B and ScheduleGPipe and Megatron-LM's interleaved
// 1F1B order them.
TEST(Pipeline, GoldenSchedules) {
  EXPECT_EQ((PipelineAction{true, 2, 0}).to_string(), "2F0");
  EXPECT_EQ((PipelineAction{false, 11, 13}).to_string(), "11B13");
  EXPECT_EQ(schedule_string(schedule_actions(Schedule::gpipe, 1, 2, 3)), "1F0 1F1 1F2 1B0 1B1 1B2");
  // 1F1B over 3 stages and 4 microbatches: S - 1 - s forwards ahead, then F and B in turn.
  const std::vector<std::string> one_f_one_b{"0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3", "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
                                             "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"};
  for (int64_t s = 0; s < 3; ++s)
    EXPECT_EQ(schedule_string(schedule_actions(Schedule::one_f_one_b, s, 3, 4)), one_f_one_b[static_cast<size_t>(s)]);
  // Fewer microbatches than stages: the warm-up is every forward.
  EXPECT_EQ(schedule_string(schedule_actions(Schedule::one_f_one_b, 0, 4, 2)), "0F0 0F1 0B0 0B1");
  // Interleaved over 2 meshes of 2 stages each (mesh 0 runs stages 0 and 2), 4 microbatches:
  // mesh 0 warms up with 4 forwards (microbatches 0, 1 through stage 0, then through stage 2).
  EXPECT_EQ(schedule_string(pipeline_actions(Schedule::interleaved_one_f_one_b, 0, 2, 2, 4)),
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  EXPECT_EQ(schedule_string(pipeline_actions(Schedule::interleaved_one_f_one_b, 1, 2, 2, 4)),
            "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
  // Without interleaving, pipeline_actions is the stage's schedule.
  EXPECT_EQ(pipeline_actions(Schedule::one_f_one_b, 1, 3, 1, 4), schedule_actions(Schedule::one_f_one_b, 1, 3, 4));
}

// describe() prints each mesh's schedule as run.
TEST(Pipeline, DescribesItsSchedule) {
  for_each_world({2}, [] {
    if (world_size() % 2) return;
    const MultiMesh mm({2, world_size() / 2}, {"pp", "dp"});
    const std::vector<DeviceMesh> two = mm.split("pp");
    const auto identity = [](const DTensor& x) { return x; };
    const auto loss = [](const DTensor& y, const DTensor&) { return sum(y); };
    const Pipeline plain({{two[0], identity}, {two[1], identity}}, loss, {Schedule::one_f_one_b, 3, 0});
    EXPECT_EQ(plain.describe(), "stage 0: 0F0 0F1 0B0 0F2 0B1 0B2\nstage 1: 1F0 1B0 1F1 1B1 1F2 1B2\n");
    const Pipeline interleaved({{two[0], identity}, {two[1], identity}, {two[0], identity}, {two[1], identity}}, loss,
                               {Schedule::interleaved_one_f_one_b, 2, 0});
    EXPECT_EQ(interleaved.meshes(), 2);
    EXPECT_EQ(interleaved.stages_per_mesh(), 2);
    EXPECT_EQ(interleaved.describe(),
              "stages 0, 2: 0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1\nstages 1, 3: 1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1\n");
  });
}

// Interleaved 1F1B: four one-layer stages cycling over two meshes (each rank runs two), and
// over four meshes of one rank where the world allows, equal the unsplit step.
TEST(Pipeline, InterleavedOneFOneBEqualsTheUnsplitStep) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const MultiMesh mm({2, n / 2}, {"pp", "dp"});
    const std::vector<DeviceMesh> two = mm.split("pp");
    for (int64_t microbatches : {2, 4, 6})
      expect_equal_to_unsplit({two[0], two[1], two[0], two[1]}, {1, 1, 1, 1}, Schedule::interleaved_one_f_one_b,
                              microbatches, "interleaved over 2 meshes, " + std::to_string(microbatches) + " microbatches");
    // Uneven stages, one of them empty (it passes its input on), on single-rank meshes.
    if (n >= 4) {
      const DeviceMesh r0({1}, {"dp"}, {0}), r1({1}, {"dp"}, {1});
      expect_equal_to_unsplit({r0, r1, r0, r1}, {2, 1, 0, 1}, Schedule::interleaved_one_f_one_b, 4,
                              "interleaved, single ranks, an empty stage");
    }
  });
}

// Megatron's interleaved order: every (stage, microbatch) forward and backward once, the forward
// first, each rank running only its stages, and the schedule free of deadlock when replayed
// against the dependencies (F(s, i) after F(s - 1, i); B(s, i) after B(s + 1, i) and F(s, i)).
TEST(Pipeline, InterleavedScheduleShape) {
  for (int64_t groups : {2, 3, 4})
    for (int64_t chunks : {1, 2, 3})
      for (int64_t rounds : {1, 2, 3}) {
        const int64_t n = groups * rounds, stages = groups * chunks;
        std::vector<std::vector<PipelineAction>> plans;
        for (int64_t p = 0; p < groups; ++p)
          plans.push_back(pipeline_actions(Schedule::interleaved_one_f_one_b, p, groups, chunks, n));
        std::set<std::tuple<bool, int64_t, int64_t>> done;
        std::vector<size_t> next(static_cast<size_t>(groups), 0);
        const auto ready = [&](const PipelineAction& a) {
          if (a.forward) return a.stage == 0 || done.count({true, a.stage - 1, a.microbatch}) > 0;
          return done.count({true, a.stage, a.microbatch}) > 0 &&
                 (a.stage + 1 == stages || done.count({false, a.stage + 1, a.microbatch}) > 0);
        };
        // Replay: any rank whose next action is ready runs it; stuck means a deadlock.
        for (bool progress = true; progress;) {
          progress = false;
          for (int64_t p = 0; p < groups; ++p) {
            auto& i = next[static_cast<size_t>(p)];
            while (i < plans[static_cast<size_t>(p)].size() && ready(plans[static_cast<size_t>(p)][i])) {
              const PipelineAction& a = plans[static_cast<size_t>(p)][i++];
              EXPECT_EQ(a.stage % groups, p);
              EXPECT_TRUE(done.insert({a.forward, a.stage, a.microbatch}).second);
              progress = true;
            }
          }
        }
        EXPECT_EQ(static_cast<int64_t>(done.size()), 2 * n * stages)
            << "deadlock: P " << groups << ", v " << chunks << ", n " << n;
      }
}

// One layer's step on a batch of kBatch + 1 rows, unsplit on one rank: the loss and the gradients
// of w and b (wr, br) that microbatching must reproduce.
struct UnsplitStep {
  Tensor input = smooth({kBatch + 1, kWidth}, 0.5), target = smooth({kBatch + 1, kWidth}, 1.5);
  Tensor w = smooth({kWidth, kWidth}, 0.9), b = smooth({kWidth}, 0.4);
  Tensor wr = w.clone().requires_grad_(), br = b.clone().requires_grad_();
  Tensor loss = mse_loss(reference_layer(input, wr, br, false), target);
  UnsplitStep() { loss.backward(); }
};

// microbatch: the step's gradients and loss equal the unsplit step's on a dp-sharded batch.
TEST(Microbatch, AccumulatesTheUnsplitGradients) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh = line_mesh();
    const UnsplitStep ref;
    const Tensor &input = ref.input, &target = ref.target, &w = ref.w, &b = ref.b, &wr = ref.wr, &br = ref.br;
    const Tensor& expected = ref.loss;
    for (int64_t n : {1, 2, 3, 5}) {
      DTensor wd = distribute_tensor(w, mesh, {Replicate{}}).requires_grad_();
      DTensor bd = distribute_tensor(b, mesh, {Replicate{}}).requires_grad_();
      const DTensor loss = microbatch(
          [&](const std::vector<DTensor>& in) { return mse_loss(layer(in[0], wd, bd, false), in[1]); },
          {distribute_tensor(input, mesh, {Shard{0}}), distribute_tensor(target, mesh, {Shard{0}})}, 0, n);
      EXPECT_NEAR(loss.full_tensor().item<double>(), expected.item<double>(), 1e-12) << n << " microbatches";
      EXPECT_TRUE(allclose(wd.grad().full_tensor(), wr.grad(), 1e-12, 1e-13)) << n << " microbatches";
      EXPECT_TRUE(allclose(bd.grad().full_tensor(), br.grad(), 1e-12, 1e-13)) << n << " microbatches";
    }
    // The function-transform form gives the same step.
    {
      DTensor wd = distribute_tensor(w, mesh, {Replicate{}}).requires_grad_();
      DTensor bd = distribute_tensor(b, mesh, {Replicate{}}).requires_grad_();
      const auto step = microbatch([&](const std::vector<DTensor>& in) { return mse_loss(layer(in[0], wd, bd, false), in[1]); },
                                   0, 3);
      const DTensor loss = step({distribute_tensor(input, mesh, {Shard{0}}), distribute_tensor(target, mesh, {Shard{0}})});
      EXPECT_NEAR(loss.full_tensor().item<double>(), expected.item<double>(), 1e-12);
      EXPECT_TRUE(allclose(wd.grad().full_tensor(), wr.grad(), 1e-12, 1e-13));
    }
    // NoSync: the gradients are reduced once per step, whatever the microbatch count.
    const auto gradient_reductions = [&](int64_t n) {
      DTensor wd = distribute_tensor(w, mesh, {Replicate{}}).requires_grad_();
      DTensor bd = distribute_tensor(b, mesh, {Replicate{}}).requires_grad_();
      const DTensor xs = distribute_tensor(input, mesh, {Shard{0}}), ts = distribute_tensor(target, mesh, {Shard{0}});
      CommDebugMode debug;
      microbatch([&](const std::vector<DTensor>& in) { return mse_loss(layer(in[0], wd, bd, false), in[1]); }, {xs, ts},
                 0, n);
      EXPECT_EQ(wd.grad().placements(), (Placements{Replicate{}}));
      return debug.total_bytes_received();
    };
    // One reduction of the weight's and the bias's gradients (plus the loss's scalars), not five.
    const int64_t one = gradient_reductions(1), five = gradient_reductions(5);
    EXPECT_GE(one, (kWidth * kWidth + kWidth) * 8);
    EXPECT_LT(five, 2 * one);
    // Inputs cut differently would pair rows wrongly: refused.
    EXPECT_TRUE(sharding_error([&] {
      microbatch([](const std::vector<DTensor>& in) { return sum(in[0]); },
                 {distribute_tensor(input, mesh, {Shard{0}}), distribute_tensor(target, mesh, {Replicate{}})}, 0, 2);
    }, {"[microbatch]", "every input needs the first input's layout along dim 0"}));
  });
}

// microbatch with argnums (multimesh.jax's argnum): only the named inputs are split; the weight,
// passed as an input, goes whole to every microbatch and its gradient accumulates.
TEST(Microbatch, ArgnumsSplitOnlyTheNamedInputs) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh = line_mesh();
    const UnsplitStep ref;
    const Tensor &input = ref.input, &target = ref.target, &w = ref.w, &b = ref.b, &wr = ref.wr, &br = ref.br;
    const Tensor& expected = ref.loss;
    const auto step = [](const std::vector<DTensor>& in) { return mse_loss(layer(in[1], in[0], in[3], false), in[2]); };
    for (int64_t n : {1, 2, 5}) {
      // The weight is Replicate and the batch Shard(0): without argnums their layouts along dim 0
      // differ and microbatch refuses them.
      DTensor wd = distribute_tensor(w, mesh, {Replicate{}}).requires_grad_();
      DTensor bd = distribute_tensor(b, mesh, {Replicate{}}).requires_grad_();
      const DTensor xs = distribute_tensor(input, mesh, {Shard{0}}), ts = distribute_tensor(target, mesh, {Shard{0}});
      const DTensor loss = microbatch(step, 0, n, {1, 2})({wd, xs, ts, bd});
      EXPECT_NEAR(loss.full_tensor().item<double>(), expected.item<double>(), 1e-12) << n << " microbatches";
      EXPECT_TRUE(allclose(wd.grad().full_tensor(), wr.grad(), 1e-12, 1e-13)) << n << " microbatches";
      EXPECT_TRUE(allclose(bd.grad().full_tensor(), br.grad(), 1e-12, 1e-13)) << n << " microbatches";
    }
    const DTensor wd = distribute_tensor(w, mesh, {Replicate{}}), bd = distribute_tensor(b, mesh, {Replicate{}});
    const DTensor xs = distribute_tensor(input, mesh, {Shard{0}}), ts = distribute_tensor(target, mesh, {Shard{0}});
    EXPECT_TRUE(sharding_error(
        [&] {
          microbatch(step, {wd, xs, ts, bd}, 0, 2);
        },
        {"[microbatch]", "every input needs the first input's layout along dim 0"}));
    EXPECT_TRUE(value_error(
        [&] {
          microbatch(step, {wd, xs, ts, bd}, 0, 2, {1, 4});
        },
        {"[microbatch]", "argnum 4 is out of range for 4 inputs"}));
    EXPECT_TRUE(value_error(
        [&] {
          microbatch(step, {wd, xs, ts, bd}, 0, 2, {2, 2});
        },
        {"[microbatch]", "argnum 2 is named twice"}));
  });
}

// Stages on meshes of different shapes and sizes: the boundary moves each destination block's
// pieces from the source ranks holding them (dp 2 x tp 2 -> dp 2 -> a single rank), and a rank
// in no stage only learns the loss.
TEST(Pipeline, StagesOnMeshesOfDifferentShapes) {
  for_each_world({6}, [] {
    if (world_size() < 6) return;
    const DeviceMesh grid({2, 2}, {"dp", "tp"}, {0, 1, 2, 3}), pair({2}, {"dp"}, {4, 5}), single({1}, {"dp"}, {5});
    for (Schedule schedule : {Schedule::gpipe, Schedule::one_f_one_b}) {
      expect_equal_to_unsplit({grid, pair}, {2, 2}, schedule, 3, "dp2 x tp2 -> dp2");
      expect_equal_to_unsplit({pair, grid}, {1, 3}, schedule, 4, "dp2 -> dp2 x tp2");
      const DeviceMesh first({2}, {"dp"}, {0, 1}), second({3}, {"dp"}, {2, 3, 4});
      expect_equal_to_unsplit({first, second, single}, {2, 1, 1}, schedule, 3, "dp2 -> dp3 -> 1 rank");
    }
  });
}

TEST(Pipeline, ErrorsNameTheStages) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n < 4) return;
    const DeviceMesh a({2}, {"dp"}, {0, 1}), c({2}, {"dp"}, {1, 2});
    const auto id = [](const DTensor& x) { return x; };
    const auto loss = [](const DTensor& y, const DTensor&) { return sum(y); };
    EXPECT_TRUE(sharding_error([&] { Pipeline({{a, id}, {c, id}}, loss); }, {"[Pipeline]", "world rank 1 is in two stages"}));
    EXPECT_TRUE(sharding_error([&] { Pipeline({}, loss); }, {"[Pipeline]", "no stages"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { Pipeline({{a, id}}, loss, {Schedule::gpipe, 0, 0}); },
                                        {"[Pipeline]", "microbatches = 0"}));
    const DeviceMesh b({2}, {"dp"}, {2, 3});
    const PipelineOptions interleaved{Schedule::interleaved_one_f_one_b, 4, 0};
    EXPECT_TRUE(sharding_error([&] { Pipeline({{a, id}, {b, id}, {a, id}, {a, id}}, loss, interleaved); },
                               {"[Pipeline]", "stage 3's mesh", "is not stage 1's"}));
    EXPECT_TRUE(sharding_error([&] { Pipeline({{a, id}, {a, id}}, loss, interleaved); },
                               {"[Pipeline]", "cycle over P >= 2 meshes"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { Pipeline({{a, id}, {b, id}, {a, id}, {b, id}}, loss, {Schedule::interleaved_one_f_one_b, 3, 0}); },
                                        {"[Pipeline]", "multiple of 2"}));
    // Every (boundary, microbatch) has tags of its own, from the pipeline's range (comm/tags.hpp).
    EXPECT_TRUE(throws_with<ValueError>([&] { Pipeline({{a, id}, {b, id}}, loss, {Schedule::gpipe, int64_t{1} << 26, 0}); },
                                        {"[Pipeline]", "2 stages x 67108864 microbatches", "more message tags"}));
  });
}

// A stage that throws: every rank's step ends with an error, none is left waiting.
TEST(Pipeline, AStageThatThrowsFailsEveryRank) {
  TESSERA_SKIP_UNDER_MPI();
  EXPECT_THROW(launch(4, [] {
                 const MultiMesh mm({2, 2}, {"pp", "dp"});
                 const auto meshes = mm.split("pp");
                 Pipeline pipeline({{meshes[0], [](const DTensor& x) { return x * Scalar(2.0); }},
                                    {meshes[1], [](const DTensor& x) -> DTensor {
                                       if (rank() == 3) throw ValueError("stage 1 failed on purpose");
                                       return x;
                                     }}},
                                   [](const DTensor& y, const DTensor& t) { return mse_loss(y, t); });
                 const DTensor x = distribute_tensor(smooth({4, 3}, 0.1), meshes[0], {Shard{0}});
                 const DTensor t = distribute_tensor(smooth({4, 3}, 0.2), meshes[1], {Shard{0}});
                 pipeline.step(x, t);
               }),
               Error);
}
