#include <tessera/mpmd/detail/layout_wire.hpp>

#include <map>

#include <tessera/core/error.hpp>

namespace tessera::mpmd::detail {

namespace {
enum Kind : int64_t { kShard = 0, kReplicate = 1, kPartial = 2 };
}

// [dtype, ndim, shape..., mesh dims, (kind, arg) per mesh dim, per dim: order count, order...,
//  per dim: sizes count (0: chunk), sizes...]
std::vector<int64_t> encode_layout(const Layout& layout) {
  std::vector<int64_t> words{static_cast<int64_t>(layout.dtype()), layout.ndim()};
  for (int64_t d = 0; d < layout.ndim(); ++d) words.push_back(layout.global_shape()[d]);
  words.push_back(static_cast<int64_t>(layout.placements().size()));
  for (const Placement& p : layout.placements()) {
    if (const auto* s = std::get_if<Shard>(&p)) {
      words.insert(words.end(), {kShard, s->dim});
    } else if (const auto* partial = std::get_if<Partial>(&p)) {
      words.insert(words.end(), {kPartial, static_cast<int64_t>(partial->op)});
    } else {
      words.insert(words.end(), {kReplicate, 0});
    }
  }
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const auto& order = layout.shard_order(d);
    words.push_back(static_cast<int64_t>(order.size()));
    words.insert(words.end(), order.begin(), order.end());
  }
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    if (!layout.has_explicit_sizes(d)) {
      words.push_back(0);
      continue;
    }
    const auto& sizes = layout.piece_sizes(d);
    words.push_back(static_cast<int64_t>(sizes.size()));
    words.insert(words.end(), sizes.begin(), sizes.end());
  }
  return words;
}

Layout decode_layout(const std::vector<int64_t>& words, const MeshSpec& mesh) {
  size_t at = 0;
  const auto next = [&]() {
    TESSERA_CHECK(at < words.size(), ShardingError, "stage boundary", "a truncated layout header (", words.size(),
                  " words)");
    return words[at++];
  };
  const auto dtype = static_cast<DType>(next());
  const int64_t ndim = next();
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < ndim; ++d) shape.push_back(next());
  const int64_t mesh_dims = next();
  TESSERA_CHECK(mesh_dims == mesh.ndim(), ShardingError, "stage boundary", "a layout of ", mesh_dims,
                " mesh dims arrived for ", mesh.to_string());
  Placements placements;
  for (int64_t m = 0; m < mesh_dims; ++m) {
    const int64_t kind = next(), arg = next();
    if (kind == kShard)
      placements.push_back(Shard{arg});
    else if (kind == kPartial)
      placements.push_back(Partial{static_cast<ReduceOp>(arg)});
    else
      placements.push_back(Replicate{});
  }
  // A count and as many words, per tensor dim; empty lists are left out of the map.
  const auto per_dim_lists = [&] {
    std::map<int64_t, std::vector<int64_t>> lists;
    for (int64_t d = 0; d < ndim; ++d) {
      const int64_t count = next();
      std::vector<int64_t> list;
      for (int64_t i = 0; i < count; ++i) list.push_back(next());
      if (!list.empty()) lists[d] = std::move(list);
    }
    return lists;
  };
  ShardOrder order = per_dim_lists();
  ShardSizes sizes = per_dim_lists();
  return Layout(Shape(shape), dtype, mesh, std::move(placements), std::move(order), std::move(sizes));
}

}  // namespace tessera::mpmd::detail
