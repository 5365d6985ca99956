#include <tessera/sharding/detail/rank_classes.hpp>

#include <algorithm>
#include <numeric>

#include <tessera/core/error.hpp>

namespace tessera::detail {

namespace {

// The layouts a class of ranks is found for. The planner asks for classes hundreds of times per
// plan, so nothing here allocates per call beyond a few small inline vectors.
struct Layouts {
  const Layout* const* first;
  size_t count;
  const Layout* const* begin() const { return first; }
  const Layout* const* end() const { return first + count; }
};

// Where a mesh dim splits a tensor dim in one layout.
struct Appearance {
  const Layout* layout;
  int64_t dim;
  size_t level;  // index in the dim's shard order
};

// Where each mesh dim splits a tensor dim in each layout (at most once per layout: a mesh dim
// shards one tensor dim): found once per enumeration by scanning the shard orders, then read
// per mesh dim.
class Appearances {
 public:
  Appearances(const Layouts& layouts, int64_t mesh_ndim)
      : layouts_(layouts),
        nm_(mesh_ndim),
        where_(DimVector::filled(static_cast<int64_t>(layouts.count) * mesh_ndim, -1)) {
    for (size_t l = 0; l < layouts.count; ++l)
      for (int64_t d = 0; d < layouts.first[l]->ndim(); ++d) {
        const auto& order = layouts.first[l]->shard_order(d);
        for (size_t t = 0; t < order.size(); ++t)
          where_[static_cast<int64_t>(l) * nm_ + order[t]] = d * kLevels + static_cast<int64_t>(t);
      }
  }

  // Calls f(appearance) for every place mesh dim m splits a tensor dim in one of the layouts.
  template <class F>
  void each(int64_t m, F&& f) const {
    for (size_t l = 0; l < layouts_.count; ++l)
      if (const int64_t w = where_[static_cast<int64_t>(l) * nm_ + m]; w >= 0)
        f(Appearance{layouts_.first[l], w / kLevels, static_cast<size_t>(w % kLevels)});
  }

  bool any(int64_t m) const {
    for (size_t l = 0; l < layouts_.count; ++l)
      if (where_[static_cast<int64_t>(l) * nm_ + m] >= 0) return true;
    return false;
  }

  const Layouts& layouts() const { return layouts_; }

