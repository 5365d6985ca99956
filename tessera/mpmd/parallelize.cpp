#include <tessera/mpmd/parallelize.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/detail/lm_units.hpp>
#include <tessera/mpmd/detail/plan_search.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera::mpmd {

namespace {

using detail::ParameterInfo;
using detail::PipelinePricing;
using detail::StepShape;
using detail::UnitCost;

std::string parent_of(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

// What parallelize plans for: a module, the units its parameters fall into (what a pipeline
// stage or an FSDP choice takes whole), its tensor parallel plan, how to time its step.
struct Subject {
  explicit Subject(nn::Module& m) : model(m) {}
  nn::Module& model;
  int64_t units = 0;
  std::function<int64_t(const std::string& path)> unit_of;          // a parameter's unit
  std::function<std::vector<std::string>(int64_t)> unit_modules;    // a unit's module paths
  std::function<std::string(int64_t)> unit_label;                   // for plan names
  std::function<std::map<std::string, nn::ParallelStyle>(bool)> tp_plan;  // by sequence parallelism
  bool tensor_parallel = false, sequence_parallel = false;          // candidates to consider
  std::function<double(int64_t rows)> step_us;                      // the unsharded step at [rows, ...]
  int64_t boundary_features = 0;                                    // a pipeline activation's last dim
  std::vector<ParameterInfo> parameters;                            // what pricing needs of them
};

// What pricing needs of the subject's parameters: their units and owning modules' kinds.
std::vector<ParameterInfo> describe_parameters(const Subject& subject) {
  using Owner = ParameterInfo::Owner;
  std::vector<ParameterInfo> out;
  for (const auto& [path, param] : subject.model.named_parameters()) {
    const std::string module = parent_of(path);
    const nn::Module& owner = module.empty() ? subject.model : subject.model.submodule(module);
    ParameterInfo info{path, subject.unit_of(path), param->shape(), param->dtype(), Owner::other};
    if (dynamic_cast<const nn::Linear*>(&owner)) info.owner = Owner::linear;
    if (dynamic_cast<const nn::Embedding*>(&owner)) info.owner = Owner::embedding;
    if (dynamic_cast<const nn::RMSNorm*>(&owner) || dynamic_cast<const nn::LayerNorm*>(&owner))
      info.owner = Owner::norm;
    out.push_back(std::move(info));
  }
  return out;
}

// A strategy's cost unit by unit for the subject, on its model's mesh.
std::vector<UnitCost> price(const ParallelStrategy& s, const Subject& subject, const CostModel& cost,
                            const StepShape& step) {
  const auto tp_plan =
      s.tensor ? subject.tp_plan(s.tensor->sequence_parallel) : std::map<std::string, nn::ParallelStyle>{};
  return detail::price_units(s, subject.parameters, subject.units, tp_plan, subject.model.mesh().spec(), cost, step);
}

// Times `step` (forward, loss, backward) on every rank of `mesh` at once (a barrier before each
// run, so that each is as contended as the sharded run will be): the median of three after a
// warm-up, the slowest rank's.
double time_step_us(const std::function<void()>& step, nn::Module& model, const DeviceMesh& mesh) {
  const auto comm = mesh.mesh_comm_ptr();
  std::vector<double> times;
  for (int i = 0; i < 4; ++i) {
    if (comm) comm->barrier();
    const auto start = std::chrono::steady_clock::now();
    step();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) times.push_back(us);
  }
  model.zero_grad();
  std::sort(times.begin(), times.end());
  double median = times[1];
  if (comm) comm->all_reduce(&median, 1, DType::f64, ReduceOp::max);
  return median;
}

// One unsharded step's time on this mesh at [rows, seq]: every rank computes the whole step.
double measure_unsharded_step_us(nn::TransformerLM& model, int64_t rows, const ParallelizeOptions& options) {
  const auto [tokens, targets] = detail::synthetic_batch(model, rows, options.seq);
  return time_step_us([&] { model.loss(tokens, targets).backward(); }, model, model.mesh());
}

// How many ranks share each core of the most crowded host of `mesh` (at least 1): in-process
// ranks all share this machine (simulated hosts too); MPI ranks those of their host.
double ranks_per_core(const DeviceMesh& mesh) {
  const unsigned cores = std::thread::hardware_concurrency();
  const auto comm = mesh.mesh_comm_ptr();
  if (cores == 0 || !comm) return 1;
  const HostTopology& hosts = host_topology();
  const auto local = world().backend() == "threads" || hosts.is_simulated()
                         ? static_cast<size_t>(world_size())
                         : hosts.ranks_on(hosts.host_of(rank())).size();
  double sharing = std::max(1.0, static_cast<double>(local) / static_cast<double>(cores));
  comm->all_reduce(&sharing, 1, DType::f64, ReduceOp::max);
  return sharing;
}

// One collective call's latency on this mesh as it runs now (in-process ranks sharing cores wait
// for each other's turn): the mean of 32 one-element all_reduces, the slowest rank's. The
// recorded CostModel's is measured on an idle machine.
double measure_call_us(const DeviceMesh& mesh) {
  const auto comm = mesh.mesh_comm_ptr();
  if (!comm || comm->size() < 2) return 0;
  double value = 0;
  comm->barrier();
  const auto start = std::chrono::steady_clock::now();
  constexpr int kCalls = 32;
  for (int i = 0; i < kCalls; ++i) comm->all_reduce(&value, 1, DType::f64, ReduceOp::sum);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kCalls;
  comm->all_reduce(&us, 1, DType::f64, ReduceOp::max);
  return us;
}

// A candidate's communication and memory without a pipeline: the sum over its units.
void total(PlanEstimate& e, const std::vector<UnitCost>& units, int64_t budget) {
  e.comm_us = 0, e.comm_calls = 0, e.comm_bytes = 0;
  for (const UnitCost& u : units) e.comm_us += u.comm_us, e.comm_calls += u.calls, e.comm_bytes += u.bytes;
  e.memory_bytes = detail::memory_of(units, 0, static_cast<int64_t>(units.size()), 1);
  e.fits = budget <= 0 || e.memory_bytes <= budget;
}

// Prices a candidate without a pipeline: the whole step on the mesh.
void estimate(PlanEstimate& e, const Subject& subject, const ParallelizeOptions& options, double compute_us,
              const CostModel& cost, int64_t budget) {
  e.compute_us = compute_us;
  total(e, price(e.strategy, subject, cost, StepShape{options.batch, options.seq, 1}), budget);
}

// Prices a candidate as the plan inside every stage of a pipeline, choosing its boundaries.
void estimate_pipeline(PlanEstimate& e, const Subject& subject, const ParallelizeOptions& options,
                       std::vector<double> unit_compute_us, int64_t stages, double sharing, const CostModel& cost,
                       int64_t budget) {
  const MeshSpec& spec = subject.model.mesh().spec();
  const int64_t n = options.microbatches, rows = (options.batch + n - 1) / n;
  PipelinePricing p;
  p.stages = stages;
  p.microbatches = n;
  p.schedule = options.schedule;
  p.units = price(e.strategy, subject, cost, StepShape{rows, options.seq, n});
  p.compute_us = std::move(unit_compute_us);
  const int64_t dp_ways = detail::data_parallel_ways(e.strategy, spec);
  p.boundary_bytes = (rows + dp_ways - 1) / dp_ways * options.seq * subject.boundary_features * itemsize(DType::f32);
  p.boundary_us = cost.call_us + static_cast<double>(p.boundary_bytes) / cost.bytes_per_us;
  std::vector<int64_t> bounds = detail::choose_boundaries(p, budget);
  e.fits = !bounds.empty();
  if (!e.fits) bounds = detail::choose_boundaries(p, 0);
  // The step: the first microbatch through every stage, then one per microbatch at the slowest.
  double total = 0, slowest = 0, compute_total = 0, compute_slowest = 0;
  PipelineStages pipeline{options.pipeline_axis, {}, {}};
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t first = bounds[static_cast<size_t>(s)], end = bounds[static_cast<size_t>(s + 1)];
    const double t = p.time_us(s, first, end, true), c = p.time_us(s, first, end, false);
    total += t, slowest = std::max(slowest, t), compute_total += c, compute_slowest = std::max(compute_slowest, c);
    int64_t calls = n * p.boundaries(s), bytes = n * p.boundaries(s) * p.boundary_bytes;
    std::vector<std::string> modules;
    for (int64_t u = first; u < end; ++u) {
      calls += p.units[static_cast<size_t>(u)].calls, bytes += p.units[static_cast<size_t>(u)].bytes;
      for (std::string& m : subject.unit_modules(u)) modules.push_back(std::move(m));
    }
    pipeline.modules.push_back(std::move(modules));
    e.comm_calls = std::max(e.comm_calls, calls);
    e.comm_bytes = std::max(e.comm_bytes, bytes);
    e.memory_bytes = std::max(e.memory_bytes, p.memory_bytes(s, first, end));
    std::string units = subject.unit_label(first);
    if (end - first > 1) units.append("-").append(subject.unit_label(end - 1));
    pipeline.units.push_back(std::move(units));
  }
  // The critical path, unless the ranks sharing a host's cores cannot do their work in that
  // time: then the host's work over its cores (each stage's ranks alike, `sharing` ranks a core).
  const double critical = total + static_cast<double>(n - 1) * slowest;
  const double throughput = sharing * static_cast<double>(n) * compute_total / static_cast<double>(stages);
  e.compute_us = std::max(compute_total + static_cast<double>(n - 1) * compute_slowest, throughput);
  e.comm_us = std::max(critical, throughput + (critical - compute_total - static_cast<double>(n - 1) * compute_slowest)) -
              e.compute_us;
  e.strategy.pipeline = std::move(pipeline);
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

std::string ParallelPlan::to_string() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-40s %12s %12s %12s %7s %12s %14s  %s\n", "plan", "estimate us", "compute us",
                "comm us", "calls", "comm bytes", "memory/rank", "");
  out << line;
  for (const PlanEstimate& e : candidates) {
    std::snprintf(line, sizeof line, "%-40s %12.0f %12.0f %12.0f %7lld %12lld %14s  %s\n", e.name().c_str(),
                  e.estimated_us(), e.compute_us, e.comm_us, static_cast<long long>(e.comm_calls),
                  static_cast<long long>(e.comm_bytes), mib(e.memory_bytes).c_str(),
                  e.strategy == chosen.strategy ? "<- chosen" : (e.fits ? "" : "over budget"));
    out << line;
  }
  return out.str();
}

