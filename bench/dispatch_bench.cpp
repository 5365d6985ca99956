// Op-dispatch overhead on DTensor: what an op costs on small shards beyond the Tensor kernel
// it runs. Four ops whose inputs are already where the rule wants them (no communication):
//
//    add       [64, 64] S(0) + [64, 64] S(0)
//    matmul    [64, 32] S(0) @ [32, 16] R
//    softmax   [64, 64] S(0), dim 1
//    reshape   [64, 64] S(0) -> [4096] (the sharded leading dim flattens cleanly)
//
// Per op: local = the same Tensor op on this rank's shards (the floor); hit = the DTensor op with
// its decision cached (warmed by one call); miss = the DTensor op after clear_dispatch_cache()
// (rule + planner each call; the clear itself is not timed). overhead = hit - local.
// Goal: overhead < 1000 ns for add and matmul (PyTorch 2.15 DTensor: about 7 us of CPU time per op, measured by make bench-peers); a hit must make
// no planner call (a miss prices candidates with plans cached per process, so it reports 0 too).
// Goals are reported, never asserted.
//
// Timing: the median of 7 repetitions of the per-iteration mean (steady_clock), taken on rank 0.
// Every rank runs the same loops: ops are collective in general (SPMD), so all ranks must make
// the same calls even though these four do not communicate. A barrier starts every repetition.
//
// Usage: tessera_dispatch_bench [--iters 20000] [--miss-iters 200] [--json PATH] [--ranks 4]
// Runs on 4 ranks (a 1-d mesh of 4). Google Benchmark flags are ignored.
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <tessera/dtensor/dispatch.hpp>
#include <tessera/tessera.hpp>

#include "bench_util.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace tessera;

struct Options {
  int iters = 20000;
  int miss_iters = 200;
  std::string json;
  int ranks = 4;
};

constexpr int kRepetitions = 7;

struct Case {
  std::string name;
  std::function<void()> local;    // the Tensor op on the local shards
  std::function<void()> dtensor;  // the DTensor op
};

// One repetition: the mean ns per call of `op` over `iters` calls, every rank starting together.
double mean_ns(int iters, const std::function<void()>& op) {
  world().barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
}

// The same with `before` run untimed ahead of each call, so each call is timed on its own
// (steady_clock's own cost, ~20 ns, is small against a cache miss).
double mean_ns(int iters, const std::function<void()>& op, const std::function<void()>& before) {
  world().barrier();
  double ns = 0;
  for (int i = 0; i < iters; ++i) {
    before();
    const auto t0 = Clock::now();
    op();
    ns += std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  }
  return ns / iters;
}

// The first call of an op on a mesh: dispatch and plan caches both cleared, so the rule, the
// strategy pricing and every plan it needs run (issue 12 item 13: 0.6-1.2 s per rank on 3-d
// meshes before the bounded search; goal < 1 ms). Inputs need moving: x (S(0), R, S(1)) style
// layouts against a weight and a Partial. The median of kRepetitions, on rank 0 (all ranks plan
// at once, sharing the process's plan cache as they do in use).
// CPU time of the calling thread (a rank), in microseconds.
double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

