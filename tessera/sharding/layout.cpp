#include <tessera/sharding/layout.hpp>

#include <algorithm>
#include <numeric>
#include <sstream>

#include <tessera/core/error.hpp>

namespace tessera {

Shape Block::shape() const {
  Shape s = Shape::filled(begin.size(), 0);
  for (int64_t d = 0; d < begin.size(); ++d) s[d] = std::max<int64_t>(end[d] - begin[d], 0);
  return s;
}

Block Block::intersect(const Block& other) const {
  Block out{begin, end};
  for (int64_t d = 0; d < begin.size(); ++d) {
    out.begin[d] = std::max(begin[d], other.begin[d]);
    out.end[d] = std::max(out.begin[d], std::min(end[d], other.end[d]));
  }
  return out;
}

std::string Block::to_string() const {
  std::ostringstream out;
  out << '[';
  for (int64_t d = 0; d < begin.size(); ++d) out << (d ? ", " : "") << begin[d] << ':' << end[d];
  out << ']';
  return out.str();
}

int64_t piece_of(const MeshSpec& mesh, const std::vector<int64_t>& order, const std::vector<int64_t>& coordinate) {
  int64_t piece = 0;
  const Shape& sizes = mesh.shape();  // inline: the planner calls this per class of ranks
  for (int64_t m : order) piece = piece * sizes[m] + coordinate[static_cast<size_t>(m)];
  return piece;
}

std::vector<int64_t> piece_coordinate(const MeshSpec& mesh, const std::vector<int64_t>& order, int64_t piece) {
  std::vector<int64_t> coordinate(static_cast<size_t>(mesh.ndim()), 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    coordinate[static_cast<size_t>(*it)] = piece % mesh.size(*it);
    piece /= mesh.size(*it);
  }
  return coordinate;
}

std::vector<int64_t> pieces_from_local_shapes(const MeshSpec& mesh, const std::vector<std::vector<int64_t>>& shapes,
                                              const std::vector<int64_t>& order, int64_t dim) {
  int64_t count = 1;
  for (int64_t m : order) count *= mesh.size(m);
  std::vector<int64_t> all_dims(static_cast<size_t>(mesh.ndim()));
  for (int64_t m = 0; m < mesh.ndim(); ++m) all_dims[static_cast<size_t>(m)] = m;
  std::vector<int64_t> pieces;
  pieces.reserve(static_cast<size_t>(count));
  for (int64_t p = 0; p < count; ++p) {
    // ranks() is row-major over the grid: the holder's position is its coordinate's flat index.
    const int64_t position = piece_of(mesh, all_dims, piece_coordinate(mesh, order, p));
    pieces.push_back(shapes[static_cast<size_t>(position)][static_cast<size_t>(dim)]);
  }
  return pieces;
}

std::vector<int64_t> chunk_sizes(int64_t length, const std::vector<int64_t>& splits) {
  std::vector<int64_t> pieces{length};
  for (int64_t k : splits) {
    std::vector<int64_t> next;
    next.reserve(pieces.size() * static_cast<size_t>(k));
    for (int64_t p : pieces) {
      const int64_t c = (p + k - 1) / k;
      for (int64_t j = 0; j < k; ++j) next.push_back(std::clamp<int64_t>(p - j * c, 0, c));
    }
    pieces = std::move(next);
  }
  return pieces;
}

namespace {

size_t compute_hash(const Layout& layout) {
  size_t h = std::hash<tessera::MeshSpec>{}(layout.mesh());
  const auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int64_t s : layout.global_shape()) mix(std::hash<int64_t>{}(s));
  mix(static_cast<size_t>(layout.dtype()));
  for (const auto& p : layout.placements()) mix(std::hash<tessera::Placement>{}(p));
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    for (int64_t m : layout.shard_order(d)) mix(std::hash<int64_t>{}(m));
    // Chunk pieces follow from the shape and the order; only explicit ones add to the hash.
    mix(layout.has_explicit_sizes(d) ? 1 : 0);
    if (layout.has_explicit_sizes(d))
      for (int64_t s : layout.piece_sizes(d)) mix(std::hash<int64_t>{}(s));
  }
  return h;
}

std::string describe(const Shape& shape, DType dtype, const MeshSpec& mesh, const Placements& placements) {
  return shape.to_string() + " " + std::string(name(dtype)) + " on " + mesh.to_string() + " as " +
         tessera::to_string(placements);
}

}  // namespace

