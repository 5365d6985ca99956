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
#include <tessera/nn/parallel.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera::mpmd {

namespace {

const nn::ParallelStyle* style_of(const std::map<std::string, nn::ParallelStyle>& plan, const std::string& module) {
  for (const auto& [pattern, style] : plan)
    if (nn::path_matches(pattern, module)) return &style;
  return nullptr;
}

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
};

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

// The candidates on a mesh of one or two axes: every tensor parallel plan with and without
// sequence parallelism.
std::vector<PlanEstimate> candidates_of(const MeshSpec& spec, bool tensor_parallel, bool sequence_parallel) {
  const auto& axes = spec.names();
  std::vector<PlanEstimate> out;
  const auto add = [&](std::string tp, std::vector<std::string> dp, bool fsdp, bool sp) {
    if ((!tp.empty() && !tensor_parallel) || (sp && !sequence_parallel)) return;
    PlanEstimate e;
    e.tp_axis = std::move(tp);
    e.sequence_parallel = sp;
    e.dp_axes = std::move(dp);
    e.fsdp = fsdp;
    std::string name;
    if (!e.tp_axis.empty()) name = std::string(sp ? "tp+sp(" : "tp(") + e.tp_axis + ")";
    if (!e.dp_axes.empty()) {
      std::string joined;
      for (const auto& a : e.dp_axes) joined.append(joined.empty() ? "" : ",").append(a);
      name.append(name.empty() ? "" : " + ").append(std::string(fsdp ? "fsdp(" : "ddp(") + joined + ")");
    }
    e.name = name;
    out.push_back(std::move(e));
  };
  if (axes.size() == 1) {
    add("", {axes[0]}, false, false);
    add("", {axes[0]}, true, false);
    for (bool sp : {false, true}) add(axes[0], {}, false, sp);
  } else if (axes.size() == 2) {
    for (int t = 0; t < 2; ++t)
      for (bool sp : {false, true}) {
        add(axes[static_cast<size_t>(t)], {axes[static_cast<size_t>(1 - t)]}, false, sp);
        add(axes[static_cast<size_t>(t)], {axes[static_cast<size_t>(1 - t)]}, true, sp);
      }
    add("", {axes[0], axes[1]}, false, false);
  } else {
    TESSERA_CHECK(false, ShardingError, "parallelize", "meshes of 1 or 2 axes are supported, not ", spec.to_string());
  }
  return out;
}

// The ranks that split the batch under a candidate, and those that split one stage's compute.
int64_t dp_ways_of(const PlanEstimate& e, const MeshSpec& spec) {
  int64_t ways = 1;
  for (const auto& a : e.dp_axes) ways *= spec.size(spec.dim_of(a, "parallelize"));
  return ways;
}
int64_t ways_of(const PlanEstimate& e, const MeshSpec& spec) {
  return dp_ways_of(e, spec) * (e.tp_axis.empty() ? 1 : spec.size(spec.dim_of(e.tp_axis, "parallelize")));
}

// One unit's share of a candidate's cost per step on a stage's mesh.
struct UnitCost {
  double comm_us = 0;
  int64_t calls = 0, bytes = 0;
  int64_t state_bytes = 0;       // parameters, gradients and AdamW moments by their stored shard
  int64_t activation_bytes = 0;  // one microbatch's saved activations of the linear layers
  int64_t gather_bytes = 0;      // the largest parameter an FSDP all-gather materialises
};

