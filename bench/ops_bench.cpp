// Local op throughput against the two ceilings that matter, measured in the same run:
//
//  * Elementwise add, mul and the full sum are memory-bound, so their baseline is memcpy
//    moving the same number of bytes of memory traffic. An op that reads R bytes and writes
//    W bytes is compared with memcpy of (R + W) / 2 bytes (memcpy of B bytes reads B and
//    writes B):
//        add, mul over N f32:  R = 8N, W = 4N  ->  memcpy of 6N bytes
//        sum over N f32:       R = 4N, W = 0   ->  memcpy of 2N bytes
//    ratio = time(op) / time(memcpy); 1.00 is the memory-bound ceiling, > 1 is slower.
//    Tessera ops allocate their result on every call and that is part of their time (large
//    blocks come back from Tessera's allocator cache, tessera/core/storage.hpp); the memcpy
//    writes into a preallocated buffer.
//
//  * matmul of two n x n f32 matrices is compared with calling cblas_sgemm directly on
//    preallocated buffers of the same sizes: ratio = GFLOP/s(tessera) / GFLOP/s(cblas),
//    goal >= 0.95 at n >= 512. Tessera runs BLAS with one thread per calling thread by default
//    (tessera/ops/linalg.hpp); the direct baseline is given the same count through
//    openblas_set_num_threads(tessera::blas_threads()), so both use the same number of threads.
//
// Each benchmark runs 3 repetitions; the table at the end uses the medians. Everything measured
// is single-threaded when BLAS has one thread, and then the table uses the thread's CPU time,
// which a busy machine (other jobs sharing the cores) does not inflate; with more BLAS threads
// it uses wall-clock time.
// Usage: tessera_ops_bench [google benchmark flags, e.g. --benchmark_filter=matmul]
#include <cblas.h>

#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

namespace {

using tessera::Tensor;

constexpr int64_t kSmall = int64_t{1} << 20;  // 1M elements
constexpr int64_t kLarge = int64_t{1} << 24;  // 16M elements
constexpr int64_t kF32 = 4;
constexpr int kRepetitions = 3;
constexpr double kMinTime = 0.2;  // seconds per repetition

Tensor random_tensor(const tessera::Shape& shape) {
  tessera::manual_seed(1234);
  return tessera::rand(shape);
}

// --- memory-bound baseline ----------------------------------------------------------------------

void BM_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<char> src(bytes, 1);
  std::vector<char> dst(bytes, 2);  // touched, so no page faults inside the loop
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * bytes));
}

// --- elementwise and reduction ------------------------------------------------------------------