namespace {

void check_unsharded(nn::Module& model) {
  for (const auto& [path, p] : model.named_parameters())
    TESSERA_CHECK(p->layout().is_replicated(), ShardingError, "parallelize", "parameter ", path, " is already ",
                  p->layout().to_string(), "; parallelize takes an unsharded model");
}

// Prices every candidate of `subject` on `mesh` (result.stage_meshes set: as a pipeline's
// stages, each unit timed by `unit_us`) and chooses.
ParallelPlan plan_subject(const Subject& subject, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                          const ParallelizeOptions& options, ParallelPlan result,
                          const std::function<std::vector<double>(int64_t rows)>& unit_us) {
  nn::Module& model = subject.model;
  const bool pipelined = !result.stage_meshes.empty();
  CostModel cost = options.cost.value_or(CostModel::for_backend(world().backend()));
  if (!options.cost) {
    double call = measure_call_us(model.mesh());
    if (const auto comm = mesh.mesh_comm_ptr()) comm->all_reduce(&call, 1, DType::f64, ReduceOp::max);
    cost.call_us = std::max(cost.call_us, call);
  }
  result.cost = cost;
  for (ParallelStrategy& s :
       detail::candidate_strategies(model.mesh().spec(), subject.tensor_parallel, subject.sequence_parallel))
    result.candidates.push_back(PlanEstimate{std::move(s)});
  // A rank's compute under a plan splitting the batch (or the features) `ways` ways: the
  // unsharded step (pipelined: each unit at one microbatch) measured at the rank's share of the
  // rows, so that the per-op costs that do not shrink with the shard are counted; or a given
  // time divided by `ways`. One measurement per distinct `ways`.
  const int64_t rows = pipelined ? (options.batch + options.microbatches - 1) / options.microbatches : options.batch;
  const auto share = [&](int64_t ways) { return std::max<int64_t>(1, (rows + ways - 1) / ways); };
  if (pipelined && !options.unit_us.empty())
    TESSERA_CHECK(static_cast<int64_t>(options.unit_us.size()) == subject.units, ValueError, "parallelize",
                  "unit_us has ", options.unit_us.size(), " times; the model has ", subject.units,
                  " units (embeddings, each block, head)");
  const double sharing = !pipelined ? 1.0 : options.ranks_per_core > 0 ? options.ranks_per_core : ranks_per_core(mesh);
  std::map<int64_t, std::vector<double>> measured;  // by ways: the step's, or each unit's
  const auto compute_of = [&](int64_t ways) -> const std::vector<double>& {
    auto it = measured.find(ways);
    if (it != measured.end()) return it->second;
    std::vector<double> us;
    if (pipelined && !options.unit_us.empty())
      for (double u : options.unit_us) us.push_back(u / static_cast<double>(ways));
    else if (pipelined)
      us = unit_us(share(ways));
    else if (options.unsharded_step_us > 0)
      us = {options.unsharded_step_us / static_cast<double>(ways)};
    else
      us = {subject.step_us(share(ways))};
    return measured.emplace(ways, std::move(us)).first->second;
  };
  for (PlanEstimate& e : result.candidates) {
    const std::vector<double>& compute = compute_of(detail::compute_ways(e.strategy, model.mesh().spec()));
    if (pipelined)
      estimate_pipeline(e, subject, options, compute, static_cast<int64_t>(result.stage_meshes.size()), sharing, cost,
                        memory_budget_bytes);
    else
      estimate(e, subject, options, compute.front(), cost, memory_budget_bytes);
  }
  // Where a plan's DDP form does not fit and its FSDP form does more than it must, FSDP for some
  // units only: the least communication that fits.
  if (!pipelined && memory_budget_bytes > 0) {
    std::vector<PlanEstimate> mixed;
    for (const PlanEstimate& d : result.candidates) {
      if (d.strategy.data.sharded || d.fits || d.strategy.data.axes.size() != 1) continue;
      ParallelStrategy fsdp = d.strategy;
      fsdp.data.sharded = true;
      const StepShape step{options.batch, options.seq, 1};
      const std::vector<UnitCost> ddp_units = price(d.strategy, subject, cost, step);
      const std::vector<UnitCost> fsdp_units = price(fsdp, subject, cost, step);
      const std::vector<int64_t> sharded = detail::choose_sharded_units(ddp_units, fsdp_units, memory_budget_bytes);
      if (sharded.empty() || static_cast<int64_t>(sharded.size()) == subject.units) continue;
      PlanEstimate e = d;
      e.strategy = fsdp;
      std::vector<UnitCost> units = ddp_units;
      for (int64_t u : sharded) {
        units[static_cast<size_t>(u)] = fsdp_units[static_cast<size_t>(u)];
        for (std::string& m : subject.unit_modules(u)) e.strategy.data.sharded_modules.push_back(std::move(m));
        e.strategy.data.sharded_units.push_back(subject.unit_label(u));
      }
      total(e, units, memory_budget_bytes);
      mixed.push_back(std::move(e));
    }
    for (PlanEstimate& e : mixed) result.candidates.push_back(std::move(e));
  }
  const PlanEstimate* best = nullptr;
  const PlanEstimate* smallest = &result.candidates.front();
  for (const PlanEstimate& e : result.candidates) {
    if (e.memory_bytes < smallest->memory_bytes) smallest = &e;
    if (e.fits && (!best || e.estimated_us() < best->estimated_us())) best = &e;
  }
  TESSERA_CHECK(best != nullptr, ValueError, "parallelize", "no plan fits the memory budget of ",
                mib(memory_budget_bytes), " per rank on ", mesh.to_string(), "; the smallest, ", smallest->name(),
                ", needs ", mib(smallest->memory_bytes));
  result.chosen = *best;
  const MeshSpec& spec = model.mesh().spec();
  result.data.assign(static_cast<size_t>(spec.ndim()), Replicate{});
  for (const auto& a : best->strategy.data.axes)
    result.data[static_cast<size_t>(spec.dim_of(a, "parallelize"))] = Shard{0};
  return result;
}

// The transformer LM as units: embeddings, each block, norm and head.
Subject lm_subject(nn::TransformerLM& model, const ParallelizeOptions& options) {
  Subject s(model);
  s.units = model.units();
  s.unit_of = [&model](const std::string& path) { return detail::unit_of(model, path); };
  s.unit_modules = [&model](int64_t u) { return detail::unit_modules(model, u); };
  s.unit_label = [&model](int64_t u) { return detail::unit_label(model, u); };
  s.tp_plan = [](bool sp) { return nn::transformer_tp_plan(sp); };
  s.tensor_parallel = s.sequence_parallel = true;
  s.step_us = [&model, options](int64_t rows) { return measure_unsharded_step_us(model, rows, options); };
  s.boundary_features = model.config().dim;
  s.parameters = describe_parameters(s);
  return s;
}

// Any module: each module owning parameters is a unit; tensor parallel by the options' plan.
Subject module_subject(nn::Module& model, const ParallelizeOptions& options) {
  auto owners = std::make_shared<std::vector<std::string>>();
  for (const auto& [path, p] : model.named_parameters())
    if (std::find(owners->begin(), owners->end(), parent_of(path)) == owners->end()) owners->push_back(parent_of(path));
  Subject s(model);
  s.units = static_cast<int64_t>(owners->size());
  s.unit_of = [owners](const std::string& path) {
    return static_cast<int64_t>(std::find(owners->begin(), owners->end(), parent_of(path)) - owners->begin());
  };
  s.unit_modules = [owners](int64_t u) { return std::vector<std::string>{(*owners)[static_cast<size_t>(u)]}; };
  s.unit_label = [owners](int64_t u) {
    const std::string& m = (*owners)[static_cast<size_t>(u)];
    return m.empty() ? std::string("(root)") : m;
  };
  s.tp_plan = [plan = options.tp_plan](bool) { return plan; };
  s.tensor_parallel = !options.tp_plan.empty();
  s.step_us = [&model, loss = options.loss](int64_t rows) {
    return time_step_us([&] { loss(rows).backward(); }, model, model.mesh());
  };
  s.parameters = describe_parameters(s);
  return s;
}

void apply(nn::Module& model, const ParallelStrategy& plan, const std::map<std::string, nn::ParallelStyle>& tp_plan) {
  if (plan.tensor) nn::parallelize_module(model, plan.tensor->axis, tp_plan);
  if (plan.data.sharded && plan.data.sharded_modules.empty()) nn::fully_shard(model, plan.data.axes.front());
  for (const std::string& module : plan.data.sharded_modules)
    nn::fully_shard(module.empty() ? model : model.submodule(module), plan.data.axes.front());
}

void print_plan(const ParallelPlan& result, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                const ParallelizeOptions& options) {
  if (!options.print || !mesh.is_member() || mesh.coordinate() != std::vector<int64_t>(static_cast<size_t>(mesh.ndim()), 0))
    return;
  const std::string microbatches =
      result.pipeline_axis.empty() ? "" : " in " + std::to_string(result.microbatches) + " microbatches";
  std::printf("parallelize on %s (budget %s per rank, step of [%lld, %lld] tokens%s, %s):\n%s", mesh.to_string().c_str(),
              memory_budget_bytes > 0 ? mib(memory_budget_bytes).c_str() : "none",
              static_cast<long long>(options.batch), static_cast<long long>(options.seq), microbatches.c_str(),
              result.cost.to_string().c_str(), result.to_string().c_str());
}

}  // namespace