 private:
  static constexpr int64_t kLevels = 1 << 16;  // more than any shard order's length
  Layouts layouts_;
  int64_t nm_;
  DimVector where_;  // per (layout, mesh dim): dim * kLevels + level, or -1
};

// A mesh dim's coordinates are enumerated as runs (compressed) when, for every tensor dim it
// splits in some layout, every layout either splits that dim the same way down to it (same
// mesh dims before it, at the same level, chunk semantics) or splits it no deeper than its
// parent (its block there then contains the runs' chunks). Else coordinate by coordinate.
bool compressible(int64_t m, const Appearances& appearances) {
  bool ok = true;
  appearances.each(m, [&](const Appearance& a) {
    if (!ok || a.layout->has_explicit_sizes(a.dim)) {
      ok = false;
      return;
    }
    const auto& order = a.layout->shard_order(a.dim);
    for (const Layout* other : appearances.layouts()) {
      const auto& theirs = other->shard_order(a.dim);
      if (theirs.empty()) continue;
      if (other->has_explicit_sizes(a.dim)) ok = false;
      const bool splits_by_m = std::find(theirs.begin(), theirs.end(), m) != theirs.end();
      const size_t common = splits_by_m ? a.level + 1 : theirs.size();
      if (splits_by_m ? theirs.size() < common : theirs.size() > a.level) ok = false;
      if (ok && !std::equal(theirs.begin(), theirs.begin() + static_cast<std::ptrdiff_t>(common), order.begin()))
        ok = false;
    }
  });
  return ok;
}

// [begin, end) of the chunk that the first `levels` levels of tensor dim `dim`'s shard order pick
// at `coordinate` (chunk semantics): each level's digit is the coordinate itself, so a level
// takes one division, where recovering digits from a piece index would take three.
std::pair<int64_t, int64_t> chunk_at(const Layout& layout, int64_t dim, size_t levels,
                                     const std::vector<int64_t>& coordinate) {
  const auto& order = layout.shard_order(dim);
  const Shape& mesh = layout.mesh().shape();
  int64_t begin = 0, length = layout.global_shape()[dim];
  for (size_t t = 0; t < levels; ++t) {
    const int64_t k = mesh[order[t]], c = (length + k - 1) / k;
    const int64_t lo = std::min(coordinate[static_cast<size_t>(order[t])] * c, length);
    begin += lo;
    length = std::min(lo + c, length) - lo;
  }
  return {begin, begin + length};
}

// Length of the parent piece of level `level` of tensor dim `dim` at the coordinates chosen so
// far (the mesh dims before `level` in the order are chosen).
int64_t parent_length(const Layout& layout, int64_t dim, size_t level, const std::vector<int64_t>& coordinate) {
  const auto [begin, end] = chunk_at(layout, dim, level, coordinate);
  return end - begin;
}

enum Mode : int64_t { kUnused = 0, kRuns = 1, kEvery = 2 };

struct Plan {
  Appearances appearances;
  DimVector order;      // mesh dims in enumeration order
  DimVector mode;       // per mesh dim: a Mode
  bool sample = false;  // kEvery: a few coordinates only
};

Plan enumeration_plan(const MeshSpec& mesh, const Layouts& layouts, const std::vector<bool>& varying) {
  const int64_t nm = mesh.ndim();
  Plan plan{Appearances(layouts, nm), {}, DimVector::filled(nm, kUnused)};
  for (int64_t m = 0; m < nm; ++m) {
    if (mesh.shape()[m] == 1 || (!varying.empty() && !varying[static_cast<size_t>(m)])) continue;
    if (plan.appearances.any(m)) plan.mode[m] = compressible(m, plan.appearances) ? kRuns : kEvery;
  }
  // Coordinates first for the mesh dims listed one by one and the unused ones; then each mesh dim
  // in runs once the mesh dims above it in every order it appears in are chosen. A cycle (two
  // layouts nesting two mesh dims in opposite orders on different tensor dims) falls back to
  // every coordinate.
  DimVector chosen = DimVector::filled(nm, 0);
  for (int64_t m = 0; m < nm; ++m)
    if (plan.mode[m] != kRuns) {
      plan.order.push_back(m);
      chosen[m] = 1;
    }
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t m = 0; m < nm; ++m) {
      if (chosen[m]) continue;
      bool ready = true;
      plan.appearances.each(m, [&](const Appearance& a) {
        const auto& order = a.layout->shard_order(a.dim);
        for (size_t t = 0; t < a.level; ++t) ready = ready && chosen[order[t]];
      });
      if (!ready) continue;
      plan.order.push_back(m);
      chosen[m] = 1;
      progress = true;
    }
  }
  for (int64_t m = 0; m < nm; ++m)
    if (!chosen[m]) {
      plan.mode[m] = kEvery;
      plan.order.push_back(m);
    }
  return plan;
}

// The coordinates a plan lists one by one (the product of its kEvery dims' sizes), at most cap + 1.
int64_t listed(const MeshSpec& mesh, const Plan& plan, int64_t cap) {
  int64_t count = 1;
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    if (plan.mode[m] == kEvery) count = std::min(count * mesh.shape()[m], cap + 1);
  return count;
}

using Visit = std::function<bool(const std::vector<int64_t>&, int64_t)>;

