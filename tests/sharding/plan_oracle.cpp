// The planner as it was before plans at scale (issue 34), kept as the tests' oracle: every cost
// computed per world rank, every exchange listed for every rank (O(ranks^2)). The planner's
// new figures, computed on classes of ranks, must equal these on the small meshes the tests
// sweep, and its plans must cost no more. Test-only code.
#include "plan_oracle.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <tessera/core/error.hpp>

namespace tessera::oracle {

namespace {
// Ranks of src grouped by the block they hold (replicas share one group), in mesh order.
std::vector<std::pair<Block, std::vector<int>>> holder_groups(const Layout& src) {
  std::vector<std::pair<Block, std::vector<int>>> groups;
  for (int r : src.mesh().ranks()) {
    const Block b = src.block_of_rank(r);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == b; });
    if (it == groups.end()) groups.push_back({b, {r}});
    else it->second.push_back(r);
  }
  return groups;
}

}  // namespace

std::vector<Transfer> old_direct_exchange(const Layout& src, const Layout& dst) {
  const auto groups = holder_groups(src);
  std::map<int, int64_t> load;  // elements each rank sends so far
  std::vector<Transfer> transfers;
  for (int d : dst.mesh().ranks()) {
    const Block want = dst.block_of_rank(d);
    if (want.numel() == 0) continue;
    for (const auto& [held, holders] : groups) {
      const Block piece = held.intersect(want);
      if (piece.numel() == 0) continue;
      // The destination itself if it holds the piece, else the least loaded replica (ties
      // rotate with the destination rank), which keeps every rank's sends near the average.
      int from = d;
      if (std::find(holders.begin(), holders.end(), d) == holders.end()) {
        const size_t n = holders.size();
        from = holders[static_cast<size_t>(d) % n];
        for (size_t i = 0; i < n; ++i) {
          const int candidate = holders[(static_cast<size_t>(d) + i) % n];
          if (load[candidate] < load[from]) from = candidate;
        }
        load[from] += piece.numel();
      }
      transfers.push_back(Transfer{from, d, piece});
    }
  }
  return transfers;
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

// Elements of its destination block the busiest rank of dst does not hold in `at` (a Partial
// counts as holding its block; a rank outside at's mesh holds nothing).
int64_t most_lacking(const Layout& at, const Layout& dst) {
  int64_t most = 0;
  for (int r : dst.mesh().ranks()) {
    const Block want = dst.block_of_rank(r);
    const int64_t held = at.mesh().contains(r) ? at.block_of_rank(r).intersect(want).numel() : 0;
    most = std::max(most, want.numel() - held);
  }
  return most;
}

// Rounds of a latency-optimal collective over k ranks (recursive halving or doubling): the
// messages the model charges a rank, ceil(log2 k).
int64_t rounds(int64_t k) { return k <= 1 ? 0 : std::bit_width(static_cast<uint64_t>(k - 1)); }

// The mesh dims whose placement differs, ascending.
std::vector<int64_t> changed_dims(const Layout& before, const Layout& after) {
  std::vector<int64_t> changed;
  for (int64_t m = 0; m < before.mesh().ndim(); ++m)
    if (!(before.placements()[static_cast<size_t>(m)] == after.placements()[static_cast<size_t>(m)]))
      changed.push_back(m);
  return changed;
}

// The collective that turns `from` into `to` on one mesh dim, if one does.
std::optional<StepKind> change_kind(const Placement& from, const Placement& to) {
  if (is_shard(from) && is_replicate(to)) return StepKind::all_gather;
  if (is_shard(from) && is_shard(to)) return StepKind::all_to_all;
  if (is_replicate(from) && is_shard(to)) return StepKind::local_chunk;
  if (is_partial(from) && is_replicate(to)) return StepKind::all_reduce;
  if (is_partial(from) && is_shard(to)) return StepKind::reduce_scatter;
  if (is_replicate(from) && is_partial(to)) return StepKind::to_partial;
  return std::nullopt;
}

// Kinds that may span several mesh dims in one call (all_to_all across dims is the exchange).
bool spans_dims(StepKind kind) {
  return kind == StepKind::all_gather || kind == StepKind::all_reduce || kind == StepKind::reduce_scatter ||
         kind == StepKind::local_chunk;
}

// A step changing the placements at one mesh dim, or at several with the same kind of change
// (one call over their flattened group), costed per rank; nullopt when no single collective does
// it (the blocks do not line up, or the change is not one of the step kinds).
std::optional<OracleStep> mesh_dim_step(const Layout& before, const Layout& after, int world) {
  if (!(before.mesh() == after.mesh())) return std::nullopt;
  OracleStep step;
  step.mesh_dims = changed_dims(before, after);
  if (step.mesh_dims.empty()) return std::nullopt;
  std::optional<ReduceOp> op;
  for (int64_t m : step.mesh_dims) {
    const Placement& from = before.placements()[static_cast<size_t>(m)];
    const Placement& to = after.placements()[static_cast<size_t>(m)];
    const auto kind = change_kind(from, to);
    if (!kind || (m != step.mesh_dims.front() && *kind != step.kind)) return std::nullopt;
    step.kind = *kind;
    const Placement& partial = is_partial(from) ? from : to;
    if (is_partial(partial)) {
      if (op && *op != std::get<Partial>(partial).op) return std::nullopt;
      op = std::get<Partial>(partial).op;
    }
  }
  if (step.mesh_dims.size() > 1 && !spans_dims(step.kind)) return std::nullopt;
  if (step.mesh_dims.size() == 1) step.mesh_dim = step.mesh_dims.front();
  if (op) step.op = *op;

  const MeshSpec& mesh = before.mesh();
  int64_t k = 1;
  for (int64_t m : step.mesh_dims) k *= mesh.shape()[m];
  const int64_t item = itemsize(before.dtype());
  step.bytes_sent.assign(static_cast<size_t>(world), 0);
  step.bytes_received.assign(static_cast<size_t>(world), 0);
  for (int r : mesh.ranks()) {
    const auto coordinate = mesh.coordinate_of(r);
    const Block want = after.block(coordinate);
    const Block held = before.block(coordinate);
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
        // Source blocks along the group are disjoint (Shard at every dim of it): they must cover `want`.
        int64_t covered = 0, peers = 0;
        for (const auto& c : mesh.group(coordinate, step.mesh_dims)) {
          const int64_t piece = before.block(c).intersect(want).numel();
          covered += piece;
          if (c == coordinate || piece == 0) continue;
          received += piece * item;
          step.bytes_sent[static_cast<size_t>(mesh.rank_at(c))] += piece * item;
          ++peers;
        }
        if (covered != want.numel()) return std::nullopt;
        // A gather relays through log2(k) rounds; an all_to_all sends to each peer directly.
        if (step.kind == StepKind::all_gather) peers = std::min(peers, rounds(k));
        step.messages = std::max(step.messages, peers);
        break;
      }
      case StepKind::reduce_scatter: {
        // Every rank of the group holds the same (partial) block; the new blocks must tile it.
        if (!contains(held, want)) return std::nullopt;
        int64_t tiled = 0;
        for (const auto& c : mesh.group(coordinate, step.mesh_dims)) tiled += after.block(c).numel();
        if (tiled != held.numel()) return std::nullopt;
        received = (k - 1) * want.numel() * item;
        step.bytes_sent[static_cast<size_t>(r)] = (held.numel() - want.numel()) * item;
        step.messages = std::max(step.messages, rounds(k));  // recursive halving
        break;
      }
      case StepKind::all_reduce:
        if (!(held == want)) return std::nullopt;
        // Bytes of a bandwidth-optimal all-reduce (ring or Rabenseifner): 2(k-1)/k of the block;
        // latency of recursive doubling (small messages): log2(k) rounds, two more when k is
        // not a power of two (the extra ranks fold in first and get the result last).
        received = 2 * (k - 1) * held.numel() * item / k;
        step.bytes_sent[static_cast<size_t>(r)] = received;
        step.messages = std::max(step.messages, rounds(k) + ((k & (k - 1)) != 0 ? 2 : 0));
        break;
      case StepKind::exchange:
        break;
    }
  }
  step.calls = step.messages > 0 ? 1 : 0;
  step.before = before;
  step.after = after;
  return step;
}

