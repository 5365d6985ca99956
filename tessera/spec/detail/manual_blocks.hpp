#pragma once
// The step shared by disable_manual_sharding and shard_map's output: per-rank blocks of a spec
// made into a DTensor, with uneven piece sizes read off the blocks.
#include <optional>

#include <tessera/core/shape.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/spec/partition_spec.hpp>

namespace tessera::detail {

/// Each rank's `local` block of a tensor laid out by `spec` on `mesh` as a DTensor. The full
/// shape, when not given, is the sum of each sharded dim's pieces (unsharded dims: the local's).
/// Gathers the local shapes over the mesh; throws ShardingError naming `call` on every rank alike
/// when they do not tile the full shape.
DTensor from_manual_blocks(const char* call, const Tensor& local, const PartitionSpec& spec,
                           const std::optional<Shape>& full_shape, const DeviceMesh& mesh);

}  // namespace tessera::detail