// Returns false once visit did (stop).
bool enumerate(const MeshSpec& mesh, const Plan& plan, int64_t at, std::vector<int64_t>& coordinate, int64_t count,
               const Visit& visit) {
  if (at == plan.order.size()) return visit(coordinate, count);
  const int64_t m = plan.order[at];
  const auto i = static_cast<size_t>(m);
  const int64_t k = mesh.shape()[m];
  if (plan.mode[m] == kUnused) {
    coordinate[i] = 0;
    return enumerate(mesh, plan, at + 1, coordinate, count * k, visit);
  }
  if (plan.mode[m] == kEvery) {
    if (plan.sample && k > 4) {  // both ends and the middle, each one rank's coordinate
      for (int64_t v : {int64_t{0}, int64_t{1}, k / 2, k - 1}) {
        coordinate[i] = v;
        if (!enumerate(mesh, plan, at + 1, coordinate, count, visit)) return false;
      }
      return true;
    }
    for (int64_t v = 0; v < k; ++v) {
      coordinate[i] = v;
      if (!enumerate(mesh, plan, at + 1, coordinate, count, visit)) return false;
    }
    return true;
  }
  // Runs: the chunks of equal length at every place the mesh dim splits a tensor dim.
  DimVector cuts{0, k};
  plan.appearances.each(m, [&](const Appearance& a) {
    const int64_t length = parent_length(*a.layout, a.dim, a.level, coordinate);
    const int64_t c = (length + k - 1) / k;
    const int64_t full = c > 0 ? length / c : 0;
    cuts.push_back(std::min(full, k));
    cuts.push_back(std::min(full + (c > 0 && length % c != 0 ? 1 : 0), k));
  });
  std::sort(cuts.begin(), cuts.end());
  const int64_t* last = std::unique(cuts.begin(), cuts.end());
  for (const int64_t* r = cuts.begin(); r + 1 < last; ++r) {
    coordinate[i] = *r;
    if (!enumerate(mesh, plan, at + 1, coordinate, count * (r[1] - *r), visit)) return false;
  }
  return true;
}

bool classes_until(const MeshSpec& mesh, const Layouts& layouts, const Visit& visit, bool sample,
                   const std::vector<bool>& varying) {
  for (const Layout* layout : layouts)
    TESSERA_ASSERT(layout->mesh() == mesh, "rank classes of layouts on another mesh: ", layout->to_string(), " vs ",
                   mesh.to_string());
  std::vector<int64_t> coordinate(static_cast<size_t>(mesh.ndim()), 0);
  Plan plan = enumeration_plan(mesh, layouts, varying);
  // Sample only where listing every coordinate would cost much: up to a few thousand classes
  // the bounds stay exact, which keeps a search ordered as tightly as exact figures would.
  constexpr int64_t kExactClasses = 4096;
  plan.sample = sample && listed(mesh, plan, kExactClasses) > kExactClasses;
  return enumerate(mesh, plan, 0, coordinate, 1, visit);
}

Layouts of(const std::vector<const Layout*>& layouts) { return {layouts.data(), layouts.size()}; }
Layouts of(std::initializer_list<const Layout*> layouts) { return {layouts.begin(), layouts.size()}; }

// Every class, none stopping the visit.
void each_class(const MeshSpec& mesh, const Layouts& layouts,
                const std::function<void(const std::vector<int64_t>& coordinate, int64_t count)>& visit) {
  const auto until = [&](const std::vector<int64_t>& c, int64_t count) {
    visit(c, count);
    return true;
  };
  classes_until(mesh, layouts, std::ref(until), false, {});
}

}  // namespace

bool for_each_rank_class_until(const MeshSpec& mesh, const std::vector<const Layout*>& layouts, const Visit& visit,
                               bool sample, const std::vector<bool>& varying) {
  return classes_until(mesh, of(layouts), visit, sample, varying);
}

bool for_each_rank_class_until(const MeshSpec& mesh, std::initializer_list<const Layout*> layouts, const Visit& visit,
                               bool sample, const std::vector<bool>& varying) {
  return classes_until(mesh, of(layouts), visit, sample, varying);
}

