#include <tessera/sharding/view_rules.hpp>

#include <algorithm>

namespace tessera {

ShardSizes explicit_sizes(const Layout& layout) {
  ShardSizes sizes;
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (layout.has_explicit_sizes(d)) sizes[d] = layout.piece_sizes(d);
  return sizes;
}

ShardOrder shard_orders(const Layout& layout) {
  ShardOrder orders;
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (!layout.shard_order(d).empty()) orders[d] = layout.shard_order(d);
  return orders;
}

OpProposal permute_proposal(const Layout& input, const std::vector<int64_t>& dims) {
  std::vector<int64_t> inverse(dims.size());
  for (size_t j = 0; j < dims.size(); ++j) inverse[static_cast<size_t>(dims[j])] = static_cast<int64_t>(j);
  Placements placements = input.placements();
  for (auto& p : placements)
    if (auto* s = std::get_if<Shard>(&p)) s->dim = inverse[static_cast<size_t>(s->dim)];
  Shape shape = input.global_shape();
  ShardOrder orders;
  ShardSizes sizes;
  for (size_t j = 0; j < dims.size(); ++j) {
    const int64_t d = dims[j];
    shape[static_cast<int64_t>(j)] = input.global_shape()[d];
    if (!input.shard_order(d).empty()) orders[static_cast<int64_t>(j)] = input.shard_order(d);
    if (input.has_explicit_sizes(d)) sizes[static_cast<int64_t>(j)] = input.piece_sizes(d);
  }
  return {{input}, Layout(shape, input.dtype(), input.mesh(), placements, orders, sizes)};
}

namespace {

struct DimGroup {
  int64_t in_begin, in_end, out_begin, out_end;
};

// Runs of input and result dims with equal products (unit dims left over form groups alone).
std::vector<DimGroup> dim_groups(const Shape& in, const Shape& out) {
  std::vector<DimGroup> groups;
  int64_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    if (i < in.size() && j < out.size()) {
      DimGroup g{i, 0, j, 0};
      int64_t pi = in[i++], pj = out[j++];
      while (pi != pj) {
        if (pi < pj) pi *= in[i++];
        else pj *= out[j++];
      }
      g.in_end = i;
      g.out_end = j;
      groups.push_back(g);
    } else if (i < in.size()) {
      groups.push_back({i, i + 1, j, j});
      ++i;
    } else {
      groups.push_back({i, i, j, j + 1});
      ++j;
    }
  }
  return groups;
}

int64_t first_non_unit(const Shape& shape, int64_t begin, int64_t end) {
  for (int64_t d = begin; d < end; ++d)
    if (shape[d] != 1) return d;
  return -1;
}

int64_t product(const Shape& shape, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t d = begin; d < end; ++d) p *= shape[d];
  return p;
}

}  // namespace

