// Training step time of a transformer LM on 4 ranks (threads) against the same model and global
// batch on one rank, with the share of the step spent in communication (CommDebugMode timings:
// wall time inside blocking collectives, waiting for peers included). Parallel setups: dp x tp 2x2
// (tensor parallel + fully sharded), data parallel over 4 (DDP), tensor parallel over 4.
// Ratios are of medians measured in the same run; on a machine with fewer cores than ranks the
// ranks share cores, so the ratio shows overhead, not speedup.
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/tessera.hpp>

#include "bench_util.hpp"

using namespace tessera;

namespace {

nn::TransformerConfig config() {
  nn::TransformerConfig c;
  c.vocab = 256;
  c.dim = 128;
  c.heads = 8;
  c.layers = 2;
  c.max_seq = 64;
  c.hidden = 512;
  return c;
}

constexpr int64_t kBatch = 16;
constexpr int kWarmup = 2;
int kSteps = 5;

std::pair<Tensor, Tensor> batch(int64_t vocab, int64_t seq) {
  std::vector<int64_t> ids(static_cast<size_t>(kBatch * seq)), next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 31 + 7) % static_cast<size_t>(vocab));
    next[i] = static_cast<int64_t>((i * 31 + 38) % static_cast<size_t>(vocab));
  }
  return {from_vector(ids, Shape{kBatch, seq}), from_vector(next, Shape{kBatch, seq})};
}

struct Result {
  double step_ms = 0;
  double comm_share = 0;
  int64_t collectives = 0;
  double peak_mib_per_rank = 0;  // tensor memory (memory_stats), the largest rank's peak over the steps
};

// Median step time (ms) and communication share over kSteps steps after kWarmup, on rank 0.
Result measure(int ranks, std::vector<int64_t> mesh_shape, const std::function<void(nn::TransformerLM&)>& parallelize,
               Placements data) {
  Result result;
  launch(ranks, [&] {
    const DeviceMesh mesh(mesh_shape, {"dp", "tp"});
    manual_seed(1);
    nn::TransformerLM model(mesh, config());
    parallelize(model);
    nn::AdamW optimizer(model.parameters(), 1e-3);
    const auto [ids, next] = batch(config().vocab, config().max_seq);
    const DTensor tokens = distribute_tensor(ids, mesh, data), targets = distribute_tensor(next, mesh, data);
    std::vector<double> times, shares;
    int64_t collectives = 0;
    for (int step = 0; step < kWarmup + kSteps; ++step) {
      if (step == kWarmup) reset_peak_memory_stats();
      world().barrier();
      CommDebugMode comm;
      const auto start = std::chrono::steady_clock::now();
      model.zero_grad();
      model.loss(tokens, targets).backward();
      nn::clip_grad_norm_(model.parameters(), 1.0);
      optimizer.step();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step < kWarmup) continue;
      times.push_back(seconds * 1e3);
      shares.push_back(comm.total_seconds() / seconds);
      collectives = comm.total_count();
    }
    double peak = static_cast<double>(memory_stats().peak_allocated_bytes);
    world().all_reduce(&peak, 1, DType::f64, ReduceOp::max);
    if (rank() != 0) return;
    result = {bench_util::median(times), bench_util::median(shares), collectives, peak / (1 << 20)};
  });
  return result;
}

// FSDP2's idiom: one unit per block, then the root for the embeddings, final norm and head.
void fsdp_per_block(nn::TransformerLM& m) {
  for (int64_t i = 0; i < m.config().layers; ++i) nn::fully_shard(m.submodule("blocks." + std::to_string(i)), "dp");
  nn::fully_shard(m, "dp");
}

}  // namespace

// The 1-rank step's matrix products alone, back to back, through matmul (the BLAS routes the step
// takes): each Linear's forward x W^T, input gradient dY W and weight gradient dY^T x, and per
// layer attention's six products on whole [L, S] scores (S = Q K^T and O = P V; dV = P^T dO,
// dP = dO V^T, dQ = dS K and dK = dS^T Q), batched over batch and heads. What the step would take
// if it were nothing but its products: its sgemm-bound floor.
double products_floor_ms() {
  const auto c = config();
  const int64_t tokens = kBatch * c.max_seq, pairs = kBatch * c.heads, len = c.max_seq, head = c.dim / c.heads;
  struct Product {
    Tensor a, b;
  };
  std::vector<Product> products;
  const auto linear = [&](int64_t in, int64_t out) {
    const Tensor x = randn({tokens, in}), w = randn({out, in}), dy = randn({tokens, out});
    products.push_back({x, w.t()});
    products.push_back({dy, w});
    products.push_back({dy.t(), x});
  };
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    for (int i = 0; i < 4; ++i) linear(c.dim, c.dim);  // q, k, v, o
    linear(c.dim, c.hidden);
    linear(c.hidden, c.dim);
    const Tensor q = randn({pairs, len, head}), k = randn({pairs, len, head}), v = randn({pairs, len, head});
    const Tensor p = randn({pairs, len, len}), d_out = randn({pairs, len, head});
    products.push_back({q, k.transpose(1, 2)});
    products.push_back({p, v});
    products.push_back({p.transpose(1, 2), d_out});
    products.push_back({d_out, v.transpose(1, 2)});
    products.push_back({p, k});
    products.push_back({p.transpose(1, 2), q});
  }
  linear(c.dim, c.vocab);  // the head
  std::vector<double> times;
  for (int step = 0; step < kWarmup + kSteps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    for (const Product& product : products) matmul(product.a, product.b);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= kWarmup) times.push_back(seconds * 1e3);
  }
  return bench_util::median(times);
}

