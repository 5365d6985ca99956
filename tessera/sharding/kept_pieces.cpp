#include <tessera/sharding/detail/kept_pieces.hpp>

#include <algorithm>
#include <limits>
#include <numeric>
#include <queue>
#include <set>
#include <unordered_map>

#include <tessera/core/error.hpp>

namespace tessera::detail {

namespace {

using Range = std::pair<int64_t, int64_t>;

int64_t overlap(Range a, Range b) { return std::max<int64_t>(0, std::min(a.second, b.second) - std::max(a.first, b.first)); }

// Writes piece's mixed-radix digits over `order` (major first) at their mesh dims in `coordinate`.
void write_digits(const MeshSpec& mesh, const std::vector<int64_t>& order, int64_t piece, std::vector<int64_t>& coordinate) {
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int64_t k = mesh.shape()[*it];
    coordinate[static_cast<size_t>(*it)] = piece % k;
    piece /= k;
  }
}

// The pieces of tensor dim `dim` in splitting order ({[0, size)} where the layout does not split
// it). They tile the dim in that order, so their starts and ends never decrease.
std::vector<Range> piece_ranges(const Layout& layout, int64_t dim) {
  const int64_t size = layout.global_shape()[dim];
  const std::vector<int64_t>& order = layout.shard_order(dim);
  if (order.empty()) return {Range{0, size}};
  const auto count = static_cast<size_t>(layout.piece_count(dim));
  std::vector<Range> out;
  out.reserve(count);
  if (layout.has_explicit_sizes(dim) || size % static_cast<int64_t>(count) == 0) {
    for (size_t p = 0; p < count; ++p) out.push_back(layout.piece_range(dim, static_cast<int64_t>(p)));
    return out;
  }
  // Nested chunks, level by level: each piece splits into k chunks of ceil(length / k), children
  // next to each other (the first split major, as piece_range numbers them). One division per
  // piece split, where asking piece_range piece by piece divides at every level.
  out.push_back({0, size});
  std::vector<Range> next;
  next.reserve(count);
  for (int64_t m : order) {
    const int64_t k = layout.mesh().shape()[m];
    next.clear();
    for (const auto& [begin, end] : out) {
      const int64_t length = end - begin, chunk = (length + k - 1) / k;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t lo = std::min(j * chunk, length), hi = std::min(lo + chunk, length);
        next.push_back({begin + lo, begin + hi});
      }
    }
    out.swap(next);
  }
  return out;
}

// Calls visit(i, j) for every pair of a piece of `a` and a piece of `b` that overlap: both tile
// one dim in order, so one sweep finds them.
template <class Visit>
void for_each_overlap(const std::vector<Range>& a, const std::vector<Range>& b, Visit&& visit) {
  size_t from = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first >= a[i].second) continue;
    while (from < b.size() && b[from].second <= a[i].first) ++from;
    for (size_t j = from; j < b.size() && b[j].first < a[i].second; ++j)
      if (overlap(a[i], b[j]) > 0) visit(i, j);
  }
}

// One tensor dim: the mesh dims splitting it in either layout, and every pair of a held piece and
// a wanted piece that overlap with their coordinates agreeing on the mesh dims both split it by.
struct Pairs {
  std::vector<int64_t> mesh_dims;     // ascending
  std::vector<int64_t> coordinates;   // per pair, one per mesh dim of mesh_dims
  std::vector<int64_t> kept;          // per pair: the overlap
  std::vector<int64_t> wanted_piece;  // per pair
  size_t size() const { return kept.size(); }
};

