#pragma once
// Meshes in torch_xla's vocabulary: a mesh from device ids, its logical grid, a hybrid mesh whose
// dcn axes span hosts and whose ici axes stay within one, and a per-rank global mesh.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/mesh/device_mesh.hpp>

namespace tessera TESSERA_API {

/// torch_xla's `Mesh(device_ids, mesh_shape, axis_names)`: the world ranks `device_ids` laid out
/// row-major on `shape`. Empty `names` gives "axis0", "axis1", ... Collective over the world.
/// Throws ShardingError naming the call when the ids do not fill the shape, repeat, or are not
/// ranks of the world.
/// Example: `mesh_from_device_ids({3, 2, 1, 0}, {2, 2}, {"dp", "tp"})` puts rank 3 at (0, 0).
DeviceMesh mesh_from_device_ids(std::vector<int> device_ids, std::vector<int64_t> shape,
                                std::vector<std::string> names);

/// The ranks as laid out on the mesh (torch_xla get_logical_mesh), one row per index of the
/// leading axes (row-major) along the last axis: a 2-d mesh gives its rows, a 1-d mesh one row.
std::vector<std::vector<int>> logical_mesh(const DeviceMesh& mesh);

/// torch_xla's HybridMesh / JAX's create_hybrid_device_mesh: one axis per name, of size
/// ici_shape[i] * dcn_shape[i]; along axis i the index is dcn_index * ici_shape[i] + ici_index,
/// where the dcn indices (row-major over dcn_shape) pick the host and the ici indices (row-major
/// over ici_shape) the rank within it, from the host topology (MPI: the machines; threads or a
/// simulation: TESSERA_HOSTS). So an axis with dcn size 1 never leaves a host and one with ici
/// size 1 always crosses hosts. Collective over the world. Throws ShardingError naming the
/// topology when the host count is not the product of dcn_shape, a host does not hold the
/// product of ici_shape ranks, or the lengths differ.
/// Example: 2 hosts of 4 ranks, `hybrid_mesh({1, 4}, {2, 1}, {"dcn", "ici"})`.
DeviceMesh hybrid_mesh(std::vector<int64_t> ici_shape, std::vector<int64_t> dcn_shape,
                       std::vector<std::string> names);

/// The calling rank's global mesh (torch_xla set_global_mesh / get_global_mesh): per rank, so
/// thread-local under the threads backend. global_mesh() throws ShardingError when none is set.
void set_global_mesh(const DeviceMesh& mesh);
const DeviceMesh& global_mesh();
/// True when this rank has set a global mesh.
bool has_global_mesh();

/// A 1-d mesh over the whole world in rank order, its one axis named `name` ("axis0" when
/// empty): torch_xla get_1d_mesh. Collective over the world.
DeviceMesh get_1d_mesh(std::string name = "");

}  // namespace tessera
