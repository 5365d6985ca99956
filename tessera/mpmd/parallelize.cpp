#include <tessera/mpmd/parallelize.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
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

// One unsharded step's time on this mesh (every rank computes the whole step, as contended as
// the sharded run will be): the median of three, the slowest rank's.
double measure_unsharded_step_us(nn::TransformerLM& model, const ParallelizeOptions& options) {
  const auto& c = model.config();
  std::vector<int64_t> ids(static_cast<size_t>(options.batch * options.seq)), next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3) % static_cast<size_t>(c.vocab));
    next[i] = static_cast<int64_t>((i * 7 + 10) % static_cast<size_t>(c.vocab));
  }
  const DeviceMesh& mesh = model.mesh();
  const Placements whole(static_cast<size_t>(mesh.ndim()), Replicate{});
  const DTensor tokens = distribute_tensor(from_vector(ids, Shape{options.batch, options.seq}), mesh, whole);
  const DTensor targets = distribute_tensor(from_vector(next, Shape{options.batch, options.seq}), mesh, whole);
  std::vector<double> times;
  for (int i = 0; i < 4; ++i) {
    const auto start = std::chrono::steady_clock::now();
    model.loss(tokens, targets).backward();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) times.push_back(us);
  }
  model.zero_grad();
  std::sort(times.begin(), times.end());
  double median = times[1];
  if (const auto comm = mesh.mesh_comm_ptr()) comm->all_reduce(&median, 1, DType::f64, ReduceOp::max);
  return median;
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

// The candidates on a mesh of one or two axes.
std::vector<PlanEstimate> candidates_of(const MeshSpec& spec) {
  const auto& axes = spec.names();
  std::vector<PlanEstimate> out;
  const auto add = [&](std::string tp, std::vector<std::string> dp, bool fsdp) {
    PlanEstimate e;
    e.tp_axis = std::move(tp);
    e.dp_axes = std::move(dp);
    e.fsdp = fsdp;
    std::string name;
    if (!e.tp_axis.empty()) name = "tp(" + e.tp_axis + ")";
    if (!e.dp_axes.empty()) {
      std::string joined;
      for (const auto& a : e.dp_axes) joined += (joined.empty() ? "" : ",") + a;
      name += (name.empty() ? "" : " + ") + std::string(fsdp ? "fsdp(" : "ddp(") + joined + ")";
    }
    e.name = name;
    out.push_back(std::move(e));
  };
  if (axes.size() == 1) {
    add("", {axes[0]}, false);
    add("", {axes[0]}, true);
    add(axes[0], {}, false);
  } else if (axes.size() == 2) {
    for (int t = 0; t < 2; ++t) {
      add(axes[static_cast<size_t>(t)], {axes[static_cast<size_t>(1 - t)]}, false);
      add(axes[static_cast<size_t>(t)], {axes[static_cast<size_t>(1 - t)]}, true);
    }
    add("", {axes[0], axes[1]}, false);
  } else {
    TESSERA_CHECK(false, ShardingError, "parallelize", "meshes of 1 or 2 axes are supported, not ", spec.to_string());
  }
  return out;
}

