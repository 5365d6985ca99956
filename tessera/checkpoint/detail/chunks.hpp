#pragma once
// How a DTensor maps onto a Zarr chunk grid: the chunk-aligned layout save moves it to (each
// sharded dim cut into torch.chunk pieces of one size c, so that the piece with mixed-radix
// index i over its mesh dims is chunk i), which rank writes which chunk, and the chunk's bytes
// (edge chunks padded to the full chunk shape, as Zarr stores them).
#include <cstdint>
#include <optional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {
namespace checkpoint::detail {

struct ChunkPlan {
  Layout layout;                // chunk-aligned
  Shape chunks;                 // chunk shape
  std::vector<std::vector<int64_t>> cut_by;  // per tensor dim, the mesh dims cutting it, outermost first (none: whole)
};

/// The chunk-aligned layout nearest `layout`: Partial reduced; explicit piece sizes replaced by
/// torch.chunk sizes on the same mesh dims; a split over several mesh dims kept when its pieces
/// are regular (one size, then one shorter piece at most, then empty ones), else left whole.
ChunkPlan chunk_plan(const Layout& layout);
/// The grid index of the chunk the rank at `coordinate` writes, or nullopt: a replica (not
/// coordinate 0 on a mesh dim that cuts nothing) or an empty piece.
std::optional<std::vector<int64_t>> chunk_index(const ChunkPlan& plan, const std::vector<int64_t>& coordinate);
/// `block` in a zero tensor of the chunk shape (contiguous), at the origin.
Tensor padded_chunk(const Tensor& block, const Shape& chunks);

}  // namespace checkpoint::detail
}  // namespace tessera