OracleStep exchange_step(const Layout& before, const Layout& after, int world) {
  OracleStep step;
  step.kind = StepKind::exchange;
  step.before = before;
  step.after = after;
  step.transfers = old_direct_exchange(before, after);
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
  step.calls = step.messages > 0 ? 1 : 0;
  return step;
}

// Time of a step (CostModel) in bytes: the busiest receiver plus the call and message latency;
// the lower bound is on receives, so that is what the model counts (sends are balanced by
// direct_exchange). A tiny share of the total breaks ties toward plans that move less overall.
double step_score(const OracleStep& step, const PlanOptions& options) {
  int64_t busiest = 0, total = 0;
  for (int64_t b : step.bytes_received) busiest = std::max(busiest, b), total += b;
  // Ties go to fewer steps, and to a collective over an exchange of the same cost.
  const double tie = step.kind == StepKind::exchange ? 0.5 : 0.25;
  return static_cast<double>(busiest) + 1e-3 * static_cast<double>(total) +
         options.cost.message_bytes() * static_cast<double>(step.messages) +
         options.cost.call_bytes() * static_cast<double>(step.calls) + tie;
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
    if (!o.empty()) order[d] = o;
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
      // is to the destination's (or, towards another mesh, out of a Partial).
      if (want && !(*want == cur) && !is_partial(*want)) targets.push_back(*want);
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

// A lower bound on the score of every path the search can take from `at` to `dst`, from four
// counts no step can avoid:
// - bytes: what the busiest destination rank lacks (a Partial counts as holding its block; its
//   reduction still has to bring the block in, so this only undercounts);
// - messages: the Partial mesh dims dst does not keep, of k1, k2, ... ranks, need reductions over
//   them: rounds(k1 k2 ...) messages at least, however they are grouped into calls (rounds of a
//   product never exceed the sum of the rounds); and one more if a rank lacks elements, which
//   no reduction brings (a reduction's result lies inside the block it reduces);
// - calls: one for the reductions, one for what a rank lacks;
// - steps (the tie-break): one step changes mesh dims of one kind only, and the kind follows
//   from the placement left (Shard: gather or all_to_all; Replicate: chunk or to_partial;
//   Partial: a reduction), so each class of placement among the differing dims takes a step of
//   its own, unless one exchange (tie 0.5; after the reductions if any) does the rest.
// It never overestimates, and a step lowers it by at most the step's own score, so A* with it
// returns what Dijkstra would.
double remaining_bound(const Layout& at, const Layout& dst, const PlanOptions& options) {
  if (at == dst) return 0;
  const bool same_mesh = at.mesh() == dst.mesh();
  const int64_t lacking = most_lacking(at, dst);
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
  const double bytes = static_cast<double>(lacking * itemsize(dst.dtype()));
  // A reduction never brings a rank elements outside its block, so what a rank lacks comes by
  // another step (gather, all_to_all, exchange): its call and message come on top.
  const int64_t messages = (lacking > 0 ? 1 : 0) + reduce_messages;
  const int64_t calls = (lacking > 0 ? 1 : 0) + (reduce_messages > 0 ? 1 : 0);
  return bytes + options.cost.message_bytes() * static_cast<double>(messages) +
         options.cost.call_bytes() * static_cast<double>(calls) + steps;
}

Placements without_partial(const Placements& placements) {
  Placements out = placements;
  for (auto& p : out)
    if (is_partial(p)) p = Replicate{};
  return out;
}

}  // namespace

