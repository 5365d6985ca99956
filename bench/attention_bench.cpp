// Ring attention (scaled_dot_product_attention with the sequence split over the ranks) against
// unsharded attention on one rank, measured in the same run: forward + backward of
// [batch, heads, L, E] f32 attention, causal and not; for causal, contiguous pieces and
// context_parallel's load-balanced (zig-zag) order.
//
// Printed per setup: the median time of forward + backward (the slowest rank's), the speedup over
// the unsharded one-rank time (its time / this one), and the peak memory the steps added per
// rank: each setup runs in a child process of its own, twice (with the steps, and with the
// inputs only), and the difference of the two peak resident sets (VmHWM) is divided by the ranks
// (in-process rank threads share one process). Ring attention needs O(L/p) per rank.
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
  std::string child;  // "n,causal,balance,steps": run that one setup and print "<ms> <peak KiB>"
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--length") o.length = std::atoll(value.c_str());
    else if (flag == "--heads") o.heads = std::atoll(value.c_str());
    else if (flag == "--dim") o.dim = std::atoll(value.c_str());
    else if (flag == "--reps") o.reps = std::atoi(value.c_str());
    else if (flag == "--child") o.child = value;
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

Tensor smooth(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape).to(DType::f32);
}

struct Result {
  double ms = 0;
  double peak_mib_per_rank = 0;
};

// Peak resident set of this process so far, KiB.
int64_t peak_kb() { return status_kb("VmHWM:"); }

// One setup in a child process of its own (peak memory is per process): this binary with
// --child n causal balance steps, which prints "<ms> <peak KiB>".
std::pair<double, int64_t> in_child(const char* self, const Options& o, int n, bool causal, bool balance, bool steps) {
  const std::string command = std::string(self) + " --length " + std::to_string(o.length) + " --heads " +
                              std::to_string(o.heads) + " --dim " + std::to_string(o.dim) + " --reps " +
                              std::to_string(o.reps) + " --child " + std::to_string(n) + "," + std::to_string(causal) +
                              "," + std::to_string(balance) + "," + std::to_string(steps);
  FILE* pipe = popen(command.c_str(), "r");
  double ms = 0;
  long long kb = 0;
  if (!pipe || std::fscanf(pipe, "%lf %lld", &ms, &kb) != 2) {
    std::fprintf(stderr, "child failed: %s\n", command.c_str());
    std::exit(1);
  }
  pclose(pipe);
  return {ms, kb};
}

Result run_setup(const char* self, const Options& o, int n, bool causal, bool balance) {
  const auto [ms, peak] = in_child(self, o, n, causal, balance, true);
  const auto [unused, baseline] = in_child(self, o, n, causal, balance, false);
  (void)unused;
  return {ms, static_cast<double>(peak - baseline) / 1024.0 / n};
}

// Forward + backward, timed reps times after one warm-up; the slowest rank's median. The inputs
// are leaves already split along the sequence (as a model's activations would be), so the step
// is the attention alone. With steps false: the inputs only (the memory figure's baseline).
Result measure(const Options& o, int n, bool causal, bool load_balance, bool steps) {
  Result result;
  launch(n, [&] {
    const Shape shape{o.batch, o.heads, o.length, o.dim};
    const Tensor q = smooth(shape, 0.1), k = smooth(shape, 0.4), v = smooth(shape, 0.9);
    const DeviceMesh mesh({n}, {"cp"});
    DTensor qd = distribute_tensor(q, mesh, {Replicate{}}), kd = distribute_tensor(k, mesh, {Replicate{}}),
            vd = distribute_tensor(v, mesh, {Replicate{}});
    ContextParallelOptions options;
    options.load_balance = load_balance;
    const auto run = [&] {
      // The rank's rows as leaves: no gather of their gradients to the replicated originals.
      DTensor ql = qd.detach(), kl = kd.detach(), vl = vd.detach();
      for (DTensor* t : {&ql, &kl, &vl}) t->requires_grad_();
      const auto step = [&] {
        if (n == 1) {
          Tensor a = q.clone().requires_grad_(), b = k.clone().requires_grad_(), c = v.clone().requires_grad_();
          sum(scaled_dot_product_attention(a, b, c, std::nullopt, 0.0, causal)).backward();
          return;
        }
        // The local sum of the ring's output: each rank's rows, no gather.
        sum(scaled_dot_product_attention(ql, kl, vl, std::nullopt, 0.0, causal).to_local()).backward();
      };
      if (!steps) return;  // inputs only: the baseline of the memory figure
      step();  // warm-up
      std::vector<double> times;
      for (int r = 0; r < o.reps; ++r) {
        world().barrier();
        const auto start = std::chrono::steady_clock::now();
        step();
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        world().all_reduce(&ms, 1, DType::f64, ReduceOp::max);
        times.push_back(ms);
      }
      if (rank() == 0 && !times.empty()) result.ms = bench_util::median(times);
    };
    if (n == 1) run();
    else context_parallel(mesh, {&qd, &kd, &vd}, {2, 2, 2}, run, options);
  });
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (!o.child.empty()) {
    int n = 1, causal = 0, balance = 0, steps = 1;
    std::sscanf(o.child.c_str(), "%d,%d,%d,%d", &n, &causal, &balance, &steps);
    const Result r = measure(o, n, causal != 0, balance != 0, steps != 0);
    std::printf("%.6f %lld\n", r.ms, static_cast<long long>(peak_kb()));
    return 0;
  }
  std::printf("attention [%lld, %lld, %lld, %lld] f32, forward + backward, rank threads on this machine\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.length),
              static_cast<long long>(o.dim));
  std::printf("%-8s %-6s %-14s %10s %12s %16s\n", "mask", "ranks", "order", "ms", "speedup", "peak MiB/rank");
  for (bool causal : {false, true}) {
    const Result base = run_setup(argv[0], o, 1, causal, false);
    std::printf("%-8s %-6d %-14s %10.1f %12.2f %16.1f\n", causal ? "causal" : "none", 1, "unsharded", base.ms, 1.0,
                base.peak_mib_per_rank);
    for (int n : o.ranks) {
      if (n == 1) continue;
      for (bool balance : causal ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
        const Result r = run_setup(argv[0], o, n, causal, balance);
        std::printf("%-8s %-6d %-14s %10.1f %12.2f %16.1f\n", causal ? "causal" : "none", n,
                    balance ? "load-balanced" : "contiguous", r.ms, base.ms / r.ms, r.peak_mib_per_rank);
      }
    }
  }
  return 0;
}
