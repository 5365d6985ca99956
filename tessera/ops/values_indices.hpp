#pragma once
// The result of a reduction that also says where: max/min along a dim, sort, topk (Tensor and
// DTensor). Use with structured bindings: `auto [values, indices] = topk(x, 3);`.

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

template <class T>
struct ValuesIndices {
  T values;
  T indices;  ///< i64, positions along the reduced dim
};

}  // namespace tessera