int64_t OracleStep::max_bytes_sent() const { return max_of(bytes_sent); }
int64_t OracleStep::max_bytes_received() const { return max_of(bytes_received); }

std::string OracleStep::to_string() const {
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

int64_t OraclePlan::bytes_received(int world_rank) const {
  int64_t total = 0;
  for (const auto& s : steps)
    if (world_rank >= 0 && static_cast<size_t>(world_rank) < s.bytes_received.size())
      total += s.bytes_received[static_cast<size_t>(world_rank)];
  return total;
}

int64_t OraclePlan::bytes_sent(int world_rank) const {
  int64_t total = 0;
  for (const auto& s : steps)
    if (world_rank >= 0 && static_cast<size_t>(world_rank) < s.bytes_sent.size())
      total += s.bytes_sent[static_cast<size_t>(world_rank)];
  return total;
}

int64_t OraclePlan::max_bytes_received() const {
  int64_t most = 0;
  const int world = world_extent(src, dst);
  for (int r = 0; r < world; ++r) most = std::max(most, bytes_received(r));
  return most;
}

int64_t OraclePlan::total_bytes_received() const {
  int64_t total = 0;
  for (const auto& s : steps)
    for (int64_t b : s.bytes_received) total += b;
  return total;
}

int64_t OraclePlan::calls() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.calls;
  return total;
}

