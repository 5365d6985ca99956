// Collective bus bandwidth of all_reduce, all_gather, reduce_scatter and all_to_all (f32, sum)
// against a baseline measured in the same run:
//
//  * threads backend (the default; 4 in-process ranks, `--ranks N` or TESSERA_RANKS): the
//    baseline is memcpy bandwidth on one thread, bytes / time of a memcpy of S bytes between
//    two preallocated, pre-faulted buffers (rank 0 measures it while the other ranks wait).
//    ratio = busbw(tessera) / memcpy bandwidth. A second baseline is the machine's copy bound
//    for n ranks: every rank memcpys (n-1)/n of S bytes at once (as many threads as ranks, so
//    ranks on fewer cores share them as a collective's copies do), then meets the others in a
//    barrier, as a collective's ranks meet before returning (without it, ranks that a shared
//    core starts late would each time only their own copy, and the bound would count cores the
//    machine does not have); bound = those bytes / the slowest rank's time, the best busbw a
//    collective whose ranks copy their (n-1)/n could reach. vs bound = busbw / bound; goal >=
//    0.8 at S >= 16 MiB.
//  * mpi backend (run under mpirun; Tessera built with TESSERA_WITH_MPI=ON): the baseline is
//    the same raw MPI call on MPI_COMM_WORLD (MPI_Allreduce in place, MPI_Allgather,
//    MPI_Reduce_scatter_block, MPI_Alltoall). ratio = busbw(tessera) / busbw(MPI) =
//    time(MPI) / time(tessera); goal >= 1.0 everywhere, >= 2.0 for all_reduce and
//    reduce_scatter at S >= 16 MiB.
//
// Bus bandwidth follows NCCL-tests (n ranks, t seconds, S bytes as below, GB = 1e9 bytes):
//    all_reduce      S = bytes of the buffer              busbw = S/t * 2(n-1)/n
//    all_gather      S = bytes received (n blocks)        busbw = S/t * (n-1)/n
//    reduce_scatter  S = bytes sent (n blocks)            busbw = S/t * (n-1)/n
//    all_to_all      S = bytes sent (n blocks)            busbw = S/t * (n-1)/n
// Every timed iteration starts after a barrier; an iteration's time is the slowest rank's, and
// the table uses the median over iterations (JSON also has the best). Under MPI the Tessera and
// raw MPI iterations alternate, so both see the same machine. Goals are reported, never asserted.
//
// Usage: tessera_comm_bench [--sizes 1,16,64] [--iters N] [--json PATH] [--ranks N]
//        mpirun -np 4 tessera_comm_bench ...
// Google Benchmark flags (--benchmark_*, passed by `make bench BENCH_ARGS=...`) are ignored.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <tessera/runtime/runtime.hpp>

#if TESSERA_COMM_BENCH_MPI
#include <mpi.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
using tessera::DType;
using tessera::ReduceOp;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kF32 = 4;

struct Options {
  std::vector<int64_t> sizes_mib{1, 16, 64};
  int iters = 0;  // 0: by size
  std::string json;
  int ranks = 4;
};

// Timed iterations for S bytes unless --iters: 50 at 1 MiB, 40 at 16 MiB, 10 at 64 MiB.
int iterations(const Options& options, int64_t bytes) {
  if (options.iters > 0) return options.iters;
  return static_cast<int>(std::clamp<int64_t>(640 * kMiB / std::max<int64_t>(bytes, 1), 10, 50));
}
constexpr int kWarmup = 2;

enum class Kind { all_reduce, all_gather, reduce_scatter, all_to_all };
constexpr Kind kKinds[] = {Kind::all_reduce, Kind::all_gather, Kind::reduce_scatter, Kind::all_to_all};

const char* name(Kind kind) {
  switch (kind) {
    case Kind::all_reduce: return "all_reduce";
    case Kind::all_gather: return "all_gather";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::all_to_all: return "all_to_all";
  }
  return "?";
}

// busbw / algbw (NCCL-tests).
double bus_factor(Kind kind, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return kind == Kind::all_reduce ? 2 * f : f;
}