// Prices a candidate's communication and memory unit by unit, for microbatches of `rows` rows:
// what moves per microbatch (FSDP's gathers and gradient reduce-scatters, tensor parallel
// activations) counts `microbatches` times, DDP's gradient all-reduce once (NoSync defers it).
std::vector<UnitCost> price_units(const PlanEstimate& e, const Subject& subject, const MeshSpec& spec,
                                  const CostModel& cost, int64_t rows, int64_t seq, int64_t microbatches) {
  nn::Module& model = subject.model;
  const PlanOptions plan_options{cost};
  const int64_t tp = e.tp_axis.empty() ? -1 : spec.dim_of(e.tp_axis, "parallelize");
  std::vector<int64_t> dp;
  for (const auto& a : e.dp_axes) dp.push_back(spec.dim_of(a, "parallelize"));
  const int64_t dp_ways = dp_ways_of(e, spec);
  std::vector<UnitCost> units(static_cast<size_t>(subject.units));
  const auto price = [&](UnitCost& u, const Layout& src, const Layout& dst, int64_t times) {
    const Plan p = plan(src, dst, plan_options);
    u.comm_us += static_cast<double>(times) * p.estimated_us;
    u.calls += times * p.calls();
    u.bytes += times * p.max_bytes_received();
  };
  const auto with = [&](Placements placements, int64_t m, Placement p) {
    placements[static_cast<size_t>(m)] = p;
    return placements;
  };
  const std::map<std::string, nn::ParallelStyle> tp_plan =
      tp >= 0 ? subject.tp_plan(e.sequence_parallel) : std::map<std::string, nn::ParallelStyle>{};
  const bool sp = tp >= 0 && e.sequence_parallel;
  const int64_t tp_ways = tp >= 0 ? spec.size(tp) : 1;
  const Placements replicate(static_cast<size_t>(spec.ndim()), Replicate{});
  const std::vector<int64_t> origin(static_cast<size_t>(spec.ndim()), 0);
  const int64_t tokens = rows * seq;
  std::vector<std::string> colwise_parents;
  for (const auto& [path, param] : model.named_parameters()) {
    UnitCost& u = units[static_cast<size_t>(subject.unit_of(path))];
    const std::string module = parent_of(path), name = path.substr(module.empty() ? 0 : module.size() + 1);
    nn::Module& sub = module.empty() ? model : model.submodule(module);
    const auto* linear = dynamic_cast<const nn::Linear*>(&sub);
    const auto* embedding = dynamic_cast<const nn::Embedding*>(&sub);
    const bool norm = dynamic_cast<const nn::RMSNorm*>(&sub) || dynamic_cast<const nn::LayerNorm*>(&sub);
    const nn::ParallelStyle* style = tp >= 0 ? style_of(tp_plan, module) : nullptr;
    const bool colwise = style && std::holds_alternative<nn::ColwiseParallel>(*style);
    const bool rowwise = style && std::holds_alternative<nn::RowwiseParallel>(*style);
    // The parameter's compute layout under the tensor parallel plan.
    Placements compute = replicate;
    if (linear && colwise) compute[static_cast<size_t>(tp)] = Shard{0};
    if (linear && rowwise && name == "weight") compute[static_cast<size_t>(tp)] = Shard{1};
    if (embedding && colwise) compute[static_cast<size_t>(tp)] = Shard{1};
    if (embedding && rowwise) compute[static_cast<size_t>(tp)] = Shard{0};
    const Shape shape = param->shape();
    const DType dtype = param->dtype();
    const Layout compute_layout(shape, dtype, spec, compute);
    Layout storage = compute_layout;
    if (e.fsdp) {
      const int64_t m = dp.front();
      std::vector<int64_t> order = compute_layout.shard_order(0);
      order.push_back(m);
      storage = Layout(shape, dtype, spec, with(compute, m, Shard{0}), ShardOrder{{0, order}});
      price(u, storage, compute_layout, microbatches);  // all_gather for the forward
      price(u, Layout(shape, dtype, spec, with(compute, m, Partial{})), storage, microbatches);  // gradient reduce_scatter
      u.gather_bytes = std::max(u.gather_bytes, compute_layout.local_shape(origin).numel() * itemsize(dtype));
    } else if (!dp.empty() || (sp && norm)) {
      // All-reduce of the gradient over the data-parallel axes, and over tp for a norm that sees
      // only its sequence shard.
      Placements partial = compute;
      for (int64_t m : dp) partial[static_cast<size_t>(m)] = Partial{};
      if (sp && norm) partial[static_cast<size_t>(tp)] = Partial{};
      price(u, Layout(shape, dtype, spec, partial), compute_layout, 1);
    }
    // Parameter, gradient and AdamW's two moments, by the stored shard (the largest rank's).
    u.state_bytes += 4 * storage.local_shape(origin).numel() * itemsize(dtype);
    // A norm saves its input: the whole sequence, or its shard under sequence parallelism.
    if (norm && name == "weight") u.activation_bytes += tokens / dp_ways * shape[0] / (sp ? tp_ways : 1) * itemsize(dtype);
    if (name != "weight" || !(linear || embedding)) continue;
    // Tensor parallel activations [rows, seq, features]. A row-parallel output is all-reduced in
    // the forward (sequence parallel: reduce-scattered onto sequence shards, and its gradient
    // all-gathered in the backward). The input of column-parallel siblings (q, k, v share one)
    // has its gradient all-reduced in the backward (sequence parallel: the input all-gathered
    // from its shards in the forward, its gradient reduce-scattered back).
    const auto activation = [&](int64_t features, Placement on_tp) {
      Placements p = replicate;
      for (int64_t m : dp) p[static_cast<size_t>(m)] = Shard{0};
      if (tp >= 0) p[static_cast<size_t>(tp)] = on_tp;
      return Layout(Shape{rows, seq, features}, dtype, spec, p);
    };
    const int64_t in = linear ? linear->in_features() : shape[0], out = linear ? linear->out_features() : shape[1];
    if (rowwise && !sp) price(u, activation(out, Partial{}), activation(out, Replicate{}), microbatches);
    if (rowwise && sp) {
      price(u, activation(out, Partial{}), activation(out, Shard{1}), microbatches);
      price(u, activation(out, Shard{1}), activation(out, Replicate{}), microbatches);
    }
    if (colwise && linear && std::find(colwise_parents.begin(), colwise_parents.end(), parent_of(module)) ==
                                 colwise_parents.end()) {
      colwise_parents.push_back(parent_of(module));
      if (!sp) price(u, activation(in, Partial{}), activation(in, Replicate{}), microbatches);
      if (sp) {
        price(u, activation(in, Shard{1}), activation(in, Replicate{}), microbatches);
        price(u, activation(in, Partial{}), activation(in, Shard{1}), microbatches);
      }
    }
    // Saved activations of a linear layer: its input and output on this rank.
    if (linear)
      u.activation_bytes +=
          tokens / dp_ways * (in / (rowwise ? tp_ways : 1) + out / (colwise ? tp_ways : 1)) * itemsize(dtype);
  }
  return units;
}