Layout::Layout(Shape global_shape, DType dtype, MeshSpec mesh, Placements placements, ShardOrder shard_order,
               ShardSizes sizes) {
  auto data = std::make_shared<Data>();
  Data& l = *data;
  l.global_shape = std::move(global_shape);
  l.dtype = dtype;
  l.mesh = std::move(mesh);
  l.placements = std::move(placements);
  const int64_t nd = l.global_shape.size();
  // Descriptions are built only when a check fails: the dispatcher constructs many layouts per miss.
  const auto text = [&] { return describe(l.global_shape, l.dtype, l.mesh, l.placements); };
  TESSERA_CHECK(static_cast<int64_t>(l.placements.size()) == l.mesh.ndim(), ShardingError, "Layout", "layout ", text(),
                " has ", l.placements.size(), " placements for a mesh of ", l.mesh.ndim(), " dims");
  for (int64_t s : l.global_shape) TESSERA_CHECK(s >= 0, ShardingError, "Layout", "negative size in layout ", text());
  l.orders.assign(static_cast<size_t>(nd), {});
  for (int64_t m = 0; m < l.mesh.ndim(); ++m) {
    auto* shard = std::get_if<Shard>(&l.placements[static_cast<size_t>(m)]);
    if (!shard) continue;
    TESSERA_CHECK(shard->dim >= -nd && shard->dim < nd, ShardingError, "Layout", "shard dim ", shard->dim,
                  " of mesh dim ", m, " out of range in layout ", text(), "; the tensor has ", nd, " dims");
    if (shard->dim < 0) shard->dim += nd;
    l.orders[static_cast<size_t>(shard->dim)].push_back(m);
  }
  for (auto& [dim, order] : shard_order) {
    TESSERA_CHECK(dim >= 0 && dim < nd, ShardingError, "Layout", "shard order for tensor dim ", dim,
                  " out of range in layout ", text());
    std::vector<int64_t> given = order, expected = l.orders[static_cast<size_t>(dim)];
    std::sort(given.begin(), given.end());
    TESSERA_CHECK(given == expected, ShardingError, "Layout", "shard order ", Shape(order).to_string(),
                  " for tensor dim ", dim, " must list exactly the mesh dims sharding it, ",
                  Shape(expected).to_string(), ", in layout ", text());
    l.orders[static_cast<size_t>(dim)] = order;
  }
  l.counts = DimVector::filled(nd, 1);
  for (int64_t d = 0; d < nd; ++d) {
    int64_t count = 1;
    for (int64_t m : l.orders[static_cast<size_t>(d)]) count *= l.mesh.shape()[m];
    l.counts[d] = count;
    const auto it = sizes.find(d);
    if (it == sizes.end()) continue;  // chunk semantics: pieces in closed form, never stored
    std::vector<int64_t> splits;
    for (int64_t m : l.orders[static_cast<size_t>(d)]) splits.push_back(l.mesh.shape()[m]);
    TESSERA_CHECK(!splits.empty(), ShardingError, "Layout", "explicit sizes for tensor dim ", d,
                  ", which is not sharded, in layout ", text());
    const std::vector<int64_t>& pieces = it->second;
    TESSERA_CHECK(static_cast<int64_t>(pieces.size()) == count, ShardingError, "Layout", "explicit sizes ",
                  Shape(pieces).to_string(), " for tensor dim ", d, " have ", pieces.size(), " entries; expected ",
                  count, " (one per piece) in layout ", text());
    int64_t total = 0;
    for (int64_t s : pieces) {
      TESSERA_CHECK(s >= 0, ShardingError, "Layout", "negative explicit size ", s, " for tensor dim ", d,
                    " in layout ", text());
      total += s;
    }
    TESSERA_CHECK(total == l.global_shape[d], ShardingError, "Layout", "explicit sizes ", Shape(pieces).to_string(),
                  " for tensor dim ", d, " add up to ", total, " but the dim has size ", l.global_shape[d],
                  " in layout ", text());
    // Sizes equal to chunk semantics are the default layout, not an explicit one.
    if (pieces == chunk_sizes(l.global_shape[d], splits)) continue;
    if (l.pieces.empty()) {
      l.pieces.resize(static_cast<size_t>(nd));
      l.starts.resize(static_cast<size_t>(nd));
    }
    l.pieces[static_cast<size_t>(d)] = pieces;
    auto& starts = l.starts[static_cast<size_t>(d)];
    starts.assign(pieces.size() + 1, 0);
    for (size_t i = 0; i < pieces.size(); ++i) starts[i + 1] = starts[i] + pieces[i];
  }
  for (const auto& [dim, ignored] : sizes)
    TESSERA_CHECK(dim >= 0 && dim < nd, ShardingError, "Layout", "explicit sizes for tensor dim ", dim,
                  " out of range in layout ", text());
  data_ = data;
  data->hash = compute_hash(*this);
}

ShardOrder Layout::shard_orders() const {
  ShardOrder orders;
  for (int64_t d = 0; d < ndim(); ++d)
    if (shard_order(d).size() > 1) orders[d] = shard_order(d);
  return orders;
}

