#include <tessera/sharding/detail/step_cost.hpp>

#include <algorithm>
#include <bit>
#include <functional>
#include <limits>
#include <numeric>

#include <tessera/sharding/block_exchange.hpp>
#include <tessera/sharding/detail/kept_pieces.hpp>
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

// How many of held's pieces of tensor dim d overlap want's piece at a coordinate: what visiting
// classes of ranks asks of every class. A dim held whole or evenly split answers by arithmetic
// (pieces_overlapping); an uneven one searches held's pieces (nested chunks, explicit sizes),
// and since the answer depends only on want's piece while the classes may be as many as the
// ranks, it remembers the answer per wanted piece (allocated on first need: most figures never
// visit classes).
class SourcePieces {
 public:
  SourcePieces(const Layout& held, const Layout& want) : held_(held), want_(want) {}

  // Held's pieces of tensor dim d overlapping `w`, want's non-empty piece at `coordinate`.
  int64_t count(int64_t d, const std::vector<int64_t>& coordinate, Range w) {
    if (evenly_split(held_, d) || want_.shard_order(d).empty())
      return pieces_overlapping(held_, d, w.first, w.second).overlapping;
    if (memo_.empty()) memo_.resize(static_cast<size_t>(want_.ndim()));
    std::vector<int64_t>& memo = memo_[static_cast<size_t>(d)];
    if (memo.empty()) memo.assign(static_cast<size_t>(want_.piece_count(d)), -1);
    int64_t& known = memo[static_cast<size_t>(piece_of(want_.mesh(), want_.shard_order(d), coordinate))];
    if (known < 0) known = pieces_overlapping(held_, d, w.first, w.second).overlapping;
    return known;
  }

 private:
  const Layout& held_;
  const Layout& want_;
  std::vector<std::vector<int64_t>> memo_;  // per dim: per piece of want, -1 until asked
};

// Tensor dims that share no mesh dim (in either layout's shard orders) lack and keep their parts
// independently: a rank's figures are products over groups of dims, each depending only on the
// coordinates of its group's mesh dims. Pricing each group alone visits the sum of the groups'
// classes, not their product: (S(0), P, R, S(1)) -> (R, S(1), S(0), R) on 16x8x8x16 crosses
// shard orders in two groups of 128 coordinates, which together make 16,384 classes.
struct DimGroup {
  std::vector<int64_t> dims;
  std::vector<bool> mesh_dims;  // a flag per mesh dim
};

std::vector<DimGroup> independent_dim_groups(const Layout& held, const Layout& want) {
  const int64_t nd = want.ndim(), nm = want.mesh().ndim();
  std::vector<int64_t> group(static_cast<size_t>(nd));
  std::iota(group.begin(), group.end(), 0);
  const auto root = [&](int64_t d) {
    while (group[static_cast<size_t>(d)] != d) d = group[static_cast<size_t>(d)];
    return d;
  };
  std::vector<int64_t> first_dim(static_cast<size_t>(nm), -1);  // a tensor dim each mesh dim splits
  for (const Layout* layout : {&held, &want})
    for (int64_t d = 0; d < nd; ++d)
      for (int64_t m : layout->shard_order(d)) {
        int64_t& first = first_dim[static_cast<size_t>(m)];
        if (first < 0) first = d;
        group[static_cast<size_t>(root(d))] = root(first);
      }
  std::vector<DimGroup> out;
  std::vector<int64_t> index(static_cast<size_t>(nd), -1);
  for (int64_t d = 0; d < nd; ++d) {
    if (held.shard_order(d).empty() && want.shard_order(d).empty()) continue;  // whole in both
    int64_t& at = index[static_cast<size_t>(root(d))];
    if (at < 0) {
      at = static_cast<int64_t>(out.size());
      out.push_back({{}, std::vector<bool>(static_cast<size_t>(nm), false)});
    }
    DimGroup& g = out[static_cast<size_t>(at)];
    g.dims.push_back(d);
    for (const Layout* layout : {&held, &want})
      for (int64_t m : layout->shard_order(d)) g.mesh_dims[static_cast<size_t>(m)] = true;
  }
  return out;
}

// Products of a rank count and a sum over ranks exceed 64 bits before they are divided back.
__extension__ using Wide = __int128;

// Every piece of `layout` has one size in every dim (so every rank wants as much).
bool even(const Layout& layout) {
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (!layout.shard_order(d).empty() && !evenly_split(layout, d)) return false;
  return true;
}

