#pragma once
// The layouts the planner's oracle tests sweep on one mesh and shape.
#include <algorithm>
#include <vector>

#include <tessera/sharding/layout.hpp>

namespace tessera::testing {

/// Every placement of `choices` on every mesh dim; for each, the reversed shard order of a dim
/// split twice, and explicit sizes (chunk sizes reversed) on a split dim 0 where they differ.
inline std::vector<Layout> layout_sweep(const MeshSpec& mesh, const Shape& shape, const std::vector<Placement>& choices) {
  std::vector<Layout> out;
  const auto n = static_cast<int64_t>(choices.size());
  int64_t combos = 1;
  for (int64_t i = 0; i < mesh.ndim(); ++i) combos *= n;
  for (int64_t c = 0; c < combos; ++c) {
    Placements p;
    for (int64_t i = 0, rest = c; i < mesh.ndim(); ++i, rest /= n) p.push_back(choices[static_cast<size_t>(rest % n)]);
    const Layout plain(shape, DType::f32, mesh, p);
    out.push_back(plain);
    for (int64_t dim = 0; dim < shape.size(); ++dim) {
      const auto& order = plain.shard_order(dim);
      if (order.size() >= 2) {
        out.emplace_back(shape, DType::f32, mesh, p, ShardOrder{{dim, {order.rbegin(), order.rend()}}});
        break;
      }
    }
    if (!plain.shard_order(0).empty()) {
      auto sizes = plain.piece_sizes(0);
      std::reverse(sizes.begin(), sizes.end());
      if (sizes != plain.piece_sizes(0)) out.emplace_back(shape, DType::f32, mesh, p, ShardOrder{}, ShardSizes{{0, sizes}});
    }
  }
  return out;
}

}  // namespace tessera::testing
