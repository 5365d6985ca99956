// The training step on many in-process ranks (issue 34): a tiny transformer LM, tensor parallel x
// fully sharded on a dp x tp mesh of 8, 64 and 256 thread ranks, with the same global batch. The
// model is tiny on purpose: what grows with the rank count is the per-step overhead (dispatch,
// planning on the first step, the rendezvous of every collective, per-rank bookkeeping), not the
// arithmetic. Prints, per world, the mesh and model setup, the first step (dispatch decisions and
// plans made), the median later step and its time inside collectives, and their ratios against 8
// ranks measured in the same run (these machines are noisy: compare ratios, not times across runs).
// Ranks share the machine's cores, so the ratio is overhead, not speedup.
//
// Run: tessera_many_ranks_bench [--ranks 8,64,256] [--steps 5]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/tessera.hpp>

#include "bench_util.hpp"

using namespace tessera;

namespace {

using Clock = std::chrono::steady_clock;

nn::TransformerConfig config() {
  nn::TransformerConfig c;
  c.vocab = 32;
  c.dim = 32;
  c.heads = 16;
  c.layers = 2;
  c.max_seq = 8;
  c.hidden = 64;
  return c;
}

constexpr int64_t kBatch = 16;

std::pair<Tensor, Tensor> batch(int step) {
  const auto c = config();
  std::vector<int64_t> ids(static_cast<size_t>(kBatch * c.max_seq)), next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3 + static_cast<size_t>(step) * 5) % static_cast<size_t>(c.vocab));
    next[i] = static_cast<int64_t>((i * 7 + 10 + static_cast<size_t>(step) * 5) % static_cast<size_t>(c.vocab));
  }
  return {from_vector(ids, Shape{kBatch, c.max_seq}), from_vector(next, Shape{kBatch, c.max_seq})};
}

// dp x tp with tp the larger factor, as square as the rank count allows: 8 -> 2 x 4, 64 -> 8 x 8.
std::vector<int64_t> mesh_shape(int ranks) {
  int64_t dp = 1;
  for (int64_t d = 1; d * d <= ranks; ++d)
    if (ranks % d == 0) dp = d;
  return {dp, ranks / dp};
}

struct Result {
  std::vector<int64_t> shape;
  double setup_ms = 0, first_ms = 0, step_ms = 0, cpu_ms = 0, comm_ms = 0;
  int64_t collectives = 0;
  double rss_mib = 0;
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// CPU time of the whole process (every rank's thread), in ms: on a shared machine the wall time
// of many ranks depends on the other load, their CPU time much less.
double process_cpu_ms() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto ms = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_usec) / 1e3;
  };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

Result measure(int ranks, int steps) {
  Result result;
  result.shape = mesh_shape(ranks);
  launch(ranks, [&] {
    world().barrier();
    const auto setup = Clock::now();
    const DeviceMesh mesh(result.shape, {"dp", "tp"});
    manual_seed(1);
    nn::TransformerLM model(mesh, config());
    nn::parallelize_module(model, "tp", nn::transformer_tp_plan());
    nn::fully_shard(model, "dp");
    nn::AdamW optimizer(model.parameters(), 1e-3);
    world().barrier();
    const double setup_ms = ms_since(setup);
    const Placements data{Shard{0}, Replicate{}};
    std::vector<double> times, cpu_times, comm_times;
    double first_ms = 0;
    int64_t collectives = 0;
    for (int step = 0; step <= steps; ++step) {
      const auto [ids, next] = batch(step);
      world().barrier();
      CommDebugMode comm;
      const double cpu = process_cpu_ms();
      const auto start = Clock::now();
      model.zero_grad();
      const DTensor loss = model.loss(distribute_tensor(ids, mesh, data), distribute_tensor(next, mesh, data));
      loss.backward();
      nn::clip_grad_norm_(model.parameters(), 1.0);
      optimizer.step();
      world().barrier();  // the step ends when its slowest rank's does
      const double ms = ms_since(start), cpu_ms = process_cpu_ms() - cpu;
      if (step == 0) {
        first_ms = ms;
        continue;
      }
      times.push_back(ms);
      cpu_times.push_back(cpu_ms);
      comm_times.push_back(comm.total_seconds() * 1e3);
      collectives = comm.total_count();
    }
    if (rank() != 0) return;
    result.setup_ms = setup_ms;
    result.first_ms = first_ms;
    result.step_ms = bench_util::median(times);
    result.cpu_ms = bench_util::median(cpu_times);
    result.comm_ms = bench_util::median(comm_times);
    result.collectives = collectives;
  });
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  result.rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  return result;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) ranks.push_back(std::atoi(item.c_str()));
  return ranks;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds{8, 64, 256};
  int steps = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks") worlds = parse_ranks(argv[++i]);
    else if (arg == "--steps") steps = std::atoi(argv[++i]);
  }
  if (worlds.empty() || steps < 1) {
    std::fprintf(stderr, "usage: %s [--ranks 8,64,256] [--steps 5]\n", argv[0]);
    return 2;
  }
  const auto c = config();
  std::printf("Training step (forward, backward, clipping, AdamW) of a %lld-layer LM, dim %lld, %lld heads, "
              "hidden %lld, vocab %lld, batch %lld x %lld tokens, f32; tp x fully_shard on dp x tp thread ranks; "
              "median of %d steps after the first; ratios against %d ranks in this run\n",
              static_cast<long long>(c.layers), static_cast<long long>(c.dim), static_cast<long long>(c.heads),
              static_cast<long long>(c.hidden), static_cast<long long>(c.vocab), static_cast<long long>(kBatch),
              static_cast<long long>(c.max_seq), steps, worlds.front());
  std::printf("%6s %8s %9s %12s %7s %9s %7s %9s %7s %11s %6s %9s\n", "ranks", "mesh", "setup ms", "1st step ms",
              "x 1st", "step ms", "x step", "step cpu", "x cpu", "in comm ms", "calls", "peak RSS");
  std::printf("%6s %8s %9s %12s %7s %9s %7s %9s %7s %11s %6s %9s\n", "", "", "", "", "", "(median)", "", "ms", "",
              "(rank 0)", "", "MiB");
  (void)measure(1, 1);  // the process's first step pays one-time costs (kernels, allocator): not shown
  Result base;
  for (size_t i = 0; i < worlds.size(); ++i) {
    const Result r = measure(worlds[i], steps);
    if (i == 0) base = r;
    const std::string mesh = std::to_string(r.shape[0]) + "x" + std::to_string(r.shape[1]);
    std::printf("%6d %8s %9.1f %12.1f %7.2f %9.2f %7.2f %9.1f %7.2f %11.2f %6lld %9.0f\n", worlds[i], mesh.c_str(),
                r.setup_ms, r.first_ms, r.first_ms / base.first_ms, r.step_ms, r.step_ms / base.step_ms, r.cpu_ms,
                r.cpu_ms / base.cpu_ms, r.comm_ms, static_cast<long long>(r.collectives), r.rss_mib);
    std::fflush(stdout);
  }
  return 0;
}
