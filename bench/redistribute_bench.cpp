// Redistribution: bytes the planner moves against the lower bound, and the time of
// DTensor::redistribute against the raw collectives its plan lowers to, measured in the same run.
//
//  * bytes: the most any rank receives over the plan / the lower bound (a rank must receive what
//    it needs and does not hold; for Partial sources the reduce-scatter bound). Goal 1.00. The
//    DTensor column is what PyTorch DTensor's greedy per-mesh-dim planner moves for the same
//    transition (gather every changed dim, then chunk), for the trap cases.
//  * time: redistribute (planning cached, packing, allocation of the result) / the same plan's
//    collectives called directly on preallocated, pre-packed buffers (no planning, no packing).
//    Goal: overhead ~ 0, a ratio near 1. Medians over iterations; an iteration's time is the
//    slowest rank's; every iteration starts after a barrier; the two alternate.
//
// Usage: tessera_redistribute_bench [--mib 16] [--iters 20] [--json PATH] [--ranks 4]
//        mpirun -np 4 tessera_redistribute_bench
// Runs on 4 ranks (a 1-d mesh of 4 and a 2x2 mesh). Google Benchmark flags are ignored.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace tessera;

struct Options {
  int64_t mib = 16;
  int iters = 20;
  std::string json;
  int ranks = 4;
};

struct Case {
  std::string name;
  std::vector<int64_t> mesh;
  Placements src, dst;
  bool uneven = false;
  int64_t dtensor_factor = 0;  // DTensor's bytes / lower bound for the trap cases (0: not a trap)
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"S(0) -> R", {4}, {Shard{0}}, {Replicate{}}},
      {"S(0) -> S(1)", {4}, {Shard{0}}, {Shard{1}}},
      {"S(0) -> S(1) uneven", {4}, {Shard{0}}, {Shard{1}}, true},
      {"P(sum) -> R", {4}, {Partial{}}, {Replicate{}}},
      {"P(sum) -> S(0)", {4}, {Partial{}}, {Shard{0}}},
      {"R -> S(1)", {4}, {Replicate{}}, {Shard{1}}},
      {"(S(0), R) -> (R, R)", {2, 2}, {Shard{0}, Replicate{}}, {Replicate{}, Replicate{}}},
      {"(S(0), S(1)) -> (S(1), S(0))", {2, 2}, {Shard{0}, Shard{1}}, {Shard{1}, Shard{0}}, false, 4},
      {"(S(0), S(0)) -> (R, S(0))", {2, 2}, {Shard{0}, Shard{0}}, {Replicate{}, Shard{0}}, false, 2},
      {"(P(sum), S(0)) -> (R, R)", {2, 2}, {Partial{}, Shard{0}}, {Replicate{}, Replicate{}}},
  };
  return all;
}

double slowest(double seconds) {
  world().all_reduce(&seconds, 1, DType::f64, ReduceOp::max);
  return seconds;
}

// The plan's collectives on preallocated contiguous buffers with the plan's counts.
struct RawPlan {
  std::vector<std::function<void()>> calls;
  std::vector<Tensor> buffers;
};

RawPlan raw_collectives(const Plan& plan, const DeviceMesh& mesh) {
  RawPlan raw;
  const auto coordinate = mesh.coordinate();
  const int me = rank();
  const DType dtype = plan.src.dtype();
  auto buffer = [&](int64_t n) -> void* {
    raw.buffers.push_back(zeros(Shape{std::max<int64_t>(n, 1)}, dtype));
    return raw.buffers.back().raw_data();
  };
  for (const PlanStep& step : plan.steps) {
    if (step.kind == StepKind::local_chunk || step.kind == StepKind::to_partial) continue;
    if (step.kind == StepKind::exchange) {
      Communicator& comm = *mesh.mesh_comm_ptr();
      std::vector<int64_t> send(static_cast<size_t>(comm.size()), 0), recv = send;
      const auto& ranks = comm.world_ranks();
      auto index = [&](int r) { return static_cast<size_t>(std::find(ranks.begin(), ranks.end(), r) - ranks.begin()); };
      for (const Transfer& t : exchange_transfers(step.before, step.after, me)) {
        if (t.src_rank == me) send[index(t.dst_rank)] += t.block.numel();
        if (t.dst_rank == me) recv[index(t.src_rank)] += t.block.numel();
      }
      int64_t ns = 0, nr = 0;
      for (auto c : send) ns += c;
      for (auto c : recv) nr += c;
      void* s = buffer(ns);
      void* r = buffer(nr);
      raw.calls.push_back([&comm, s, r, send, recv, dtype] { comm.all_to_all_v(s, send, r, recv, dtype); });
      continue;
    }
    Communicator& comm = *mesh.comm_ptr(step.mesh_dims);
    const auto group = mesh.spec().group(coordinate, step.mesh_dims);
    std::vector<int64_t> before, after;
    for (const auto& c : group) {
      before.push_back(step.before.block(c).numel());
      after.push_back(step.after.block(c).numel());
    }
    const int64_t own = before[static_cast<size_t>(comm.rank())];
    int64_t total_before = 0, total_after = 0;
    for (auto n : before) total_before += n;
    for (auto n : after) total_after += n;
    const ReduceOp op = step.op;
    switch (step.kind) {
      case StepKind::all_gather: {
        void* s = buffer(own);
        void* r = buffer(total_before);
        raw.calls.push_back([&comm, s, r, before, dtype] { comm.all_gather_v(s, r, before, dtype); });
        break;
      }
      case StepKind::all_to_all: {
        // Same pieces as the executor: my block intersected with every peer's new block.
        std::vector<int64_t> send, recv;
        const Block held = step.before.block(coordinate), want = step.after.block(coordinate);
        int64_t ns = 0, nr = 0;
        for (const auto& cc : group) {
          send.push_back(held.intersect(step.after.block(cc)).numel());
          recv.push_back(want.intersect(step.before.block(cc)).numel());
          ns += send.back();
          nr += recv.back();
        }
        void* s = buffer(ns);
        void* r = buffer(nr);
        raw.calls.push_back([&comm, s, r, send, recv, dtype] { comm.all_to_all_v(s, send, r, recv, dtype); });
        break;
      }
      case StepKind::reduce_scatter: {
        void* s = buffer(total_after);
        void* r = buffer(after[static_cast<size_t>(comm.rank())]);
        raw.calls.push_back([&comm, s, r, after, dtype, op] { comm.reduce_scatter_v(s, r, after, dtype, op); });
        break;
      }
      case StepKind::all_reduce: {
        void* s = buffer(own);
        raw.calls.push_back([&comm, s, own, dtype, op] { comm.all_reduce(s, own, dtype, op); });
        break;
      }
      default:
        break;
    }
  }
  return raw;
}