OpProposal reshape_proposal(const Layout& input, const Shape& shape) {
  const Shape& in = input.global_shape();
  Placements required = input.placements();
  if (in == shape) return {{input}, input};
  const int64_t mesh_ndim = input.mesh().ndim();
  if (in.numel() == 0) {  // nothing to keep sharded; no bytes to move either
    for (auto& p : required)
      if (is_shard(p)) p = Replicate{};
    return {{input.with_placements(required)}, Layout(shape, input.dtype(), input.mesh(), required)};
  }
  const auto groups = dim_groups(in, shape);
  std::vector<int64_t> target(static_cast<size_t>(in.size()), -1);  // result dim of each mappable input dim
  std::vector<std::vector<int64_t>> pieces(static_cast<size_t>(in.size()));
  for (const auto& g : groups) {
    const int64_t lead_in = first_non_unit(in, g.in_begin, g.in_end);
    const int64_t lead_out = first_non_unit(shape, g.out_begin, g.out_end);
    if (lead_in < 0 && lead_out < 0) {
      // Unit dims on both sides ([1, ...] -> [1, ...]): the i-th keeps its shard as the i-th
      // result dim, with the same pieces (the one element on one rank).
      for (int64_t i = 0; g.in_begin + i < g.in_end && g.out_begin + i < g.out_end; ++i) {
        const int64_t d = g.in_begin + i;
        if (input.shard_order(d).empty()) continue;
        target[static_cast<size_t>(d)] = g.out_begin + i;
        pieces[static_cast<size_t>(d)] = input.piece_sizes(d);
      }
      continue;
    }
    if (lead_in < 0 || lead_out < 0 || input.shard_order(lead_in).empty()) continue;
    bool others_sharded = false;
    for (int64_t d = g.in_begin; d < g.in_end; ++d)
      others_sharded |= d != lead_in && in[d] != 1 && !input.shard_order(d).empty();  // unit dims replicate alone
    if (others_sharded) continue;
    const int64_t inner_in = product(in, lead_in + 1, g.in_end), inner_out = product(shape, lead_out + 1, g.out_end);
    std::vector<int64_t> mapped;
    bool whole_rows = true;
    for (int64_t p : input.piece_sizes(lead_in)) {
      whole_rows &= (p * inner_in) % inner_out == 0;
      mapped.push_back(p * inner_in / inner_out);
    }
    if (!whole_rows) continue;
    target[static_cast<size_t>(lead_in)] = lead_out;
    pieces[static_cast<size_t>(lead_in)] = std::move(mapped);
  }
  Placements result = required;
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    auto* s = std::get_if<Shard>(&required[static_cast<size_t>(m)]);
    if (!s) continue;
    const int64_t to = target[static_cast<size_t>(s->dim)];
    if (to < 0) {
      required[static_cast<size_t>(m)] = Replicate{};
      result[static_cast<size_t>(m)] = Replicate{};
    } else {
      result[static_cast<size_t>(m)] = Shard{to};
    }
  }
  ShardOrder orders;
  ShardSizes sizes;
  for (int64_t d = 0; d < in.size(); ++d) {
    const int64_t to = target[static_cast<size_t>(d)];
    if (to < 0) continue;
    orders[to] = input.shard_order(d);
    sizes[to] = pieces[static_cast<size_t>(d)];
  }
  return {{input.with_placements(required)}, Layout(shape, input.dtype(), input.mesh(), result, orders, sizes)};
}

OpProposal expand_proposal(const Layout& input, const Shape& shape) {
  const int64_t offset = shape.size() - input.ndim();
  Placements required = input.placements();
  for (auto& p : required)
    if (auto* s = std::get_if<Shard>(&p); s && input.global_shape()[s->dim] == 1 && shape[s->dim + offset] != 1)
      p = Replicate{};
  const Layout needed = input.with_placements(required);
  Placements result = required;
  for (auto& p : result)
    if (auto* s = std::get_if<Shard>(&p)) s->dim += offset;
  ShardOrder orders;
  ShardSizes sizes;
  for (const auto& [d, order] : shard_orders(needed)) orders[d + offset] = order;
  for (const auto& [d, pieces] : explicit_sizes(needed)) sizes[d + offset] = pieces;
  return {{needed}, Layout(shape, input.dtype(), input.mesh(), result, orders, sizes)};
}

OpProposal narrow_proposal(const Layout& input, int64_t dim, int64_t start, int64_t length) {
  Shape shape = input.global_shape();
  shape[dim] = length;
  ShardSizes sizes = explicit_sizes(input);
  if (!input.shard_order(dim).empty()) {
    std::vector<int64_t> clipped;
    int64_t begin = 0;
    for (int64_t p : input.piece_sizes(dim)) {
      clipped.push_back(std::max<int64_t>(0, std::min(begin + p, start + length) - std::max(begin, start)));
      begin += p;
    }
    sizes[dim] = std::move(clipped);
  }
  return {{input}, Layout(shape, input.dtype(), input.mesh(), input.placements(), shard_orders(input), sizes)};
}

}  // namespace tessera
