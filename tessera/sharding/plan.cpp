#include <tessera/sharding/plan.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <tessera/core/error.hpp>
#include <tessera/sharding/detail/rank_classes.hpp>
#include <tessera/sharding/detail/step_cost.hpp>

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

using detail::rounds;

std::string bytes_text(int64_t bytes) {
  if (bytes < 10 * 1024) return std::to_string(bytes) + " B";
  if (bytes < 10 * 1024 * 1024) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes / (1024 * 1024)) + " MiB";
}

// Time of a step (CostModel) in bytes: the busiest receiver plus the call and message latency;
// the lower bound is on receives, so that is what the model counts (sends are balanced by
// direct_exchange). A tiny share of the total breaks ties toward plans that move less overall.
// How many hosts' worth of ranks a step's group spans (options.spans_hosts): the product of the
// sizes of its mesh dims whose lines span hosts (each dim's lines stay inside a host otherwise,
// and so does any walk along them), 1 when none does; an exchange over a mesh with such a dim
// counts as spanning with all its messages.
int64_t host_span(const PlanStep& step, const PlanOptions& options) {
  if (!options.spans_hosts) return 1;
  if (step.kind != StepKind::exchange) {
    int64_t span = 1;
    for (int64_t m : step.mesh_dims)
      if (options.spans_hosts(step.before.mesh(), m)) span *= step.before.mesh().shape()[m];
    return span;
  }
  for (const MeshSpec* mesh : {&step.before.mesh(), &step.after.mesh()})
    for (int64_t m = 0; m < mesh->ndim(); ++m)
      if (options.spans_hosts(*mesh, m)) return std::numeric_limits<int64_t>::max();
  return 1;
}

// The score of a step: its time, in bytes at the within-host bandwidth. A step whose group spans
// hosts makes its call and moves its bytes at the network's cost; of its messages, the rounds
// among the hosts (recursive doubling pairs the inner, within-host dims first) cross it, the rest
// stay inside. Ties go to fewer steps, and to a collective over an exchange of the same cost.
double step_score(const PlanStep& step, const PlanOptions& options) {
  const int64_t span = host_span(step, options);
  const CostModel& model = span > 1 ? options.across_hosts : options.cost;
  const int64_t across = span > 1 ? std::min(step.messages, span == std::numeric_limits<int64_t>::max() ? step.messages
                                                                                                       : rounds(span))
                                  : 0;
  const double scale = options.cost.bytes_per_us / model.bytes_per_us;  // bytes there, in bytes here
  const double tie = step.kind == StepKind::exchange ? 0.5 : 0.25;
  return scale * (static_cast<double>(step.max_received) + 1e-3 * static_cast<double>(step.total_received)) +
         options.cost.bytes_per_us *
             (options.across_hosts.message_us * static_cast<double>(across) +
              options.cost.message_us * static_cast<double>(step.messages - across) +
              model.call_us * static_cast<double>(step.calls)) +
         tie;
}

// `at` with the placements at `changes`' mesh dims replaced, the shard order kept for the other
// mesh dims and each changed one inserted at `position` in its tensor dim's order (-1: innermost).
// Explicit sizes stay on tensor dims sharded as before. nullopt if that is not a layout.
std::optional<Layout> changed_layout(const Layout& at, const std::vector<std::pair<int64_t, Placement>>& changes,
                                     int64_t position = -1) {
  Placements placements = at.placements();
  for (const auto& [m, p] : changes) placements[static_cast<size_t>(m)] = p;
  ShardOrder order;
  ShardSizes sizes;
  for (int64_t d = 0; d < at.ndim(); ++d) {
    std::vector<int64_t> o = at.shard_order(d);
    for (const auto& change : changes) o.erase(std::remove(o.begin(), o.end(), change.first), o.end());
    bool sharded_now = false;
    for (const auto& [m, p] : changes)
      if (is_shard(p, d)) {
        o.insert(position < 0 ? o.end() : o.begin() + position, m);
        sharded_now = true;
      }
    if (!std::is_sorted(o.begin(), o.end())) order[d] = o;  // the default order needs no entry
    if (at.has_explicit_sizes(d) && !sharded_now && o == at.shard_order(d)) sizes[d] = at.piece_sizes(d);
  }
  try {
    return Layout(at.global_shape(), at.dtype(), at.mesh(), placements, order, sizes);
  } catch (const ShardingError&) {
    return std::nullopt;  // not a layout (cannot happen for well-formed inputs): nothing to explore
  }
}

