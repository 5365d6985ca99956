#include <tessera/sharding/mesh_move.hpp>

#include <algorithm>

namespace tessera {

Layout layout_on_mesh(const Layout& src, const MeshSpec& dst) {
  const MeshSpec& from = src.mesh();
  // The mesh dim of `src` each mesh dim of `dst` carries (by axis name), or -1.
  std::vector<int64_t> carried(static_cast<size_t>(dst.ndim()), -1);
  Placements placements(static_cast<size_t>(dst.ndim()), Replicate{});
  for (int64_t m = 0; m < dst.ndim(); ++m) {
    const auto& names = from.names();
    const auto it = std::find(names.begin(), names.end(), dst.names()[static_cast<size_t>(m)]);
    if (it == names.end()) continue;
    const auto source = static_cast<size_t>(it - names.begin());
    if (is_partial(src.placements()[source])) continue;
    carried[static_cast<size_t>(m)] = static_cast<int64_t>(source);
    placements[static_cast<size_t>(m)] = src.placements()[source];
  }
  // A tensor dim whose every splitting mesh dim is carried keeps its order (renumbered) and sizes.
  ShardOrder orders;
  ShardSizes sizes;
  for (int64_t d = 0; d < src.ndim(); ++d) {
    const auto& order = src.shard_order(d);
    if (order.size() < 2 && !src.has_explicit_sizes(d)) continue;  // the default order is the same
    std::vector<int64_t> renumbered;
    for (int64_t m : order) {
      const auto at = std::find(carried.begin(), carried.end(), m);
      if (at == carried.end()) break;
      renumbered.push_back(at - carried.begin());
    }
    if (renumbered.size() != order.size()) continue;
    orders[d] = renumbered;
    if (src.has_explicit_sizes(d)) sizes[d] = src.piece_sizes(d);
  }
  return Layout(src.global_shape(), src.dtype(), dst, std::move(placements), std::move(orders), std::move(sizes));
}

}  // namespace tessera
