#include <tessera/sharding/block_exchange.hpp>

#include <algorithm>

#include <tessera/sharding/detail/rank_classes.hpp>

#include <tessera/core/error.hpp>

namespace tessera {

std::string Transfer::to_string() const {
  return "rank " + std::to_string(src_rank) + " -> rank " + std::to_string(dst_rank) + ": " + block.to_string();
}

namespace {

void check_exchangeable(const Layout& src, const Layout& dst, const char* op) {
  TESSERA_CHECK(src.global_shape() == dst.global_shape(), ShardingError, op, "global shapes differ: ",
                src.to_string(), " -> ", dst.to_string());
  TESSERA_CHECK(!src.has_partial(), ShardingError, op, "source ", src.to_string(),
                " holds Partial values, which need a reduction, not a block exchange");
  TESSERA_CHECK(!dst.has_partial(), ShardingError, op, "destination ", dst.to_string(),
                " is Partial; a redistribution cannot produce Partial values");
}

// The mesh dims of `layout` that split no tensor dim: the replicas of a block differ only there.
std::vector<int64_t> replica_dims(const Layout& layout) {
  std::vector<int64_t> dims;
  for (int64_t m = 0; m < layout.mesh().ndim(); ++m)
    if (!is_shard(layout.placements()[static_cast<size_t>(m)])) dims.push_back(m);
  return dims;
}

int64_t product_of_sizes(const MeshSpec& mesh, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t m : dims) n *= mesh.shape()[m];
  return n;
}

// Sets the coordinates of `dims` to the row-major digits of `index`.
void set_digits(const MeshSpec& mesh, const std::vector<int64_t>& dims, int64_t index, std::vector<int64_t>& coordinate) {
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    const int64_t k = mesh.shape()[*it];
    coordinate[static_cast<size_t>(*it)] = index % k;
    index /= k;
  }
}

int64_t digits_of(const MeshSpec& mesh, const std::vector<int64_t>& dims, const std::vector<int64_t>& coordinate) {
  int64_t index = 0;
  for (int64_t m : dims) index = index * mesh.shape()[m] + coordinate[static_cast<size_t>(m)];
  return index;
}

// Per tensor dim, the pieces of `layout` whose overlap with `box` is not empty.
std::vector<std::vector<int64_t>> overlapping_pieces(const Layout& layout, const Block& box) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(layout.ndim()));
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const detail::PieceSpan span = detail::pieces_overlapping(layout, d, box.begin[d], box.end[d]);
    for (int64_t p = span.first; p < span.last; ++p) {
      const auto [b, e] = layout.piece_range(d, p);
      if (b < e) out[static_cast<size_t>(d)].push_back(p);
    }
  }
  return out;
}

// Calls fn(pieces) for every choice of one piece per tensor dim.
template <class F>
void for_each_combination(const std::vector<std::vector<int64_t>>& choices, F&& fn) {
  for (const auto& c : choices)
    if (c.empty()) return;
  std::vector<size_t> at(choices.size(), 0);
  std::vector<int64_t> pick(choices.size());
  for (;;) {
    for (size_t d = 0; d < choices.size(); ++d) pick[d] = choices[d][at[d]];
    fn(pick);
    size_t d = choices.size();
    while (d > 0 && ++at[d - 1] == choices[d - 1].size()) at[--d] = 0;
    if (d == 0) return;
  }
}

// The coordinate (replica dims at 0) holding the pieces `pick` of `layout`.
std::vector<int64_t> holder_coordinate(const Layout& layout, const std::vector<int64_t>& pick) {
  std::vector<int64_t> coordinate(static_cast<size_t>(layout.mesh().ndim()), 0);
  for (int64_t d = 0; d < layout.ndim(); ++d)
    set_digits(layout.mesh(), layout.shard_order(d), pick[static_cast<size_t>(d)], coordinate);
  return coordinate;
}

Block box_of(const Layout& layout, const std::vector<int64_t>& pick) {
  Block b{Shape::filled(layout.ndim(), 0), layout.global_shape()};
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const auto [begin, end] = layout.piece_range(d, pick[static_cast<size_t>(d)]);
    b.begin[d] = begin;
    b.end[d] = end;
  }
  return b;
}

