// controller_demo: Monarch's single controller. This program's main thread is the controller;
// it creates a 2 x 2 mesh of workers, and each training step it calls the remote function
// "lm.step" on the mesh (every worker runs its SPMD share: forward, backward, clip, AdamW of the
// transformer LM, tensor parallel over tp and fully sharded over dp) and fetches the loss. The
// controller holds no tensor data, only handles and the losses it fetched. Then the same
// training runs as a plain SPMD program on the same communication backend and the two loss
// curves must be identical (exit 1 if not).
//
// Run: controller_demo [--steps 8]  (4 in-process workers), or mpirun -np 5 controller_demo (rank 0
// the controller, ranks 1-4 the workers; the check runs on the controller's process).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/tessera.hpp>

#include "lm_task.hpp"

using namespace tessera;

namespace {

constexpr int64_t kRows = 8;

// The LM with the example's seed: the same weights on every run.
nn::TransformerLM seeded_model(const DeviceMesh& mesh) {
  manual_seed(2024);
  return nn::TransformerLM(mesh, examples::lm_config());
}

// One worker's training state, kept between remote calls.
struct Trainer {
  Trainer(const DeviceMesh& mesh, int steps) : steps(steps), model(seeded_model(mesh)) {
    nn::parallelize_module(model, "tp", nn::transformer_tp_plan());
    nn::fully_shard(model, "dp");
    optimizer = std::make_unique<nn::AdamW>(model.parameters(), 3e-3, 0.9, 0.99, 1e-8, 0.01);
  }
  // One step; returns the loss (replicated scalar).
  DTensor step() {
    const auto c = model.config();
    const auto [ids, next] = examples::counting_batch(done, kRows, c.max_seq, c.vocab);
    const Placements data{Shard{0}, Replicate{}};
    model.zero_grad();
    const DTensor loss = model.loss(distribute_tensor(ids, model.mesh(), data), distribute_tensor(next, model.mesh(), data));
    loss.backward();
    nn::clip_grad_norm_(model.parameters(), 1.0);
    optimizer->set_lr(nn::warmup_cosine_lr(done, 3, steps, 3e-3, 3e-4));
    optimizer->step();
    ++done;
    return loss.detach();
  }
  int steps, done = 0;
  nn::TransformerLM model;
  std::unique_ptr<nn::AdamW> optimizer;
};

int steps_from(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--steps")) return std::atoi(argv[i + 1]);
  return 8;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = steps_from(argc, argv);
  // Remote functions are registered before the controller starts: every worker knows them.
  const controller::Remote init = controller::remote("lm.init", [steps](const DeviceMesh& mesh, const std::vector<DTensor>&) {
    rank_state("controller_demo.trainer") = std::make_shared<Trainer>(mesh, steps);
    return std::vector<DTensor>{};
  });
  const controller::Remote train_step = controller::remote("lm.step", [](const DeviceMesh&, const std::vector<DTensor>&) {
    auto& trainer = *std::static_pointer_cast<Trainer>(rank_state("controller_demo.trainer"));
    return std::vector<DTensor>{trainer.step()};
  });

  // The reference run by the workers themselves: every step in one remote call, no controller
  // between the steps.
  const controller::Remote spmd_run = controller::remote("lm.spmd", [steps](const DeviceMesh& mesh, const std::vector<DTensor>&) {
    Trainer trainer(mesh, steps);
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) losses.push_back(trainer.step().full_tensor().item<double>());
    return std::vector<DTensor>{DTensor::from_local(from_vector(losses), mesh, {Replicate{}, Replicate{}})};
  });

  std::vector<double> controlled, spmd;
  char ranks_flag[] = "--ranks", four[] = "4";
  char* worker_argv[] = {argv[0], ranks_flag, four, nullptr};
  const int status = controller::run(3, worker_argv, [&] {
    const controller::WorkerMesh mesh({2, 2}, {"dp", "tp"});
    std::printf("controller: %d workers as %s; each step calls lm.step on every worker and fetches the loss\n",
                controller::num_workers(), mesh.to_string().c_str());
    init.call(mesh, {}, 0);
    for (int step = 0; step < steps; ++step) {
      const controller::RemoteTensor loss = train_step.call(mesh)[0];
      controlled.push_back(controller::fetch_full(loss).get().item<double>());
      std::printf("step %2d  loss %.4f\n", step, controlled.back());
    }
    // The reference must run on the workers' backend: backends associate a reduction over more
    // than two ranks differently (the threads backend sums in rank order, ((a + b) + c) + d;
    // MPI's recursive doubling (a + b) + (c + d)), so gradients reduced over the 4 workers may
    // differ in their last bit between backends, and so may a loss (step 5 of 8 does). Worker
    // processes (under mpirun, ranks from 1) run it here; in-process workers share their
    // backend with launch() below, a world of its own.
    if (mesh.spec().ranks().front() != 0) spmd = controller::fetch_full(spmd_run.call(mesh)[0]).get().to_vector<double>();
  });
  if (status != 0) return status;
  if (controlled.empty()) return 0;  // a worker process (under mpirun): the controller checks

  if (spmd.empty()) {
    launch(4, [&] {
      Trainer trainer(DeviceMesh({2, 2}, {"dp", "tp"}), steps);
      for (int step = 0; step < steps; ++step) {
        const double loss = trainer.step().full_tensor().item<double>();
        if (rank() == 0) spmd.push_back(loss);
      }
    });
  }
  bool same = spmd.size() == controlled.size();
  for (size_t i = 0; same && i < spmd.size(); ++i) same = spmd[i] == controlled[i];
  std::printf("\n%s: the controller's %d losses %s the SPMD program's\n", same ? "IDENTICAL" : "MISMATCH", steps,
              same ? "equal bit for bit" : "differ from");
  return same ? 0 : 1;
}
