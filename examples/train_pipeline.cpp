// train_pipeline: the transformer LM of train_lm trained with pipeline parallelism (tessera/mpmd)
// on a pp x dp x tp MultiMesh: stage 0 (tok, pos, blocks.0) and stage 1 (blocks.1, norm, head)
// each on its own dp x tp submesh, tensor parallel over tp and fully sharded over dp inside the
// stage, 1F1B over 4 microbatches, AdamW. Activations and their gradients cross the stage
// boundary by isend/irecv between the ranks at the same (dp, tp) coordinates. Then it trains the
// same model (same seed) on one device, checks that both end with the same parameters, and
// prints the schedule, the bubble and what moved. Exits 1 if the check fails.
//
// With --parallelize, mpmd::parallelize chooses the stage boundaries and the plan inside each
// stage (printing every candidate's estimate) and make_pipeline runs it.
//
// With --interleaved the model is cut into four chunks (embeddings, block 0, block 1, norm and
// head) cycling over the two stage meshes, each rank running two (Megatron's interleaved 1F1B).
//
// Run: train_pipeline --ranks 8 [--steps 10 --microbatches 4 --gpipe | --interleaved | --parallelize]
// (threads), or
// mpirun -np 8 train_pipeline. Any even world works (dp 2 where the stage's ranks are even; --ranks 4: dp 2 x tp 1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/tessera.hpp>

#include "lm_task.hpp"

using namespace tessera;

namespace {

struct Options {
  int steps = 10;
  int64_t microbatches = 4;
  bool gpipe = false;
  bool interleaved = false;
  bool parallelize = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) o.steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--microbatches") && i + 1 < argc) o.microbatches = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--gpipe")) o.gpipe = true;
    if (!std::strcmp(argv[i], "--interleaved")) o.interleaved = true;
    if (!std::strcmp(argv[i], "--parallelize")) o.parallelize = true;
  }
  return o;
}

constexpr int64_t kRows = 8;

// The module paths of each stage; interleaved, four chunks cycling over the two meshes.
const std::vector<std::vector<std::string>> kStagePaths = {{"tok", "pos", "blocks.0"}, {"blocks.1", "norm", "head"}};
const std::vector<std::vector<std::string>> kChunkPaths = {{"tok", "pos"}, {"blocks.0"}, {"blocks.1"}, {"norm", "head"}};

std::vector<DTensor*> parameters_under(nn::Module& model, const std::vector<std::string>& paths) {
  std::vector<DTensor*> params;
  for (const auto& [name, p] : model.named_parameters())
    for (const std::string& path : paths)
      if (name.rfind(path + ".", 0) == 0) params.push_back(p);
  return params;
}