ParallelPlan plan_parallelism(nn::TransformerLM& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                              const ParallelizeOptions& options) {
  check_unsharded(model);
  ParallelPlan result;
  const bool pipelined = !options.pipeline_axis.empty();
  if (pipelined) {
    const int64_t axis = mesh.spec().dim_of(options.pipeline_axis, "parallelize");
    TESSERA_CHECK(mesh.ndim() >= 2, ShardingError, "parallelize", "the pipeline axis '", options.pipeline_axis,
                  "' must leave a mesh for each stage: ", mesh.to_string(), " has no other axis (add one of size 1)");
    TESSERA_CHECK(mesh.is_member(), ShardingError, "parallelize", "this rank is not on ", mesh.to_string());
    TESSERA_CHECK(options.microbatches >= 1, ValueError, "parallelize", "microbatches must be at least 1, got ",
                  options.microbatches);
    TESSERA_CHECK(options.schedule != Schedule::interleaved_one_f_one_b, ValueError, "parallelize",
                  "interleaved 1F1B is not among the schedules parallelize prices (gpipe, one_f_one_b)");
    for (int64_t i = 0; i < mesh.size(axis); ++i) result.stage_meshes.push_back(mesh.slice({{options.pipeline_axis, i}}));
    const DeviceMesh& mine = result.stage_meshes[static_cast<size_t>(mesh.coordinate()[static_cast<size_t>(axis)])];
    TESSERA_CHECK(model.mesh().spec() == mine.spec(), ShardingError, "parallelize", "with pipeline axis '",
                  options.pipeline_axis, "' the model must live on this rank's stage mesh ", mine.to_string(),
                  ", not on ", model.mesh().to_string());
    const int64_t stages = mesh.size(axis);
    TESSERA_CHECK(model.units() >= stages, ShardingError, "parallelize", "a ", stages,
                  "-stage pipeline needs at least as many units (embeddings, ", model.config().layers,
                  " blocks, head), got ", model.units());
    result.pipeline_axis = options.pipeline_axis;
    result.microbatches = options.microbatches;
    result.schedule = options.schedule;
  } else {
    TESSERA_CHECK(mesh.spec() == model.mesh().spec(), ShardingError, "parallelize", "the model lives on ",
                  model.mesh().to_string(), ", not on ", mesh.to_string());
  }
  return plan_subject(lm_subject(model, options), mesh, memory_budget_bytes, options, std::move(result),
                      [&](int64_t rows) { return detail::measure_unit_us(model, rows, options.seq, mesh); });
}