// Changes of several mesh dims at once towards dst, each one call over their flattened group:
// Partials of one op reduced together (to Replicate, or scattered to dst's Shards), Shards dst
// replicates gathered together, Replicates dst shards chunked together. Every subset of two or
// more such dims is a candidate.
void multi_dim_neighbours(const Layout& at, const Layout& dst, std::vector<Layout>& out) {
  struct Group {
    std::vector<int64_t> dims;
    bool to_destination;  // each dim takes dst's placement; else Replicate
  };
  std::vector<Group> groups;
  std::vector<std::pair<ReduceOp, Group>> reduce_all, scatter_all;
  Group gather{{}, false}, chunk{{}, true};
  for (int64_t m = 0; m < at.mesh().ndim(); ++m) {
    const Placement& cur = at.placements()[static_cast<size_t>(m)];
    const Placement& want = dst.placements()[static_cast<size_t>(m)];
    if (at.mesh().shape()[m] == 1 || cur == want) continue;
    if (is_partial(cur)) {
      const ReduceOp op = std::get<Partial>(cur).op;
      auto add = [&](std::vector<std::pair<ReduceOp, Group>>& list, bool to_destination) {
        auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == op; });
        if (it == list.end()) list.push_back({op, Group{{}, to_destination}}), it = list.end() - 1;
        it->second.dims.push_back(m);
      };
      add(reduce_all, false);
      if (is_shard(want)) add(scatter_all, true);
    } else if (is_shard(cur) && is_replicate(want)) {
      gather.dims.push_back(m);
    } else if (is_replicate(cur) && is_shard(want)) {
      chunk.dims.push_back(m);
    }
  }
  for (auto& [op, g] : reduce_all) groups.push_back(std::move(g));
  for (auto& [op, g] : scatter_all) groups.push_back(std::move(g));
  groups.push_back(std::move(gather));
  groups.push_back(std::move(chunk));
  for (const Group& g : groups) {
    const auto n = static_cast<uint32_t>(g.dims.size());
    if (n < 2) continue;
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      if (std::popcount(mask) < 2) continue;
      std::vector<std::pair<int64_t, Placement>> changes;
      for (uint32_t i = 0; i < n; ++i)
        if (mask & (1u << i)) {
          const int64_t m = g.dims[i];
          changes.emplace_back(m, g.to_destination ? dst.placements()[static_cast<size_t>(m)] : Placement{Replicate{}});
        }
      if (auto next = changed_layout(at, changes)) out.push_back(std::move(*next));
    }
  }
}

// The layouts one placement change at one mesh dim away from `at`, with every position of the
// mesh dim in the new shard order; on a shared mesh also several dims at once (multi_dim_neighbours).
std::vector<Layout> neighbours(const Layout& at, const Layout& dst, const PlanOptions& options) {
  const bool same_mesh = at.mesh() == dst.mesh();
  const int64_t nd = at.ndim();
  std::vector<Layout> out;
  for (int64_t m = 0; m < at.mesh().ndim(); ++m) {
    const Placement& cur = at.placements()[static_cast<size_t>(m)];
    const Placement* want = same_mesh ? &dst.placements()[static_cast<size_t>(m)] : nullptr;
    if (is_partial(cur) && want && *want == cur) continue;  // the destination keeps it
    std::vector<Placement> targets;
    if (at.mesh().shape()[m] == 1) {
      // One rank along m: every placement there holds the same data, so the only useful change
      // is to the destination's (or, towards another mesh, out of a Partial). A Partial may also
      // go to Replicate first: the destination's Shard may not line up with explicit sizes the
      // other mesh dims keep until later.
      if (want && !(*want == cur) && !is_partial(*want)) {
        targets.push_back(*want);
        if (is_partial(cur) && !is_replicate(*want)) targets.push_back(Replicate{});
      }
      else if (want && is_partial(*want) && is_replicate(cur) && options.allow_partial_destination) targets.push_back(*want);
      else if (want && is_partial(*want) && !is_replicate(cur)) targets.push_back(Replicate{});
      else if (!want && is_partial(cur)) targets.push_back(Replicate{});
    } else {
      if (!is_replicate(cur)) targets.push_back(Replicate{});
      for (int64_t d = 0; d < nd; ++d)
        if (!is_shard(cur, d)) targets.push_back(Shard{d});
      if (options.allow_partial_destination && want && is_partial(*want) && is_replicate(cur)) targets.push_back(*want);
    }
    for (const Placement& target : targets) {
      int64_t positions = 1;
      if (is_shard(target)) {
        auto order = at.shard_order(std::get<Shard>(target).dim);
        positions = static_cast<int64_t>(order.size()) + 1 -
                    static_cast<int64_t>(std::count(order.begin(), order.end(), m));
      }
      for (int64_t pos = 0; pos < positions; ++pos)
        if (auto next = changed_layout(at, {{m, target}}, pos)) out.push_back(std::move(*next));
    }
  }
  if (same_mesh) {
    multi_dim_neighbours(at, dst, out);
    out.push_back(dst);
  }
  return out;
}

