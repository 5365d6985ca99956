#pragma once
// FSDP's geometry: a layout whose dim 0 is split over one more mesh dim than another's (the
// split last in dim 0's order), so that each rank of that mesh dim holds a run of whole rows of
// the unsplit block. The bucketed all_gather (foreach_all_gather) and reduce_scatter
// (reduce_partials with targets) pack these runs rank by rank into one flat buffer.
#include <cstdint>
#include <optional>
#include <vector>

#include <tessera/sharding/layout.hpp>

namespace tessera::detail {

struct RowSplit {
  int64_t row_numel = 0;        // elements per row of the unsplit block
  std::vector<int64_t> starts;  // per rank along mesh_dim: its first row within the unsplit block
  std::vector<int64_t> counts;  // ... and its number of rows
  int64_t capacity = 0;         // elements of the largest run: every rank's slot in the flat buffer
};

/// How `split` cuts the block of `whole` held at `coordinate`, when the two differ only on mesh
/// dim `mesh_dim`: Replicate or Partial in `whole`, Shard(0) in `split`, last in dim 0's shard
/// order. nullopt otherwise (the caller falls back to redistribute).
std::optional<RowSplit> row_split(const Layout& whole, const Layout& split, int64_t mesh_dim,
                                  const std::vector<int64_t>& coordinate);

}  // namespace tessera::detail
