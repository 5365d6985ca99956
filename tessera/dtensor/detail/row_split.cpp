#include <tessera/dtensor/detail/row_split.hpp>

#include <algorithm>

namespace tessera::detail {

std::optional<RowSplit> row_split(const Layout& whole, const Layout& split, int64_t mesh_dim,
                                  const std::vector<int64_t>& coordinate) {
  const auto m = static_cast<size_t>(mesh_dim);
  if (whole.ndim() == 0 || whole.global_shape() != split.global_shape() || whole.mesh() != split.mesh() ||
      m >= whole.placements().size())
    return std::nullopt;
  for (size_t d = 0; d < whole.placements().size(); ++d) {
    if (d == m) continue;
    if (!(whole.placements()[d] == split.placements()[d])) return std::nullopt;
  }
  const Placement& from = whole.placements()[m];
  if (!(is_replicate(from) || is_partial(from)) || !(split.placements()[m] == Placement(Shard{0})))
    return std::nullopt;
  std::vector<int64_t> order = whole.shard_order(0);
  order.push_back(mesh_dim);
  if (split.shard_order(0) != order) return std::nullopt;
  for (int64_t d = 1; d < whole.ndim(); ++d)
    if (whole.shard_order(d) != split.shard_order(d) || whole.piece_sizes(d) != split.piece_sizes(d))
      return std::nullopt;

  const Block block = whole.block(coordinate);
  const Shape shape = block.shape();
  RowSplit out;
  out.row_numel = 1;
  for (int64_t d = 1; d < shape.size(); ++d) out.row_numel *= shape[d];
  const int64_t ranks = whole.mesh().shape()[m];
  std::vector<int64_t> at = coordinate;
  int64_t largest = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    at[m] = r;
    const Block piece = split.block(at);
    out.starts.push_back(piece.begin[0] - block.begin[0]);
    out.counts.push_back(piece.end[0] - piece.begin[0]);
    largest = std::max(largest, out.counts.back());
  }
  out.capacity = largest * out.row_numel;
  return out;
}

}  // namespace tessera::detail