std::optional<Pairs> overlapping_pairs(const Layout& held, const Layout& want, int64_t d, const std::vector<Range>& held_pieces,
                                       const std::vector<Range>& wanted, int64_t budget) {
  const MeshSpec& mesh = want.mesh();
  const auto& held_order = held.shard_order(d);
  const auto& want_order = want.shard_order(d);
  Pairs out;
  out.mesh_dims = held_order;
  out.mesh_dims.insert(out.mesh_dims.end(), want_order.begin(), want_order.end());
  std::sort(out.mesh_dims.begin(), out.mesh_dims.end());
  out.mesh_dims.erase(std::unique(out.mesh_dims.begin(), out.mesh_dims.end()), out.mesh_dims.end());
  std::vector<int64_t> from_held(static_cast<size_t>(mesh.ndim()), -1), from_want = from_held;
  bool over = false;
  for_each_overlap(held_pieces, wanted, [&](size_t p, size_t q) {
    if (over) return;
    write_digits(mesh, held_order, static_cast<int64_t>(p), from_held);
    write_digits(mesh, want_order, static_cast<int64_t>(q), from_want);
    for (int64_t m : want_order)
      if (from_held[static_cast<size_t>(m)] >= 0 && from_held[static_cast<size_t>(m)] != from_want[static_cast<size_t>(m)])
        return;
    for (int64_t m : out.mesh_dims) {
      const auto i = static_cast<size_t>(m);
      out.coordinates.push_back(from_held[i] >= 0 ? from_held[i] : from_want[i]);
    }
    out.kept.push_back(overlap(held_pieces[p], wanted[q]));
    out.wanted_piece.push_back(static_cast<int64_t>(q));
    over = static_cast<int64_t>(out.size()) > budget;
  });
  if (over) return std::nullopt;
  return out;
}

// One tensor dim's wanted pieces: each one's length and source blocks (held pieces overlapping it).
struct WantedPieces {
  std::vector<int64_t> length, sources;
};

WantedPieces wanted_pieces(const std::vector<Range>& held_pieces, const std::vector<Range>& wanted) {
  WantedPieces out;
  out.length.reserve(wanted.size());
  for (const Range& w : wanted) out.length.push_back(w.second - w.first);
  out.sources.assign(wanted.size(), 0);
  for_each_overlap(wanted, held_pieces, [&](size_t q, size_t) { ++out.sources[q]; });
  return out;
}

// The coordinates that keep something, on the mesh dims of the joined dims (-1 on the others),
// with what each keeps, wants and needs from how many source blocks.
struct Keeping {
  int64_t mesh_ndim = 0;
  std::vector<int64_t> coordinates;  // mesh_ndim per row
  std::vector<int64_t> kept, wanted, blocks;
  size_t size() const { return kept.size(); }
};

// Joins the dims' pairs, the next dim always one sharing the most mesh dims already chosen (its
// pairs found by binary search on those coordinates). nullopt past `budget` rows.
std::optional<Keeping> join(const std::vector<Pairs>& pairs, const std::vector<WantedPieces>& wanted,
                            const std::vector<int64_t>& sizes, int64_t budget) {
  const auto mesh_ndim = static_cast<int64_t>(sizes.size());
  Keeping rows;
  rows.mesh_ndim = mesh_ndim;
  rows.coordinates.assign(static_cast<size_t>(mesh_ndim), -1);
  rows.kept = rows.wanted = rows.blocks = {1};
  std::vector<bool> chosen(static_cast<size_t>(mesh_ndim), false), joined(pairs.size(), false);
  for (size_t step = 0; step < pairs.size(); ++step) {
    size_t next = 0;
    int64_t best = -1;
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (joined[i]) continue;
      int64_t shared = 0;
      for (int64_t m : pairs[i].mesh_dims) shared += chosen[static_cast<size_t>(m)] ? 1 : 0;
      if (shared > best) best = shared, next = i;
    }
    joined[next] = true;
    const Pairs& p = pairs[next];
    const size_t width = p.mesh_dims.size();
    // Key: the pair's coordinates on the mesh dims already chosen, as one mixed-radix number.
    std::vector<size_t> shared;
    for (size_t j = 0; j < width; ++j)
      if (chosen[static_cast<size_t>(p.mesh_dims[j])]) shared.push_back(j);
    std::vector<std::pair<int64_t, size_t>> index;  // (key, pair), sorted
    index.reserve(p.size());
    for (size_t e = 0; e < p.size(); ++e) {
      int64_t key = 0;
      for (size_t j : shared) key = key * sizes[static_cast<size_t>(p.mesh_dims[j])] + p.coordinates[e * width + j];
      index.emplace_back(key, e);
    }
    std::sort(index.begin(), index.end());
    Keeping out;
    out.mesh_ndim = mesh_ndim;
    for (size_t r = 0; r < rows.size(); ++r) {
      const int64_t* row = rows.coordinates.data() + r * static_cast<size_t>(mesh_ndim);
      int64_t key = 0;
      for (size_t j : shared) key = key * sizes[static_cast<size_t>(p.mesh_dims[j])] + row[p.mesh_dims[j]];
      for (auto it = std::lower_bound(index.begin(), index.end(), std::pair<int64_t, size_t>{key, 0});
           it != index.end() && it->first == key; ++it) {
        const size_t e = it->second;
        const auto q = static_cast<size_t>(p.wanted_piece[e]);
        out.coordinates.insert(out.coordinates.end(), row, row + mesh_ndim);
        int64_t* added = out.coordinates.data() + out.coordinates.size() - static_cast<size_t>(mesh_ndim);
        for (size_t j = 0; j < width; ++j) added[p.mesh_dims[j]] = p.coordinates[e * width + j];
        out.kept.push_back(rows.kept[r] * p.kept[e]);
        out.wanted.push_back(rows.wanted[r] * wanted[next].length[q]);
        out.blocks.push_back(rows.blocks[r] * wanted[next].sources[q]);
        if (static_cast<int64_t>(out.size()) > budget) return std::nullopt;
      }
    }
    for (int64_t m : p.mesh_dims) chosen[static_cast<size_t>(m)] = true;
    rows = std::move(out);
  }
  return rows;
}