// What every plan from src to dst receives at least, in bytes: the busiest rank, and all ranks
// together. Partial mesh dims the destination keeps are Q independent problems; the others hold
// K distinct contributions of every element that must be combined.
struct ReceiveBound {
  int64_t busiest = 0;
  int64_t total = 0;
};
ReceiveBound receive_bound(const Layout& src, const Layout& dst, const detail::Lacking& lack) {
  const bool same_mesh = src.mesh() == dst.mesh();
  int64_t contributions = 1, kept = 1;
  for (int64_t m = 0; m < src.mesh().ndim(); ++m) {
    const Placement& p = src.placements()[static_cast<size_t>(m)];
    if (!is_partial(p)) continue;
    (same_mesh && dst.placements()[static_cast<size_t>(m)] == p ? kept : contributions) *= src.mesh().shape()[m];
  }
  const int64_t item = itemsize(src.dtype());
  // Per rank: every element of its destination block it does not hold, and with K > 1 every
  // element at all (it cannot hold all K contributions).
  if (contributions == 1) return {lack.most * item, lack.total * item};
  const int64_t busiest = dst.max_block_numel();
  // The blocks over the mesh dims that shard tile the tensor once per coordinate of the others.
  int64_t destination_elements = dst.global_shape().numel();
  for (int64_t m = 0; m < dst.mesh().ndim(); ++m)
    if (!is_shard(dst.placements()[static_cast<size_t>(m)])) destination_elements *= dst.mesh().shape()[m];
  // Over all ranks: combining K contributions of an element takes K - 1 receives of it, and its
  // H destination holders need H - 1 more (the one that combined it may hold it). Summed over
  // elements and divided over the ranks, that is what the average rank, so the busiest, receives.
  // [P, P] -> [R, R] on 2x2: (3 + 3) N / 4 = 1.5 N, what reduce-scatter twice then all-gather
  // twice achieves (the per-dim sum would say 2 N).
  int64_t ranks = src.mesh().size();
  if (!same_mesh)
    for (int r : dst.mesh().ranks()) ranks += src.mesh().contains(r) ? 0 : 1;
  const int64_t total = (contributions - 2) * src.global_shape().numel() * kept + destination_elements;
  // All ranks: per rank the average, rounded down as the steps' per-rank figures are.
  const int64_t average = total * item / ranks;
  return {std::max(busiest * item, average), std::max(average * ranks, lack.total * item)};
}

// What every plan from src to a destination with Partial mesh dims receives at least: a rank's
// lacking elements, and the combining. Every element has K distinct contributions in src (the
// product of its Partial mesh dims' sizes) and K' values in dst, whose sum is the element; each
// value is a sum of some of the contributions (a reduction only adds), so forming them takes at
// least K - K' receives of the element (each joins two sums), whichever ranks and steps do it.
// (R, S(0), P, P) -> (R, S(0), R, P) on 2x2x2x2 receives at least 2 N over 16 ranks.
ReceiveBound partial_destination_bound(const Layout& src, const Layout& dst, const detail::Lacking& lack) {
  const int64_t item = itemsize(dst.dtype());
  ReceiveBound out{lack.most * item, lack.total * item};
  if (!(src.mesh() == dst.mesh())) return out;
  int64_t contributions = 1, values = 1;
  for (int64_t m = 0; m < src.mesh().ndim(); ++m) {
    if (is_partial(src.placements()[static_cast<size_t>(m)])) contributions *= src.mesh().shape()[m];
    if (is_partial(dst.placements()[static_cast<size_t>(m)])) values *= dst.mesh().shape()[m];
  }
  if (contributions <= values) return out;
  // Per rank the average, rounded down as the steps' per-rank figures are.
  const int64_t total = (contributions - values) * src.global_shape().numel() * item;
  const int64_t average = total / src.mesh().size();
  return {std::max(out.busiest, average), std::max(out.total, average * src.mesh().size())};
}