// The smallest piece of `length` split into torch.chunk pieces by `splits` from `level` on: the
// full chunks and the remainder are split again, an empty chunk is the smallest there is.
int64_t smallest_chunk(int64_t length, const std::vector<int64_t>& splits, size_t level) {
  if (level == splits.size() || length == 0) return length;
  const int64_t k = splits[level], c = (length + k - 1) / k, full = length / c, rest = length % c;
  if (full + (rest > 0 ? 1 : 0) < k) return 0;
  const int64_t smallest = smallest_chunk(c, splits, level + 1);
  return rest > 0 ? std::min(smallest, smallest_chunk(rest, splits, level + 1)) : smallest;
}

// Elements of the smallest block of `layout` (no rank's is smaller), without listing pieces
// where they are chunks.
int64_t smallest_block_numel(const Layout& layout) {
  int64_t numel = 1;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const auto& order = layout.shard_order(d);
    if (layout.has_explicit_sizes(d)) {
      const std::vector<int64_t> sizes = layout.piece_sizes(d);
      numel *= sizes.empty() ? 0 : *std::min_element(sizes.begin(), sizes.end());
      continue;
    }
    std::vector<int64_t> splits;
    for (int64_t m : order) splits.push_back(layout.mesh().shape()[m]);
    numel *= smallest_chunk(layout.global_shape()[d], splits, 0);
  }
  return numel;
}

// The mesh dims splitting any of `dims` in either layout, a flag each.
std::vector<bool> splitting(const Layout& held, const Layout& want, const std::vector<int64_t>& dims) {
  std::vector<bool> flags(static_cast<size_t>(want.mesh().ndim()), false);
  for (int64_t d : dims)
    for (const Layout* layout : {&held, &want})
      for (int64_t m : layout->shard_order(d)) flags[static_cast<size_t>(m)] = true;
  return flags;
}

// The least that one of the k chunk pieces of `parent` overlaps `w` (chunk semantics: pieces of
// ceil(length / k) in order, the last ones shorter or empty). w is one interval, so when it
// overlaps the first piece and the last, the pieces between lie inside it, whole: the least is
// at an end (zero if the last is empty).
int64_t least_chunk_overlap(Range parent, int64_t k, Range w) {
  const int64_t c = (parent.second - parent.first + k - 1) / k;
  const int64_t first = overlap({parent.first, parent.first + c}, w);
  const int64_t last = overlap({parent.first + (k - 1) * c, parent.second}, w);
  return std::min(first, last);
}

// Per tensor dim of `dims`, a mesh dim that splits it in held only, as the innermost level of
// its order, and splits no other of `dims` in either layout (else -1). Its coordinate moves the
// held piece among the chunks of one parent piece and changes nothing else a rank wants or holds
// of `dims`: classes of ranks need not list it, the chunks' least and summed overlaps follow
// from the parent. (S(1), S(1), S(1)) ordered [c, b, a] -> (R, S(1), S(0)) on 32x32x16 lists 512
// coordinates instead of 16,384.
std::vector<int64_t> held_inner_dims(const Layout& held, const Layout& want, const std::vector<int64_t>& dims) {
  std::vector<int64_t> uses(static_cast<size_t>(want.mesh().ndim()), 0);
  for (int64_t d : dims)
    for (const Layout* layout : {&held, &want})
      for (int64_t m : layout->shard_order(d)) ++uses[static_cast<size_t>(m)];
  std::vector<int64_t> out(static_cast<size_t>(want.ndim()), -1);
  for (int64_t d : dims) {
    const auto& order = held.shard_order(d);
    if (order.empty() || held.has_explicit_sizes(d) || uses[static_cast<size_t>(order.back())] != 1) continue;
    out[static_cast<size_t>(d)] = order.back();
  }
  return out;
}

