#pragma once
// A layout as a flat list of integers (without its mesh), for the headers that travel ahead of a
// stage boundary's blocks: the receiving stage rebuilds the layout on its own mesh.
#include <cstdint>
#include <vector>

#include <tessera/mesh/mesh_spec.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera::mpmd::detail {

std::vector<int64_t> encode_layout(const Layout& layout);
/// The inverse of encode_layout on `mesh` (a mesh of the encoded layout's shape).
Layout decode_layout(const std::vector<int64_t>& words, const MeshSpec& mesh);

}  // namespace tessera::mpmd::detail