// A lower bound on the score of every path the search can take from `at` to `dst`, from four
// counts no step can avoid:
// - bytes: plan_lower_bound: what the busiest destination rank lacks (a Partial counts as
//   holding its block), and with Partial values to combine, what combining them takes;
// - messages: the Partial mesh dims dst does not keep, of k1, k2, ... ranks, need reductions over
//   them: rounds(k1 k2 ...) messages at least, however they are grouped into calls (rounds of a
//   product never exceed the sum of the rounds); and what a rank lacks, which no reduction
//   brings (a reduction's result lies inside the block it reduces), comes from s other blocks:
//   each message at most doubles the blocks whose data a rank holds, so rounds(s) messages at
//   least (one if s is 1);
// - calls: one for the reductions, one for what a rank lacks;
// - the score's share of all ranks' receives: every rank receives at least what it lacks;
// - steps (the tie-break): one step changes mesh dims of one kind only, and the kind follows
//   from the placement left (Shard: gather or all_to_all; Replicate: chunk or to_partial;
//   Partial: a reduction), so each class of placement among the differing dims takes a step of
//   its own, unless one exchange (tie 0.5; after the reductions if any) does the rest.
// It never overestimates, and a step lowers it by at most the step's own score, so A* with it
// returns what Dijkstra would.
// `lack`: what at lacks of dst, lacking(at, dst, bound_only) (bound_lacking; it visits classes of
// ranks), or origin_lacking's cheaper figures (quick_bound), a weaker bound that orders layouts
// the search may never expand.
double remaining_bound(const Layout& at, const Layout& dst, const PlanOptions& options, const detail::Lacking& lack) {
  if (at == dst) return 0;
  const bool same_mesh = at.mesh() == dst.mesh();
  const int64_t lacking = lack.most;
  int64_t reduced_ranks = 1;
  bool leaves[3] = {false, false, false};  // a differing mesh dim leaves Shard, Replicate, Partial
  for (int64_t m = 0; m < at.mesh().ndim(); ++m) {
    const Placement& p = at.placements()[static_cast<size_t>(m)];
    const bool differs = !same_mesh || !(p == dst.placements()[static_cast<size_t>(m)]);
    if (!differs) continue;
    if (is_partial(p)) reduced_ranks *= at.mesh().shape()[m];
    leaves[is_shard(p) ? 0 : is_replicate(p) ? 1 : 2] = true;
  }
  const double classes = 0.25 * (leaves[0] + leaves[1] + leaves[2]);
  const double steps = std::max(0.25, std::min(classes, leaves[2] ? 0.75 : 0.5));
  const int64_t reduce_messages = rounds(reduced_ranks);
  const ReceiveBound receives =
      dst.has_partial() ? partial_destination_bound(at, dst, lack) : receive_bound(at, dst, lack);
  const double bytes = static_cast<double>(receives.busiest);
  // A reduction never brings a rank elements outside its block, so what a rank lacks comes by
  // another step (gather, all_to_all, exchange): its calls and messages come on top.
  const int64_t messages = (lacking > 0 ? std::max<int64_t>(1, rounds(lack.sources)) : 0) + reduce_messages;
  const int64_t calls = (lacking > 0 ? 1 : 0) + (reduce_messages > 0 ? 1 : 0);
  // The score's tie-break share of all ranks' receives: each rank receives what it lacks.
  const double total = 1e-3 * static_cast<double>(receives.total);
  // Steps across hosts cost more where the network is slower: the cheaper model bounds both.
  const CostModel cheapest = options.spans_hosts ? CostModel::cheaper(options.cost, options.across_hosts) : options.cost;
  const double scale = options.cost.bytes_per_us / cheapest.bytes_per_us;
  return scale * (bytes + total) +
         options.cost.bytes_per_us * (cheapest.message_us * static_cast<double>(messages) +
                                      cheapest.call_us * static_cast<double>(calls)) +
         steps;
}

