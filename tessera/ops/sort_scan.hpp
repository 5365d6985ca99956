#pragma once
// Scans and sorting along one dim. Negative dims count from the end; a 0-d tensor counts as one
// element along dim 0 or -1. Throws ValueError naming the op and the shape for a dim out of range.
#include <cstdint>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/values_indices.hpp>

namespace tessera TESSERA_API {

/// Running sum / product along dim. Integer and b8 inputs give i64 (as PyTorch), floating inputs
/// keep their dtype (f16/bf16 accumulate in f32).
Tensor cumsum(const Tensor& x, int64_t dim);
Tensor cumprod(const Tensor& x, int64_t dim);

/// Stable sort along dim (default the last); NaN sorts as the largest value. indices are i64
/// positions in x along dim.
ValuesIndices<Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false);

/// The k largest (smallest) elements along dim and their i64 indices, largest first (smallest
/// first), ties in index order. sorted = false allows any order (as in PyTorch); Tessera still
/// returns them sorted, which costs nothing extra here (the selection is a partial sort), so
/// results are the same whatever the flag and whatever the sharding.
/// Throws ValueError if k is negative or above the dim's size.
ValuesIndices<Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);

namespace detail {
/// Zeros of `shape` with values[..., j] written at position indices[..., j] - offset along d
/// (positions outside [0, shape[d]) skipped): the adjoint of picking along d (sort, topk), also
/// for a piece of a sharded dim that starts at `offset`. indices and values share one shape.
Tensor place_along(const Shape& shape, int64_t d, const Tensor& indices, const Tensor& values, int64_t offset);
}  // namespace detail

}  // namespace tessera