// Prices one candidate.
void estimate(PlanEstimate& e, nn::TransformerLM& model, const ParallelizeOptions& options, double unsharded_us,
              const CostModel& cost, int64_t budget) {
  const MeshSpec& spec = model.mesh().spec();
  const PlanOptions plan_options{cost};
  const int64_t tp = e.tp_axis.empty() ? -1 : spec.dim_of(e.tp_axis, "parallelize");
  std::vector<int64_t> dp;
  for (const auto& a : e.dp_axes) dp.push_back(spec.dim_of(a, "parallelize"));
  int64_t ways = tp >= 0 ? spec.size(tp) : 1, dp_ways = 1;
  for (int64_t m : dp) ways *= spec.size(m), dp_ways *= spec.size(m);
  e.compute_us = unsharded_us / static_cast<double>(ways);
  const auto price = [&](const Layout& src, const Layout& dst) {
    const Plan p = plan(src, dst, plan_options);
    e.comm_us += p.estimated_us;
    e.comm_calls += p.calls();
    e.comm_bytes += p.max_bytes_received();
  };
  const auto with = [&](Placements placements, int64_t m, Placement p) {
    placements[static_cast<size_t>(m)] = p;
    return placements;
  };
  const std::map<std::string, nn::ParallelStyle> tp_plan = nn::transformer_tp_plan();
  const Placements replicate(static_cast<size_t>(spec.ndim()), Replicate{});
  const int64_t tokens = options.batch * options.seq;
  int64_t memory = 0, largest_gather = 0;
  std::vector<std::string> colwise_parents;
  for (const auto& [path, param] : model.named_parameters()) {
    const std::string module = parent_of(path), name = path.substr(module.empty() ? 0 : module.size() + 1);
    nn::Module& sub = module.empty() ? static_cast<nn::Module&>(model) : model.submodule(module);
    const auto* linear = dynamic_cast<const nn::Linear*>(&sub);
    const auto* embedding = dynamic_cast<const nn::Embedding*>(&sub);
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
      price(storage, compute_layout);  // all_gather for the forward
      price(Layout(shape, dtype, spec, with(compute, m, Partial{})), storage);  // reduce_scatter of the gradient
      largest_gather = std::max(largest_gather, compute_layout.local_shape(std::vector<int64_t>(spec.ndim(), 0)).numel() *
                                                    itemsize(dtype));
    } else if (!dp.empty()) {
      Placements partial = compute;
      for (int64_t m : dp) partial[static_cast<size_t>(m)] = Partial{};
      price(Layout(shape, dtype, spec, partial), compute_layout);  // all_reduce of the gradient
    }
    // Parameter, gradient and AdamW's two moments, by the stored shard (the largest rank's).
    memory += 4 * storage.local_shape(std::vector<int64_t>(spec.ndim(), 0)).numel() * itemsize(dtype);
    if (name != "weight" || !(linear || embedding)) continue;
    // Tensor parallel activations: a row-parallel output is all-reduced in the forward; the input
    // of column-parallel siblings (q, k, v share one) has its gradient all-reduced in the backward.
    const auto activation = [&](int64_t features, Placement on_tp) {
      Placements p = replicate;
      for (int64_t m : dp) p[static_cast<size_t>(m)] = Shard{0};
      if (tp >= 0) p[static_cast<size_t>(tp)] = on_tp;
      return Layout(Shape{tokens, features}, dtype, spec, p);
    };
    const int64_t in = linear ? linear->in_features() : shape[0], out = linear ? linear->out_features() : shape[1];
    if (rowwise) price(activation(out, Partial{}), activation(out, Replicate{}));
    if (colwise && linear && std::find(colwise_parents.begin(), colwise_parents.end(), parent_of(module)) ==
                                 colwise_parents.end()) {
      colwise_parents.push_back(parent_of(module));
      price(activation(in, Partial{}), activation(in, Replicate{}));
    }
    // Saved activations of a linear layer: its input and output on this rank.
    if (linear) {
      const int64_t tp_ways = tp >= 0 ? spec.size(tp) : 1;
      memory += tokens / dp_ways * (in / (rowwise ? tp_ways : 1) + out / (colwise ? tp_ways : 1)) * itemsize(dtype);
    }
  }
  e.memory_bytes = memory + largest_gather;
  e.fits = budget <= 0 || e.memory_bytes <= budget;
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
  std::snprintf(line, sizeof line, "%-24s %12s %12s %12s %7s %12s %14s  %s\n", "plan", "estimate us", "compute us",
                "comm us", "calls", "comm bytes", "memory/rank", "");
  out << line;
  for (const PlanEstimate& e : candidates) {
    std::snprintf(line, sizeof line, "%-24s %12.0f %12.0f %12.0f %7lld %12lld %14s  %s\n", e.name.c_str(),
                  e.estimated_us(), e.compute_us, e.comm_us, static_cast<long long>(e.comm_calls),
                  static_cast<long long>(e.comm_bytes), mib(e.memory_bytes).c_str(),
                  e.name == chosen.name ? "<- chosen" : (e.fits ? "" : "over budget"));
    out << line;
  }
  return out.str();
}

ParallelPlan plan_parallelism(nn::TransformerLM& model, int64_t memory_budget_bytes, const ParallelizeOptions& options) {
  for (const auto& [path, p] : model.named_parameters())
    TESSERA_CHECK(p->layout().is_replicated(), ShardingError, "parallelize", "parameter ", path, " is already ",
                  p->layout().to_string(), "; parallelize takes an unsharded model");
  const double unsharded = options.unsharded_step_us > 0 ? options.unsharded_step_us
                                                         : measure_unsharded_step_us(model, options);
  CostModel cost = options.cost.value_or(CostModel::for_backend(world().backend()));
  if (!options.cost) cost.call_us = std::max(cost.call_us, measure_call_us(model.mesh()));
  ParallelPlan result;
  result.cost = cost;
  result.candidates = candidates_of(model.mesh().spec());
  for (PlanEstimate& e : result.candidates) estimate(e, model, options, unsharded, cost, memory_budget_bytes);
  const PlanEstimate* best = nullptr;
  const PlanEstimate* smallest = &result.candidates.front();
  for (const PlanEstimate& e : result.candidates) {
    if (e.memory_bytes < smallest->memory_bytes) smallest = &e;
    if (e.fits && (!best || e.estimated_us() < best->estimated_us())) best = &e;
  }
  TESSERA_CHECK(best != nullptr, ValueError, "parallelize", "no plan fits the memory budget of ",
                mib(memory_budget_bytes), " per rank on ", model.mesh().to_string(), "; the smallest, ", smallest->name,
                ", needs ", mib(smallest->memory_bytes));
  result.chosen = *best;
  const MeshSpec& spec = model.mesh().spec();
  result.data.assign(static_cast<size_t>(spec.ndim()), Replicate{});
  for (const auto& a : best->dp_axes) result.data[static_cast<size_t>(spec.dim_of(a, "parallelize"))] = Shard{0};
  return result;
}

ParallelPlan parallelize(nn::TransformerLM& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options) {
  TESSERA_CHECK(mesh.spec() == model.mesh().spec(), ShardingError, "parallelize", "the model lives on ",
                model.mesh().to_string(), ", not on ", mesh.to_string());
  ParallelPlan result = plan_parallelism(model, memory_budget_bytes, options);
  if (options.print && mesh.is_member() && mesh.coordinate() == std::vector<int64_t>(static_cast<size_t>(mesh.ndim()), 0))
    std::printf("parallelize on %s (budget %s per rank, step of [%lld, %lld] tokens, %s):\n%s",
                mesh.to_string().c_str(), memory_budget_bytes > 0 ? mib(memory_budget_bytes).c_str() : "none",
                static_cast<long long>(options.batch), static_cast<long long>(options.seq),
                result.cost.to_string().c_str(), result.to_string().c_str());
  if (!result.chosen.tp_axis.empty()) nn::parallelize_module(model, result.chosen.tp_axis, nn::transformer_tp_plan());
  if (result.chosen.fsdp) nn::fully_shard(model, result.chosen.dp_axes.front());
  return result;
}

}  // namespace tessera::mpmd
