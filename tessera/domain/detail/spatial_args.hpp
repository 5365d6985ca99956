#pragma once
// Argument handling shared by the sharded spatial ops (spatial.cpp, spatial_transpose.cpp).
#include <cstdint>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera::detail {

/// One value per spatial dim (a single value applies to all), as torch's int-or-tuple arguments.
inline std::vector<int64_t> per_dim(const char* call, const char* what, std::vector<int64_t> v, int64_t spatial) {
  if (v.size() == 1) v.assign(static_cast<size_t>(spatial), v.front());
  TESSERA_CHECK(static_cast<int64_t>(v.size()) == spatial, ValueError, call, what, " has ", v.size(),
                " values for ", spatial, " spatial dims; give 1 or ", spatial);
  return v;
}

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
