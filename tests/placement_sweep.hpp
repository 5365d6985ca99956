#pragma once
// What the equivalence sweeps over sharded ops iterate: the meshes of a world, every placement
// combination of an input, and how many combinations to run (docs/architecture.md, Adding an op).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <tessera/mesh/device_mesh.hpp>
#include <tessera/sharding/placement.hpp>

namespace tessera::testing {

/// The meshes a sweep runs on in a world of n ranks: [4] and 2x2 for 4, 2x3 for 6, else [n].
inline std::vector<std::vector<int64_t>> sweep_meshes(int n) {
  switch (n) {
    case 4: return {{4}, {2, 2}};
    case 6: return {{2, 3}};
    default: return {{n}};
  }
}

/// A mesh of that shape with axes named a, b, c.
inline DeviceMesh sweep_mesh(const std::vector<int64_t>& shape) {
  static const std::vector<std::string> names = {"a", "b", "c"};
  return DeviceMesh(shape, std::vector<std::string>(names.begin(), names.begin() + static_cast<long>(shape.size())));
}

/// Every placement list for a tensor of `ndim` dims on a mesh of `mesh_ndim` dims, from
/// {R, S(d) for each dim} and, with `partial`, P(sum).
inline std::vector<Placements> placement_combinations(int64_t ndim, int64_t mesh_ndim, bool partial) {
  std::vector<Placement> choices{Replicate{}};
  for (int64_t d = 0; d < ndim; ++d) choices.push_back(Shard{d});
  if (partial) choices.push_back(Partial{});
  std::vector<Placements> out{{}};
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<Placements> next;
    for (const auto& p : out)
      for (const auto& c : choices) {
        next.push_back(p);
        next.back().push_back(c);
      }
    out = std::move(next);
  }
  return out;
}

/// How many combinations a sweep runs: max_combos, or fewer when TESSERA_TEST_SAMPLE says so
/// (make sanitize sets it; the Release run covers what max_combos allows).
inline size_t sample_limit(size_t max_combos) {
  if (const char* sample = std::getenv("TESSERA_TEST_SAMPLE"))
    return std::min<size_t>(max_combos, static_cast<size_t>(std::max(1, std::atoi(sample))));
  return max_combos;
}

}  // namespace tessera::testing
