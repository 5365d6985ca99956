#include <tessera/sharding/plan.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <tessera/core/error.hpp>

namespace tessera {

std::string_view name(StepKind kind) {
  switch (kind) {
#define TESSERA_PLAN_STEP_NAME(n) \
  case StepKind::n:               \
    return #n;
    TESSERA_FORALL_PLAN_STEPS(TESSERA_PLAN_STEP_NAME)
#undef TESSERA_PLAN_STEP_NAME
  }
  return "?";
}

namespace {

int64_t max_of(const std::vector<int64_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

std::string bytes_text(int64_t bytes) {
  if (bytes < 10 * 1024) return std::to_string(bytes) + " B";
  if (bytes < 10 * 1024 * 1024) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes / (1024 * 1024)) + " MiB";
}

bool contains(const Block& outer, const Block& inner) {
  for (int64_t d = 0; d < outer.begin.size(); ++d)
    if (inner.numel() > 0 && (inner.begin[d] < outer.begin[d] || inner.end[d] > outer.end[d])) return false;
  return true;
}

int world_extent(const Layout& a, const Layout& b) {
  int top = 0;
  for (int r : a.mesh().ranks()) top = std::max(top, r);
  for (int r : b.mesh().ranks()) top = std::max(top, r);
  return top + 1;
}

int64_t max_block_numel(const Layout& layout) {
  int64_t most = 0;
  for (int r : layout.mesh().ranks()) most = std::max(most, layout.block_of_rank(r).numel());
  return most;
}

// The coordinates of the ranks that differ from `coordinate` only along mesh dim m.
std::vector<std::vector<int64_t>> group_along(const MeshSpec& mesh, std::vector<int64_t> coordinate, int64_t m) {
  std::vector<std::vector<int64_t>> group;
  for (int64_t i = 0; i < mesh.shape()[m]; ++i) {
    coordinate[static_cast<size_t>(m)] = i;
    group.push_back(coordinate);
  }
  return group;
}

// The single mesh dim whose placement differs, or nullopt when none or several differ.
std::optional<int64_t> single_changed_dim(const Layout& before, const Layout& after) {
  std::optional<int64_t> changed;
  for (int64_t m = 0; m < before.mesh().ndim(); ++m) {
    if (before.placements()[static_cast<size_t>(m)] == after.placements()[static_cast<size_t>(m)]) continue;
    if (changed) return std::nullopt;
    changed = m;
  }
  return changed;
}

// A step changing only the placement at one mesh dim, costed per rank; nullopt when no single
// collective does it (the blocks do not line up, or the change is not one of the step kinds).
std::optional<PlanStep> mesh_dim_step(const Layout& before, const Layout& after, int world) {
  if (!(before.mesh() == after.mesh())) return std::nullopt;
  const auto changed = single_changed_dim(before, after);
  if (!changed) return std::nullopt;
  const int64_t m = *changed;
  const Placement& from = before.placements()[static_cast<size_t>(m)];
  const Placement& to = after.placements()[static_cast<size_t>(m)];
  PlanStep step;
  step.mesh_dim = m;
  if (is_shard(from) && is_replicate(to)) step.kind = StepKind::all_gather;
  else if (is_shard(from) && is_shard(to)) step.kind = StepKind::all_to_all;
  else if (is_replicate(from) && is_shard(to)) step.kind = StepKind::local_chunk;
  else if (is_partial(from) && is_replicate(to)) step.kind = StepKind::all_reduce;
  else if (is_partial(from) && is_shard(to)) step.kind = StepKind::reduce_scatter;
  else if (is_replicate(from) && is_partial(to)) step.kind = StepKind::to_partial;
  else return std::nullopt;
  if (is_partial(from)) step.op = std::get<Partial>(from).op;
  if (is_partial(to)) step.op = std::get<Partial>(to).op;

  const MeshSpec& mesh = before.mesh();
  const int64_t k = mesh.shape()[m];
  const int64_t item = itemsize(before.dtype());
  step.bytes_sent.assign(static_cast<size_t>(world), 0);
  step.bytes_received.assign(static_cast<size_t>(world), 0);
  for (int r : mesh.ranks()) {
    const auto coordinate = mesh.coordinate_of(r);
    const Block want = after.block(coordinate);
    const Block held = before.block(coordinate);
    const auto group = group_along(mesh, coordinate, m);
    auto& received = step.bytes_received[static_cast<size_t>(r)];
    switch (step.kind) {
      case StepKind::local_chunk:
        if (!contains(held, want)) return std::nullopt;
        break;
      case StepKind::to_partial:
        if (!(held == want)) return std::nullopt;
        break;
      case StepKind::all_gather:
      case StepKind::all_to_all: {
        // Source blocks along the group are disjoint (Shard at m): they must cover `want`.
        int64_t covered = 0, peers = 0;
        for (const auto& c : group) {
          const int64_t piece = before.block(c).intersect(want).numel();
          covered += piece;
          if (c == coordinate || piece == 0) continue;
          received += piece * item;
          step.bytes_sent[static_cast<size_t>(mesh.rank_at(c))] += piece * item;
          ++peers;
        }
        if (covered != want.numel()) return std::nullopt;
        step.messages = std::max(step.messages, peers);
        break;
      }
      case StepKind::reduce_scatter: {
        // Every rank of the group holds the same (partial) block; the new blocks must tile it.
        if (!contains(held, want)) return std::nullopt;
        int64_t tiled = 0;
        for (const auto& c : group) tiled += after.block(c).numel();
        if (tiled != held.numel()) return std::nullopt;
        received = (k - 1) * want.numel() * item;
        step.bytes_sent[static_cast<size_t>(r)] = (held.numel() - want.numel()) * item;
        step.messages = std::max(step.messages, k - 1);
        break;
      }
      case StepKind::all_reduce:
        if (!(held == want)) return std::nullopt;
        // Bandwidth-optimal all-reduce: reduce-scatter then all-gather, 2(k-1)/k of the block.
        received = 2 * (k - 1) * held.numel() * item / k;
        step.bytes_sent[static_cast<size_t>(r)] = received;
        step.messages = std::max(step.messages, 2 * (k - 1));
        break;
      case StepKind::exchange:
        break;
    }
  }
  step.before = before;
  step.after = after;
  return step;
}

PlanStep exchange_step(const Layout& before, const Layout& after, int world) {
  PlanStep step;
  step.kind = StepKind::exchange;
  step.before = before;
  step.after = after;
  step.transfers = direct_exchange(before, after);
  step.bytes_sent.assign(static_cast<size_t>(world), 0);
  step.bytes_received.assign(static_cast<size_t>(world), 0);
  const int64_t item = itemsize(before.dtype());
  std::vector<std::vector<int>> peers(static_cast<size_t>(world));
  for (const Transfer& t : step.transfers) {
    if (t.src_rank == t.dst_rank) continue;
    step.bytes_sent[static_cast<size_t>(t.src_rank)] += t.block.numel() * item;
    step.bytes_received[static_cast<size_t>(t.dst_rank)] += t.block.numel() * item;
    auto& p = peers[static_cast<size_t>(t.src_rank)];
    if (std::find(p.begin(), p.end(), t.dst_rank) == p.end()) p.push_back(t.dst_rank);
  }
  for (const auto& p : peers) step.messages = std::max<int64_t>(step.messages, static_cast<int64_t>(p.size()));
  return step;
}

// Time of a step ~ the busiest receiver plus the message latency; the lower bound is on
// receives, so that is what the model counts (sends are balanced by direct_exchange). A tiny
// share of the total breaks ties toward plans that move less overall.
double step_score(const PlanStep& step, const PlanOptions& options) {
  int64_t busiest = 0, total = 0;
  for (int64_t b : step.bytes_received) busiest = std::max(busiest, b), total += b;
  // Ties go to fewer steps, and to a collective over an exchange of the same cost.
  const double tie = step.kind == StepKind::exchange ? 0.5 : 0.25;
  return static_cast<double>(busiest) + 1e-3 * static_cast<double>(total) +
         options.message_cost_bytes * static_cast<double>(step.messages) + tie;
}

// The layouts one placement change at one mesh dim away from `at`, with every position of the
// mesh dim in the new shard order. Explicit sizes stay on tensor dims sharded as before.
std::vector<Layout> neighbours(const Layout& at, const Layout& dst, const PlanOptions& options) {
  const bool same_mesh = at.mesh() == dst.mesh();
  const int64_t nd = at.ndim();
  std::vector<Layout> out;
  for (int64_t m = 0; m < at.mesh().ndim(); ++m) {
    const Placement& cur = at.placements()[static_cast<size_t>(m)];
    const Placement* want = same_mesh ? &dst.placements()[static_cast<size_t>(m)] : nullptr;
    if (is_partial(cur) && want && *want == cur) continue;  // the destination keeps it
    std::vector<Placement> targets;
    if (!is_replicate(cur)) targets.push_back(Replicate{});
    for (int64_t d = 0; d < nd; ++d)
      if (!is_shard(cur, d)) targets.push_back(Shard{d});
    if (options.allow_partial_destination && want && is_partial(*want) && is_replicate(cur)) targets.push_back(*want);
    for (const Placement& target : targets) {
      Placements placements = at.placements();
      placements[static_cast<size_t>(m)] = target;
      ShardOrder order;
      ShardSizes sizes;
      for (int64_t d = 0; d < nd; ++d) {
        std::vector<int64_t> o = at.shard_order(d);
        o.erase(std::remove(o.begin(), o.end(), m), o.end());
        if (!o.empty()) order[d] = o;
        if (at.has_explicit_sizes(d) && o == at.shard_order(d) && !is_shard(target, d)) sizes[d] = at.piece_sizes(d);
      }
      const int64_t positions = is_shard(target) ? static_cast<int64_t>(order[std::get<Shard>(target).dim].size()) + 1 : 1;
      for (int64_t pos = 0; pos < positions; ++pos) {
        ShardOrder o = order;
        if (is_shard(target)) {
          auto& list = o[std::get<Shard>(target).dim];
          list.insert(list.begin() + pos, m);
        }
        try {
          out.emplace_back(at.global_shape(), at.dtype(), at.mesh(), placements, o, sizes);
        } catch (const ShardingError&) {
          // Not a layout (cannot happen for well-formed inputs); nothing to explore.
        }
      }
    }
  }
  if (same_mesh) out.push_back(dst);
  return out;
}

Placements without_partial(const Placements& placements) {
  Placements out = placements;
  for (auto& p : out)
    if (is_partial(p)) p = Replicate{};
  return out;
}

}  // namespace

int64_t PlanStep::max_bytes_sent() const { return max_of(bytes_sent); }
int64_t PlanStep::max_bytes_received() const { return max_of(bytes_received); }

std::string PlanStep::to_string() const {
  std::ostringstream out;
  out << name(kind);
  if (kind == StepKind::reduce_scatter || kind == StepKind::all_reduce || kind == StepKind::to_partial)
    out << '(' << tessera::name(op) << ')';
  if (mesh_dim >= 0) {
    out << " over " << before.mesh().names()[static_cast<size_t>(mesh_dim)] << " (mesh dim " << mesh_dim << ", "
        << before.mesh().shape()[mesh_dim] << " ranks)";
  } else {
    out << " over " << before.mesh().to_string();
    if (!(before.mesh() == after.mesh())) out << " -> " << after.mesh().to_string();
  }
  out << ": " << tessera::to_string(before.placements()) << " -> " << tessera::to_string(after.placements());
  out << "; recv <= " << bytes_text(max_bytes_received()) << "/rank, " << messages
      << (messages == 1 ? " msg" : " msgs");
  return out.str();
}

int64_t Plan::bytes_received(int world_rank) const {
  int64_t total = 0;
  for (const auto& s : steps)
    if (world_rank >= 0 && static_cast<size_t>(world_rank) < s.bytes_received.size())
      total += s.bytes_received[static_cast<size_t>(world_rank)];
  return total;
}

int64_t Plan::bytes_sent(int world_rank) const {
  int64_t total = 0;
  for (const auto& s : steps)
    if (world_rank >= 0 && static_cast<size_t>(world_rank) < s.bytes_sent.size())
      total += s.bytes_sent[static_cast<size_t>(world_rank)];
  return total;
}

int64_t Plan::max_bytes_received() const {
  int64_t most = 0;
  const int world = world_extent(src, dst);
  for (int r = 0; r < world; ++r) most = std::max(most, bytes_received(r));
  return most;
}

int64_t Plan::total_bytes_received() const {
  int64_t total = 0;
  for (const auto& s : steps)
    for (int64_t b : s.bytes_received) total += b;
  return total;
}

int64_t Plan::messages() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.messages;
  return total;
}

