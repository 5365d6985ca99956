#pragma once
// The layout a tensor takes when it moves onto another mesh: one rule for every move between
// meshes (a task's inputs, a pipeline stage's activations). Pure.
#include <tessera/core/export.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

/// `src`'s tensor on `dst`: each mesh dim of `dst` takes the placement of `src`'s mesh dim of the
/// same axis name, Replicate where `src` has none; a Partial becomes Replicate (the caller
/// reduces it first: its values, not its partial sums, move). A tensor dim split only by carried
/// mesh dims keeps its shard order and explicit piece sizes.
/// Example: (S(0), P) on mesh[dp=2, tp=2] onto mesh[tp=2, dp=2] is (R, S(0)); onto mesh[pp=2]
/// it is (R).
Layout layout_on_mesh(const Layout& src, const MeshSpec& dst);

}  // namespace tessera