// The wanted block (one wanted piece per dim) of each row, as a mixed-radix number over the dims'
// piece counts, and how many rows have it.
std::unordered_map<int64_t, int64_t> rows_per_wanted_block(const Keeping& rows, const Layout& want,
                                                           const std::vector<int64_t>& dims) {
  std::unordered_map<int64_t, int64_t> out;
  std::vector<int64_t> coordinate(static_cast<size_t>(rows.mesh_ndim));
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t* row = rows.coordinates.data() + r * static_cast<size_t>(rows.mesh_ndim);
    coordinate.assign(row, row + rows.mesh_ndim);
    int64_t key = 0;
    for (int64_t d : dims) {
      const auto& order = want.shard_order(d);
      key = key * (order.empty() ? 1 : want.piece_count(d)) + (order.empty() ? 0 : piece_of(want.mesh(), order, coordinate));
    }
    ++out[key];
  }
  return out;
}

// The most that a product over dims of per-wanted-piece values takes at a coordinate outside the
// rows (`row_values`: the product at each row). Each wanted block stands at `per_block`
// coordinates, so it has one outside unless that many rows have it (it is full): the answer is
// the largest product over the blocks not full. Blocks are visited best first (each dim's values sorted, a frontier of index tuples), which
// pops at most one block more than there are full ones. Some block must not be full.
template <class RowsPerBlock>
int64_t most_outside(const std::vector<WantedPieces>& wanted, std::vector<int64_t> WantedPieces::*field, int64_t per_block,
                     RowsPerBlock&& rows_per_block, const std::vector<int64_t>& row_values) {
  const size_t n = wanted.size();
  const auto values = [&](size_t i) -> const std::vector<int64_t>& { return wanted[i].*field; };
  // Most often some coordinate taking the largest product is outside: count them, no sorting.
  int64_t largest = 1, taking = per_block;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int64_t>& v = values(i);
    const int64_t m = *std::max_element(v.begin(), v.end());
    largest *= m;
    taking *= std::count(v.begin(), v.end(), m);
  }
  if (taking > std::count(row_values.begin(), row_values.end(), largest)) return largest;
  std::vector<std::vector<int64_t>> sorted(n);  // per dim: piece indices by value, largest first
  for (size_t i = 0; i < n; ++i) {
    sorted[i].resize(values(i).size());
    std::iota(sorted[i].begin(), sorted[i].end(), 0);
    std::stable_sort(sorted[i].begin(), sorted[i].end(),
                     [&](int64_t a, int64_t b) { return values(i)[static_cast<size_t>(a)] > values(i)[static_cast<size_t>(b)]; });
  }
  using Tuple = std::vector<int64_t>;  // a position in each dim's sorted list
  const auto product = [&](const Tuple& t) {
    int64_t p = 1;
    for (size_t i = 0; i < n; ++i) p *= values(i)[static_cast<size_t>(sorted[i][static_cast<size_t>(t[i])])];
    return p;
  };
  const auto block = [&](const Tuple& t) {
    int64_t key = 0;
    for (size_t i = 0; i < n; ++i) key = key * static_cast<int64_t>(values(i).size()) + sorted[i][static_cast<size_t>(t[i])];
    return key;
  };
  const std::unordered_map<int64_t, int64_t>& full = rows_per_block();
  std::priority_queue<std::pair<int64_t, Tuple>> frontier;
  std::set<Tuple> seen;
  frontier.emplace(product(Tuple(n, 0)), Tuple(n, 0));
  seen.insert(Tuple(n, 0));
  while (!frontier.empty()) {
    auto [value, t] = frontier.top();
    frontier.pop();
    const auto found = full.find(block(t));
    if (found == full.end() || found->second < per_block) return value;
    for (size_t i = 0; i < n; ++i) {
      if (t[i] + 1 >= static_cast<int64_t>(values(i).size())) continue;
      Tuple next = t;
      ++next[i];
      if (seen.insert(next).second) frontier.emplace(product(next), next);
    }
  }
  TESSERA_ASSERT(false, "most_outside: every wanted block is full of rows");
  return 0;
}

}  // namespace

