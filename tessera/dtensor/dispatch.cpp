// The dispatcher and its per-rank decision cache.
#include <tessera/dtensor/detail/dispatch.hpp>

#include <array>
#include <mutex>
#include <unordered_map>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch_handler_call.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/dtensor/explicit_redistribution.hpp>
#include <tessera/dtensor/op_observer.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

RuleRegistry& rule_registry() {
  static RuleRegistry registry;
  static std::once_flag built_in;
  std::call_once(built_in, [] { register_builtin_rules(registry); });
  return registry;
}

namespace {

struct Entry {
  int op = 0;
  std::vector<std::shared_ptr<const Layout>> inputs;  // keep the key's layouts alive
  OpArgs args;
  detail::Decision decision;
};

// Per rank: ranks are threads, so a thread-local cache needs no lock on the hot path.
struct Cache {
  uint64_t version = 0;
  std::unordered_multimap<size_t, Entry> entries;
  DispatchStats stats;
};
thread_local Cache cache;

constexpr size_t kMaxEntries = 16384;  // a bound, not a policy: programs use few layouts

size_t key_hash(int op, std::span<const DTensor* const> inputs, const OpArgs& args) {
  size_t h = static_cast<size_t>(op) * 0x9e3779b97f4a7c15ULL;
  const auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (const DTensor* t : inputs) mix(t->layout().hash());
  mix(hash_value(args));
  return h;
}

bool matches(const Entry& e, int op, std::span<const DTensor* const> inputs, const OpArgs& args) {
  if (e.op != op || e.inputs.size() != inputs.size() || !(e.args == args)) return false;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!(*e.inputs[i] == inputs[i]->layout())) return false;
  return true;
}

std::string describe(std::span<const DTensor* const> inputs) {
  std::string text;
  for (const DTensor* t : inputs) text.append(text.empty() ? "" : ", ").append(t->layout().to_string());
  return text;
}

detail::Decision decide(int op, std::span<const DTensor* const> inputs, const OpArgs& args) {
  const std::string name = rule_registry().name(op);
  const auto rule = rule_registry().rule(op);
  TESSERA_CHECK(rule != nullptr, ShardingError, name, "no sharding rule for op '", name, "' on inputs ",
                describe(inputs), "; register one with register_sharding, or run local code with local_map");
  std::vector<const Layout*> layouts;
  for (const DTensor* t : inputs) layouts.push_back(&t->layout());
  std::vector<OpProposal> proposals = (*rule)(layouts, args);
  TESSERA_CHECK(!proposals.empty(), ShardingError, name, "the rule of '", name, "' proposed no strategy for inputs ",
                describe(inputs));
  const PlanOptions options = plan_options(true);  // a bias joining a Partial output becomes Partial
  const auto cost = [&](const Layout& from, const Layout& to) { return cached_plan(from, to, options)->cost; };
  const auto bound = [&](const Layout& from, const Layout& to) { return plan_cost_lower_bound(from, to, options); };
  OpProposal& chosen = proposals[cheapest_proposal(proposals, layouts, cost, name, bound)];

  detail::Decision d;
  const std::vector<int64_t> coordinate = inputs.front()->device_mesh().coordinate();
  for (size_t i = 0; i < inputs.size(); ++i) {
    Layout& target = chosen.inputs[i];
    TESSERA_CHECK(target.global_shape() == layouts[i]->global_shape() && target.mesh() == layouts[i]->mesh(),
                  InternalError, name, "rule of '", name, "' changed input ", i, ": ", layouts[i]->to_string(),
                  " -> ", target.to_string());
    d.blocks.push_back(target.block(coordinate));
    if (target == *layouts[i]) {
      d.targets.push_back(detail::DTensorAccess::layout_ptr(*inputs[i]));
      d.plans.push_back(nullptr);
    } else {
      d.plans.push_back(cached_plan(*layouts[i], target, options));
      d.targets.push_back(std::make_shared<const Layout>(std::move(target)));
    }
  }
  d.output_block = chosen.output.block(coordinate);
  d.output_local_shape = d.output_block.shape();
  d.output = std::make_shared<const Layout>(std::move(chosen.output));
  return d;
}

}  // namespace