// What the rank at dst's first coordinate lacks at least, from the dims' piece lengths alone:
// of its block (piece 0 of every dim) it keeps no more than the largest held piece of each dim
// allows. It lower-bounds lacking(at, dst) at no cost in ranks, so the search can set aside
// layouts whose blocks are the wrong shape (a dim cut finer than dst wants it) without visiting
// their classes.
detail::Lacking origin_lacking(const Layout& at, const Layout& dst) {
  int64_t wanted = 1, kept_at_most = 1;
  for (int64_t d = 0; d < dst.ndim(); ++d) {
    const auto [begin, end] = dst.piece_range(d, 0);
    wanted *= end - begin;
    kept_at_most *= std::min(end - begin, at.max_piece_size(d));
  }
  const int64_t most = wanted - kept_at_most;
  return {most, most, 0};
}

double quick_bound(const Layout& at, const Layout& dst, const PlanOptions& options) {
  return remaining_bound(at, dst, options, origin_lacking(at, dst));
}

// lacking(at, dst, bound_only), no less than origin_lacking's: the sampled figures of crossing
// shard orders may fall below it.
detail::Lacking bound_lacking(const Layout& at, const Layout& dst) {
  detail::Lacking lack = detail::lacking(at, dst, /*bound_only=*/true);
  const detail::Lacking origin = origin_lacking(at, dst);
  lack.most = std::max(lack.most, origin.most);
  lack.total = std::max(lack.total, origin.total);
  return lack;
}

double full_bound(const Layout& at, const Layout& dst, const PlanOptions& options) {
  if (at == dst) return 0;
  return remaining_bound(at, dst, options, bound_lacking(at, dst));
}

Placements without_partial(const Placements& placements) {
  Placements out = placements;
  for (auto& p : out)
    if (is_partial(p)) p = Replicate{};
  return out;
}

}  // namespace

std::string PlanStep::to_string() const {
  std::ostringstream out;
  out << name(kind);
  if (kind == StepKind::reduce_scatter || kind == StepKind::all_reduce || kind == StepKind::to_partial)
    out << '(' << tessera::name(op) << ')';
  if (!mesh_dims.empty()) {
    // "over tp (mesh dim 1, 2 ranks)"; several dims: "over dp+tp (mesh dims 0, 1; 4 ranks)".
    std::string names, dims;
    int64_t ranks = 1;
    for (int64_t m : mesh_dims) {
      names.append(names.empty() ? "" : "+").append(before.mesh().names()[static_cast<size_t>(m)]);
      dims.append(dims.empty() ? "" : ", ").append(std::to_string(m));
      ranks *= before.mesh().shape()[m];
    }
    out << " over " << names << (mesh_dims.size() == 1 ? " (mesh dim " : " (mesh dims ") << dims
        << (mesh_dims.size() == 1 ? ", " : "; ") << ranks << " ranks)";
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
  for (const auto& s : steps) total += s.bytes_received(world_rank);
  return total;
}

int64_t Plan::bytes_sent(int world_rank) const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.bytes_sent(world_rank);
  return total;
}

int64_t Plan::max_bytes_received() const {
  if (steps.empty()) return 0;
  // On one mesh the busiest rank over the whole plan is found among classes of ranks alike in
  // every step's layouts; across meshes, rank by rank.
  const MeshSpec& mesh = steps.front().before.mesh();
  bool one_mesh = true;
  std::vector<const Layout*> layouts;
  for (const auto& s : steps) {
    one_mesh = one_mesh && s.before.mesh() == mesh && s.after.mesh() == mesh;
    layouts.push_back(&s.before);
    layouts.push_back(&s.after);
  }
  int64_t most = 0;
  if (one_mesh) {
    detail::for_each_rank_class(mesh, layouts, [&](const std::vector<int64_t>& c, int64_t) {
      int64_t total = 0;
      for (const auto& s : steps) total += detail::received_at(s, c);
      most = std::max(most, total);
    });
    return most;
  }
  for (const MeshSpec* m : {&src.mesh(), &dst.mesh()})
    for (int r : m->ranks()) most = std::max(most, bytes_received(r));
  return most;
}

