#pragma once
// Argument handling shared by the sharded spatial ops (spatial.cpp, spatial_transpose.cpp).
#include <cstdint>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/internal/spatial_args.hpp>  // per_spatial_dim

namespace tessera::detail {

/// x with the mesh dims whose placement `moves` replicated instead (redistributed only if any).
template <class Moves>
DTensor replicate_where(const DTensor& x, Moves moves) {
  Placements placements = x.placements();
  bool changed = false;
  for (auto& p : placements)
    if (moves(p)) p = Replicate{}, changed = true;
  return changed ? x.redistribute(placements) : x;
}

/// t on every rank whole.
inline DTensor replicated(const DTensor& t) {
  if (t.layout().is_replicated()) return t;
  return t.redistribute(Placements(t.placements().size(), Replicate{}));
}

}  // namespace tessera::detail
