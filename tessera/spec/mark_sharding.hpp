#pragma once
// torch_xla's and JAX's sharding annotations over DTensor: mark_sharding / with_sharding_constraint
// lay a tensor out by a PartitionSpec (planned by the redistribute planner), clear_sharding
// gathers it back, and a manual region hands out the local shard and takes it back.
#include <string>

#include <tessera/core/export.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/spec/partition_spec.hpp>

namespace tessera TESSERA_API {

/// torch_xla mark_sharding on a plain tensor that every rank holds: the DTensor laid out by
/// `spec` on `mesh`, each rank's block taken from the mesh's first rank (distribute_tensor).
/// Communicates. Throws ShardingError as layout_from_spec does, naming mark_sharding.
DTensor mark_sharding(const Tensor& global, const DeviceMesh& mesh, const PartitionSpec& spec);
/// mark_sharding on a DTensor: the same values laid out by `spec` on its mesh (a planned
/// redistribute; a Partial source is reduced on the way). Communicates unless already so laid out.
DTensor mark_sharding(const DTensor& x, const PartitionSpec& spec);
/// JAX's name for mark_sharding on a DTensor (jax.lax.with_sharding_constraint).
DTensor with_sharding_constraint(const DTensor& x, const PartitionSpec& spec);
/// torch_xla clear_sharding: the whole tensor on every rank. Communicates.
Tensor clear_sharding(const DTensor& x);

/// torch_xla enable_manual_sharding: `x` laid out by `spec` (redistributed when it is not), and
/// this rank's block of it, to compute on by hand. Differentiable. Communicates when it moves.
Tensor enable_manual_sharding(const DTensor& x, const PartitionSpec& spec);
/// torch_xla disable_manual_sharding: each rank's `local` block of a tensor of `full_shape` laid
/// out by `spec` on `mesh`, as a DTensor. Pieces may be uneven: each sharded dim's piece sizes
/// are read off the locals (an all_gather of their shapes), so every rank learns every size and
/// all check the same things. Differentiable. Throws ShardingError naming the rank and shapes
/// when the locals do not tile `full_shape` (pieces not adding up, replicas of different shapes,
/// unsharded dims not full).
DTensor disable_manual_sharding(const Tensor& local, const PartitionSpec& spec, const Shape& full_shape,
                                const DeviceMesh& mesh);

/// JAX's typed text of a sharded value: each dim's size, then '@' and its mesh axes when
/// sharded (several axes: '@(dp,tp)'), plus "{P(sum)@tp}"-style pending reductions.
/// Example: `f32[8@dp,4]` for an [8, 4] f32 DTensor sharded by P('dp').
std::string type_string(const DTensor& x);

}  // namespace tessera