const char* formula(Kind kind) {
  return kind == Kind::all_reduce   ? "S/t * 2(n-1)/n, S = buffer bytes"
         : kind == Kind::all_gather ? "S/t * (n-1)/n, S = bytes received (all n blocks)"
                                    : "S/t * (n-1)/n, S = bytes sent (all n blocks)";
}

// The goal on the ratio, if there is one at this size.
std::optional<double> goal(bool mpi, Kind kind, int64_t bytes) {
  if (!mpi) return bytes >= 16 * kMiB ? std::optional(0.8) : std::nullopt;
  if (bytes >= 16 * kMiB && (kind == Kind::all_reduce || kind == Kind::reduce_scatter)) return 2.0;
  return 1.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Timing {
  double median_s = 0, best_s = 0;
  int iters = 0;
};

// Times each of `ops` on every rank, interleaved so that all see the same conditions: per
// iteration, each op once (alternating which goes first), each after a barrier; kWarmup untimed
// rounds first. An iteration's time is the slowest rank's. Collective over the world.
std::vector<Timing> time_collectives(int iters, const std::vector<std::function<void()>>& ops) {
  auto& world = tessera::world();
  const size_t nops = ops.size();
  for (int i = 0; i < kWarmup; ++i)
    for (const auto& op : ops) {
      world.barrier();
      op();
    }
  std::vector<double> seconds(nops * static_cast<size_t>(iters));  // [op][iteration]
  for (int i = 0; i < iters; ++i)
    for (size_t j = 0; j < nops; ++j) {
      const size_t k = i % 2 ? nops - 1 - j : j;
      world.barrier();
      const auto start = Clock::now();
      ops[k]();
      seconds[k * static_cast<size_t>(iters) + static_cast<size_t>(i)] =
          std::chrono::duration<double>(Clock::now() - start).count();
    }
  world.all_reduce(seconds.data(), static_cast<int64_t>(seconds.size()), DType::f64, ReduceOp::max);
  std::vector<Timing> timings;
  for (size_t k = 0; k < nops; ++k) {
    const std::vector<double> mine(seconds.begin() + static_cast<std::ptrdiff_t>(k * iters),
                                   seconds.begin() + static_cast<std::ptrdiff_t>((k + 1) * iters));
    timings.push_back({median(mine), *std::min_element(mine.begin(), mine.end()), iters});
  }
  return timings;
}

// memcpy of `bytes` on this thread between preallocated, pre-faulted buffers.
Timing time_memcpy(int64_t bytes, int iters) {
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes), 2);
  std::vector<double> seconds(static_cast<size_t>(2 * iters));  // cheap: twice the samples
  for (int i = -kWarmup; i < static_cast<int>(seconds.size()); ++i) {
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    asm volatile("" : : "r"(dst.data()) : "memory");  // keep the copy
    if (i >= 0) seconds[static_cast<size_t>(i)] = s;
  }
  return {median(seconds), *std::min_element(seconds.begin(), seconds.end()), static_cast<int>(seconds.size())};
}

// Per-rank buffers for S bytes on n ranks: block elements per rank-block, S = n * block * 4.
struct Buffers {
  int64_t block;
  std::vector<float> send, recv, inplace;
  Buffers(int64_t bytes, int n)
      : block(std::max<int64_t>(bytes / kF32 / n, 1)),
        send(static_cast<size_t>(block * n), 1.0f),  // filled: pre-faulted
        recv(static_cast<size_t>(block * n), 0.0f),
        inplace(static_cast<size_t>(block * n), 0.0f) {}  // zeros stay zeros under repeated sums
  int64_t bytes(int n) const { return block * n * kF32; }
};

void tessera_call(Kind kind, Buffers& b) {
  auto& w = tessera::world();
  switch (kind) {
    case Kind::all_reduce: w.all_reduce(b.inplace.data(), b.block * w.size(), DType::f32, ReduceOp::sum); return;
    case Kind::all_gather: w.all_gather(b.send.data(), b.recv.data(), b.block, DType::f32); return;
    case Kind::reduce_scatter: w.reduce_scatter(b.send.data(), b.recv.data(), b.block, DType::f32, ReduceOp::sum); return;
    case Kind::all_to_all: w.all_to_all(b.send.data(), b.recv.data(), b.block, DType::f32); return;
  }
}

