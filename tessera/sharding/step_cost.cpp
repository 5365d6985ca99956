#include <tessera/sharding/detail/step_cost.hpp>

#include <algorithm>
#include <bit>

#include <tessera/sharding/block_exchange.hpp>
#include <tessera/sharding/detail/rank_classes.hpp>

namespace tessera::detail {

namespace {

using Range = std::pair<int64_t, int64_t>;

int64_t overlap(Range a, Range b) { return std::max<int64_t>(0, std::min(a.second, b.second) - std::max(a.first, b.first)); }
int64_t length(Range a) { return std::max<int64_t>(0, a.second - a.first); }
Range range_of(const Block& b, int64_t d) { return {b.begin[d], b.end[d]}; }

bool contains(const Block& outer, const Block& inner) {
  if (inner.numel() == 0) return true;
  for (int64_t d = 0; d < outer.begin.size(); ++d)
    if (inner.begin[d] < outer.begin[d] || inner.end[d] > outer.end[d]) return false;
  return true;
}

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

// What the pieces of `layout` held by the members of a group (the coordinates differing from
// `coordinate` on `group`) bring to `want`: the elements they cover, and the members other
// than `coordinate` whose overlap is not empty. Each mesh dim of the group splits one tensor
// dim, so both are products over tensor dims; a dim split by the group's innermost mesh dims
// is one interval the pieces tile, else its pieces are visited one by one.
struct GroupCover {
  int64_t covered = 1;
  int64_t peers = 0;
};
GroupCover group_cover(const Layout& layout, const Block& want, const std::vector<int64_t>& coordinate,
                       const std::vector<int64_t>& group) {
  GroupCover out;
  int64_t members = 1, own = 1;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const Range w = range_of(want, d);
    const Range mine = dim_range(layout, d, coordinate);
    own *= overlap(mine, w);
    int64_t covered = 0, touching = 0;
    bool by_group = false;
    for (int64_t m : layout.shard_order(d)) by_group = by_group || std::count(group.begin(), group.end(), m) > 0;
    if (!by_group) {  // one piece along d for the whole group: the member's own
      covered = overlap(mine, w);
      touching = covered > 0 ? 1 : 0;
    } else if (const auto u = group_union(layout, d, coordinate, group)) {
      // The group's pieces tile u in order: those touching want are those touching u ∩ want.
      covered = overlap(*u, w);
      if (covered > 0)
        touching = pieces_overlapping(layout, d, std::max(u->first, w.first), std::min(u->second, w.second)).overlapping;
    } else {
      for_each_group_piece(layout, d, coordinate, group, [&](const std::vector<int64_t>& c) {
        const int64_t o = overlap(dim_range(layout, d, c), w);
        covered += o;
        touching += o > 0 ? 1 : 0;
        return true;
      });
    }
    out.covered *= covered;
    members *= touching;
  }
  out.peers = members - (own > 0 ? 1 : 0);
  return out;
}

// The tiles of the group's blocks of `after` (the group's mesh dims split in it): how many
// elements they add up to. A product over tensor dims, as group_cover.
int64_t group_tiles(const Layout& after, const std::vector<int64_t>& coordinate, const std::vector<int64_t>& group) {
  int64_t total = 1;
  for (int64_t d = 0; d < after.ndim(); ++d) {
    if (const auto u = group_union(after, d, coordinate, group)) {
      total *= length(*u);
      continue;
    }
    int64_t sum = 0;
    for_each_group_piece(after, d, coordinate, group, [&](const std::vector<int64_t>& c) {
      sum += length(dim_range(after, d, c));
      return true;
    });
    total *= sum;
  }
  return total;
}

// Source blocks of `source` overlapping `want` (none if want is empty).
int64_t sources_overlapping(const Layout& source, const Block& want) {
  int64_t n = 1;
  for (int64_t d = 0; d < source.ndim() && n > 0; ++d)
    n *= pieces_overlapping(source, d, want.begin[d], want.end[d]).overlapping;
  return want.numel() > 0 ? n : 0;
}

int64_t group_size(const MeshSpec& mesh, const std::vector<int64_t>& dims) {
  int64_t k = 1;
  for (int64_t m : dims) k *= mesh.shape()[m];
  return k;
}

// Per rank of `want`'s mesh: what it lacks of its block (and, with `messages`, from how many
// source blocks), calling visit(lacking elements, sources, ranks alike). On one mesh by classes of
// ranks; between meshes sharing no rank by classes of the destination's; else rank by rank.
template <class Visit>
void for_each_receiver(const Layout& held, const Layout& want, bool messages, Visit&& visit, bool sample = false) {
  const auto sources = [&](const Block& w, const Block& h) {
    if (!messages) return int64_t{0};
    return sources_overlapping(held, w) - (h.intersect(w).numel() > 0 ? 1 : 0);
  };
  if (held.mesh() == want.mesh()) {
    // Per dim, without building blocks: this runs once per class of ranks, and crossing shard
    // orders make many classes.
    for_each_rank_class_until(want.mesh(), {&held, &want}, [&](const std::vector<int64_t>& c, int64_t count) {
      int64_t wanted = 1, kept = 1, blocks = 1;
      for (int64_t d = 0; d < want.ndim(); ++d) {
        const Range w = dim_range(want, d, c);
        wanted *= length(w);
        kept *= overlap(dim_range(held, d, c), w);
        if (messages && blocks > 0) blocks *= length(w) > 0 ? pieces_overlapping(held, d, w.first, w.second).overlapping : 0;
      }
      visit(wanted - kept, messages ? blocks - (kept > 0 ? 1 : 0) : 0, count);
      return true;
    }, sample);
    return;
  }
  bool shared = false;
  for (int r : want.mesh().ranks()) shared = shared || held.mesh().contains(r);
  const Block nothing{Shape::filled(want.ndim(), 0), Shape::filled(want.ndim(), 0)};
  if (!shared) {
    for_each_rank_class(want.mesh(), {&want}, [&](const std::vector<int64_t>& c, int64_t count) {
      const Block w = want.block(c);
      visit(w.numel(), sources(w, nothing), count);
    });
    return;
  }
  // Meshes that share ranks (to_mesh between overlapping meshes): a rank's own block depends on
  // both meshes' rank lists, so each rank counts on its own.
  for (int r : want.mesh().ranks()) {
    const Block w = want.block_of_rank(r);
    const Block h = held.mesh().contains(r) ? held.block_of_rank(r) : nothing;
    visit(w.numel() - h.intersect(w).numel(), sources(w, h), 1);
  }
}

}  // namespace

