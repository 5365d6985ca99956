// Calibrates the planner's CostModel (tessera/sharding/cost_model.hpp) for the running backend:
// times real redistributions (DTensor::redistribute, each after a barrier, the slowest rank's
// time, median over iterations) of single collectives and multi-dim collectives over 2- and
// 4-rank groups at sizes from 16 B to 1 MiB, then fits
//
//     time = call_us * calls + message_us * messages + bytes / bytes_per_us
//
// by least squares on relative error (every coefficient >= 0), with calls, messages and bytes
// (the busiest rank's receives, summed over steps) taken from the plan itself. Prints each
// case's measured time next to the fitted and the recorded model's estimate, and the line to
// record in cost_model.cpp. Nothing is asserted.
//
// Usage: tessera_cost_model_bench [--iters N] [--ranks 4] [--json PATH] [--no-message-term]
//        mpirun -np 4 tessera_cost_model_bench
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <tessera/tessera.hpp>

#include "bench_util.hpp"

using namespace tessera;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int iters = 30;
  bool no_messages = false;  // fit call + bytes only (backends without per-message rounds)
  int ranks = 4;
  std::string json;
};

struct Case {
  std::string name;
  bool square;  // 2 x (n/2) mesh, else the line of n ranks
  Placements src, dst;
};

std::vector<Case> cases() {
  const Placement P = Partial{}, R = Replicate{}, S0 = Shard{0}, S1 = Shard{1};
  return {
      {"P -> R", false, {P}, {R}},
      {"P -> S(0)", false, {P}, {S0}},
      {"S(0) -> R", false, {S0}, {R}},
      {"S(0) -> S(1)", false, {S0}, {S1}},
      {"(R, P) -> (R, R)", true, {R, P}, {R, R}},
      {"(S(0), R) -> (R, R)", true, {S0, R}, {R, R}},
      {"(P, P) -> (R, R)", true, {P, P}, {R, R}},
      {"(S(0), S(1)) -> (R, R)", true, {S0, S1}, {R, R}},
      {"(P, P) -> (S(0), S(1))", true, {P, P}, {S0, S1}},
      {"(S(0), S(1)) -> (S(1), S(0))", true, {S0, S1}, {S1, S0}},
  };
}

struct Point {
  std::string name, plan;
  int64_t side = 0;
  double calls = 0, messages = 0, bytes = 0;
  double measured_us = 0;
};

double slowest(double seconds) {
  world().all_reduce(&seconds, 1, DType::f64, ReduceOp::max);
  return seconds;
}

// Median time of redistributing `input` to `dst` (slowest rank per iteration), in microseconds.
double time_redistribute(const DTensor& input, const DeviceMesh& mesh, const Layout& dst, int iters) {
  std::vector<double> samples;
  for (int i = -3; i < iters; ++i) {
    world().barrier();
    const auto start = Clock::now();
    DTensor out = input.redistribute(mesh, dst);
    const double t = slowest(std::chrono::duration<double>(Clock::now() - start).count());
    if (i >= 0) samples.push_back(t * 1e6);
  }
  return bench_util::median(samples);
}

using Coefficients = std::array<double, 3>;  // call_us, message_us, us per byte

double estimate(const Point& p, const Coefficients& c) { return c[0] * p.calls + c[1] * p.messages + c[2] * p.bytes; }

// Least squares on relative error over the coefficients in `use` (the others 0); nullopt-like
// (all NaN) when the system is singular.
Coefficients fit(const std::vector<Point>& points, const std::array<bool, 3>& use) {
  std::array<std::array<double, 4>, 3> m{};  // normal equations [A | b]
  for (const Point& p : points) {
    const std::array<double, 3> x{p.calls / p.measured_us, p.messages / p.measured_us, p.bytes / p.measured_us};
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) m[i][j] += x[i] * x[j];
      m[i][3] += x[i];
    }
  }
  for (int i = 0; i < 3; ++i)
    if (!use[i]) {
      m[i] = {0, 0, 0, 0};
      m[i][i] = 1;
      for (int j = 0; j < 3; ++j)
        if (j != i) m[j][i] = 0;
    }
  for (int col = 0; col < 3; ++col) {  // Gauss-Jordan with partial pivoting
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    std::swap(m[col], m[pivot]);
    if (std::abs(m[col][col]) < 1e-300) return {NAN, NAN, NAN};
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int k = col; k < 4; ++k) m[r][k] -= f * m[col][k];
    }
  }
  return {m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]};
}

double relative_error(const std::vector<Point>& points, const Coefficients& c) {
  double sum = 0;
  for (const Point& p : points) sum += std::pow(estimate(p, c) / p.measured_us - 1, 2);
  return std::sqrt(sum / static_cast<double>(points.size()));
}

// The best fit with every coefficient >= 0 and a bandwidth term, over the subsets of latency
// terms (without the message term if `no_messages`).
Coefficients best_fit(const std::vector<Point>& points, bool no_messages) {
  Coefficients best{NAN, NAN, NAN};
  double best_error = std::numeric_limits<double>::infinity();
  for (const std::array<bool, 3>& use : {std::array{true, true, true}, std::array{true, false, true},
                                         std::array{false, true, true}, std::array{false, false, true}}) {
    if (no_messages && use[1]) continue;
    const Coefficients c = fit(points, use);
    if (std::isnan(c[0]) || c[0] < 0 || c[1] < 0 || c[2] <= 0) continue;
    const double error = relative_error(points, c);
    if (error < best_error) best = c, best_error = error;
  }
  return best;
}