ParallelPlan plan_parallelism(nn::TransformerLM& model, int64_t memory_budget_bytes, const ParallelizeOptions& options) {
  return plan_parallelism(model, model.mesh(), memory_budget_bytes, options);
}

ParallelPlan plan_parallelism(nn::Module& model, int64_t memory_budget_bytes, const ParallelizeOptions& options) {
  if (auto* lm = dynamic_cast<nn::TransformerLM*>(&model)) return plan_parallelism(*lm, memory_budget_bytes, options);
  check_unsharded(model);
  TESSERA_CHECK(options.pipeline_axis.empty(), ValueError, "parallelize", "a pipeline axis needs a model cut into "
                "units (TransformerLM); for another module build the stages and a Pipeline directly");
  TESSERA_CHECK(options.unsharded_step_us > 0 || static_cast<bool>(options.loss), ValueError, "parallelize",
                "set ParallelizeOptions::loss (the loss of a batch of `rows` rows, to time the step) or "
                "unsharded_step_us");
  return plan_subject(module_subject(model, options), model.mesh(), memory_budget_bytes, options, ParallelPlan{}, {});
}

ParallelPlan parallelize(nn::TransformerLM& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options) {
  ParallelPlan result = plan_parallelism(model, mesh, memory_budget_bytes, options);
  print_plan(result, mesh, memory_budget_bytes, options);
  apply_plan(model, result.chosen.strategy);
  return result;
}