int64_t rounds(int64_t k) { return k <= 1 ? 0 : std::bit_width(static_cast<uint64_t>(k - 1)); }

std::optional<PlanStep> mesh_dim_step(const Layout& before, const Layout& after) {
  if (!(before.mesh() == after.mesh())) return std::nullopt;
  PlanStep step;
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
  const int64_t k = group_size(mesh, step.mesh_dims);
  const int64_t item = itemsize(before.dtype());
  bool valid = true;
  for_each_rank_class_until(mesh, {&before, &after}, [&](const std::vector<int64_t>& c, int64_t count) {
    const Block held = before.block(c), want = after.block(c);
    int64_t received = 0;  // bytes
    switch (step.kind) {
      case StepKind::local_chunk:
        valid = contains(held, want);
        break;
      case StepKind::to_partial:
        valid = held == want;
        break;
      case StepKind::all_gather:
      case StepKind::all_to_all: {
        // The group's source blocks are disjoint (Shard at every dim of it): they must cover `want`.
        const GroupCover cover = group_cover(before, want, c, step.mesh_dims);
        valid = cover.covered == want.numel();
        received = (want.numel() - held.intersect(want).numel()) * item;
        // A gather relays through log2(k) rounds; an all_to_all sends to each peer directly.
        const int64_t peers = step.kind == StepKind::all_gather ? std::min(cover.peers, rounds(k)) : cover.peers;
        step.messages = std::max(step.messages, peers);
        break;
      }
      case StepKind::reduce_scatter:
        // Every rank of the group holds the same (partial) block; the new blocks must tile it.
        valid = contains(held, want) && group_tiles(after, c, step.mesh_dims) == held.numel();
        received = (k - 1) * want.numel() * item;
        step.messages = std::max(step.messages, rounds(k));  // recursive halving
        break;
      case StepKind::all_reduce:
        valid = held == want;
        // Bytes of a bandwidth-optimal all-reduce (ring or Rabenseifner): 2(k-1)/k of the block;
        // latency of recursive doubling (small messages): log2(k) rounds, two more when k is
        // not a power of two (the extra ranks fold in first and get the result last).
        received = 2 * (k - 1) * held.numel() * item / k;
        step.messages = std::max(step.messages, rounds(k) + ((k & (k - 1)) != 0 ? 2 : 0));
        break;
      case StepKind::exchange:
        break;
    }
    step.max_received = std::max(step.max_received, received);
    step.total_received += received * count;
    return valid;
  });
  if (!valid) return std::nullopt;
  step.calls = step.messages > 0 ? 1 : 0;
  step.before = before;
  step.after = after;
  return step;
}