void bench(const Options& options, const char* argv0) {
  const int n = world_size();
  TESSERA_CHECK(n >= 4 && n % 2 == 0, ValueError, "tessera_cost_model_bench", "needs an even number >= 4 of ranks, got ",
                n);
  const DeviceMesh line({n}, {"x"});
  const DeviceMesh square({2, n / 2}, {"a", "b"});
  const CostModel recorded = CostModel::for_backend(world().backend());
  std::vector<Point> points;
  for (const Case& c : cases())
    for (int64_t side : {2, 8, 32, 128, 512}) {
      const DeviceMesh& mesh = c.square ? square : line;
      const Shape shape{side * n / 2, side * 2};
      const Layout src(shape, DType::f32, mesh.spec(), c.src), dst(shape, DType::f32, mesh.spec(), c.dst);
      const DTensor input(full(src.block(mesh.coordinate()).shape(), 1.0), mesh, src);
      const Plan& plan = *cached_plan(src, dst);
      Point p{c.name, "", side, 0, 0, 0, 0};
      for (const PlanStep& s : plan.steps) {
        p.plan.append(p.plan.empty() ? "" : " + ").append(tessera::name(s.kind));
        if (s.mesh_dims.size() > 1) p.plan.append("[").append(std::to_string(s.mesh_dims.size())).append("d]");
        p.bytes += static_cast<double>(s.max_bytes_received());
      }
      p.calls = static_cast<double>(plan.calls());
      p.messages = static_cast<double>(plan.messages());
      if (p.calls == 0) continue;  // nothing moves: nothing to calibrate
      p.measured_us = time_redistribute(input, mesh, dst, side >= 512 ? std::max(5, options.iters / 3) : options.iters);
      points.push_back(p);
    }
  const Coefficients fitted = best_fit(points, options.no_messages);
  const Coefficients mine{recorded.call_us, recorded.message_us, 1 / recorded.bytes_per_us};
  if (rank() != 0) return;
  std::printf("cost model calibration, %s backend, %d ranks; median of %d redistributions per point\n",
              bench_util::backend_name(), n, options.iters);
  std::printf("%-30s %9s %-32s %5s %5s %10s %11s %9s %9s\n", "transition", "bytes", "plan", "calls", "msgs",
              "recv B", "measured us", "fit us", "recorded");
  nlohmann::json rows = nlohmann::json::array();
  for (const Point& p : points) {
    const int64_t bytes = p.side * n / 2 * p.side * 2 * 4;
    std::printf("%-30s %9lld %-32s %5.0f %5.0f %10.0f %11.1f %9.1f %9.1f\n", p.name.c_str(),
                static_cast<long long>(bytes), p.plan.c_str(), p.calls, p.messages, p.bytes, p.measured_us,
                estimate(p, fitted), estimate(p, mine));
    rows.push_back({{"transition", p.name}, {"tensor_bytes", bytes}, {"plan", p.plan}, {"calls", p.calls},
                    {"messages", p.messages}, {"recv_bytes", p.bytes}, {"measured_us", p.measured_us},
                    {"fit_us", estimate(p, fitted)}, {"recorded_us", estimate(p, mine)}});
  }
  const CostModel model{fitted[0], fitted[1], 1 / fitted[2]};
  std::printf("\nrms relative error: fitted %.2f, recorded %.2f\n", relative_error(points, fitted),
              relative_error(points, mine));
  std::printf("fitted:   %s\nrecorded: %s\n", model.to_string().c_str(), recorded.to_string().c_str());
  std::printf("to record (cost_model.cpp): CostModel{%.3g, %.3g, %.4g}\n", model.call_us, model.message_us,
              model.bytes_per_us);
  bench_util::write_json({{"backend", bench_util::backend_name()},
                          {"ranks", n},
                          {"fitted", {{"call_us", model.call_us}, {"message_us", model.message_us}, {"bytes_per_us", model.bytes_per_us}}},
                          {"recorded", {{"call_us", recorded.call_us}, {"message_us", recorded.message_us}, {"bytes_per_us", recorded.bytes_per_us}}},
                          {"rows", rows}},
                         options.json, argv0, "cost_model_bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Tessera cost model: fits the planner's call, message and bandwidth constants to timed redistributions"};
  app.add_option("--iters", options.iters, "timed iterations per point")->check(CLI::PositiveNumber);
  app.add_option("--json", options.json, "JSON output (default: next to the binary)");
  app.add_flag("--no-message-term", options.no_messages, "fit call + bytes only (the threads backend: one rendezvous per call)");
  app.add_option("--ranks", options.ranks, "threads backend: number of ranks (read by tessera::run)");
  app.allow_extras();  // Google Benchmark flags from `make bench BENCH_ARGS=...`
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tessera::run(argc, argv, [&] { bench(options, argv[0]); });
}