ShardSizes Layout::explicit_sizes() const {
  ShardSizes sizes;
  for (int64_t d = 0; d < ndim(); ++d)
    if (has_explicit_sizes(d)) sizes[d] = piece_sizes(d);
  return sizes;
}

bool Layout::has_partial() const {
  return std::any_of(data_->placements.begin(), data_->placements.end(), [](const Placement& p) { return is_partial(p); });
}

bool Layout::is_replicated() const {
  return std::all_of(data_->placements.begin(), data_->placements.end(), [](const Placement& p) { return is_replicate(p); });
}

Block Layout::block(const std::vector<int64_t>& coordinate) const {
  TESSERA_CHECK(static_cast<int64_t>(coordinate.size()) == data_->mesh.ndim(), ShardingError, "Layout::block",
                "coordinate ", Shape(coordinate).to_string(), " has ", coordinate.size(), " entries for ",
                to_string());
  for (int64_t m = 0; m < data_->mesh.ndim(); ++m)
    TESSERA_CHECK(coordinate[static_cast<size_t>(m)] >= 0 && coordinate[static_cast<size_t>(m)] < data_->mesh.shape()[m],
                  ShardingError, "Layout::block", "coordinate ", Shape(coordinate).to_string(), " out of range for ",
                  to_string());
  Block out{Shape::filled(ndim(), 0), data_->global_shape};
  for (int64_t d = 0; d < ndim(); ++d) {
    const auto& order = data_->orders[static_cast<size_t>(d)];
    if (order.empty()) continue;
    const auto [begin, end] = piece_range(d, piece_of(data_->mesh, order, coordinate));
    out.begin[d] = begin;
    out.end[d] = end;
  }
  return out;
}

std::vector<int64_t> Layout::piece_sizes(int64_t dim) const {
  if (has_explicit_sizes(dim)) return data_->pieces[static_cast<size_t>(dim)];
  std::vector<int64_t> splits;
  for (int64_t m : data_->orders[static_cast<size_t>(dim)]) splits.push_back(data_->mesh.shape()[m]);
  return chunk_sizes(data_->global_shape[dim], splits);
}

std::pair<int64_t, int64_t> Layout::piece_range(int64_t dim, int64_t piece) const {
  const auto d = static_cast<size_t>(dim);
  if (has_explicit_sizes(dim)) {
    const auto& starts = data_->starts[d];
    return {starts[static_cast<size_t>(piece)], starts[static_cast<size_t>(piece) + 1]};
  }
  // An even split is a grid of one size (the planner's common case, on every rank class).
  const int64_t size = data_->global_shape[dim], count = data_->counts[dim];
  if (size % count == 0) return {piece * (size / count), (piece + 1) * (size / count)};
  // Nested chunks: the piece's digit at each level (mixed radix, the first split major) picks a
  // chunk of the piece chosen so far.
  int64_t begin = 0, length = data_->global_shape[dim], place = data_->counts[dim];
  for (int64_t m : data_->orders[d]) {
    const int64_t k = data_->mesh.shape()[m];
    place /= k;
    const int64_t digit = (piece / place) % k;
    const int64_t c = (length + k - 1) / k;
    const int64_t lo = std::min(digit * c, length), hi = std::min(lo + c, length);
    begin += lo;
    length = hi - lo;
  }
  return {begin, begin + length};
}

int64_t Layout::max_piece_size(int64_t dim) const {
  const auto d = static_cast<size_t>(dim);
  if (has_explicit_sizes(dim)) {
    const auto& pieces = data_->pieces[d];
    return pieces.empty() ? 0 : *std::max_element(pieces.begin(), pieces.end());
  }
  // The first chunk at every level is a largest one.
  const auto [begin, end] = piece_range(dim, 0);
  return end - begin;
}

int64_t Layout::max_block_numel() const {
  // A mesh dim shards one tensor dim at most, so the dims' pieces vary independently.
  int64_t most = 1;
  for (int64_t d = 0; d < ndim(); ++d) most *= max_piece_size(d);
  return most;
}

DimVector Layout::global_offset(const std::vector<int64_t>& coordinate) const {
  const Block b = block(coordinate);
  DimVector offset = b.begin;
  for (int64_t d = 0; d < ndim(); ++d)
    if (!data_->orders[static_cast<size_t>(d)].empty() && b.end[d] == b.begin[d]) offset[d] = data_->global_shape[d];
  return offset;
}

Block Layout::block_of_rank(int world_rank) const { return block(data_->mesh.coordinate_of(world_rank)); }

