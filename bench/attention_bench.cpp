// Ring attention (scaled_dot_product_attention with the sequence split over the ranks) against
// unsharded attention on one rank, measured in the same run: forward + backward of
// [batch, heads, L, E] f32 attention, causal and not; for causal, contiguous pieces and
// context_parallel's load-balanced (zig-zag) order.
//
// Printed per setup: the median time of forward + backward (the slowest rank's), the speedup over
// the unsharded one-rank time (its time / this one), and the peak memory the step added per
// rank: the process's peak resident set (VmHWM, reset through /proc/self/clear_refs just before the step) less its
// resident set then, divided by the ranks (in-process rank threads share one process). The
// attention itself needs O(L/p) per rank; one rank's inputs and their gradients are 6 L/p rows.
//
// Usage: tessera_attention_bench [--length L] [--heads H] [--dim E] [--ranks 1,2,4] [--reps R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"

using namespace tessera;

namespace {

struct Options {
  int64_t length = 4096, heads = 4, dim = 64, batch = 1;
  std::vector<int> ranks = {1, 2, 4};
  int reps = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--length") o.length = std::atoll(value.c_str());
    else if (flag == "--heads") o.heads = std::atoll(value.c_str());
    else if (flag == "--dim") o.dim = std::atoll(value.c_str());
    else if (flag == "--reps") o.reps = std::atoi(value.c_str());
    else if (flag == "--ranks") {
      o.ranks.clear();
      size_t at = 0;
      while (at < value.size()) {
        const size_t comma = value.find(',', at);
        o.ranks.push_back(std::atoi(value.substr(at, comma - at).c_str()));
        at = comma == std::string::npos ? value.size() : comma + 1;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

// kB of a /proc/self/status line ("VmHWM:", "VmRSS:").
int64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::string(key).size());
  return 0;
}

void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

Tensor smooth(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape).to(DType::f32);
}

struct Result {
  double ms = 0;
  double peak_mib_per_rank = 0;
};

// Forward + backward, timed reps times after one warm-up; the slowest rank's median.
Result measure(const Options& o, int n, bool causal, bool load_balance) {
  Result result;
  launch(n, [&] {
    const Shape shape{o.batch, o.heads, o.length, o.dim};
    const Tensor q = smooth(shape, 0.1), k = smooth(shape, 0.4), v = smooth(shape, 0.9);
    const DeviceMesh mesh({n}, {"cp"});
    const auto step = [&] {
      if (n == 1) {
        Tensor ql = q.clone().requires_grad_(), kl = k.clone().requires_grad_(), vl = v.clone().requires_grad_();
        sum(scaled_dot_product_attention(ql, kl, vl, std::nullopt, 0.0, causal)).backward();
        return;
      }
      DTensor qd = distribute_tensor(q, mesh, {Replicate{}}), kd = distribute_tensor(k, mesh, {Replicate{}}),
              vd = distribute_tensor(v, mesh, {Replicate{}});
      for (DTensor* t : {&qd, &kd, &vd}) t->requires_grad_();
      ContextParallelOptions options;
      options.load_balance = load_balance;
      context_parallel(mesh, {&qd, &kd, &vd}, {2, 2, 2}, [&] {
        // The local sum of the ring's output: each rank's rows, no gather.
        sum(scaled_dot_product_attention(qd, kd, vd, std::nullopt, 0.0, causal).to_local()).backward();
      }, options);
    };
    step();  // warm-up
    std::vector<double> times;
    for (int r = 0; r < o.reps; ++r) {
      world().barrier();
      int64_t rss_kb = 0;
      if (rank() == 0) rss_kb = status_kb("VmRSS:"), reset_peak();
      world().barrier();
      const auto start = std::chrono::steady_clock::now();
      step();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      world().all_reduce(&ms, 1, DType::f64, ReduceOp::max);
      times.push_back(ms);
      world().barrier();
      if (rank() == 0)
        result.peak_mib_per_rank =
            std::max(result.peak_mib_per_rank, (status_kb("VmHWM:") - rss_kb) / 1024.0 / static_cast<double>(n));
    }
    if (rank() == 0) result.ms = bench_util::median(times);
  });
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("attention [%lld, %lld, %lld, %lld] f32, forward + backward, rank threads on this machine\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.length),
              static_cast<long long>(o.dim));
  std::printf("%-8s %-6s %-14s %10s %12s %16s\n", "mask", "ranks", "order", "ms", "speedup", "peak MiB/rank");
  for (bool causal : {false, true}) {
    const Result base = measure(o, 1, causal, false);
    std::printf("%-8s %-6d %-14s %10.1f %12.2f %16.1f\n", causal ? "causal" : "none", 1, "unsharded", base.ms, 1.0,
                base.peak_mib_per_rank);
    for (int n : o.ranks) {
      if (n == 1) continue;
      for (bool balance : causal ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
        const Result r = measure(o, n, causal, balance);
        std::printf("%-8s %-6d %-14s %10.1f %12.2f %16.1f\n", causal ? "causal" : "none", n,
                    balance ? "load-balanced" : "contiguous", r.ms, base.ms / r.ms, r.peak_mib_per_rank);
      }
    }
  }
  return 0;
}