// The memory per rank of units [first, end) holding `held` microbatches' activations: their
// state, the activations, and the largest FSDP gather (one at a time).
int64_t memory_of(const std::vector<UnitCost>& units, int64_t first, int64_t end, int64_t held) {
  int64_t state = 0, activations = 0, gather = 0;
  for (int64_t u = first; u < end; ++u) {
    const UnitCost& c = units[static_cast<size_t>(u)];
    state += c.state_bytes, activations += c.activation_bytes, gather = std::max(gather, c.gather_bytes);
  }
  return state + held * activations + gather;
}

// A candidate's communication and memory without a pipeline: the sum over its units.
void total(PlanEstimate& e, const std::vector<UnitCost>& units, int64_t budget) {
  e.comm_us = 0, e.comm_calls = 0, e.comm_bytes = 0;
  for (const UnitCost& u : units) e.comm_us += u.comm_us, e.comm_calls += u.calls, e.comm_bytes += u.bytes;
  e.memory_bytes = memory_of(units, 0, static_cast<int64_t>(units.size()), 1);
  e.fits = budget <= 0 || e.memory_bytes <= budget;
}

// Prices a candidate without a pipeline: the whole step on the mesh.
void estimate(PlanEstimate& e, const Subject& subject, const ParallelizeOptions& options, double compute_us,
              const CostModel& cost, int64_t budget) {
  e.compute_us = compute_us;
  total(e, price_units(e, subject, subject.model.mesh().spec(), cost, options.batch, options.seq, 1), budget);
}

