#pragma once
// How a DTensor maps onto a Zarr chunk grid: the chunk-aligned layout save moves it to (each
// sharded dim cut by one mesh dim, torch.chunk pieces: chunk size ceil(L / k), so block i is
// chunk i), which rank writes which chunk, and the chunk's bytes (edge chunks padded to the full
// chunk shape, as Zarr stores them).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {
namespace checkpoint::detail {

struct ChunkPlan {
  Layout layout;                // chunk-aligned
  Shape chunks;                 // chunk shape
  std::vector<int64_t> cut_by;  // per tensor dim, the mesh dim cutting it (-1: whole)
};

/// The chunk-aligned layout nearest `layout`: Partial reduced; a dim split by several mesh dims
/// or into explicit sizes left whole; every other split kept.
ChunkPlan chunk_plan(const Layout& layout);
/// The grid index of the chunk the rank at `coordinate` writes, or nullopt: a replica (not
/// coordinate 0 on a mesh dim that cuts nothing) or an empty piece.
std::optional<std::vector<int64_t>> chunk_index(const ChunkPlan& plan, const std::vector<int64_t>& coordinate);
/// `block` in a zero tensor of the chunk shape (contiguous), at the origin.
Tensor padded_chunk(const Tensor& block, const Shape& chunks);
/// Throws ValueError naming `op` unless `key` is a usable array name.
void check_key(const std::string& key, const char* op);

/// Every rank's `mine`, concatenated in rank order, on every rank of the world. Collective.
std::string all_gather_text(const std::string& mine);

/// Tests only: the calling rank's save throws after writing `chunks` more arrays' chunks
/// (negative: never).
void set_save_fault(int64_t chunks);
void save_fault_point();

}  // namespace checkpoint::detail
}  // namespace tessera