int64_t OraclePlan::messages() const {
  int64_t total = 0;
  for (const auto& s : steps) total += s.messages;
  return total;
}

std::string OraclePlan::to_string() const {
  std::string text;
  for (size_t i = 0; i < steps.size(); ++i) text.append(i ? "\n" : "").append(steps[i].to_string());
  return text.empty() ? "no steps" : text;
}

int64_t plan_lower_bound(const Layout& src, const Layout& dst) {
  // Partial mesh dims the destination keeps are Q independent problems; the others hold K
  // distinct contributions of every element that must be combined.
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
  if (contributions == 1) return most_lacking(src, dst) * item;
  const int64_t busiest = max_block_numel(dst);
  int64_t destination_elements = 0;
  for (int r : dst.mesh().ranks()) destination_elements += dst.block_of_rank(r).numel();
  // Over all ranks: combining K contributions of an element takes K - 1 receives of it, and its
  // H destination holders need H - 1 more (the one that combined it may hold it). Summed over
  // elements and divided over the ranks, that is what the average rank, so the busiest, receives.
  // [P, P] -> [R, R] on 2x2: (3 + 3) N / 4 = 1.5 N, what reduce-scatter twice then all-gather
  // twice achieves (the per-dim sum would say 2 N).
  std::vector<int> ranks = src.mesh().ranks();
  for (int r : dst.mesh().ranks())
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  const int64_t total = (contributions - 2) * src.global_shape().numel() * kept + destination_elements;
  return std::max(busiest * item, total * item / static_cast<int64_t>(ranks.size()));
}



double plan_cost_lower_bound(const Layout& src, const Layout& dst, const PlanOptions& options) {
  return remaining_bound(src, dst, options);
}

OraclePlan plan(const Layout& src, const Layout& dst, const PlanOptions& options) {
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
  OraclePlan result{src, dst, {}, 0};
  if (src == dst) return result;

  const int world = world_extent(src, dst);
  const int64_t memory_cap = std::max(max_block_numel(src), max_block_numel(dst));
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
  std::vector<std::pair<int, OracleStep>> edges;  // (index of the layout's predecessor edge, step)
  struct Entry {
    double estimate;  // score + remaining_bound: what the search orders by
    double score;
    Layout layout;
  };
  auto later = [](const Entry& a, const Entry& b) { return a.estimate > b.estimate; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> frontier(later);
  reached.emplace(src, Reached{0, -1});
  frontier.push({remaining_bound(src, dst, options), 0, src});

  auto relax = [&](const Layout& from, double base, OracleStep step) {
    const double score = base + step_score(step, options);
    const Layout to = step.after;
    auto it = reached.find(to);
    if (it != reached.end() && it->second.score <= score) return;
    const int via = reached.at(from).edge;
    edges.push_back({via, std::move(step)});
    reached[to] = Reached{score, static_cast<int>(edges.size()) - 1};
    frontier.push({score + remaining_bound(to, dst, options), score, to});
  };

  while (!frontier.empty()) {
    Entry top = frontier.top();
    frontier.pop();
    const double score = top.score;
    const Layout& at = top.layout;
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
  TESSERA_CHECK(it != reached.end(), ShardingError, "redistribute", "no plan found for ", both(),
                "; Partial values cannot leave their mesh unreduced");
  result.cost = it->second.score;
  result.estimated_us = options.cost.microseconds(result.cost);
  for (int e = it->second.edge; e >= 0; e = edges[static_cast<size_t>(e)].first)
    result.steps.push_back(edges[static_cast<size_t>(e)].second);
  std::reverse(result.steps.begin(), result.steps.end());
  return result;
}


std::optional<OracleStep> oracle_mesh_dim_step(const Layout& before, const Layout& after) {
  return mesh_dim_step(before, after, world_extent(before, after));
}
OracleStep oracle_exchange_step(const Layout& before, const Layout& after) {
  return exchange_step(before, after, world_extent(before, after));
}
int64_t oracle_most_lacking(const Layout& at, const Layout& dst) { return most_lacking(at, dst); }
double oracle_remaining_bound(const Layout& at, const Layout& dst, const PlanOptions& options) {
  return remaining_bound(at, dst, options);
}

}  // namespace tessera::oracle