// True when world rank `r` holds, in src, the block of pieces `pick`.
bool holds(const Layout& src, int r, const std::vector<int64_t>& pick) {
  if (!src.mesh().contains(r)) return false;
  const auto& coordinate = src.mesh().coordinate_of(r);
  for (int64_t d = 0; d < src.ndim(); ++d)
    if (piece_of(src.mesh(), src.shard_order(d), coordinate) != pick[static_cast<size_t>(d)]) return false;
  return true;
}

// What world rank `r` of dst's mesh receives (and copies from itself).
void receives_of(const Layout& src, const Layout& dst, int r, std::vector<Transfer>& out) {
  const Block want = dst.block_of_rank(r);
  if (want.numel() == 0) return;
  const std::vector<int64_t> replicas = replica_dims(src);
  const int64_t count = product_of_sizes(src.mesh(), replicas);
  for_each_combination(overlapping_pieces(src, want), [&](const std::vector<int64_t>& pick) {
    int from = r;
    if (!holds(src, r, pick)) {
      std::vector<int64_t> coordinate = holder_coordinate(src, pick);
      set_digits(src.mesh(), replicas, r % count, coordinate);
      from = src.mesh().rank_at(coordinate);
    }
    out.push_back(Transfer{from, r, box_of(src, pick).intersect(want)});
  });
}

// What world rank `s` of src's mesh sends to other ranks.
void sends_of(const Layout& src, const Layout& dst, int s, std::vector<Transfer>& out) {
  const Block held = src.block_of_rank(s);
  if (held.numel() == 0) return;
  const auto& mine = src.mesh().coordinate_of(s);
  std::vector<int64_t> pick(static_cast<size_t>(src.ndim()));
  for (int64_t d = 0; d < src.ndim(); ++d) pick[static_cast<size_t>(d)] = piece_of(src.mesh(), src.shard_order(d), mine);
  const std::vector<int64_t> replicas = replica_dims(src), dst_replicas = replica_dims(dst);
  const int64_t count = product_of_sizes(src.mesh(), replicas);
  const int64_t my_replica = digits_of(src.mesh(), replicas, mine);
  const int64_t dst_copies = product_of_sizes(dst.mesh(), dst_replicas);
  for_each_combination(overlapping_pieces(dst, held), [&](const std::vector<int64_t>& dst_pick) {
    std::vector<int64_t> coordinate = holder_coordinate(dst, dst_pick);
    for (int64_t copy = 0; copy < dst_copies; ++copy) {
      set_digits(dst.mesh(), dst_replicas, copy, coordinate);
      const int r = dst.mesh().rank_at(coordinate);
      if (r == s || holds(src, r, pick) || r % count != my_replica) continue;
      out.push_back(Transfer{s, r, held.intersect(box_of(dst, dst_pick))});
    }
  });
}

}  // namespace

std::vector<Transfer> exchange_transfers(const Layout& src, const Layout& dst, int world_rank) {
  check_exchangeable(src, dst, "exchange_transfers");
  std::vector<Transfer> transfers;
  if (dst.mesh().contains(world_rank)) receives_of(src, dst, world_rank, transfers);
  if (src.mesh().contains(world_rank)) sends_of(src, dst, world_rank, transfers);
  return transfers;
}

std::vector<Transfer> direct_exchange(const Layout& src, const Layout& dst) {
  check_exchangeable(src, dst, "direct_exchange");
  std::vector<Transfer> transfers;
  for (int r : dst.mesh().ranks()) receives_of(src, dst, r, transfers);
  return transfers;
}

int64_t receive_lower_bound(const Layout& src, const Layout& dst, int world_rank) {
  check_exchangeable(src, dst, "receive_lower_bound");
  if (!dst.mesh().contains(world_rank)) return 0;
  const Block want = dst.block_of_rank(world_rank);
  int64_t held = 0;
  if (src.mesh().contains(world_rank)) held = src.block_of_rank(world_rank).intersect(want).numel();
  return (want.numel() - held) * itemsize(dst.dtype());
}

}  // namespace tessera