std::optional<KeptFigures> kept_by_join(const Layout& held, const Layout& want, const std::vector<int64_t>& dims,
                                        int64_t budget) {
  const MeshSpec& mesh = want.mesh();
  const int64_t nm = mesh.ndim();
  std::vector<Pairs> pairs;
  std::vector<WantedPieces> wanted;
  int64_t pieces = 0;
  for (int64_t d : dims) {
    pieces += held.piece_count(d) + want.piece_count(d);
    if (pieces > budget) return std::nullopt;
    const std::vector<Range> held_pieces = piece_ranges(held, d), wanted_ranges = piece_ranges(want, d);
    auto p = overlapping_pairs(held, want, d, held_pieces, wanted_ranges, budget - pieces);
    if (!p) return std::nullopt;
    pieces += static_cast<int64_t>(p->size());
    pairs.push_back(std::move(*p));
    wanted.push_back(wanted_pieces(held_pieces, wanted_ranges));
  }
  const auto rows = join(pairs, wanted, mesh.shape().vec(), budget);
  if (!rows) return std::nullopt;

  // Coordinates: those of the mesh dims the dims are split by (each stands for `per` ranks).
  std::vector<bool> used(static_cast<size_t>(nm), false), by_want(static_cast<size_t>(nm), false);
  for (int64_t d : dims) {
    for (int64_t m : held.shard_order(d)) used[static_cast<size_t>(m)] = true;
    for (int64_t m : want.shard_order(d)) used[static_cast<size_t>(m)] = by_want[static_cast<size_t>(m)] = true;
  }
  int64_t coordinates = 1, free_coordinates = 1;  // free: used, but no wanted piece depends on it
  for (int64_t m = 0; m < nm; ++m) {
    if (!used[static_cast<size_t>(m)]) continue;
    coordinates *= mesh.shape()[m];
    if (!by_want[static_cast<size_t>(m)]) free_coordinates *= mesh.shape()[m];
  }
  const int64_t per = mesh.size() / coordinates;
  const auto outside = coordinates - static_cast<int64_t>(rows->size());

  KeptFigures out;
  int64_t wanted_pieces_count = 1, wanted_elements = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    wanted_pieces_count *= static_cast<int64_t>(wanted[i].length.size());
    wanted_elements *= want.global_shape()[dims[i]];
  }
  out.wanted_sum = mesh.size() / wanted_pieces_count * wanted_elements;  // the pieces tile each dim
  out.least_kept = std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < rows->size(); ++r) {
    out.least_kept = std::min(out.least_kept, rows->kept[r]);
    out.kept_sum += rows->kept[r] * per;
    out.most_lacking = std::max(out.most_lacking, rows->wanted[r] - rows->kept[r]);
    out.keeping_blocks = std::max(out.keeping_blocks, rows->blocks[r]);
  }
  if (outside > 0) {
    out.least_kept = 0;
    std::optional<std::unordered_map<int64_t, int64_t>> rows_per_block;  // counted on first need
    const auto count_rows = [&]() -> const std::unordered_map<int64_t, int64_t>& {
      if (!rows_per_block) rows_per_block = rows_per_wanted_block(*rows, want, dims);
      return *rows_per_block;
    };
    out.most_lacking = std::max(out.most_lacking, most_outside(wanted, &WantedPieces::length, free_coordinates, count_rows, rows->wanted));
    out.empty_blocks = most_outside(wanted, &WantedPieces::sources, free_coordinates, count_rows, rows->blocks);
  }
  return out;
}

}  // namespace tessera::detail
