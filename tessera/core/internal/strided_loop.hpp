#pragma once
// The one general strided path: walks an N-d index space in row-major order over several
// operands and hands the innermost run to a kernel, which specialises on its strides.
#include <array>
#include <cstdint>

#include <tessera/core/tensor.hpp>

namespace tessera::detail {

/// Byte pointers and byte strides of the innermost run of NOps operands.
template <size_t NOps>
struct Run {
  std::array<char*, NOps> ptr;
  std::array<int64_t, NOps> stride;  // bytes
  int64_t count;
};

/// Calls inner(Run<NOps>) for every innermost run of `shape`, after dropping size-1 dims and
/// merging dims that are contiguous in every operand (so contiguous tensors make one run).
/// Operand i is at base[i] with element strides strides[i] (all of ndim == shape.size()) and
/// element size itemsizes[i]. Does nothing when shape has a zero size.
template <size_t NOps, class Inner>
void strided_loop(const Shape& shape, const std::array<const Strides*, NOps>& strides,
                  const std::array<char*, NOps>& base, const std::array<int64_t, NOps>& itemsizes, Inner&& inner) {
  const int64_t ndim = shape.size();
  if (shape.numel() == 0) return;
  // Collapse into (size, byte strides) from innermost outwards.
  DimVector sizes;
  std::array<DimVector, NOps> bstrides;
  for (int64_t d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < NOps && merge; ++k)
      merge = (*strides[k])[d] * itemsizes[k] == bstrides[k].back() * sizes.back();
    if (merge) {
      sizes[sizes.size() - 1] *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k < NOps; ++k) bstrides[k].push_back((*strides[k])[d] * itemsizes[k]);
    }
  }
  Run<NOps> run{base, {}, 1};
  if (sizes.empty()) {  // a single element
    inner(run);
    return;
  }
  // sizes/bstrides are innermost-first now.
  const int64_t nd = sizes.size();
  run.count = sizes[0];
  for (size_t k = 0; k < NOps; ++k) run.stride[k] = bstrides[k][0];
  if (nd == 1) {
    inner(run);
    return;
  }
  DimVector counter = DimVector::filled(nd, 0);
  std::array<char*, NOps> ptr = base;
  while (true) {
    run.ptr = ptr;
    inner(run);
    int64_t d = 1;
    for (; d < nd; ++d) {
      for (size_t k = 0; k < NOps; ++k) ptr[k] += bstrides[k][d];
      if (++counter[d] < sizes[d]) break;
      for (size_t k = 0; k < NOps; ++k) ptr[k] -= bstrides[k][d] * sizes[d];
      counter[d] = 0;
    }
    if (d == nd) return;
  }
}

/// Pointer to a tensor's first element as writable bytes (kernels write only to outputs).
inline char* bytes(const Tensor& t) { return static_cast<char*>(const_cast<void*>(t.raw_data())); }

}  // namespace tessera::detail