// FSDP for some units only (FSDP2's fully_shard per submodule), the rest DDP over the same
// axis: the subset of units to shard that fits `budget` with the least communication. Memory is
// each unit's state and activations under its choice plus the largest gather of a sharded unit;
// for each bound g on that gather, units gathering more stay DDP and the rest are chosen by a
// Pareto frontier of (memory, communication) over the units. Returns the units to shard (empty:
// none fits).
std::vector<int64_t> choose_sharded_units(const std::vector<UnitCost>& ddp, const std::vector<UnitCost>& fsdp,
                                          int64_t budget) {
  struct Choice {
    int64_t memory = 0;
    double comm = 0;
    std::vector<int64_t> sharded;
  };
  const auto units = static_cast<int64_t>(ddp.size());
  std::vector<int64_t> bounds;
  for (const UnitCost& u : fsdp) bounds.push_back(u.gather_bytes);
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  Choice best;
  best.comm = std::numeric_limits<double>::infinity();
  for (int64_t bound : bounds) {
    std::vector<Choice> frontier(1);
    for (int64_t u = 0; u < units; ++u) {
      const UnitCost &d = ddp[static_cast<size_t>(u)], &f = fsdp[static_cast<size_t>(u)];
      std::vector<Choice> next;
      for (const Choice& c : frontier) {
        Choice keep = c;
        keep.memory += d.state_bytes + d.activation_bytes, keep.comm += d.comm_us;
        next.push_back(std::move(keep));
        if (f.gather_bytes > bound) continue;
        Choice shard = c;
        shard.memory += f.state_bytes + f.activation_bytes, shard.comm += f.comm_us;
        shard.sharded.push_back(u);
        next.push_back(std::move(shard));
      }
      // Keep the choices no other beats on both memory and communication.
      std::sort(next.begin(), next.end(), [](const Choice& a, const Choice& b) {
        return a.memory != b.memory ? a.memory < b.memory : a.comm < b.comm;
      });
      frontier.clear();
      for (Choice& c : next)
        if (frontier.empty() || c.comm < frontier.back().comm) frontier.push_back(std::move(c));
    }
    for (const Choice& c : frontier)
      if (!c.sharded.empty() && c.memory + bound <= budget && c.comm < best.comm) best = c;
  }
  return best.sharded;
}

// What a pipeline run of a candidate needs to price a stage of units [first, end).
struct PipelinePricing {
  std::vector<UnitCost> units;
  std::vector<double> compute_us;  // per unit per microbatch, split over the stage's ranks
  double boundary_us = 0;          // one activation (or its gradient) across a boundary
  int64_t boundary_bytes = 0;
  int64_t stages = 1, microbatches = 1;
  Schedule schedule = Schedule::one_f_one_b;

  // The stage's time per microbatch, with or without its communication.
  double time_us(int64_t s, int64_t first, int64_t end, bool with_comm) const {
    double t = 0;
    for (int64_t u = first; u < end; ++u) {
      t += compute_us[static_cast<size_t>(u)];
      if (with_comm) t += units[static_cast<size_t>(u)].comm_us / static_cast<double>(microbatches);
    }
    if (with_comm) t += static_cast<double>(boundaries(s)) * boundary_us;
    return t;
  }
  // Stage s receives the activation from s - 1 and the gradient from s + 1.
  int64_t boundaries(int64_t s) const { return (s > 0 ? 1 : 0) + (s + 1 < stages ? 1 : 0); }
  // Microbatches whose activations stage s holds at once.
  int64_t held(int64_t s) const {
    return schedule == Schedule::gpipe ? microbatches : std::min(microbatches, stages - s);
  }
  int64_t memory_bytes(int64_t s, int64_t first, int64_t end) const { return memory_of(units, first, end, held(s)); }
};

