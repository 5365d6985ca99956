// parallelize's estimates against measured step times, in the same run: the transformer LM on a
// 1-d or 2-d mesh of in-process ranks; mpmd::plan_parallelism prices every candidate plan (its
// compute from one measured unsharded step, its communication by the planner's cost model), then
// each candidate is applied to a fresh model and its forward + loss + backward timed (median of
// --reps steps after a warm-up, the slowest rank). Prints estimate, measurement and their ratio
// per plan, and whether the chosen plan was also the fastest measured of those within the budget. Nothing is asserted.
// With --pp S the mesh gains a leading pipeline axis of S stages: every candidate is a pipeline
// (its boundaries chosen by parallelize) of --microbatches microbatches, and its measured time is
// Pipeline::step's (1F1B).
//
// Usage: tessera_parallelize_bench [--ranks 4] [--mesh 1|2] [--pp 0] [--microbatches 4] [--batch 16]
//        [--seq 32] [--dim 64] [--hidden 256] [--vocab 256] [--layers 2] [--reps 5] [--budget-kib 0]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

using namespace tessera;

namespace {

struct Options {
  int64_t mesh_dims = 1, pp = 0, microbatches = 4, batch = 16, seq = 32, dim = 64, hidden = 256, vocab = 256, layers = 2;
  int64_t budget_kib = 0;  // per rank; 0: none
  int reps = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--mesh") o.mesh_dims = value;
    if (flag == "--pp") o.pp = value;
    if (flag == "--budget-kib") o.budget_kib = value;
    if (flag == "--microbatches") o.microbatches = value;
    if (flag == "--batch") o.batch = value;
    if (flag == "--seq") o.seq = value;
    if (flag == "--dim") o.dim = value;
    if (flag == "--hidden") o.hidden = value;
    if (flag == "--vocab") o.vocab = value;
    if (flag == "--layers") o.layers = value;
    if (flag == "--reps") o.reps = static_cast<int>(value);
  }
  return o;
}

nn::TransformerConfig config_of(const Options& o) {
  nn::TransformerConfig c;
  c.vocab = o.vocab;
  c.dim = o.dim;
  c.heads = 4;
  c.layers = o.layers;
  c.max_seq = o.seq;
  c.hidden = o.hidden;
  return c;
}

std::pair<Tensor, Tensor> tokens(const Options& o) {
  std::vector<int64_t> ids(static_cast<size_t>(o.batch * o.seq)), next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3) % static_cast<size_t>(o.vocab));
    next[i] = static_cast<int64_t>((i * 7 + 10) % static_cast<size_t>(o.vocab));
  }
  return {from_vector(ids, Shape{o.batch, o.seq}), from_vector(next, Shape{o.batch, o.seq})};
}

// Median over --reps runs of `step` after a warm-up, each the slowest rank's, in us.
double median_step_us(nn::TransformerLM& model, const Options& o, const std::function<void()>& step) {
  std::vector<double> times;
  for (int i = 0; i <= o.reps; ++i) {
    world().barrier();
    const auto start = std::chrono::steady_clock::now();
    step();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    world().all_reduce(&us, 1, DType::f64, ReduceOp::max);
    if (i > 0) times.push_back(us);
    model.zero_grad();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median over reps of forward + loss + backward, the slowest rank's, in us.
double measure(nn::TransformerLM& model, const mpmd::PlanEstimate& plan, const Options& o) {
  const DeviceMesh& mesh = model.mesh();
  Placements data(static_cast<size_t>(mesh.ndim()), Replicate{});
  for (const auto& a : plan.strategy.data.axes) data[static_cast<size_t>(mesh.spec().dim_of(a))] = Shard{0};
  const auto [ids, next] = tokens(o);
  const DTensor x = distribute_tensor(ids, mesh, data), t = distribute_tensor(next, mesh, data);
  return median_step_us(model, o, [&] { model.loss(x, t).backward(); });
}

// The same for a pipeline plan: median over reps of Pipeline::step, the slowest rank's, in us.
double measure_pipeline(nn::TransformerLM& model, const mpmd::ParallelPlan& plan, const Options& o) {
  mpmd::Pipeline pipeline = mpmd::make_pipeline(model, plan);
  const auto [ids, next] = tokens(o);
  const DTensor x = distribute_tensor(ids, plan.stage_meshes.front(), plan.data);
  const DTensor t = distribute_tensor(next, plan.stage_meshes.back(), plan.data);
  return median_step_us(model, o, [&] { pipeline.step(x, t); });
}

DeviceMesh mesh_of(const Options& o, int n) {
  if (o.pp > 0) {
    const int64_t rest = n / o.pp;
    if (o.mesh_dims == 2 && rest % 2 == 0) return DeviceMesh({o.pp, 2, rest / 2}, {"pp", "dp", "tp"});
    return DeviceMesh({o.pp, rest}, {"pp", "x"});
  }
  return o.mesh_dims == 2 && n % 2 == 0 ? DeviceMesh({2, n / 2}, {"dp", "tp"}) : DeviceMesh({n}, {"x"});
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  return run(argc, argv, [&] {
    const int n = world_size();
    const DeviceMesh mesh = mesh_of(o, n);
    // With a pipeline the model lives on this rank's stage.
    const DeviceMesh model_mesh = o.pp > 0 ? mesh.slice({{"pp", mesh.coordinate("pp")}}) : mesh;
    const nn::TransformerConfig c = config_of(o);
    mpmd::ParallelizeOptions options;
    options.batch = o.batch;
    options.seq = o.seq;
    options.print = false;
    if (o.pp > 0) options.pipeline_axis = "pp", options.microbatches = o.microbatches;
    manual_seed(1);
    nn::TransformerLM probe(model_mesh, c);
    const mpmd::ParallelPlan plan = mpmd::plan_parallelism(probe, mesh, o.budget_kib * 1024, options);
    if (rank() == 0)
      std::printf("transformer LM: %lld layers, dim %lld, hidden %lld, vocab %lld; step [%lld, %lld] tokens on %s\n\n%s\n",
                  static_cast<long long>(c.layers), static_cast<long long>(c.dim), static_cast<long long>(c.hidden),
                  static_cast<long long>(c.vocab), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
                  mesh.to_string().c_str(), plan.to_string().c_str());
    if (rank() == 0) std::printf("%-40s %12s %12s %10s\n", "plan", "estimate us", "measured us", "meas/est");
    std::string fastest;
    double best = 1e300;
    for (const mpmd::PlanEstimate& e : plan.candidates) {
      manual_seed(1);
      nn::TransformerLM model(model_mesh, c);
      mpmd::apply_plan(model, e.strategy);
      mpmd::ParallelPlan as_chosen = plan;
      as_chosen.chosen = e;
      as_chosen.data.assign(static_cast<size_t>(model_mesh.ndim()), Replicate{});
      for (const auto& a : e.strategy.data.axes)
        as_chosen.data[static_cast<size_t>(model_mesh.spec().dim_of(a))] = Shard{0};
      const double measured = o.pp > 0 ? measure_pipeline(model, as_chosen, o) : measure(model, e, o);
      if (e.fits && measured < best) best = measured, fastest = e.name();
      if (rank() == 0)
        std::printf("%-40s %12.0f %12.0f %10.2f\n", e.name().c_str(), e.estimated_us(), measured,
                    measured / e.estimated_us());
    }
    if (rank() == 0)
      std::printf("\nchosen: %s; fastest measured of those that fit the budget: %s\n", plan.chosen.name().c_str(),
                  fastest.c_str());
  });
}