#if TESSERA_COMM_BENCH_MPI
void mpi_call(Kind kind, Buffers& b) {
  const int n = tessera::world().size();
  const int block = static_cast<int>(b.block);
  switch (kind) {
    case Kind::all_reduce:
      MPI_Allreduce(MPI_IN_PLACE, b.inplace.data(), block * n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return;
    case Kind::all_gather:
      MPI_Allgather(b.send.data(), block, MPI_FLOAT, b.recv.data(), block, MPI_FLOAT, MPI_COMM_WORLD);
      return;
    case Kind::reduce_scatter:
      MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return;
    case Kind::all_to_all:
      MPI_Alltoall(b.send.data(), block, MPI_FLOAT, b.recv.data(), block, MPI_FLOAT, MPI_COMM_WORLD);
      return;
  }
}
#endif

struct Row {
  Kind kind = Kind::all_reduce;
  int64_t bytes = 0;
  Timing tessera;
  Timing baseline;  // memcpy (threads) or the raw MPI call (mpi)
  double busbw = 0, baseline_bw = 0;  // GB/s; baseline_bw is memcpy bandwidth or MPI busbw
  double bound_bw = 0;                // threads: the n-rank copy bound, GB/s
  std::optional<double> ratio, vs_bound, goal;
};

// Threads: every rank memcpys (n-1)/n of `bytes` between its own pre-faulted buffers at once,
// after a barrier, and meets the others in a barrier after it; the slowest rank's time (median
// over iterations) gives the copy bound.
double copy_bound_GBps(int64_t bytes, int iters) {
  auto& world = tessera::world();
  const int n = world.size();
  const auto each = static_cast<size_t>(bytes / n * (n - 1));
  if (each == 0) return 0;
  std::vector<char> src(each, 1), dst(each, 2);
  const std::vector<Timing> t = time_collectives(iters, {[&] {
    std::memcpy(dst.data(), src.data(), each);
    asm volatile("" : : "r"(dst.data()) : "memory");
    world.barrier();  // the group's span, as a collective's closing rendezvous gives it
  }});
  return static_cast<double>(each) / t[0].median_s * 1e-9;
}

std::string fixed(std::optional<double> value, const char* format) {
  if (!value) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, *value);
  return text;
}

// The goal applies to the ratio under MPI and to vs bound on threads.
const char* verdict(const Row& r) {
  if (!r.goal) return "";
  const std::optional<double> judged = r.bound_bw > 0 ? r.vs_bound : r.ratio;
  if (!judged) return "-";
  return *judged >= *r.goal ? "met" : "MISSED";
}