DTensor positions(const DeviceMesh& mesh, int64_t seq) {
  return DTensor::from_local(arange(seq), mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
}

DTensor next_token_loss(const DTensor& logits, const DTensor& targets) {
  const int64_t rows = logits.shape()[0] * logits.shape()[1];
  return cross_entropy(reshape(logits, {rows, logits.shape()[2]}), reshape(targets, {rows}));
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  bool ok = true;
  const int status = run(argc, argv, [&] {
    const int n = world_size();
    TESSERA_CHECK(n % 2 == 0, ValueError, "train_pipeline", "needs an even number of ranks (2 stages), got ", n);
    const int64_t per_stage = n / 2, dp = per_stage % 2 == 0 ? 2 : 1, tp = per_stage / dp;
    const mpmd::MultiMesh mm({2, dp, tp}, {"pp", "dp", "tp"});
    const std::vector<DeviceMesh> stage_meshes = mm.split("pp");
    const bool speaker = rank() == 0;
    const nn::TransformerConfig config = examples::lm_config();

    // Each rank builds the model on its stage's mesh with the reference's seed (so the weights
    // equal the reference's) and keeps its stage's modules; the stage shards them dp x tp.
    int64_t my_stage = 0;
    for (size_t s = 0; s < stage_meshes.size(); ++s)
      if (stage_meshes[s].is_member()) my_stage = static_cast<int64_t>(s);
    const DeviceMesh& mesh = stage_meshes[static_cast<size_t>(my_stage)];
    manual_seed(2024);
    nn::TransformerLM model(mesh, config);
    std::optional<mpmd::ParallelPlan> plan;
    if (options.parallelize) {
      mpmd::ParallelizeOptions choose;
      choose.batch = kRows;
      choose.seq = config.max_seq;
      choose.pipeline_axis = "pp";
      choose.microbatches = options.microbatches;
      plan = mpmd::parallelize(model, mm.global(), 0, choose);
    } else {
      nn::parallelize_module(model, "tp", nn::transformer_tp_plan());
      nn::fully_shard(model, "dp");
    }
    std::vector<std::string> my_paths = kStagePaths[static_cast<size_t>(my_stage)];
    if (options.interleaved) {
      my_paths = kChunkPaths[static_cast<size_t>(my_stage)];
      my_paths.insert(my_paths.end(), kChunkPaths[static_cast<size_t>(my_stage + 2)].begin(),
                      kChunkPaths[static_cast<size_t>(my_stage + 2)].end());
    }
    const std::vector<DTensor*> params = plan ? mpmd::stage_parameters(model, *plan) : parameters_under(model, my_paths);
    nn::AdamW optimizer(params, 3e-3, 0.9, 0.99, 1e-8, 0.01);

    const auto block = [&](int64_t i) -> const nn::TransformerBlock& {
      return dynamic_cast<const nn::TransformerBlock&>(model.submodule("blocks." + std::to_string(i)));
    };
    const auto& tok = dynamic_cast<const nn::Embedding&>(model.submodule("tok"));
    const auto& pos = dynamic_cast<const nn::Embedding&>(model.submodule("pos"));
    const auto& norm = dynamic_cast<const nn::RMSNorm&>(model.submodule("norm"));
    const auto& head = dynamic_cast<const nn::Linear&>(model.submodule("head"));
    std::vector<mpmd::Stage> stages{
        {stage_meshes[0],
         [&](const DTensor& tokens) {
           return block(0).forward(add(tok.forward(tokens), pos.forward(positions(mesh, tokens.shape()[1]))));
         }},
        {stage_meshes[1], [&](const DTensor& x) { return head.forward(norm.forward(block(1).forward(x))); }}};
    if (options.interleaved)
      stages = {{stage_meshes[0],
                 [&](const DTensor& tokens) { return add(tok.forward(tokens), pos.forward(positions(mesh, tokens.shape()[1]))); }},
                {stage_meshes[1], [&](const DTensor& x) { return block(0).forward(x); }},
                {stage_meshes[0], [&](const DTensor& x) { return block(1).forward(x); }},
                {stage_meshes[1], [&](const DTensor& x) { return head.forward(norm.forward(x)); }}};
    mpmd::PipelineOptions pipeline_options;
    pipeline_options.schedule = options.interleaved ? mpmd::Schedule::interleaved_one_f_one_b
                                : options.gpipe     ? mpmd::Schedule::gpipe
                                                    : mpmd::Schedule::one_f_one_b;
    pipeline_options.microbatches = options.microbatches;
    mpmd::Pipeline pipeline = plan ? mpmd::make_pipeline(model, *plan) : mpmd::Pipeline(stages, next_token_loss, pipeline_options);

    if (speaker) {
      std::cout << "Pipeline-parallel training of a " << config.layers << "-layer transformer LM on "
                << mm.global().to_string() << " ("
                << (options.interleaved ? "interleaved 1F1B" : options.gpipe ? "GPipe" : "1F1B") << ", "
                << options.microbatches << " microbatches of a batch of " << kRows << ")\n";
      const auto& paths = plan                  ? plan->chosen.strategy.pipeline->modules
                          : options.interleaved ? kChunkPaths
                                                : kStagePaths;
      for (size_t s = 0; s < paths.size(); ++s) {
        std::cout << "  stage " << s << " on " << stage_meshes[s % 2].to_string() << ":";
        for (const std::string& p : paths[s]) std::cout << ' ' << p;
        std::cout << "\n";
      }
      std::cout << "  inside each stage: "
                << (plan ? plan->chosen.name()
                         : "tp splits heads, MLP hidden and vocabulary; dp splits the batch, parameters fully sharded")
                << "\n\nschedule:\n"
                << pipeline.describe() << "\n";
    }
    const Placements data = plan ? plan->data : Placements{Shard{0}, Replicate{}};
    std::string step_comm;
    double loss = 0;
    for (int step = 0; step < options.steps; ++step) {
      const auto [ids, next] = examples::counting_batch(step, kRows, config.max_seq, config.vocab);
      std::optional<CommDebugMode> counting;
      if (step == 1) counting.emplace();
      for (DTensor* p : params) p->set_grad(DTensor());
      loss = pipeline.step(distribute_tensor(ids, stage_meshes[0], data), distribute_tensor(next, stage_meshes[1], data));
      optimizer.set_lr(nn::warmup_cosine_lr(step, 3, options.steps, 3e-3, 3e-4));
      optimizer.step();
      if (counting) step_comm = counting->to_string();
      if (speaker) std::printf("step %2d  loss %.4f\n", step, loss);
    }
    // Each rank's idle share and bytes across the stage boundary, gathered for rank 0.
    const mpmd::PipelineStats& stats = pipeline.stats();
    const double mine[4] = {stats.bubble(), stats.step_seconds, static_cast<double>(stats.bytes_sent),
                            static_cast<double>(stats.bytes_received)};
    std::vector<double> all(static_cast<size_t>(4 * n));
    world().all_gather(mine, all.data(), 4, DType::f64);

    // The reference: the whole model on every rank, no split, the whole batch per step.
    manual_seed(2024);
    nn::TransformerLM reference(mm.global(), config);
    const Placements whole(3, Replicate{});
    nn::AdamW reference_optimizer(reference.parameters(), 3e-3, 0.9, 0.99, 1e-8, 0.01);
    double ref_loss = 0;
    for (int step = 0; step < options.steps; ++step) {
      const auto [ids, next] = examples::counting_batch(step, kRows, config.max_seq, config.vocab);
      reference.zero_grad();
      const DTensor l =
          reference.loss(distribute_tensor(ids, mm.global(), whole), distribute_tensor(next, mm.global(), whole));
      l.backward();
      reference_optimizer.set_lr(nn::warmup_cosine_lr(step, 3, options.steps, 3e-3, 3e-4));
      reference_optimizer.step();
      ref_loss = l.full_tensor().item();
    }
    // This stage's parameters against the reference's of the same paths; the worst over ranks.
    double max_diff = 0;
    std::string worst;
    for (const auto& [name, p] : model.named_parameters()) {
      if (std::find(params.begin(), params.end(), p) == params.end()) continue;
      const DTensor* ref = nullptr;
      for (const auto& [ref_name, q] : reference.named_parameters())
        if (ref_name == name) ref = q;
      const double diff = amax(abs(sub(p->full_tensor(), ref->full_tensor()))).item();
      if (diff > max_diff) max_diff = diff, worst = name;
    }
    double worst_over_ranks = max_diff;
    world().all_reduce(&worst_over_ranks, 1, DType::f64, ReduceOp::max);
    // f32: microbatches and shards sum in another order; Adam magnifies the last bits.
    constexpr double kTolerance = 1e-3;
    ok = worst_over_ranks <= kTolerance && std::abs(loss - ref_loss) <= kTolerance;
    if (speaker) {
      std::cout << "\n" << (ok ? "EQUIVALENT" : "MISMATCH") << ": after " << options.steps
                << " steps every stage's parameters equal single-device training within " << kTolerance
                << " (largest difference " << worst_over_ranks << "); final loss " << loss << " vs " << ref_loss
                << "\n\nlast step per rank (bubble: the share of the step spent waiting for the other stage; "
                << "ideal " << stats.ideal_bubble << " with equal stages):\n"
                << "rank  stage  step ms  bubble  bytes sent  bytes received (across the stage boundary)\n";
      for (int r = 0; r < n; ++r) {
        const double* v = &all[static_cast<size_t>(4 * r)];
        std::printf("%4d  %5d  %7.1f  %6.2f  %10.0f  %14.0f\n", r, r < n / 2 ? 0 : 1, v[1] * 1e3, v[0], v[2], v[3]);
      }
      std::cout << "\nCommunication of one step on rank 0 (its stage's collectives and the boundary's sends):\n"
                << step_comm << "\n";
    }
  });
  return status != 0 ? status : (ok ? 0 : 1);
}