PlanStep exchange_step(const Layout& before, const Layout& after) {
  PlanStep step;
  step.kind = StepKind::exchange;
  step.before = before;
  step.after = after;
  const int64_t item = itemsize(before.dtype());
  for_each_receiver(before, after, true, [&](int64_t lacking, int64_t sources, int64_t count) {
    step.max_received = std::max(step.max_received, lacking * item);
    step.total_received += lacking * item * count;
    step.messages = std::max(step.messages, sources);
  });
  step.calls = step.messages > 0 ? 1 : 0;
  return step;
}

Lacking lacking(const Layout& at, const Layout& dst, bool bound_only) {
  Lacking out;
  for_each_receiver(at, dst, true, [&](int64_t lacking, int64_t sources, int64_t count) {
    out.most = std::max(out.most, lacking);
    out.total += lacking * count;
    out.sources = std::max(out.sources, sources);
  }, bound_only);
  return out;
}

int64_t received_at(const PlanStep& step, const std::vector<int64_t>& c) {
  const int64_t item = itemsize(step.before.dtype());
  const int64_t k = group_size(step.before.mesh(), step.mesh_dims);
  const Block held = step.before.block(c), want = step.after.block(c);
  switch (step.kind) {
    case StepKind::local_chunk:
    case StepKind::to_partial:
      return 0;
    case StepKind::all_gather:
    case StepKind::all_to_all:
    case StepKind::exchange:
      return (want.numel() - held.intersect(want).numel()) * item;
    case StepKind::reduce_scatter:
      return (k - 1) * want.numel() * item;
    case StepKind::all_reduce:
      return 2 * (k - 1) * held.numel() * item / k;
  }
  return 0;
}

}  // namespace tessera::detail

namespace tessera {

namespace {

// What `world_rank` moves in a mesh-dim step, exactly as running it does: (received, sent).
std::pair<int64_t, int64_t> moved_in_collective(const PlanStep& step, int world_rank) {
  const MeshSpec& mesh = step.before.mesh();
  if (!mesh.contains(world_rank)) return {0, 0};
  const auto& c = mesh.coordinate_of(world_rank);
  const int64_t item = itemsize(step.before.dtype());
  int64_t k = 1;
  for (int64_t m : step.mesh_dims) k *= mesh.shape()[m];
  const Block held = step.before.block(c), want = step.after.block(c);
  switch (step.kind) {
    case StepKind::local_chunk:
    case StepKind::to_partial:
    case StepKind::exchange:
      return {0, 0};
    case StepKind::all_gather:
    case StepKind::all_to_all: {
      int64_t received = 0, sent = 0;
      for (const auto& g : mesh.group(c, step.mesh_dims)) {
        if (g == c) continue;
        received += step.before.block(g).intersect(want).numel() * item;
        sent += held.intersect(step.after.block(g)).numel() * item;
      }
      return {received, sent};
    }
    case StepKind::reduce_scatter:
      return {(k - 1) * want.numel() * item, (held.numel() - want.numel()) * item};
    case StepKind::all_reduce: {
      const int64_t bytes = 2 * (k - 1) * held.numel() * item / k;
      return {bytes, bytes};
    }
  }
  return {0, 0};
}

std::pair<int64_t, int64_t> moved(const PlanStep& step, int world_rank) {
  if (step.kind != StepKind::exchange) return moved_in_collective(step, world_rank);
  const bool involved = step.before.mesh().contains(world_rank) || step.after.mesh().contains(world_rank);
  if (!involved) return {0, 0};
  const int64_t item = itemsize(step.before.dtype());
  int64_t received = 0, sent = 0;
  for (const Transfer& t : exchange_transfers(step.before, step.after, world_rank)) {
    if (t.src_rank == t.dst_rank) continue;
    if (t.dst_rank == world_rank) received += t.block.numel() * item;
    if (t.src_rank == world_rank) sent += t.block.numel() * item;
  }
  return {received, sent};
}

}  // namespace

int64_t PlanStep::bytes_received(int world_rank) const { return moved(*this, world_rank).first; }
int64_t PlanStep::bytes_sent(int world_rank) const { return moved(*this, world_rank).second; }

}  // namespace tessera