nlohmann::json cold_misses() {
  const std::vector<std::vector<int64_t>> shapes = {{4}, {2, 2}, {1, 2, 2}, {2, 1, 2}};
  nlohmann::json out = nlohmann::json::array();
  if (rank() == 0) {
    std::printf("\nfirst call with cold caches (dispatch and plans cleared), us, median of %d\n", kRepetitions);
    std::printf("(wall: rank 0's elapsed time; cpu: rank 0's thread CPU time, which excludes waiting for\n"
                " the other rank threads on the shared cores)\n");
    std::printf("%-10s %12s %12s %12s %10s %10s %10s %16s\n", "mesh", "matmul", "add(P)", "matmul(P)", "cpu",
                "cpu", "cpu", "plans/3 calls");
  }
  for (const auto& shape : shapes) {
    static const std::vector<std::string> all_names = {"a", "b", "c"};
    const std::vector<std::string> names(all_names.begin(), all_names.begin() + static_cast<long>(shape.size()));
    const DeviceMesh mesh(shape, names);
    // x, w and a Partial y per mesh rank: layouts an op must move, as in a real model.
    const auto pick = [&](Placements one, Placements two, Placements three) {
      return shape.size() == 1 ? one : shape.size() == 2 ? two : three;
    };
    const DTensor x = rand({48, 40}, mesh, pick({Shard{0}}, {Shard{0}, Shard{1}}, {Shard{0}, Replicate{}, Shard{1}}));
    const DTensor w = rand({40, 24}, mesh, pick({Replicate{}}, {Replicate{}, Shard{1}}, {Replicate{}, Shard{1}, Replicate{}}));
    const Layout partial(Shape{48, 40}, DType::f32, mesh.spec(),
                         pick({Partial{}}, {Shard{0}, Partial{}}, {Replicate{}, Shard{0}, Partial{}}));
    const DTensor y(ones(partial.local_shape(mesh.coordinate())), mesh, partial);
    DTensor sink;
    const std::vector<std::function<void()>> ops = {[&] { sink = matmul(x, w); }, [&] { sink = add(x, y); },
                                                     [&] { sink = matmul(y, w); }};
    std::vector<double> medians, cpu_medians;
    uint64_t plans = 0;
    for (const auto& op : ops) {
      std::vector<double> reps, cpu_reps;
      for (int r = 0; r < kRepetitions; ++r) {
        world().barrier();
        if (rank() == 0) clear_plan_cache();
        clear_dispatch_cache();
        world().barrier();
        const uint64_t before = plan_call_count();
        const double cpu0 = thread_cpu_us();
        const auto t0 = Clock::now();
        op();
        reps.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        cpu_reps.push_back(thread_cpu_us() - cpu0);
        plans += plan_call_count() - before;
      }
      medians.push_back(bench_util::median(reps));
      cpu_medians.push_back(bench_util::median(cpu_reps));
    }
    if (rank() == 0) {
      std::printf("%-10s %12.0f %12.0f %12.0f %10.0f %10.0f %10.0f %16.1f\n", mesh.spec().shape().to_string().c_str(),
                  medians[0], medians[1], medians[2], cpu_medians[0], cpu_medians[1], cpu_medians[2],
                  static_cast<double>(plans) / kRepetitions);
      out.push_back({{"mesh", mesh.spec().shape().to_string()},
                     {"matmul_us", medians[0]},
                     {"add_partial_us", medians[1]},
                     {"matmul_partial_us", medians[2]},
                     {"matmul_cpu_us", cpu_medians[0]},
                     {"add_partial_cpu_us", cpu_medians[1]},
                     {"matmul_partial_cpu_us", cpu_medians[2]},
                     {"plans_per_3_calls", static_cast<double>(plans) / kRepetitions}});
    }
  }
  if (rank() == 0) std::printf("goal: < 1000 us on 3-d meshes (issue 12 item 13); 4 rank threads share the cores\n");
  return out;
}