// KeptFigures by visiting classes of ranks (one rank each; with `sample`, some ranks of the
// classes crossing shard orders would list one by one, so that the figures bound from below).
// `inner`: held_inner_dims; `mesh_dims`: the mesh dims to list, without those.
KeptFigures kept_by_classes(const Layout& held, const Layout& want, const std::vector<int64_t>& dims,
                            const std::vector<int64_t>& inner, const std::vector<bool>& mesh_dims,
                            SourcePieces& source_pieces, bool sample) {
  int64_t folded = 1;  // coordinates each visited class stands for through the inner mesh dims
  for (int64_t d : dims)
    if (const int64_t m = inner[static_cast<size_t>(d)]; m >= 0) folded *= held.mesh().shape()[m];
  KeptFigures out;
  out.least_kept = std::numeric_limits<int64_t>::max();
  const auto visit = [&](const std::vector<int64_t>& c, int64_t count) {
    // kept: over the folded coordinates, the least and the sum of what one keeps.
    int64_t wanted = 1, least = 1, sum = 1, blocks = 1;
    for (int64_t d : dims) {
      const Range w = dim_range(want, d, c);
      wanted *= length(w);
      if (const int64_t m = inner[static_cast<size_t>(d)]; m >= 0) {
        const Range parent = *group_union(held, d, c, {m});
        least *= least_chunk_overlap(parent, held.mesh().shape()[m], w);
        sum *= overlap(parent, w);
      } else {
        const int64_t kept = overlap(dim_range(held, d, c), w);
        least *= kept;
        sum *= kept;
      }
      if (blocks > 0) blocks *= length(w) > 0 ? source_pieces.count(d, c, w) : 0;
    }
    out.least_kept = std::min(out.least_kept, least);
    out.most_lacking = std::max(out.most_lacking, wanted - least);
    out.kept_sum += sum * (count / folded);
    out.wanted_sum += wanted * count;
    if (sum > 0) out.keeping_blocks = std::max(out.keeping_blocks, blocks);
    if (least == 0) out.empty_blocks = std::max(out.empty_blocks, blocks);
    return true;
  };
  for_each_rank_class_until(want.mesh(), {&held, &want}, std::ref(visit), sample, mesh_dims);
  return out;
}

// KeptFigures of `dims`: by counting keepers digit by digit where the splits are even and their
// piece lengths divide one another; by joining their overlapping pieces where the classes of
// ranks would list many coordinates one by one (crossing shard orders); else by visiting the
// classes.
KeptFigures kept_figures(const Layout& held, const Layout& want, const std::vector<int64_t>& dims,
                         SourcePieces& source_pieces, bool sample) {
  // Up to this many coordinates listing them costs about what joining does. Past it the join may
  // list up to twice as many pieces and rows as there are coordinates (each costs a few
  // operations, where visiting a class prices every dim), and at most kJoinMost: its memory stays
  // independent of the rank count, as the classes' does.
  constexpr int64_t kJoinFrom = 64, kJoinMost = 4096;
  if (auto counted = kept_by_digits(held, want, dims, /*budget=*/kJoinMost)) return *counted;
  std::vector<bool> mesh_dims = splitting(held, want, dims);
  const int64_t listed = listed_coordinates(want.mesh(), {&held, &want}, mesh_dims, std::numeric_limits<int32_t>::max());
  if (listed > kJoinFrom)
    if (auto joined = kept_by_join(held, want, dims, /*budget=*/std::min(listed * 2, kJoinMost))) return *joined;
  // The classes fold what they can. (Where the join answers it is still the cheaper: a folded
  // class searches held's uneven pieces for each wanted piece it meets.)
  const std::vector<int64_t> inner = held_inner_dims(held, want, dims);
  for (int64_t m : inner)
    if (m >= 0) mesh_dims[static_cast<size_t>(m)] = false;
  return kept_by_classes(held, want, dims, inner, mesh_dims, source_pieces, sample);
}

// The figures group by group, where want is even (a rank lacks its block's size less what it
// keeps: maximising that is minimising what it keeps, which groups do independently) and the
// dims fall into two groups or more. nullopt otherwise.
std::optional<Lacking> lacking_by_groups(const Layout& held, const Layout& want) {
  if (!even(want) || want.max_block_numel() == 0) return std::nullopt;
  const std::vector<DimGroup> groups = independent_dim_groups(held, want);
  if (groups.size() < 2) return std::nullopt;
  const MeshSpec& mesh = want.mesh();
  const std::vector<int64_t> origin(static_cast<size_t>(mesh.ndim()), 0);
  // Dims whole in both layouts keep all of themselves on every rank, from one source block.
  int64_t wanted = 1, kept_whole = 1;
  for (int64_t d = 0; d < want.ndim(); ++d) {
    wanted *= length(dim_range(want, d, origin));
    if (held.shard_order(d).empty() && want.shard_order(d).empty()) kept_whole *= want.global_shape()[d];
  }
  SourcePieces source_pieces(held, want);
  const auto ranks = static_cast<Wide>(mesh.size());
  // What all ranks keep together over the groups seen so far: a group's sum over classes counts
  // each of its own coordinates once per coordinate of the other mesh dims, so each group
  // multiplies it by that sum / ranks (exactly: the result is again such a sum).
  Wide kept_sum = kept_whole * ranks;
  int64_t least_kept = kept_whole;
  // Per group, the most source blocks of a coordinate that keeps something, and of one that
  // keeps nothing (which needs every block it overlaps); -1 when there is none.
  std::vector<std::pair<int64_t, int64_t>> most_blocks;
  for (const DimGroup& g : groups) {
    const KeptFigures f = kept_figures(held, want, g.dims, source_pieces, /*sample=*/false);
    least_kept *= f.least_kept;
    kept_sum = kept_sum * f.kept_sum / ranks;
    most_blocks.emplace_back(f.keeping_blocks, f.empty_blocks);
  }
  Lacking out;
  out.most = wanted - least_kept;
  out.total = static_cast<int64_t>(ranks * wanted - kept_sum);
  // Most sources: every group keeping (one of the blocks is the rank's own), or some group
  // keeping nothing (the rank keeps nothing) while the others take their most either way.
  int64_t all_keeping = 1;
  for (const auto& [keeping, empty] : most_blocks) all_keeping = keeping < 0 || all_keeping < 0 ? -1 : all_keeping * keeping;
  out.sources = std::max<int64_t>(0, all_keeping - 1);
  for (size_t i = 0; i < most_blocks.size(); ++i) {
    if (most_blocks[i].second < 0) continue;
    int64_t blocks = most_blocks[i].second;
    for (size_t j = 0; j < most_blocks.size(); ++j)
      if (j != i) blocks *= std::max(most_blocks[j].first, most_blocks[j].second);
    out.sources = std::max(out.sources, blocks);
  }
  return out;
}

