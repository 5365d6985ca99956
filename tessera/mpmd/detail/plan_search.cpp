#include <tessera/mpmd/detail/plan_search.hpp>

#include <algorithm>
#include <limits>

#include <tessera/core/error.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera::mpmd::detail {

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

}  // namespace

std::vector<ParallelStrategy> candidate_strategies(const MeshSpec& spec, bool tensor_parallel, bool sequence_parallel) {
  const auto& axes = spec.names();
  std::vector<ParallelStrategy> out;
  const auto add = [&](const std::string& tp, std::vector<std::string> dp, bool fsdp, bool sp) {
    if ((!tp.empty() && !tensor_parallel) || (sp && !sequence_parallel)) return;
    ParallelStrategy s;
    if (!tp.empty()) s.tensor = TensorParallel{tp, sp};
    s.data.axes = std::move(dp);
    s.data.sharded = fsdp;
    out.push_back(std::move(s));
  };
  if (axes.size() == 1) {
    add("", {axes[0]}, false, false);
    add("", {axes[0]}, true, false);
    for (bool sp : {false, true}) add(axes[0], {}, false, sp);
  } else if (axes.size() == 2) {
    for (size_t t = 0; t < 2; ++t)
      for (bool sp : {false, true}) {
        add(axes[t], {axes[1 - t]}, false, sp);
        add(axes[t], {axes[1 - t]}, true, sp);
      }
    add("", {axes[0], axes[1]}, false, false);
  } else {
    TESSERA_CHECK(false, ShardingError, "parallelize", "meshes of 1 or 2 axes are supported, not ", spec.to_string());
  }
  return out;
}

int64_t data_parallel_ways(const ParallelStrategy& s, const MeshSpec& spec) {
  int64_t ways = 1;
  for (const auto& a : s.data.axes) ways *= spec.size(spec.dim_of(a, "parallelize"));
  return ways;
}

int64_t compute_ways(const ParallelStrategy& s, const MeshSpec& spec) {
  return data_parallel_ways(s, spec) * (s.tensor ? spec.size(spec.dim_of(s.tensor->axis, "parallelize")) : 1);
}

