#pragma once
// Indexing along one dim with i64 index tensors (torch semantics). Indices must lie in
// [0, size of the dim); negative dims count from the end. Throws ValueError naming the op, the
// shapes and the offending index otherwise. Differentiable in x and src.
#include <cstdint>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// out[p] = x[p with p[dim] = index[p]]; index has x's ndim and no dim larger than x's except dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// x with x[p with p[dim] = index[p]] = src[p] for every p of index (src at least index's shape).
/// With repeated targets the last write wins.
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// As scatter, adding: repeated targets accumulate.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// The slices of x at the 1-d index along dim: out.select(dim, i) = x.select(dim, index[i]).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// x with alpha * src.select(dim, i) added into x.select(dim, index[i]) (1-d index; repeats
/// accumulate), as torch.index_add. Throws ValueError for a floating alpha on an integer x.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha = 1);

/// The checks on an index of `index` shape and dtype for dim d of an input of shape x: integer,
/// same ndim and no larger outside d (gather, scatter), or 1-d (index_select, index_add). Pure;
/// shared by the Tensor and DTensor ops. Throws ValueError naming op and the shapes.
void check_index_args(const char* op, const Shape& x, const Shape& index, DType index_dtype, int64_t d, bool same_ndim);
/// index_add's alpha for an input of `x_dtype`: an integer input takes no floating alpha. Pure;
/// shared by the Tensor and DTensor ops. Throws ValueError naming index_add, alpha and the dtype.
void check_index_add_alpha(DType x_dtype, Scalar alpha);

}  // namespace tessera
