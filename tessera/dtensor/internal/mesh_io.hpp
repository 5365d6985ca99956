#pragma once
// Small metadata exchanges over a whole mesh or a communicator (shapes, layout texts, failures):
// the dtensor layer's, the front ends' that check what every rank passed (spec's mark_sharding),
// and the checkpoint's agreement on what every rank wrote.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/mesh/device_mesh.hpp>

namespace tessera::detail {

/// Every rank of `comm`'s `values` (any length), in rank order. Collective over `comm`.
std::vector<std::vector<int64_t>> all_gather_int64(Communicator& comm, const std::vector<int64_t>& values);
/// Every rank of `comm`'s text, in rank order. Collective over `comm`.
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text);

/// Every mesh rank's `values` (any length), in the order of mesh.spec().ranks(). Collective over
/// the mesh. Throws ShardingError naming `op` when no communicator covers exactly the mesh.
std::vector<std::vector<int64_t>> all_gather_int64(const DeviceMesh& mesh, const std::vector<int64_t>& values,
                                                   const char* op);
/// Every mesh rank's text, in the order of mesh.spec().ranks(). Collective over the mesh.
std::vector<std::string> all_gather_text(const DeviceMesh& mesh, const std::string& text, const char* op);

/// The communicator over exactly the mesh's ranks. Throws ShardingError naming `op` when none
/// exists (a slice keeping two or more dims: flatten it first).
Communicator& mesh_comm(const DeviceMesh& mesh, const char* op);

}  // namespace tessera::detail