std::vector<UnitCost> price_units(const ParallelStrategy& s, const std::vector<ParameterInfo>& parameters,
                                  int64_t units, const std::map<std::string, nn::ParallelStyle>& tp_plan,
                                  const MeshSpec& spec, const CostModel& cost, const StepShape& step) {
  using Owner = ParameterInfo::Owner;
  const PlanOptions plan_options{cost};
  const int64_t tp = s.tensor ? spec.dim_of(s.tensor->axis, "parallelize") : -1;
  std::vector<int64_t> dp;
  for (const auto& a : s.data.axes) dp.push_back(spec.dim_of(a, "parallelize"));
  const int64_t dp_ways = data_parallel_ways(s, spec);
  std::vector<UnitCost> out(static_cast<size_t>(units));
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
  const bool sp = tp >= 0 && s.tensor->sequence_parallel;
  const int64_t tp_ways = tp >= 0 ? spec.size(tp) : 1;
  const Placements replicate(static_cast<size_t>(spec.ndim()), Replicate{});
  const std::vector<int64_t> origin(static_cast<size_t>(spec.ndim()), 0);
  const int64_t microbatches = step.microbatches, tokens = step.rows * step.seq;
  std::vector<std::string> colwise_parents;
  for (const ParameterInfo& param : parameters) {
    TESSERA_CHECK(param.unit >= 0 && param.unit < units, ValueError, "parallelize", "parameter ", param.path,
                  " is in unit ", param.unit, " of ", units);
    UnitCost& u = out[static_cast<size_t>(param.unit)];
    const std::string module = parent_of(param.path);
    const std::string name = param.path.substr(module.empty() ? 0 : module.size() + 1);
    const bool linear = param.owner == Owner::linear, embedding = param.owner == Owner::embedding;
    const bool norm = param.owner == Owner::norm;
    const nn::ParallelStyle* style = tp >= 0 ? style_of(tp_plan, module) : nullptr;
    const bool colwise = style && std::holds_alternative<nn::ColwiseParallel>(*style);
    const bool rowwise = style && std::holds_alternative<nn::RowwiseParallel>(*style);
    // The parameter's compute layout under the tensor parallel plan.
    Placements compute = replicate;
    if (linear && colwise) compute[static_cast<size_t>(tp)] = Shard{0};
    if (linear && rowwise && name == "weight") compute[static_cast<size_t>(tp)] = Shard{1};
    if (embedding && colwise) compute[static_cast<size_t>(tp)] = Shard{1};
    if (embedding && rowwise) compute[static_cast<size_t>(tp)] = Shard{0};
    const Shape& shape = param.shape;
    const DType dtype = param.dtype;
    const Layout compute_layout(shape, dtype, spec, compute);
    Layout storage = compute_layout;
    if (s.data.sharded) {
      const int64_t m = dp.front();
      std::vector<int64_t> order = compute_layout.shard_order(0);
      order.push_back(m);
      storage = Layout(shape, dtype, spec, with(compute, m, Shard{0}), ShardOrder{{0, order}});
      // The forward's all_gather, the gradient's reduce_scatter.
      price(u, storage, compute_layout, microbatches);
      price(u, Layout(shape, dtype, spec, with(compute, m, Partial{})), storage, microbatches);
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
    if (norm && name == "weight")
      u.activation_bytes += tokens / dp_ways * shape[0] / (sp ? tp_ways : 1) * itemsize(dtype);
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
      return Layout(Shape{step.rows, step.seq, features}, dtype, spec, p);
    };
    const int64_t in = linear ? shape[1] : shape[0], out_features = linear ? shape[0] : shape[1];
    if (rowwise && !sp)
      price(u, activation(out_features, Partial{}), activation(out_features, Replicate{}), microbatches);
    if (rowwise && sp) {
      price(u, activation(out_features, Partial{}), activation(out_features, Shard{1}), microbatches);
      price(u, activation(out_features, Shard{1}), activation(out_features, Replicate{}), microbatches);
    }
    if (colwise && linear &&
        std::find(colwise_parents.begin(), colwise_parents.end(), parent_of(module)) == colwise_parents.end()) {
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
          tokens / dp_ways * (in / (rowwise ? tp_ways : 1) + out_features / (colwise ? tp_ways : 1)) * itemsize(dtype);
  }
  return out;
}

int64_t memory_of(const std::vector<UnitCost>& units, int64_t first, int64_t end, int64_t held) {
  int64_t state = 0, activations = 0, gather = 0;
  for (int64_t u = first; u < end; ++u) {
    const UnitCost& c = units[static_cast<size_t>(u)];
    state += c.state_bytes, activations += c.activation_bytes, gather = std::max(gather, c.gather_bytes);
  }
  return state + held * activations + gather;
}

// Memory is each unit's state and activations under its choice plus the largest gather of a
// sharded unit: for each bound g on that gather, units gathering more stay DDP and the rest are
// chosen by a Pareto frontier of (memory, communication) over the units.
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

double PipelinePricing::time_us(int64_t stage, int64_t first, int64_t end, bool with_comm) const {
  double t = 0;
  for (int64_t u = first; u < end; ++u) {
    t += compute_us[static_cast<size_t>(u)];
    if (with_comm) t += units[static_cast<size_t>(u)].comm_us / static_cast<double>(microbatches);
  }
  if (with_comm) t += static_cast<double>(boundaries(stage)) * boundary_us;
  return t;
}

int64_t PipelinePricing::held(int64_t stage) const {
  return schedule == Schedule::gpipe ? microbatches : std::min(microbatches, stages - stage);
}

// Dynamic programming over (stage, end unit): best[s][end] is the slowest stage of the best
// split of units [0, end) into stages 0..s.
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
  if (S < 1 || U < S || best[static_cast<size_t>(S - 1)][static_cast<size_t>(U)] == kNone) return {};
  std::vector<int64_t> bounds(static_cast<size_t>(S + 1));
  bounds[static_cast<size_t>(S)] = U;
  for (int64_t s = S - 1; s >= 0; --s)
    bounds[static_cast<size_t>(s)] =
        from[static_cast<size_t>(s)][static_cast<size_t>(bounds[static_cast<size_t>(s + 1)])];
  return bounds;
}

}  // namespace tessera::mpmd::detail