int64_t Plan::total_bytes_received() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.total_received;
  return total;
}

int64_t Plan::calls() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.calls;
  return total;
}

int64_t Plan::messages() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.messages;
  return total;
}

std::string Plan::to_string() const {
  std::string text;
  for (size_t i = 0; i < steps.size(); ++i) text.append(i ? "\n" : "").append(steps[i].to_string());
  return text.empty() ? "no steps" : text;
}

int64_t plan_lower_bound(const Layout& src, const Layout& dst) {
  return receive_bound(src, dst, detail::lacking(src, dst)).busiest;
}

namespace {
thread_local uint64_t plan_calls = 0;
}  // namespace

uint64_t plan_call_count() { return plan_calls; }

double plan_cost_lower_bound(const Layout& src, const Layout& dst, const PlanOptions& options) {
  return full_bound(src, dst, options);
}

Plan plan(const Layout& src, const Layout& dst, const PlanOptions& options) {
  ++plan_calls;
  // Built only when a check fails (a dispatch miss plans many times).
  const auto both = [&] { return src.to_string() + " -> " + dst.to_string(); };
  TESSERA_CHECK(src.global_shape() == dst.global_shape(), ShardingError, "redistribute",
                "global shapes differ: ", both());
  TESSERA_CHECK(src.dtype() == dst.dtype(), ShardingError, "redistribute", "dtypes differ: ", both());
  const bool same_mesh = src.mesh() == dst.mesh();
  for (int64_t m = 0; m < dst.mesh().ndim(); ++m) {
    const Placement& want = dst.placements()[static_cast<size_t>(m)];
    if (!is_partial(want)) continue;
    const Placement* have = same_mesh ? &src.placements()[static_cast<size_t>(m)] : nullptr;
    // Keeping a Partial (the same one on the same mesh dim) is always allowed: redistributing
    // another mesh dim must not force a reduction. Creating one needs allow_partial_destination.
    TESSERA_CHECK(!have || !is_partial(*have) || *have == want, ShardingError, "redistribute", "cannot turn ",
                  to_string(*have), " into ", to_string(want), " on mesh dim ", m,
                  " (reduce first; different reductions do not commute): ", both());
    const bool kept = have && *have == want;
    TESSERA_CHECK(kept || options.allow_partial_destination, ShardingError, "redistribute",
                  "cannot redistribute to Partial (mesh dim ", m, "): a Partial value only arises from an "
                  "operation; ", both());
  }
  Plan result{src, dst, {}, 0};
  if (src == dst) return result;

  const int64_t memory_cap = std::max(src.max_block_numel(), dst.max_block_numel());
  const Layout exchange_target =
      dst.has_partial() ? dst.with_placements(without_partial(dst.placements())) : dst;

  // A* over layouts, ordered by score so far plus remaining_bound. Steps live in `edges`; each
  // reached layout remembers its best edge. A layout reached again more cheaply is expanded again.
  struct Reached {
    double score;
    int edge;  // -1 for the source
    bool done = false;
  };
  std::unordered_map<Layout, Reached> reached;
  std::vector<std::pair<int, PlanStep>> edges;  // (index of the layout's predecessor edge, step)
  struct Entry {
    double estimate;  // score + remaining_bound: what the search orders by
    double score;
    Layout layout;
    // What the layout lacks of dst (bound_lacking) where the estimate is the full bound; unset
    // where it is the quick one. An exchange from the layout to dst starts from the same figures.
    std::optional<detail::Lacking> lack;
    int exchange = -1;  // an exchange to exchange_target not priced yet: its index in `exchanges`
  };
  // Exchanges wait in the frontier at a bound on their score, found on some ranks, and are
  // priced exactly (which visits every class of ranks) only when that bound comes up: a search
  // over crossing shard orders reaches dozens of layouts that could exchange, and one or two
  // exchanges decide. (Layout the exchange starts from, its score there.)
  std::vector<std::pair<Layout, double>> exchanges;
  auto later = [](const Entry& a, const Entry& b) { return a.estimate > b.estimate; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> frontier(later);
  reached.emplace(src, Reached{0, -1});
  const detail::Lacking src_lack = bound_lacking(src, dst);
  frontier.push({remaining_bound(src, dst, options, src_lack), 0, src, src_lack});

  auto relax = [&](const Layout& from, double base, PlanStep step) {
    const double score = base + step_score(step, options);
    const Layout to = step.after;
    auto it = reached.find(to);
    if (it != reached.end() && it->second.score <= score) return;
    const int via = reached.at(from).edge;
    edges.push_back({via, std::move(step)});
    reached[to] = Reached{score, static_cast<int>(edges.size()) - 1};
    // The full bound waits until the layout comes up: most layouts reached never do.
    frontier.push({score + quick_bound(to, dst, options), score, to, std::nullopt});
  };

  while (!frontier.empty()) {
    Entry top = frontier.top();
    frontier.pop();
    if (top.exchange >= 0) {
      const auto& [from, base] = exchanges[static_cast<size_t>(top.exchange)];
      const auto target = reached.find(exchange_target);
      const bool settled = target != reached.end() && target->second.done;
      // Skip it once the target is settled, or once `from` was reached more cheaply (that
      // visit queued an exchange of its own).
      if (!settled && !(reached.at(from).score < base)) relax(from, base, detail::exchange_step(from, exchange_target));
      continue;
    }
    const double score = top.score;
    const Layout& at = top.layout;
    auto& node = reached.at(at);
    if (node.done || score > node.score) continue;
    std::optional<detail::Lacking> lack = top.lack;
    if (!lack && !(at == dst)) {
      lack = bound_lacking(at, dst);
      const double estimate = score + remaining_bound(at, dst, options, *lack);
      if (estimate > top.estimate + 1e-9) {
        frontier.push({estimate, score, at, lack});
        continue;
      }
    }
    node.done = true;
    if (at == dst) break;
    for (const Layout& next : neighbours(at, dst, options)) {
      if (!(next == dst) && next.max_block_numel() > memory_cap) continue;
      if (auto step = detail::mesh_dim_step(at, next)) relax(at, score, std::move(*step));
    }
    if (!at.has_partial() && !(at == exchange_target)) {
      // The exchange's score is at least what a bound on it, found on some ranks, gives.
      if (!lack || !(exchange_target == dst)) lack = bound_lacking(at, exchange_target);
      PlanStep bound;
      bound.kind = StepKind::exchange;
      bound.before = at;
      bound.after = exchange_target;
      bound.max_received = lack->most * itemsize(at.dtype());
      bound.total_received = lack->total * itemsize(at.dtype());
      bound.messages = lack->sources;
      bound.calls = lack->most > 0 ? 1 : 0;
      const double least = score + step_score(bound, options);
      const auto known = reached.find(exchange_target);
      if (known != reached.end() && least >= known->second.score) continue;
      exchanges.emplace_back(at, score);
      frontier.push({least + quick_bound(exchange_target, dst, options), least, exchange_target, std::nullopt,
                     static_cast<int>(exchanges.size()) - 1});
    }
  }
  auto it = reached.find(dst);
  TESSERA_CHECK(it != reached.end(), ShardingError, "redistribute", "no plan found for ", both(),
                "; Partial values cannot leave their mesh unreduced");
  result.cost = it->second.score;
  result.estimated_us = options.cost.microseconds(result.cost);
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
      // The first ranks' pieces: listing every rank's would cost as much as the ranks.
      int shown = 0;
      bool more = false;
      for (int r : s.after.mesh().ranks()) {
        for (const Transfer& t : exchange_transfers(s.before, s.after, r)) {
          if (t.src_rank == t.dst_rank || t.dst_rank != r) continue;
          if (shown == 12) {
            more = true;
            break;
          }
          out << "       " << t.to_string() << '\n';
          ++shown;
        }
        if (more) break;
      }
      if (more) out << "       ... more pieces\n";
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
  if (plan.messages() == 0) {
    out << " (no communication)";
  } else {
    char estimate[48];
    std::snprintf(estimate, sizeof estimate, "%.3g", plan.estimated_us);
    out << ", " << plan.calls() << (plan.calls() == 1 ? " call" : " calls") << ", est. " << estimate << " us";
  }
  out << '\n';
  return out.str();
}

}  // namespace tessera
