// train_lm: the main example. Trains a small transformer language model on a synthetic
// next-token task on a 2-d mesh dp x tp of ranks: tensor parallel over tp (attention heads and MLP
// split, vocabulary-parallel output head, the logits never gathered), fully sharded data parallel
// over dp (parameters Shard(0), all-gathered for compute, gradients reduce-scattered), AdamW with
// global-norm clipping and a warmup-cosine schedule. Then it trains the same model (same seed)
// unsharded, checks that both end with the same parameters, and shows what moved (CommDebugMode)
// and where the main weights live (visualize_sharding). Exits 1 if the check fails.
//
// Run: train_lm --ranks 4 [--dp 2 --tp 2 --steps 30] (threads), or mpirun -np 4 train_lm.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/tessera.hpp>

#include "lm_task.hpp"

using namespace tessera;

namespace {

struct Options {
  int64_t dp = 0, tp = 0;  // 0: chosen from the world size (2 x n/2 when even)
  int steps = 30;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--dp")) o.dp = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tp")) o.tp = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) o.steps = std::atoi(argv[i + 1]);
  }
  return o;
}

void progress(bool speaker, const char* label, int step, int steps, double loss) {
  if (!speaker) return;
  const bool tty = isatty(STDOUT_FILENO);
  if (!tty && step + 1 != steps && step % 5 != 0) return;
  constexpr int width = 30;
  const int filled = (step + 1) * width / steps;
  std::printf("%s%-10s [%s%s] step %3d/%d  loss %.4f%s", tty ? "\r" : "", label, std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), step + 1, steps, loss, tty ? "" : "\n");
  if (tty && step + 1 == steps) std::printf("\n");
  std::fflush(stdout);
}

// Trains `model` for `steps` steps; returns the final loss. `comm_report` (optional) gets the
// communication of step 1 (step 0 also plans and caches).
double train(nn::TransformerLM& model, const Placements& data, int steps, bool speaker, const char* label,
             std::string* comm_report = nullptr) {
  const auto c = model.config();
  nn::AdamW optimizer(model.parameters(), 3e-3, 0.9, 0.99, 1e-8, 0.01);
  double last = 0;
  for (int step = 0; step < steps; ++step) {
    const auto [ids, next] = examples::counting_batch(step, 8, c.max_seq, c.vocab);
    std::optional<CommDebugMode> counting;
    if (step == 1 && comm_report) counting.emplace();
    const DTensor tokens = distribute_tensor(ids, model.mesh(), data);
    const DTensor targets = distribute_tensor(next, model.mesh(), data);
    model.zero_grad();
    const DTensor loss = model.loss(tokens, targets);
    loss.backward();
    nn::clip_grad_norm_(model.parameters(), 1.0);
    optimizer.set_lr(nn::warmup_cosine_lr(step, 3, steps, 3e-3, 3e-4));
    optimizer.step();
    last = loss.full_tensor().item();
    if (counting) *comm_report = counting->to_string();
    progress(speaker, label, step, steps, last);
  }
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  bool ok = true;
  const int status = run(argc, argv, [&] {
    const int n = world_size();
    const int64_t dp = options.dp ? options.dp : (n % 2 == 0 ? 2 : 1);
    const int64_t tp = options.tp ? options.tp : n / dp;
    TESSERA_CHECK(dp * tp == n, ValueError, "train_lm", "--dp ", dp, " x --tp ", tp, " does not match ", n, " ranks");
    const DeviceMesh mesh({dp, tp}, {"dp", "tp"});
    const bool speaker = rank() == 0;
    const nn::TransformerConfig config = examples::lm_config();

    manual_seed(2024);
    nn::TransformerLM model(mesh, config);
    nn::parallelize_module(model, "tp", nn::transformer_tp_plan());
    nn::fully_shard(model, "dp");
    if (speaker) {
      std::cout << "Training a " << config.layers << "-layer transformer LM (" << model.num_parameters()
                << " parameters, vocab " << config.vocab << ", dim " << config.dim << ", " << config.heads
                << " heads) on " << mesh.to_string() << "\n"
                << "  tp: attention heads, MLP hidden and vocabulary split (Colwise q/k/v/fc1/head, Rowwise o/fc2/tok)\n"
                << "  dp: batch split, parameters fully sharded (Shard(0), gathered for compute)\n"
                << "  task: continue counting sequences (start, stride mod " << config.vocab << ")\n\n";
    }
    const Placements data{Shard{0}, Replicate{}};
    std::string step_comm;
    const auto started = std::chrono::steady_clock::now();
    const double loss = train(model, data, options.steps, speaker, "parallel", &step_comm);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    // The reference: the same model and seed, unsharded (every tensor whole on every rank, so no
    // collective runs): single-device training, computed on each rank.
    manual_seed(2024);
    nn::TransformerLM reference(mesh, config);
    const double ref_loss = train(reference, Placements{Replicate{}, Replicate{}}, options.steps, speaker, "reference");

    double max_diff = 0;
    std::string worst;
    const auto ref_params = reference.named_parameters();
    const auto params = model.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor a = params[i].second->full_tensor(), b = ref_params[i].second->full_tensor();
      const double diff = amax(abs(sub(a, b))).item();
      if (diff > max_diff) {
        max_diff = diff;
        worst = params[i].first;
      }
    }
    // f32: shards sum in another order, and Adam's normalisation magnifies the last bits of tiny gradients.
    constexpr double kTolerance = 1e-3;
    ok = max_diff <= kTolerance && std::abs(loss - ref_loss) <= kTolerance;
    if (speaker) {
      std::cout << "\n" << (ok ? "EQUIVALENT" : "MISMATCH") << ": after " << options.steps
                << " steps the sharded model's parameters equal single-device training within " << kTolerance
                << " (largest difference " << max_diff << " in " << worst << "); final loss " << loss << " vs "
                << ref_loss << "\n";
      std::cout << "Time: " << seconds << " s for " << options.steps << " parallel steps\n\n";
      std::cout << "Communication of one training step on rank 0 (forward, backward, clipping, AdamW):\n"
                << step_comm << "\n\n";
      std::cout << "Where the main weights live (blocks.0.attn.q.weight, blocks.0.mlp.fc2.weight):\n";
    }
    const std::string q = visualize_sharding(model.submodule("blocks.0.attn.q").parameter("weight"));
    const std::string fc2 = visualize_sharding(model.submodule("blocks.0.mlp.fc2").parameter("weight"));
    if (speaker) std::cout << q << "\n\n" << fc2 << "\n";
  });
  return status != 0 ? status : (ok ? 0 : 1);
}