void bench(const Options& options, const char* argv0) {
  TESSERA_CHECK(world_size() == 4, ValueError, "tessera_redistribute_bench", "needs 4 ranks, got ", world_size());
  const DeviceMesh line({4}, {"x"});
  const DeviceMesh square({2, 2}, {"dp", "tp"});
  // A square f32 tensor of about `mib` MiB; the uneven cases add a few rows and columns.
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(options.mib << 20) / 4.0));
  nlohmann::json rows = nlohmann::json::array();
  if (rank() == 0) {
    std::printf("redistribute on %d ranks (%s), f32 %lld x %lld (%.1f MiB), median of %d\n", world_size(),
                bench_util::backend_name(), static_cast<long long>(side), static_cast<long long>(side),
                static_cast<double>(side * side * 4) / (1 << 20), options.iters);
    std::printf("%-30s %-12s %-26s %10s %10s %6s %7s %9s %9s %6s\n", "transition", "mesh", "plan", "recv/rank",
                "bound", "ratio", "DTensor", "time ms", "raw ms", "ratio");
  }
  for (const Case& c : cases()) {
    const DeviceMesh& mesh = c.mesh.size() == 1 ? line : square;
    const Shape shape = c.uneven ? Shape{side + 3, side - 5} : Shape{side, side};
    const Layout src(shape, DType::f32, mesh.spec(), c.src), dst(shape, DType::f32, mesh.spec(), c.dst);
    const DTensor input(zeros(src.block(mesh.coordinate()).shape()) + static_cast<double>(rank()), mesh, src);
    const Plan& plan = *cached_plan(src, dst);
    RawPlan raw = raw_collectives(plan, mesh);
    std::vector<double> ours, theirs;
    for (int i = 0; i < options.iters + 2; ++i) {
      for (int which = 0; which < 2; ++which) {
        const bool tessera_first = (i % 2 == 0) == (which == 0);
        world().barrier();
        const auto t0 = Clock::now();
        if (tessera_first) {
          DTensor out = input.redistribute(mesh, dst);
        } else {
          for (auto& call : raw.calls) call();
        }
        const double t = slowest(std::chrono::duration<double>(Clock::now() - t0).count());
        if (i >= 2) (tessera_first ? ours : theirs).push_back(t);
      }
    }
    const double t_ours = bench_util::median(ours), t_raw = bench_util::median(theirs);
    const int64_t bytes = plan.max_bytes_received(), bound = plan_lower_bound(src, dst);
    std::string steps;
    for (const PlanStep& s : plan.steps) steps.append(steps.empty() ? "" : " + ").append(std::string(name(s.kind)));
    const double byte_ratio = bound > 0 ? static_cast<double>(bytes) / static_cast<double>(bound) : 1.0;
    const bool silent = raw.calls.empty();  // no communication: nothing to compare with
    const double time_ratio = silent ? 0.0 : t_ours / t_raw;
    if (rank() == 0) {
      const std::string dtensor = c.dtensor_factor ? std::to_string(c.dtensor_factor) + ".00" : "";
      const std::string ratio = silent ? "-" : std::to_string(time_ratio).substr(0, 4);
      std::printf("%-30s %-12s %-26s %8.2fMB %8.2fMB %6.2f %7s %9.3f %9.3f %6s\n", c.name.c_str(),
                  mesh.to_string().substr(4).c_str(), steps.c_str(), static_cast<double>(bytes) / 1e6,
                  static_cast<double>(bound) / 1e6, byte_ratio, dtensor.c_str(), t_ours * 1e3, t_raw * 1e3,
                  ratio.c_str());
      rows.push_back({{"transition", c.name}, {"mesh", mesh.to_string()}, {"plan", steps}, {"bytes_recv_max", bytes},
                      {"lower_bound", bound}, {"byte_ratio", byte_ratio}, {"dtensor_byte_ratio", c.dtensor_factor},
                      {"time_s", t_ours}, {"raw_time_s", t_raw}, {"time_ratio", time_ratio}});
    }
  }
  if (rank() == 0) {
    bench_util::write_json({{"ranks", world_size()}, {"mib", options.mib}, {"rows", rows}}, options.json, argv0,
                           "redistribute_bench");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Tessera redistribute: bytes vs lower bound, time vs the raw collectives of the plan"};
  app.add_option("--mib", options.mib, "tensor size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--iters", options.iters, "timed iterations per case")->check(CLI::PositiveNumber);
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