DispatchStats dispatch_stats() { return cache.stats; }
void reset_dispatch_stats() { cache.stats = {}; }
void clear_dispatch_cache() { cache.entries.clear(); }

namespace detail {

DTensor dispatch(int op, std::span<const DTensor* const> inputs, const OpArgs& args, Kernel kernel) {
  if (op_observed()) notify_op(rule_registry().name(op), inputs);
  if (auto handled = run_dispatch_handler(op, inputs, args)) return std::move(*handled);
  const DeviceMesh& mesh = inputs.front()->device_mesh();
  const uint64_t version = rule_registry().version();
  if (cache.version != version) {
    cache.entries.clear();
    cache.version = version;
  }
  const size_t hash = key_hash(op, inputs, args);
  Entry* entry = nullptr;
  for (auto [it, end] = cache.entries.equal_range(hash); it != end; ++it) {
    if (matches(it->second, op, inputs, args)) {
      entry = &it->second;
      break;
    }
  }
  if (entry) {
    ++cache.stats.hits;
  } else {
    // Validation runs on the miss path only: a hit means these exact layouts passed before.
    const std::string name = rule_registry().name(op);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DTensor* t = inputs[i];
      // A default-constructed DTensor has no mesh at all (a real mesh has a rank); a rank outside
      // the mesh holds no local but is not undefined.
      TESSERA_CHECK(t->device_mesh().size() > 0 && (t->defined() || !t->device_mesh().is_member()), ShardingError,
                    name, "input ", i, " is an undefined DTensor (default-constructed)");
      TESSERA_CHECK(t->layout().mesh() == mesh.spec(), ShardingError, name, "inputs live on different meshes: ",
                    describe(inputs), "; move one with redistribute(mesh, placements)");
    }
    TESSERA_CHECK(mesh.is_member(), ShardingError, name, "world rank ", rank(), " is not in ", mesh.to_string(),
                  "; ops on DTensors run on the mesh's ranks only");
    const uint64_t planned = plan_call_count();
    Entry made{op, {}, args, decide(op, inputs, args)};
    for (const DTensor* t : inputs) made.inputs.push_back(DTensorAccess::layout_ptr(*t));
    cache.stats.planner_calls += plan_call_count() - planned;
    ++cache.stats.misses;
    if (cache.entries.size() >= kMaxEntries) cache.entries.clear();
    entry = &cache.entries.emplace(hash, std::move(made))->second;
  }
  Decision& d = entry->decision;

  std::array<Tensor, 4> inline_locals;
  std::vector<Tensor> spilled;
  std::span<Tensor> locals(inline_locals.data(), inputs.size());
  if (inputs.size() > inline_locals.size()) {
    spilled.resize(inputs.size());
    locals = spilled;
  }
  if (ExplicitRedistributionContext::active())  // refuse before any input moves
    for (size_t i = 0; i < inputs.size(); ++i)
      if (d.plans[i]) check_implicit_redistribution(rule_registry().name(op), i, *d.plans[i]);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& held = DTensorAccess::local(*inputs[i]);
    locals[i] = d.plans[i] ? run_plan(*d.plans[i], held, mesh, mesh) : held;
  }
  Tensor out = kernel(std::span<const Tensor>(locals.data(), locals.size()), d);
  if (out.dtype() != d.output->dtype()) {
    // The first run tells the output dtype; from then on the cached layout carries it.
    d.output = std::make_shared<const Layout>(d.output->with_dtype(out.dtype()));
  }
  TESSERA_ASSERT(out.shape() == d.output_local_shape, "kernel of '", rule_registry().name(op), "' returned ",
                 out.shape().to_string(), " for block ", d.output_local_shape.to_string(), " of ",
                 d.output->to_string());
  return DTensorAccess::make(std::move(out), mesh, d.output);
}

}  // namespace detail
}  // namespace tessera