ParallelPlan parallelize(nn::Module& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options) {
  if (auto* lm = dynamic_cast<nn::TransformerLM*>(&model)) return parallelize(*lm, mesh, memory_budget_bytes, options);
  TESSERA_CHECK(mesh.spec() == model.mesh().spec(), ShardingError, "parallelize", "the model lives on ",
                model.mesh().to_string(), ", not on ", mesh.to_string());
  ParallelPlan result = plan_parallelism(model, memory_budget_bytes, options);
  print_plan(result, mesh, memory_budget_bytes, options);
  apply(model, result.chosen.strategy, options.tp_plan);
  return result;
}

void apply_plan(nn::TransformerLM& model, const ParallelStrategy& plan) {
  apply(model, plan, nn::transformer_tp_plan(plan.tensor && plan.tensor->sequence_parallel));
}

void apply_plan(nn::Module& model, const ParallelStrategy& plan,
                const std::map<std::string, nn::ParallelStyle>& tp_plan) {
  apply(model, plan, tp_plan);
}

Pipeline make_pipeline(nn::TransformerLM& model, const ParallelPlan& plan) {
  TESSERA_CHECK(!plan.pipeline_axis.empty() && plan.chosen.strategy.pipeline, ValueError, "make_pipeline", "the plan ",
                plan.chosen.name(), " has no pipeline axis (set ParallelizeOptions::pipeline_axis)");
  std::vector<Stage> stages;
  int64_t first = 0;
  const std::vector<std::vector<std::string>>& modules = plan.chosen.strategy.pipeline->modules;
  for (size_t s = 0; s < modules.size(); ++s) {
    int64_t end = first;
    for (const std::string& module : modules[s]) end = std::max(end, detail::unit_of(model, module + ".") + 1);
    stages.push_back({plan.stage_meshes[s], [&model, first, end](const DTensor& x) {
                        return model.forward_units(first, end, x);
                      }});
    first = end;
  }
  PipelineOptions options;
  options.schedule = plan.schedule;
  options.microbatches = plan.microbatches;
  return Pipeline(std::move(stages),
                  [&model](const DTensor& logits, const DTensor& targets) { return model.next_token_loss(logits, targets); },
                  options);
}

std::vector<DTensor*> stage_parameters(nn::TransformerLM& model, const ParallelPlan& plan) {
  std::vector<DTensor*> params;
  int64_t mine = -1;
  for (size_t s = 0; s < plan.stage_meshes.size(); ++s)
    if (plan.stage_meshes[s].is_member()) mine = static_cast<int64_t>(s);
  for (const auto& [path, p] : model.named_parameters()) {
    bool keep = plan.pipeline_axis.empty();
    if (mine >= 0 && plan.chosen.strategy.pipeline)
      for (const std::string& module : plan.chosen.strategy.pipeline->modules[static_cast<size_t>(mine)])
        keep = keep || path.rfind(module + ".", 0) == 0;
    if (keep) params.push_back(p);
  }
  return params;
}

}  // namespace tessera::mpmd