template <Tensor (*Op)(const Tensor&, const Tensor&)>
void BM_binary(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_tensor({n});
  const Tensor b = random_tensor({n});
  for (auto _ : state) {
    Tensor c = Op(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * n * kF32);
}

Tensor add_op(const Tensor& a, const Tensor& b) { return tessera::add(a, b); }
Tensor mul_op(const Tensor& a, const Tensor& b) { return tessera::mul(a, b); }

void BM_add(benchmark::State& state) { BM_binary<add_op>(state); }
void BM_mul(benchmark::State& state) { BM_binary<mul_op>(state); }

void BM_sum(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_tensor({n});
  for (auto _ : state) {
    Tensor s = tessera::sum(a);
    benchmark::DoNotOptimize(s.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * kF32);
}

// --- matmul -------------------------------------------------------------------------------------

void set_gflops(benchmark::State& state, int64_t n) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(n * n * n) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_tensor({n, n});
  const Tensor b = random_tensor({n, n});
  for (auto _ : state) {
    Tensor c = tessera::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

void BM_cblas_sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor a = random_tensor({n, n});
  const Tensor b = random_tensor({n, n});
  Tensor c = tessera::zeros({n, n});
  openblas_set_num_threads(tessera::blas_threads());
  const int dim = static_cast<int>(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dim, dim, dim, 1.0f, a.data<float>(), dim,
                b.data<float>(), dim, 0.0f, c.data<float>(), dim);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n);
}

// Attention over 4 heads of 64 features, L = S = arg: the fused kernel against the composition
// it replaces (softmax(q k^T / sqrt(64)) v through matmul and softmax, which forms each head's
// [L, S] scores), causal, forward only.
constexpr int64_t kHeads = 4, kHeadDim = 64;

void BM_sdpa_fused(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor q = random_tensor({kHeads, n, kHeadDim}), k = random_tensor({kHeads, n, kHeadDim}),
               v = random_tensor({kHeads, n, kHeadDim});
  for (auto _ : state) {
    Tensor out = tessera::scaled_dot_product_attention(q, k, v, std::nullopt, 0, true);
    benchmark::DoNotOptimize(out.raw_data());
  }
}

void BM_sdpa_composite(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Tensor q = random_tensor({kHeads, n, kHeadDim}), k = random_tensor({kHeads, n, kHeadDim}),
               v = random_tensor({kHeads, n, kHeadDim});
  const Tensor masked = tessera::logical_not(tessera::tril(tessera::ones({n, n}, tessera::DType::b8)));
  for (auto _ : state) {
    const Tensor scores = tessera::mul(tessera::matmul(q, k.transpose(-2, -1)), 1.0 / 8.0);
    Tensor out = tessera::matmul(tessera::softmax(tessera::masked_fill(scores, masked, -INFINITY), -1), v);
    benchmark::DoNotOptimize(out.raw_data());
  }
}

void configure(benchmark::internal::Benchmark* bench) {
  bench->MinTime(kMinTime)->Repetitions(kRepetitions)->DisplayAggregatesOnly();
  bench->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_memcpy)->Apply(configure)->Arg(6 * kSmall)->Arg(2 * kSmall)->Arg(6 * kLarge)->Arg(2 * kLarge);
BENCHMARK(BM_add)->Apply(configure)->Arg(kSmall)->Arg(kLarge);
BENCHMARK(BM_mul)->Apply(configure)->Arg(kSmall)->Arg(kLarge);
BENCHMARK(BM_sum)->Apply(configure)->Arg(kSmall)->Arg(kLarge);
BENCHMARK(BM_matmul)->Apply(configure)->Arg(128)->Arg(256)->Arg(512)->Arg(1024);
BENCHMARK(BM_cblas_sgemm)->Apply(configure)->Arg(128)->Arg(256)->Arg(512)->Arg(1024);
BENCHMARK(BM_sdpa_fused)->Apply(configure)->Arg(256)->Arg(1024)->Arg(2048);
BENCHMARK(BM_sdpa_composite)->Apply(configure)->Arg(256)->Arg(1024)->Arg(2048);

// --- the ratio table ----------------------------------------------------------------------------

// True when all the measured work runs on the benchmark's own thread.
bool single_threaded() { return tessera::blas_threads() == 1; }

// Colour only on a terminal.
benchmark::ConsoleReporter::OutputOptions console_options() {
  const char* term = std::getenv("TERM");
  const bool color = isatty(STDOUT_FILENO) && term && std::string(term) != "dumb";
  return color ? benchmark::ConsoleReporter::OO_ColorTabular : benchmark::ConsoleReporter::OO_Tabular;
}

// The console reporter, also remembering the median time (seconds) of every benchmark by
// "function/arg": thread CPU time when single_threaded(), else real time.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(console_options()) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    ConsoleReporter::ReportRuns(reports);
    for (const Run& run : reports) {
      if (run.error_occurred) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (!median && !single) continue;
      const std::string key = run.run_name.function_name + "/" + run.run_name.args;
      const double t = single_threaded() ? run.GetAdjustedCPUTime() : run.GetAdjustedRealTime();
      seconds_[key] = t / benchmark::GetTimeUnitMultiplier(run.time_unit);
    }
  }

  std::optional<double> seconds(const std::string& function, int64_t arg) const {
    auto it = seconds_.find(function + "/" + std::to_string(arg));
    if (it == seconds_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, double> seconds_;
};

std::string fixed(std::optional<double> value, const char* format) {
  if (!value) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, *value);
  return text;
}