// What each rank of `want`'s mesh lacks of its block, and from how many source blocks: the
// busiest rank, the sum over ranks, the most sources. On one mesh by groups of dims or classes of
// ranks; between meshes sharing no rank by classes of the destination's; else rank by rank.
Lacking receivers(const Layout& held, const Layout& want, bool sample = false) {
  Lacking out;
  const auto visit = [&](int64_t lacking, int64_t sources, int64_t count) {
    out.most = std::max(out.most, lacking);
    out.total += lacking * count;
    out.sources = std::max(out.sources, sources);
  };
  const auto sources = [&](const Block& w, const Block& h) {
    return sources_overlapping(held, w) - (h.intersect(w).numel() > 0 ? 1 : 0);
  };
  if (held.mesh() == want.mesh()) {
    if (auto by_groups = lacking_by_groups(held, want)) return *by_groups;
    std::vector<int64_t> dims(static_cast<size_t>(want.ndim()));
    std::iota(dims.begin(), dims.end(), 0);
    SourcePieces source_pieces(held, want);
    const KeptFigures f = kept_figures(held, want, dims, source_pieces, sample);
    out.most = f.most_lacking;
    out.total = f.wanted_sum - f.kept_sum;
    out.sources = std::max<int64_t>({0, f.keeping_blocks - 1, f.empty_blocks});
    if (sample) {
      // The sample's sum counts a few ranks, not all: but every rank lacks at least its block
      // less the largest block held, which a search over large tensors needs (that sum is the
      // tie-break of 16,384 ranks' receives).
      const int64_t least = std::max<int64_t>(0, smallest_block_numel(want) - held.max_block_numel());
      out.most = std::max(out.most, least);
      out.total = std::max(out.total, least * want.mesh().size());
    }
    return out;
  }
  bool shared = false;
  for (int r : want.mesh().ranks()) shared = shared || held.mesh().contains(r);
  const Block nothing{Shape::filled(want.ndim(), 0), Shape::filled(want.ndim(), 0)};
  if (!shared) {
    for_each_rank_class(want.mesh(), {&want}, [&](const std::vector<int64_t>& c, int64_t count) {
      const Block w = want.block(c);
      visit(w.numel(), sources(w, nothing), count);
    });
    return out;
  }
  // Meshes that share ranks (to_mesh between overlapping meshes): a rank's own block depends on
  // both meshes' rank lists, so each rank counts on its own.
  for (int r : want.mesh().ranks()) {
    const Block w = want.block_of_rank(r);
    const Block h = held.mesh().contains(r) ? held.block_of_rank(r) : nothing;
    visit(w.numel() - h.intersect(w).numel(), sources(w, h), 1);
  }
  return out;
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
  const auto visit = [&](const std::vector<int64_t>& c, int64_t count) {
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
  };
  for_each_rank_class_until(mesh, {&before, &after}, std::ref(visit));
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
  const Lacking lack = receivers(before, after);
  step.max_received = lack.most * item;
  step.total_received = lack.total * item;
  step.messages = lack.sources;
  step.calls = step.messages > 0 ? 1 : 0;
  return step;
}

Lacking lacking(const Layout& at, const Layout& dst, bool bound_only) { return receivers(at, dst, bound_only); }

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