int64_t listed_coordinates(const MeshSpec& mesh, std::initializer_list<const Layout*> layouts,
                           const std::vector<bool>& varying, int64_t cap) {
  return listed(mesh, enumeration_plan(mesh, of(layouts), varying), cap);
}

void for_each_rank_class(const MeshSpec& mesh, const std::vector<const Layout*>& layouts,
                         const std::function<void(const std::vector<int64_t>& coordinate, int64_t count)>& visit) {
  each_class(mesh, of(layouts), visit);
}

void for_each_rank_class(const MeshSpec& mesh, std::initializer_list<const Layout*> layouts,
                         const std::function<void(const std::vector<int64_t>& coordinate, int64_t count)>& visit) {
  each_class(mesh, of(layouts), visit);
}

std::pair<int64_t, int64_t> dim_range(const Layout& layout, int64_t dim, const std::vector<int64_t>& coordinate) {
  const auto& order = layout.shard_order(dim);
  const int64_t size = layout.global_shape()[dim];
  if (order.empty()) return {0, size};
  if (layout.has_explicit_sizes(dim)) return layout.piece_range(dim, piece_of(layout.mesh(), order, coordinate));
  // The planner asks this per class of ranks (thousands of times per exchange priced): an even
  // split is one product, nested chunks one division per level.
  const int64_t count = layout.piece_count(dim);
  if (size % count == 0) {
    const int64_t piece = piece_of(layout.mesh(), order, coordinate);
    return {piece * (size / count), (piece + 1) * (size / count)};
  }
  return chunk_at(layout, dim, order.size(), coordinate);
}

std::optional<std::pair<int64_t, int64_t>> group_union(const Layout& layout, int64_t dim,
                                                       const std::vector<int64_t>& coordinate,
                                                       const std::vector<int64_t>& group) {
  const auto& order = layout.shard_order(dim);
  size_t inner = 0;  // mesh dims of the group splitting `dim`
  for (int64_t m : order) inner += std::count(group.begin(), group.end(), m);
  if (inner == 0) return dim_range(layout, dim, coordinate);
  for (size_t t = order.size() - inner; t < order.size(); ++t)
    if (std::find(group.begin(), group.end(), order[t]) == group.end()) return std::nullopt;
  // The innermost digits vary: the pieces [base, base + span) in splitting order, back to back.
  std::vector<int64_t> at = coordinate;
  int64_t span = 1;
  for (size_t t = order.size() - inner; t < order.size(); ++t) {
    at[static_cast<size_t>(order[t])] = 0;
    span *= layout.mesh().shape()[order[t]];
  }
  const int64_t base = piece_of(layout.mesh(), order, at);
  return std::pair{layout.piece_range(dim, base).first, layout.piece_range(dim, base + span - 1).second};
}

void for_each_group_piece(const Layout& layout, int64_t dim, std::vector<int64_t> coordinate,
                          const std::vector<int64_t>& group,
                          const std::function<bool(const std::vector<int64_t>& coordinate)>& visit) {
  std::vector<int64_t> varying;
  for (int64_t m : layout.shard_order(dim))
    if (std::find(group.begin(), group.end(), m) != group.end()) varying.push_back(m);
  int64_t total = 1;
  for (int64_t m : varying) total *= layout.mesh().shape()[m];
  for (int64_t f = 0; f < total; ++f) {
    int64_t rest = f;
    for (auto it = varying.rbegin(); it != varying.rend(); ++it) {
      const int64_t k = layout.mesh().shape()[*it];
      coordinate[static_cast<size_t>(*it)] = rest % k;
      rest /= k;
    }
    if (!visit(coordinate)) return;
  }
}