void print_table(const std::vector<Row>& rows, bool mpi, int n) {
  std::printf("\nTessera collectives, %s backend, %d ranks, f32 sum, %u hardware threads; median over "
              "iterations, each after a barrier; an iteration's time is the slowest rank's.\n",
              mpi ? "mpi" : "threads", n, std::thread::hardware_concurrency());
  std::printf("Bus bandwidth (NCCL-tests), n ranks, t seconds, GB = 1e9 bytes:\n");
  for (Kind kind : kKinds) std::printf("  %-15s busbw = %s\n", name(kind), formula(kind));
  if (mpi) {
    std::printf("ratio = busbw(tessera) / busbw(same raw MPI call on MPI_COMM_WORLD: MPI_Allreduce in place,\n"
                "        MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall); goal >= 1.0, >= 2.0 for\n"
                "        all_reduce and reduce_scatter at >= 16 MiB\n\n");
    std::printf("  %-15s %8s %6s %12s %14s %12s %14s %7s %5s %7s\n", "collective", "size", "iters", "tessera ms",
                "tessera GB/s", "MPI ms", "MPI GB/s", "ratio", "goal", "");
  } else {
    std::printf("ratio = busbw(tessera) / memcpy bandwidth (one thread, bytes/time of a memcpy of S bytes between\n"
                "        preallocated, pre-faulted buffers, same run)\n"
                "vs bound = busbw(tessera) / copy bound (every rank memcpys (n-1)/n of S at once, then a barrier, as\n"
                "        many threads as ranks: the best busbw ranks that copy their share can reach); goal >= 0.8\n"
                "        at >= 16 MiB\n\n");
    std::printf("  %-15s %8s %6s %12s %14s %14s %7s %12s %9s %5s %7s\n", "collective", "size", "iters", "tessera ms",
                "busbw GB/s", "memcpy GB/s", "ratio", "bound GB/s", "vs bound", "goal", "");
  }
  for (const Row& r : rows) {
    const std::string size = std::to_string(r.bytes / kMiB) + " MiB";
    const std::string goal_text = r.goal ? fixed(r.goal, "%.1f") : "";
    if (mpi)
      std::printf("  %-15s %8s %6d %12.3f %14.2f %12.3f %14.2f %7s %5s %7s\n", name(r.kind), size.c_str(),
                  r.tessera.iters, r.tessera.median_s * 1e3, r.busbw, r.baseline.median_s * 1e3, r.baseline_bw,
                  fixed(r.ratio, "%.2f").c_str(), goal_text.c_str(), verdict(r));
    else
      std::printf("  %-15s %8s %6d %12.3f %14.2f %14.2f %7s %12.2f %9s %5s %7s\n", name(r.kind), size.c_str(),
                  r.tessera.iters, r.tessera.median_s * 1e3, r.busbw, r.baseline_bw, fixed(r.ratio, "%.2f").c_str(),
                  r.bound_bw, fixed(r.vs_bound, "%.2f").c_str(), goal_text.c_str(), verdict(r));
  }
  if (n == 1) std::printf("\nOne rank moves no data: bus bandwidth is 0 and ratios are not defined.\n");
  std::fflush(stdout);
}

nlohmann::json to_json(const std::vector<Row>& rows, bool mpi, int n) {
  using nlohmann::json;
  json formulas = json::object();
  for (Kind kind : kKinds) formulas[name(kind)] = formula(kind);
  const auto optional = [](std::optional<double> v) { return v ? json(*v) : json(nullptr); };
  json results = json::array();
  for (const Row& r : rows) {
    json row = {{"collective", name(r.kind)},
                {"bytes", r.bytes},
                {"iters", r.tessera.iters},
                {"median_s", r.tessera.median_s},
                {"best_s", r.tessera.best_s},
                {"busbw_GBps", r.busbw},
                {"ratio", optional(r.ratio)},
                {"goal", optional(r.goal)},
                {"met", r.goal && (r.bound_bw > 0 ? r.vs_bound : r.ratio)
                            ? json(*(r.bound_bw > 0 ? r.vs_bound : r.ratio) >= *r.goal)
                            : json(nullptr)}};
    if (mpi)
      row["mpi"] = {{"median_s", r.baseline.median_s}, {"best_s", r.baseline.best_s}, {"busbw_GBps", r.baseline_bw}};
    else
      row["memcpy"] = {{"median_s", r.baseline.median_s}, {"best_s", r.baseline.best_s}, {"GBps", r.baseline_bw},
                       {"copy_bound_GBps", r.bound_bw}, {"vs_bound", optional(r.vs_bound)}};
    results.push_back(std::move(row));
  }
  return {{"benchmark", "tessera_comm_bench"},
          {"backend", mpi ? "mpi" : "threads"},
          {"ranks", n},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"dtype", "f32"},
          {"op", "sum"},
          {"statistic", "median over iterations, each after a barrier; iteration time = slowest rank"},
          {"busbw_formulas", formulas},
          {"ratio", mpi ? "busbw(tessera) / busbw(raw MPI call)" : "busbw(tessera) / memcpy bandwidth (one thread)"},
          {"results", results}};
}