std::string Plan::to_string() const {
  std::string text;
  for (size_t i = 0; i < steps.size(); ++i) text += (i ? "\n" : "") + steps[i].to_string();
  return text.empty() ? "no steps" : text;
}

int64_t plan_lower_bound(const Layout& src, const Layout& dst) {
  if (!src.has_partial()) {
    int64_t most = 0;
    for (int r : dst.mesh().ranks()) most = std::max(most, receive_lower_bound(src, dst, r));
    return most;
  }
  // The reduction over each Partial dim, then moving the reduced values as a non-Partial source
  // would (Partial dims the destination keeps are neither reduced nor counted).
  const bool same_mesh = src.mesh() == dst.mesh();
  const int64_t item = itemsize(src.dtype());
  int64_t bound = 0;
  Placements reduced = src.placements();
  for (int64_t m = 0; m < src.mesh().ndim(); ++m) {
    const Placement& p = src.placements()[static_cast<size_t>(m)];
    if (!is_partial(p)) continue;
    reduced[static_cast<size_t>(m)] = Replicate{};
    if (same_mesh && dst.placements()[static_cast<size_t>(m)] == p) continue;
    const int64_t k = src.mesh().shape()[m];
    const bool scatters = same_mesh && is_shard(dst.placements()[static_cast<size_t>(m)]);
    bound += (scatters ? 1 : 2) * (k - 1) * max_block_numel(src) * item / k;
  }
  if (dst.has_partial()) return bound;
  const Layout values = src.with_placements(reduced);
  int64_t moved = 0;
  for (int r : dst.mesh().ranks()) moved = std::max(moved, receive_lower_bound(values, dst, r));
  return bound + moved;
}