namespace {

// Empty leaves under a piece of `length` split by the levels from `level` on of `splits`.
int64_t empty_leaves(int64_t length, const std::vector<int64_t>& splits, size_t level) {
  int64_t leaves = 1;
  for (size_t t = level; t < splits.size(); ++t) leaves *= splits[t];
  if (length == 0) return leaves;
  if (level == splits.size()) return 0;
  const int64_t k = splits[level], c = (length + k - 1) / k, full = length / c, rest = length % c;
  const int64_t below = leaves / k;  // leaves under one chunk of this level
  return full * empty_leaves(c, splits, level + 1) + (rest > 0 ? empty_leaves(rest, splits, level + 1) : 0) +
         (k - full - (rest > 0 ? 1 : 0)) * below;
}

// Empty pieces of a chunk-split dim among the pieces before `piece` (splitting order): at each
// level, the empty leaves under the chunks before the piece's own (full chunks, the remainder,
// then empty chunks, in that order).
int64_t empty_before(const Layout& layout, int64_t dim, int64_t piece) {
  std::vector<int64_t> splits;
  for (int64_t m : layout.shard_order(dim)) splits.push_back(layout.mesh().shape()[m]);
  int64_t length = layout.global_shape()[dim];
  if (piece >= layout.piece_count(dim)) return empty_leaves(length, splits, 0);
  int64_t place = layout.piece_count(dim), empties = 0;
  for (size_t t = 0; t < splits.size(); ++t) {
    const int64_t k = splits[t];
    place /= k;  // leaves under one chunk of this level
    const int64_t digit = piece / place % k;
    const int64_t c = (length + k - 1) / k;
    const int64_t full = c > 0 ? length / c : 0, rest = c > 0 ? length % c : 0;
    empties += std::min(digit, full) * empty_leaves(c, splits, t + 1);
    if (digit > full) {
      const int64_t remainder = rest > 0 ? 1 : 0;
      if (remainder) empties += empty_leaves(rest, splits, t + 1);
      empties += (digit - full - remainder) * place;
    }
    const int64_t lo = std::min(digit * c, length);
    length = std::min(lo + c, length) - lo;
  }
  return empties;
}

}  // namespace

bool evenly_split(const Layout& layout, int64_t dim) {
  const int64_t size = layout.global_shape()[dim];
  return size > 0 && !layout.has_explicit_sizes(dim) && size % layout.piece_count(dim) == 0;
}

PieceSpan pieces_overlapping(const Layout& layout, int64_t dim, int64_t begin, int64_t end) {
  const int64_t count = layout.piece_count(dim), size = layout.global_shape()[dim];
  if (begin >= end) return {0, 0, 0};
  // An even split: pieces of one size, in order, none empty.
  if (evenly_split(layout, dim)) {
    const int64_t s = size / count, first = begin / s, last = (end + s - 1) / s;
    return {first, last, last - first};
  }
  // Pieces tile the dim in splitting order, so their ends and starts never decrease.
  int64_t lo = 0, hi = count;
  while (lo < hi) {  // the first piece ending after `begin`
    const int64_t mid = lo + (hi - lo) / 2;
    if (layout.piece_range(dim, mid).second > begin) hi = mid;
    else lo = mid + 1;
  }
  const int64_t first = lo;
  hi = count;
  while (lo < hi) {  // the first piece starting at or after `end`
    const int64_t mid = lo + (hi - lo) / 2;
    if (layout.piece_range(dim, mid).first >= end) hi = mid;
    else lo = mid + 1;
  }
  PieceSpan span{first, lo, lo - first};
  // Empty pieces may sit between them (nested chunks leave them at the end of each parent).
  if (layout.has_explicit_sizes(dim)) {
    for (int64_t p = span.first; p < span.last; ++p) {
      const auto [b, e] = layout.piece_range(dim, p);
      if (b == e) --span.overlapping;
    }
  } else if (span.last > span.first) {
    span.overlapping -= empty_before(layout, dim, span.last) - empty_before(layout, dim, span.first);
  }
  return span;
}

}  // namespace tessera::detail