// One setup by name, as bench/peers/run_peers.py asks for it (the same names as the peers'
// scripts): "setup=<name> step_ms=<median> ... peak_rss_mib=<all ranks>".
int run_setup(const std::string& name) {
  const auto tp_and_fsdp = [](nn::TransformerLM& m) {
    nn::parallelize_module(m, "tp", nn::transformer_tp_plan());
    fsdp_per_block(m);
  };
  const auto tp = [](nn::TransformerLM& m) { nn::parallelize_module(m, "tp", nn::transformer_tp_plan()); };
  Result r;
  if (name == "floor") {
    std::printf("setup=floor step_ms=%.2f\n", products_floor_ms());
    return 0;
  }
  if (name == "1rank") r = measure(1, {1, 1}, [](nn::TransformerLM&) {}, {Replicate{}, Replicate{}});
  else if (name == "dp4") r = measure(4, {4, 1}, [](nn::TransformerLM&) {}, {Shard{0}, Replicate{}});
  else if (name == "tp4") r = measure(4, {1, 4}, tp, {Replicate{}, Replicate{}});
  else if (name == "dp2xtp2") r = measure(4, {2, 2}, tp_and_fsdp, {Shard{0}, Replicate{}});
  else {
    std::fprintf(stderr, "unknown setup '%s' (1rank, dp4, tp4, dp2xtp2, floor)\n", name.c_str());
    return 2;
  }
  // Peak resident memory of the process: every rank together (ranks are its threads).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("setup=%s step_ms=%.2f collectives=%lld peak_rss_mib=%.0f peak_tensor_mib_per_rank=%.1f\n", name.c_str(),
              r.step_ms, static_cast<long long>(r.collectives), static_cast<double>(usage.ru_maxrss) / 1024.0,
              r.peak_mib_per_rank);
  return 0;
}

int main(int argc, char** argv) {
  // --profile N: only the 1-rank step, N times (for perf record).
  if (argc == 3 && std::string(argv[1]) == "--profile") {
    kSteps = std::atoi(argv[2]);
    std::printf("1 rank: %.1f ms per step (median of %d)\n", measure(1, {1, 1}, [](nn::TransformerLM&) {}, {Replicate{}, Replicate{}}).step_ms, kSteps);
    return 0;
  }
  // --setup NAME [--steps N]: one setup, one line (bench/peers/run_peers.py).
  if (argc >= 3 && std::string(argv[1]) == "--setup") {
    if (argc >= 5 && std::string(argv[3]) == "--steps") kSteps = std::atoi(argv[4]);
    return run_setup(argv[2]);
  }
  const auto c = config();
  std::printf("Training step (forward, backward, clipping, AdamW) of a %lld-layer LM: dim %lld, %lld heads, vocab %lld, "
              "batch %lld x %lld tokens, f32; median of %d steps\n",
              static_cast<long long>(c.layers), static_cast<long long>(c.dim), static_cast<long long>(c.heads),
              static_cast<long long>(c.vocab), static_cast<long long>(kBatch), static_cast<long long>(c.max_seq), kSteps);
  const Result one = measure(1, {1, 1}, [](nn::TransformerLM&) {}, {Replicate{}, Replicate{}});
  struct Row {
    const char* name;
    Result r;
  };
  const std::vector<Row> rows = {
      {"1 rank (baseline)", one},
      {"4 ranks dp2 x tp2 (fsdp+tp)", measure(4, {2, 2},
                                              [](nn::TransformerLM& m) {
                                                nn::parallelize_module(m, "tp", nn::transformer_tp_plan());
                                                fsdp_per_block(m);
                                              },
                                              {Shard{0}, Replicate{}})},
      {"4 ranks dp4 (ddp)", measure(4, {4, 1}, [](nn::TransformerLM&) {}, {Shard{0}, Replicate{}})},
      {"4 ranks tp4", measure(4, {1, 4}, [](nn::TransformerLM& m) { nn::parallelize_module(m, "tp", nn::transformer_tp_plan()); },
                              {Replicate{}, Replicate{}})},
  };
  std::printf("%-30s %10s %14s %12s %12s %14s\n", "setup", "step ms", "vs 1 rank", "comm share", "collectives",
              "MiB per rank");
  for (const auto& row : rows)
    std::printf("%-30s %10.1f %13.2fx %11.1f%% %12lld %14.1f\n", row.name, row.r.step_ms, row.r.step_ms / one.step_ms,
                100 * row.r.comm_share, static_cast<long long>(row.r.collectives), row.r.peak_mib_per_rank);
  std::printf("(MiB per rank: the largest rank's peak of live tensor memory during the steps, memory_stats)\n");
  std::printf("(4 ranks are threads sharing this machine's %u cores: with fewer cores than ranks, a ratio above\n"
              " 1/4 is partly core sharing, not only communication)\n",
              std::thread::hardware_concurrency());
  return 0;
}