// Stage boundaries minimising the slowest stage's time per microbatch over contiguous runs of
// at least one unit, among those whose every stage fits `budget` (0: any); dynamic programming
// over (stage, end unit). Returns the S + 1 boundaries, or none when nothing fits.
std::vector<int64_t> choose_boundaries(const PipelinePricing& p, int64_t budget) {
  const int64_t S = p.stages, U = static_cast<int64_t>(p.units.size());
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(U + 1), kNone));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(S), std::vector<int64_t>(static_cast<size_t>(U + 1), -1));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t end = s + 1; end <= U - (S - 1 - s); ++end)
      for (int64_t first = s == 0 ? 0 : s; first < end && (s > 0 || first == 0); ++first) {
        const double before = s == 0 ? 0 : best[static_cast<size_t>(s - 1)][static_cast<size_t>(first)];
        if (before == kNone || (budget > 0 && p.memory_bytes(s, first, end) > budget)) continue;
        const double slowest = std::max(before, p.time_us(s, first, end, true));
        if (slowest < best[static_cast<size_t>(s)][static_cast<size_t>(end)]) {
          best[static_cast<size_t>(s)][static_cast<size_t>(end)] = slowest;
          from[static_cast<size_t>(s)][static_cast<size_t>(end)] = first;
        }
      }
  if (best[static_cast<size_t>(S - 1)][static_cast<size_t>(U)] == kNone) return {};
  std::vector<int64_t> bounds(static_cast<size_t>(S + 1));
  bounds[static_cast<size_t>(S)] = U;
  for (int64_t s = S - 1; s >= 0; --s)
    bounds[static_cast<size_t>(s)] = from[static_cast<size_t>(s)][static_cast<size_t>(bounds[static_cast<size_t>(s + 1)])];
  return bounds;
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
  p.units = price_units(e, subject, spec, cost, rows, options.seq, n);
  p.compute_us = std::move(unit_compute_us);
  const int64_t dp_ways = dp_ways_of(e, spec);
  p.boundary_bytes = (rows + dp_ways - 1) / dp_ways * options.seq * subject.boundary_features * itemsize(DType::f32);
  p.boundary_us = cost.call_us + static_cast<double>(p.boundary_bytes) / cost.bytes_per_us;
  std::vector<int64_t> bounds = choose_boundaries(p, budget);
  e.fits = !bounds.empty();
  if (!e.fits) bounds = choose_boundaries(p, 0);
  // The step: the first microbatch through every stage, then one per microbatch at the slowest.
  double total = 0, slowest = 0, compute_total = 0, compute_slowest = 0;
  std::string layout;
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
    e.stages.push_back(std::move(modules));
    e.comm_calls = std::max(e.comm_calls, calls);
    e.comm_bytes = std::max(e.comm_bytes, bytes);
    e.memory_bytes = std::max(e.memory_bytes, p.memory_bytes(s, first, end));
    if (s > 0) layout += '|';
    layout += subject.unit_label(first);
    if (end - first > 1) layout += '-', layout += subject.unit_label(end - 1);
  }
  // The critical path, unless the ranks sharing a host's cores cannot do their work in that
  // time: then the host's work over its cores (each stage's ranks alike, `sharing` ranks a core).
  const double critical = total + static_cast<double>(n - 1) * slowest;
  const double throughput = sharing * static_cast<double>(n) * compute_total / static_cast<double>(stages);
  e.compute_us = std::max(compute_total + static_cast<double>(n - 1) * compute_slowest, throughput);
  e.comm_us = std::max(critical, throughput + (critical - compute_total - static_cast<double>(n - 1) * compute_slowest)) -
              e.compute_us;
  std::string name = "pp(";
  name += options.pipeline_axis, name += ")[", name += layout, name += "] + ", name += e.name;
  e.name = std::move(name);
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
    std::snprintf(line, sizeof line, "%-40s %12.0f %12.0f %12.0f %7lld %12lld %14s  %s\n", e.name.c_str(),
                  e.estimated_us(), e.compute_us, e.comm_us, static_cast<long long>(e.comm_calls),
                  static_cast<long long>(e.comm_bytes), mib(e.memory_bytes).c_str(),
                  e.name == chosen.name ? "<- chosen" : (e.fits ? "" : "over budget"));
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
  result.candidates = candidates_of(model.mesh().spec(), subject.tensor_parallel, subject.sequence_parallel);
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
    const std::vector<double>& compute = compute_of(ways_of(e, model.mesh().spec()));
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
      if (d.fsdp || d.fits || d.dp_axes.size() != 1) continue;
      PlanEstimate f = d;
      f.fsdp = true;
      const MeshSpec& spec = model.mesh().spec();
      const std::vector<UnitCost> ddp_units = price_units(d, subject, spec, cost, options.batch, options.seq, 1);
      const std::vector<UnitCost> fsdp_units = price_units(f, subject, spec, cost, options.batch, options.seq, 1);
      const std::vector<int64_t> sharded = choose_sharded_units(ddp_units, fsdp_units, memory_budget_bytes);
      if (sharded.empty() || static_cast<int64_t>(sharded.size()) == subject.units) continue;
      PlanEstimate e = d;
      e.fsdp = true;
      std::vector<UnitCost> units = ddp_units;
      std::string labels;
      for (int64_t u : sharded) {
        units[static_cast<size_t>(u)] = fsdp_units[static_cast<size_t>(u)];
        for (std::string& m : subject.unit_modules(u)) e.fsdp_modules.push_back(std::move(m));
        if (!labels.empty()) labels += ',';
        labels += subject.unit_label(u);
      }
      total(e, units, memory_budget_bytes);
      const std::string plain = "ddp(" + d.dp_axes.front() + ")";
      e.name = d.name.substr(0, d.name.find(plain)) + "fsdp(" + d.dp_axes.front() + ")[" + labels + "] + " + plain;
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
                mib(memory_budget_bytes), " per rank on ", mesh.to_string(), "; the smallest, ", smallest->name,
                ", needs ", mib(smallest->memory_bytes));
  result.chosen = *best;
  const MeshSpec& spec = model.mesh().spec();
  result.data.assign(static_cast<size_t>(spec.ndim()), Replicate{});
  for (const auto& a : best->dp_axes) result.data[static_cast<size_t>(spec.dim_of(a, "parallelize"))] = Shard{0};
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
  return s;
}