// Default JSON path: comm_bench_<backend>_<n>.json next to the binary (build/bench/).
std::filesystem::path default_json(const char* argv0, bool mpi, int n) {
  std::error_code error;
  std::filesystem::path dir = std::filesystem::canonical("/proc/self/exe", error).parent_path();
  if (error || dir.empty()) dir = std::filesystem::path(argv0).parent_path();
  return dir / ("comm_bench_" + std::string(mpi ? "mpi" : "threads") + "_" + std::to_string(n) + ".json");
}

void bench(const Options& options, const char* argv0) {
  auto& world = tessera::world();
  const int n = world.size();
  const bool mpi = world.backend() == "mpi";
  const bool root = world.rank() == 0;
#if !TESSERA_COMM_BENCH_MPI
  if (mpi)
    throw tessera::ValueError("tessera_comm_bench was built without MPI (TESSERA_WITH_MPI=OFF): no raw MPI baseline");
#endif
  std::vector<Row> rows;
  for (const int64_t mib : options.sizes_mib) {
    Buffers buffers(mib * kMiB, n);
    const int64_t bytes = buffers.bytes(n);
    const int iters = iterations(options, bytes);
    Timing copy;  // only rank 0's rows are used
    double bound = 0;
    if (!mpi) {  // rank 0 alone, the other ranks wait in the barrier
      if (root) copy = time_memcpy(bytes, iters);
      world.barrier();
      bound = copy_bound_GBps(bytes, iters);
    }
    for (Kind kind : kKinds) {
      Row row;
      row.kind = kind;
      row.bytes = bytes;
      std::vector<std::function<void()>> ops{[&] { tessera_call(kind, buffers); }};
#if TESSERA_COMM_BENCH_MPI
      if (mpi) ops.push_back([&] { mpi_call(kind, buffers); });
#endif
      const std::vector<Timing> timings = time_collectives(iters, ops);
      row.tessera = timings[0];
      const double factor = bus_factor(kind, n);
      row.busbw = static_cast<double>(bytes) / row.tessera.median_s * factor * 1e-9;
      if (mpi) {
        row.baseline = timings[1];
        row.baseline_bw = static_cast<double>(bytes) / row.baseline.median_s * factor * 1e-9;
      } else if (root) {
        row.baseline = copy;
        row.baseline_bw = static_cast<double>(bytes) / copy.median_s * 1e-9;
        row.bound_bw = bound;
        if (n > 1 && bound > 0) row.vs_bound = row.busbw / bound;
      }
      if (n > 1 && row.baseline_bw > 0) row.ratio = row.busbw / row.baseline_bw;
      row.goal = goal(mpi, kind, bytes);
      rows.push_back(row);
    }
    if (root) std::fprintf(stderr, "tessera_comm_bench: %lld MiB done\n", static_cast<long long>(mib));
  }
  if (!root) return;
  print_table(rows, mpi, n);
  const std::filesystem::path path = 
      options.json.empty() ? default_json(argv0, mpi, n) : std::filesystem::path(options.json);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  out << to_json(rows, mpi, n).dump(2) << "\n";
  if (!out) throw tessera::ValueError("could not write " + path.string());
  std::printf("\nJSON: %s\n", path.string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tessera collective bus bandwidth (threads backend: vs memcpy; under mpirun: vs raw MPI)"};
  Options options;
  app.add_option("--sizes", options.sizes_mib, "message sizes S in MiB, comma separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--iters", options.iters, "timed iterations per point (default: 50 at 1 MiB, 40 at 16, 10 at 64)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", options.json, "JSON output (default: comm_bench_<backend>_<n>.json next to the binary)");
  app.add_option("--ranks", options.ranks, "threads backend: number of ranks (read by tessera::run; TESSERA_RANKS)")
      ->check(CLI::PositiveNumber);
  app.allow_extras();  // Google Benchmark flags from `make bench BENCH_ARGS=...`
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.rfind("--benchmark_", 0) == 0) continue;
    std::cerr << "tessera_comm_bench: unknown argument '" << extra << "' (see --help)\n";
    return 2;
  }
  return tessera::run(argc, argv, [&] { bench(options, argv[0]); });
}