std::optional<double> ratio(std::optional<double> num, std::optional<double> den) {
  if (!num || !den || *den <= 0) return std::nullopt;
  return *num / *den;
}

void print_table(const RatioReporter& r) {
  std::printf("\nTessera vs. baselines, same run, medians of %d repetitions of %s (BLAS threads: %d)\n\n",
              kRepetitions, single_threaded() ? "thread CPU time" : "wall-clock time", tessera::blas_threads());
  std::printf("Memory-bound ops: ratio = time(op) / time(memcpy of (bytes read + bytes written) / 2)\n");
  std::printf("                  1.00 = memcpy speed, > 1 slower. Ops include allocating their result.\n");
  std::printf("  %-4s %9s %12s %14s %12s %7s\n", "op", "elements", "op ms", "memcpy bytes", "memcpy ms", "ratio");
  struct Row {
    const char* name;
    const char* function;
    int64_t copy_factor;  // memcpy bytes per element
  };
  const Row rows[] = {{"add", "BM_add", 6}, {"mul", "BM_mul", 6}, {"sum", "BM_sum", 2}};
  for (const Row& row : rows) {
    for (int64_t n : {kSmall, kLarge}) {
      const auto op = r.seconds(row.function, n);
      const auto copy = r.seconds("BM_memcpy", row.copy_factor * n);
      std::printf("  %-4s %8lldM %12s %11lldMiB %12s %7s\n", row.name, static_cast<long long>(n >> 20),
                  fixed(op ? std::optional(*op * 1e3) : std::nullopt, "%.3f").c_str(),
                  static_cast<long long>(row.copy_factor * n >> 20),
                  fixed(copy ? std::optional(*copy * 1e3) : std::nullopt, "%.3f").c_str(),
                  fixed(ratio(op, copy), "%.2f").c_str());
    }
  }
  std::printf("\nmatmul f32 n x n: ratio = GFLOP/s(tessera matmul) / GFLOP/s(cblas_sgemm direct); goal >= 0.95 at n >= 512\n");
  std::printf("  %5s %16s %16s %7s %6s\n", "n", "tessera GFLOP/s", "cblas GFLOP/s", "ratio", "goal");
  for (int64_t n : {128, 256, 512, 1024}) {
    const double flop = 2.0 * static_cast<double>(n * n * n);
    const auto mine = r.seconds("BM_matmul", n);
    const auto blas = r.seconds("BM_cblas_sgemm", n);
    const auto gflops = [&](std::optional<double> s) -> std::optional<double> {
      if (!s || *s <= 0) return std::nullopt;
      return flop / *s * 1e-9;
    };
    const auto q = ratio(blas, mine);  // = GFLOP/s ratio
    const char* goal = n < 512 ? "" : !q ? "-" : *q >= 0.95 ? "met" : "MISSED";
    std::printf("  %5lld %16s %16s %7s %6s\n", static_cast<long long>(n), fixed(gflops(mine), "%.1f").c_str(),
                fixed(gflops(blas), "%.1f").c_str(), fixed(q, "%.3f").c_str(), goal);
  }
  std::printf("\nscaled_dot_product_attention f32, %lld heads x L x %lld, causal: ratio = time(composite) / time(fused)\n",
              static_cast<long long>(kHeads), static_cast<long long>(kHeadDim));
  std::printf("  %5s %12s %15s %7s %18s\n", "L=S", "fused ms", "composite ms", "ratio", "scores not formed");
  for (int64_t n : {256, 1024, 2048}) {
    const auto fused = r.seconds("BM_sdpa_fused", n);
    const auto composite = r.seconds("BM_sdpa_composite", n);
    std::printf("  %5lld %12s %15s %7s %15lldMiB\n", static_cast<long long>(n),
                fixed(fused ? std::optional(*fused * 1e3) : std::nullopt, "%.2f").c_str(),
                fixed(composite ? std::optional(*composite * 1e3) : std::nullopt, "%.2f").c_str(),
                fixed(ratio(composite, fused), "%.2f").c_str(), static_cast<long long>(kHeads * n * n * kF32 >> 20));
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_table(reporter);
  return 0;
}