Layout Layout::with_placements(Placements placements) const {
  const int64_t nd = ndim();
  // The mesh dims that will shard each tensor dim, ascending (the default order). Out-of-range
  // shard dims are left to the constructor, which names them.
  std::vector<DimVector> theirs(static_cast<size_t>(nd));
  for (int64_t m = 0; m < static_cast<int64_t>(placements.size()); ++m)
    if (const auto* s = std::get_if<Shard>(&placements[static_cast<size_t>(m)])) {
      const int64_t d = s->dim < 0 ? s->dim + nd : s->dim;
      if (d >= 0 && d < nd) theirs[static_cast<size_t>(d)].push_back(m);
    }
  ShardOrder order;
  ShardSizes sizes;
  for (int64_t d = 0; d < nd; ++d) {
    const std::vector<int64_t>& mine = data_->orders[static_cast<size_t>(d)];
    const DimVector& now = theirs[static_cast<size_t>(d)];
    const bool explicit_pieces = has_explicit_sizes(d);
    // Nothing to carry for a dim in the default order with chunk pieces (the common case).
    if (!explicit_pieces && std::is_sorted(mine.begin(), mine.end())) continue;
    std::vector<int64_t> a = mine;
    std::sort(a.begin(), a.end());
    if (a == now.vec()) {
      if (a.empty()) continue;
      order[d] = mine;
      if (explicit_pieces) sizes[d] = data_->pieces[static_cast<size_t>(d)];
      continue;
    }
    if (!explicit_pieces) continue;
    // Explicit pieces survive a mesh dim sharding them further or no longer: a mesh dim that
    // joins goes innermost and chunks every piece; mesh dims leaving from the inner end merge
    // their pieces back. (S(0) sizes [3, 0, 5], R) -> (S(0), S(0)) -> (S(0), R) keeps [3, 0, 5].
    const auto& pieces = data_->pieces[static_cast<size_t>(d)];
    std::vector<int64_t> joining, kept;
    for (int64_t m : now)
      if (std::find(mine.begin(), mine.end(), m) == mine.end()) joining.push_back(m);
    for (int64_t m : mine)
      if (std::find(now.begin(), now.end(), m) != now.end()) kept.push_back(m);
    const bool leaving_inner = std::equal(kept.begin(), kept.end(), mine.begin());
    if (!joining.empty() && kept == mine) {
      std::vector<int64_t> splits;
      for (int64_t m : joining) splits.push_back(data_->mesh.shape()[m]);
      std::vector<int64_t> chunked;
      for (int64_t piece : pieces)
        for (int64_t s : chunk_sizes(piece, splits)) chunked.push_back(s);
      order[d] = mine;
      order[d].insert(order[d].end(), joining.begin(), joining.end());
      sizes[d] = std::move(chunked);
    } else if (joining.empty() && leaving_inner && !kept.empty()) {
      int64_t merged = 1;
      for (size_t i = kept.size(); i < mine.size(); ++i) merged *= data_->mesh.shape()[mine[i]];
      std::vector<int64_t> summed(pieces.size() / static_cast<size_t>(merged), 0);
      for (size_t i = 0; i < pieces.size(); ++i) summed[i / static_cast<size_t>(merged)] += pieces[i];
      order[d] = kept;
      sizes[d] = std::move(summed);
    }
  }
  return Layout(data_->global_shape, data_->dtype, data_->mesh, std::move(placements), std::move(order),
                std::move(sizes));
}

Layout::Layout() {
  static const auto empty = [] {
    auto data = std::make_shared<Data>();
    data->hash = std::hash<MeshSpec>{}(data->mesh);
    return std::shared_ptr<const Data>(std::move(data));
  }();
  data_ = empty;
}

Layout Layout::with_dtype(DType dtype) const {
  if (dtype == data_->dtype) return *this;
  auto data = std::make_shared<Data>(*data_);
  data->dtype = dtype;
  Layout out;
  out.data_ = data;
  data->hash = compute_hash(out);
  return out;
}

std::string Layout::to_string() const {
  std::string text = describe(data_->global_shape, data_->dtype, data_->mesh, data_->placements);
  std::string orders, sizes;
  for (int64_t d = 0; d < ndim(); ++d) {
    const auto& order = data_->orders[static_cast<size_t>(d)];
    if (!std::is_sorted(order.begin(), order.end()))
      orders.append(orders.empty() ? "" : ", ").append(std::to_string(d) + ": " + Shape(order).to_string());
    if (has_explicit_sizes(d))
      sizes.append(sizes.empty() ? "" : ", ").append(std::to_string(d) + ": " + Shape(data_->pieces[static_cast<size_t>(d)]).to_string());
  }
  if (!orders.empty()) text += " order {" + orders + "}";
  if (!sizes.empty()) text += " sizes {" + sizes + "}";
  return text;
}

}  // namespace tessera

size_t std::hash<tessera::Layout>::operator()(const tessera::Layout& layout) const noexcept { return layout.hash(); }