namespace {
thread_local uint64_t plan_calls = 0;
}  // namespace

uint64_t plan_call_count() { return plan_calls; }

Plan plan(const Layout& src, const Layout& dst, const PlanOptions& options) {
  ++plan_calls;
  const std::string both = src.to_string() + " -> " + dst.to_string();
  TESSERA_CHECK(src.global_shape() == dst.global_shape(), ShardingError, "redistribute",
                "global shapes differ: ", both);
  TESSERA_CHECK(src.dtype() == dst.dtype(), ShardingError, "redistribute", "dtypes differ: ", both);
  const bool same_mesh = src.mesh() == dst.mesh();
  for (int64_t m = 0; m < dst.mesh().ndim(); ++m) {
    const Placement& want = dst.placements()[static_cast<size_t>(m)];
    if (!is_partial(want)) continue;
    const Placement* have = same_mesh ? &src.placements()[static_cast<size_t>(m)] : nullptr;
    // Keeping a Partial (the same one on the same mesh dim) is always allowed: redistributing
    // another mesh dim must not force a reduction. Creating one needs allow_partial_destination.
    TESSERA_CHECK(!have || !is_partial(*have) || *have == want, ShardingError, "redistribute", "cannot turn ",
                  to_string(*have), " into ", to_string(want), " on mesh dim ", m,
                  " (reduce first; different reductions do not commute): ", both);
    const bool kept = have && *have == want;
    TESSERA_CHECK(kept || options.allow_partial_destination, ShardingError, "redistribute",
                  "cannot redistribute to Partial (mesh dim ", m, "): a Partial value only arises from an "
                  "operation; ", both);
  }
  Plan result{src, dst, {}, 0};
  if (src == dst) return result;

  const int world = world_extent(src, dst);
  const int64_t memory_cap = std::max(max_block_numel(src), max_block_numel(dst));
  const Layout exchange_target =
      dst.has_partial() ? dst.with_placements(without_partial(dst.placements())) : dst;

  // Dijkstra over layouts. Steps live in `edges`; each reached layout remembers its best edge.
  struct Reached {
    double score;
    int edge;  // -1 for the source
    bool done = false;
  };
  std::unordered_map<Layout, Reached> reached;
  std::vector<std::pair<int, PlanStep>> edges;  // (index of the layout's predecessor edge, step)
  using Entry = std::pair<double, Layout>;
  auto later = [](const Entry& a, const Entry& b) { return a.first > b.first; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> frontier(later);
  reached.emplace(src, Reached{0, -1});
  frontier.push({0, src});

  auto relax = [&](const Layout& from, double base, PlanStep step) {
    const double score = base + step_score(step, options);
    const Layout to = step.after;
    auto it = reached.find(to);
    if (it != reached.end() && (it->second.done || it->second.score <= score)) return;
    edges.push_back({reached.at(from).edge, std::move(step)});
    reached[to] = Reached{score, static_cast<int>(edges.size()) - 1};
    frontier.push({score, to});
  };

  while (!frontier.empty()) {
    auto [score, at] = frontier.top();
    frontier.pop();
    auto& node = reached.at(at);
    if (node.done || score > node.score) continue;
    node.done = true;
    if (at == dst) break;
    for (const Layout& next : neighbours(at, dst, options)) {
      if (!(next == dst) && max_block_numel(next) > memory_cap) continue;
      if (auto step = mesh_dim_step(at, next, world)) relax(at, score, std::move(*step));
    }
    if (!at.has_partial() && !(at == exchange_target)) relax(at, score, exchange_step(at, exchange_target, world));
  }
  auto it = reached.find(dst);
  TESSERA_CHECK(it != reached.end(), ShardingError, "redistribute", "no plan found for ", both,
                "; Partial values cannot leave their mesh unreduced");
  result.cost = it->second.score;
  for (int e = it->second.edge; e >= 0; e = edges[static_cast<size_t>(e)].first)
    result.steps.push_back(edges[static_cast<size_t>(e)].second);
  std::reverse(result.steps.begin(), result.steps.end());
  return result;
}

std::string explain(const Plan& plan) {
  std::ostringstream out;
  out << "redistribute " << plan.src.to_string() << "\n          -> " << plan.dst.to_string() << '\n';
  if (plan.steps.empty()) {
    out << "  nothing to do: the layouts are equal\n";
    return out.str();
  }
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& s = plan.steps[i];
    out << "  " << i + 1 << ". " << s.to_string() << '\n';
    if (s.kind == StepKind::exchange) {
      int shown = 0, moving = 0;
      for (const Transfer& t : s.transfers) {
        if (t.src_rank == t.dst_rank) continue;
        ++moving;
        if (shown < 12) {
          out << "       " << t.to_string() << '\n';
          ++shown;
        }
      }
      if (moving > shown) out << "       ... " << moving - shown << " more pieces\n";
    }
  }
  int64_t bound = 0;
  std::string bound_text = "n/a";
  if (!plan.dst.has_partial()) {
    bound = plan_lower_bound(plan.src, plan.dst);
    bound_text = bytes_text(bound);
  }
  out << "  total: recv <= " << bytes_text(plan.max_bytes_received()) << "/rank (lower bound " << bound_text
      << "), " << plan.messages() << (plan.messages() == 1 ? " msg, " : " msgs, ") << plan.steps.size() << (plan.steps.size() == 1 ? " step" : " steps");
  if (plan.messages() == 0) out << " (no communication)";
  out << '\n';
  return out.str();
}

}  // namespace tessera