void apply(nn::Module& model, const PlanEstimate& plan, const std::map<std::string, nn::ParallelStyle>& tp_plan) {
  if (!plan.tp_axis.empty()) nn::parallelize_module(model, plan.tp_axis, tp_plan);
  if (plan.fsdp && plan.fsdp_modules.empty()) nn::fully_shard(model, plan.dp_axes.front());
  for (const std::string& module : plan.fsdp_modules)
    nn::fully_shard(module.empty() ? model : model.submodule(module), plan.dp_axes.front());
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
  apply_plan(model, result.chosen);
  return result;
}

ParallelPlan parallelize(nn::Module& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options) {
  if (auto* lm = dynamic_cast<nn::TransformerLM*>(&model)) return parallelize(*lm, mesh, memory_budget_bytes, options);
  TESSERA_CHECK(mesh.spec() == model.mesh().spec(), ShardingError, "parallelize", "the model lives on ",
                model.mesh().to_string(), ", not on ", mesh.to_string());
  ParallelPlan result = plan_parallelism(model, memory_budget_bytes, options);
  print_plan(result, mesh, memory_budget_bytes, options);
  apply(model, result.chosen, options.tp_plan);
  return result;
}

void apply_plan(nn::TransformerLM& model, const PlanEstimate& plan) {
  apply(model, plan, nn::transformer_tp_plan(plan.sequence_parallel));
}

void apply_plan(nn::Module& model, const PlanEstimate& plan, const std::map<std::string, nn::ParallelStyle>& tp_plan) {
  apply(model, plan, tp_plan);
}

Pipeline make_pipeline(nn::TransformerLM& model, const ParallelPlan& plan) {
  TESSERA_CHECK(!plan.pipeline_axis.empty(), ValueError, "make_pipeline", "the plan ", plan.chosen.name,
                " has no pipeline axis (set ParallelizeOptions::pipeline_axis)");
  std::vector<Stage> stages;
  int64_t first = 0;
  for (size_t s = 0; s < plan.chosen.stages.size(); ++s) {
    int64_t end = first;
    for (const std::string& module : plan.chosen.stages[s])
      end = std::max(end, detail::unit_of(model, module + ".") + 1);
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
    if (mine >= 0)
      for (const std::string& module : plan.chosen.stages[static_cast<size_t>(mine)])
        keep = keep || path.rfind(module + ".", 0) == 0;
    if (keep) params.push_back(p);
  }
  return params;
}

}  // namespace tessera::mpmd
