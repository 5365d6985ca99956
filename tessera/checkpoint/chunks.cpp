#include <tessera/checkpoint/detail/chunks.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>

namespace tessera::checkpoint::detail {

namespace {

// Whether pieces in splitting order form a regular grid: all of one size c, then at most one
// shorter piece, then empty ones (torch.chunk's pieces along one mesh dim always do; nested
// splits do when the outer pieces divide evenly).
bool regular(const std::vector<int64_t>& pieces) {
  const int64_t c = pieces.front();
  size_t i = 0;
  while (i < pieces.size() && pieces[i] == c) ++i;
  if (i < pieces.size() && pieces[i] < c) ++i;
  while (i < pieces.size() && pieces[i] == 0) ++i;
  return i == pieces.size();
}

}  // namespace

ChunkPlan chunk_plan(const Layout& layout) {
  // Partial reduced; explicit piece sizes replaced by torch.chunk ones on the same mesh dims (the
  // planner moves the rows at the boundaries); a nested split kept when its pieces are regular,
  // else left whole.
  Placements placements = layout.placements();
  for (Placement& p : placements)
    if (is_partial(p)) p = Replicate{};
  ShardOrder orders = layout.shard_orders();
  Layout aligned(layout.global_shape(), layout.dtype(), layout.mesh(), placements, orders);
  bool changed = false;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    if (aligned.shard_order(d).empty() || regular(aligned.piece_sizes(d))) continue;
    for (int64_t m : aligned.shard_order(d)) placements[static_cast<size_t>(m)] = Replicate{};
    orders.erase(d);
    changed = true;
  }
  if (changed) aligned = Layout(layout.global_shape(), layout.dtype(), layout.mesh(), placements, orders);

  ChunkPlan plan{aligned, Shape(), std::vector<std::vector<int64_t>>(static_cast<size_t>(layout.ndim()))};
  DimVector chunks;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const std::vector<int64_t>& order = aligned.shard_order(d);
    plan.cut_by[static_cast<size_t>(d)] = order;
    const int64_t chunk = order.empty() ? layout.global_shape()[d] : aligned.piece_sizes(d).front();
    chunks.push_back(std::max<int64_t>(chunk, 1));  // Zarr chunk sizes are positive
  }
  plan.chunks = Shape(chunks);
  return plan;
}

std::optional<std::vector<int64_t>> chunk_index(const ChunkPlan& plan, const std::vector<int64_t>& coordinate) {
  std::vector<bool> cuts(coordinate.size(), false);
  for (const auto& order : plan.cut_by)
    for (int64_t m : order) cuts[static_cast<size_t>(m)] = true;
  for (size_t m = 0; m < coordinate.size(); ++m)
    if (coordinate[m] != 0 && !cuts[m]) return std::nullopt;  // a replica
  if (plan.layout.block(coordinate).numel() == 0) return std::nullopt;
  std::vector<int64_t> index;
  for (const auto& order : plan.cut_by) {  // the piece's mixed-radix index, outermost split first
    int64_t i = 0;
    for (int64_t m : order) i = i * plan.layout.mesh().size(m) + coordinate[static_cast<size_t>(m)];
    index.push_back(i);
  }
  return index;
}

Tensor padded_chunk(const Tensor& block, const Shape& chunks) {
  if (block.shape() == chunks) return block.contiguous();
  Tensor chunk = zeros(chunks, block.dtype());
  Tensor region = chunk;
  for (int64_t d = 0; d < block.ndim(); ++d) region = region.narrow(d, 0, block.shape()[d]);
  region.copy_(block);
  return chunk;
}

}  // namespace tessera::checkpoint::detail