void bench(const Options& options, const char* argv0) {
  TESSERA_CHECK(world_size() == 4, ValueError, "tessera_dispatch_bench", "needs 4 ranks, got ", world_size());
  const DeviceMesh mesh({4}, {"x"});
  const DTensor a = rand({64, 64}, mesh, {Shard{0}}), b = rand({64, 64}, mesh, {Shard{0}});
  const DTensor m = rand({64, 32}, mesh, {Shard{0}}), w = rand({32, 16}, mesh, {Replicate{}});
  const Tensor la = a.to_local(), lb = b.to_local(), lm = m.to_local(), lw = w.to_local();
  const Shape flat_local{la.numel()};  // the local shard flattened, as the DTensor reshape does
  // Results are assigned to a live Tensor so each call allocates and frees its output as in use.
  Tensor sink;
  DTensor dsink;
  const std::vector<Case> cases = {
      {"add", [&] { sink = add(la, lb); }, [&] { dsink = add(a, b); }},
      {"matmul", [&] { sink = matmul(lm, lw); }, [&] { dsink = matmul(m, w); }},
      {"softmax", [&] { sink = softmax(la, 1); }, [&] { dsink = softmax(a, 1); }},
      {"reshape", [&] { sink = reshape(la, flat_local); }, [&] { dsink = reshape(a, Shape{64 * 64}); }},
  };

  nlohmann::json rows = nlohmann::json::array();
  if (rank() == 0) {
    std::printf(
        "DTensor op dispatch on %d ranks (%s), mesh [4], f32, median of %d repetitions of %d calls "
        "(miss: %d)\n",
        world_size(), bench_util::backend_name(), kRepetitions, options.iters, options.miss_iters);
    std::printf("%-8s %10s %14s %12s %10s %16s %17s\n", "op", "local ns", "DTensor hit ns", "overhead ns",
                "miss us", "planner/hit", "planner/miss");
  }
  for (const Case& c : cases) {
    // Local and hit repetitions alternate, so both see the same machine (4 rank threads may
    // share fewer cores, and drift between separate blocks would show up as overhead).
    std::vector<double> local_reps, hit_reps, miss_reps;
    c.dtensor();  // warm: the decision is cached from here on
    reset_dispatch_stats();
    for (int r = 0; r < kRepetitions; ++r) {
      local_reps.push_back(mean_ns(options.iters, c.local));
      hit_reps.push_back(mean_ns(options.iters, c.dtensor));
    }
    const DispatchStats hit = dispatch_stats();

    reset_dispatch_stats();
    for (int r = 0; r < kRepetitions; ++r)
      miss_reps.push_back(mean_ns(options.miss_iters, c.dtensor, [] { clear_dispatch_cache(); }));
    const DispatchStats miss = dispatch_stats();
    const double local_ns = bench_util::median(local_reps), hit_ns = bench_util::median(hit_reps),
                 miss_ns = bench_util::median(miss_reps);

    const double hit_calls = static_cast<double>(kRepetitions) * options.iters;
    const double miss_calls = static_cast<double>(kRepetitions) * options.miss_iters;
    const double planner_per_hit = static_cast<double>(hit.planner_calls) / hit_calls;
    const double planner_per_miss = static_cast<double>(miss.planner_calls) / miss_calls;
    if (rank() == 0) {
      std::printf("%-8s %10.0f %14.0f %12.0f %10.2f %16.3f %17.3f\n", c.name.c_str(), local_ns, hit_ns,
                  hit_ns - local_ns, miss_ns / 1e3, planner_per_hit, planner_per_miss);
      rows.push_back({{"op", c.name},
                      {"local_ns", local_ns},
                      {"hit_ns", hit_ns},
                      {"overhead_ns", hit_ns - local_ns},
                      {"miss_us", miss_ns / 1e3},
                      {"planner_calls_per_hit", planner_per_hit},
                      {"planner_calls_per_miss", planner_per_miss},
                      {"hits", hit.hits},
                      {"misses_in_hit_loop", hit.misses},
                      {"misses", miss.misses}});
    }
  }
  if (rank() == 0)
    std::printf("goal: overhead < 1000 ns for add and matmul (PyTorch 2.15 DTensor: about 7 us of CPU time; make bench-peers measures it); planner/hit = 0\n");
  const nlohmann::json cold = cold_misses();
  if (rank() == 0) {
    bench_util::write_json({{"ranks", world_size()},
                            {"iters", options.iters},
                            {"miss_iters", options.miss_iters},
                            {"repetitions", kRepetitions},
                            {"rows", rows},
                            {"cold_misses", cold}},
                           options.json, argv0, "dispatch_bench");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Tessera DTensor op dispatch: overhead over the local Tensor op, cache hit and miss"};
  app.add_option("--iters", options.iters, "calls per repetition, local and cache hit")->check(CLI::PositiveNumber);
  app.add_option("--miss-iters", options.miss_iters, "calls per repetition, cache miss")->check(CLI::PositiveNumber);
  app.add_option("--json", options.json, "JSON output (default: next to the binary)");
  app.add_option("--ranks", options.ranks, "threads backend: number of ranks (read by tessera::run)");
  app.allow_extras();  // Google Benchmark flags from `make bench BENCH_ARGS=...`
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tessera::run(argc, argv, [&] { bench(options, argv[0]); });
}
