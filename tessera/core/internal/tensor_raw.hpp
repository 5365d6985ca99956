#pragma once
// Views and copies of a Tensor without autograd recording. The core layer builds on these (a copy
// inside copy_, a conversion inside to_vector must not record); the Tensor members users call
// (x.narrow(...), x.to(...)) are these plus the recording of their derivative, defined by the ops
// layer (ops/tensor_autograd.cpp), which owns the derivatives. Same validation and errors as the
// members.
#include <cstdint>
#include <vector>

#include <tessera/core/tensor.hpp>

namespace tessera::detail {

Tensor raw_view(const Tensor& x, const Shape& shape);
Tensor raw_reshape(const Tensor& x, const Shape& shape);
Tensor raw_transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor raw_permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor raw_narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor raw_select(const Tensor& x, int64_t dim, int64_t index);
Tensor raw_unsqueeze(const Tensor& x, int64_t dim);
Tensor raw_squeeze(const Tensor& x);
Tensor raw_squeeze(const Tensor& x, int64_t dim);
Tensor raw_expand(const Tensor& x, const Shape& shape);
/// A contiguous copy.
Tensor raw_clone(const Tensor& x);
/// A copy converted to dtype (x itself when it already has that dtype).
Tensor raw_to(const Tensor& x, DType dtype);
/// x when contiguous, else a contiguous copy.
Tensor raw_contiguous(const Tensor& x);

}  // namespace tessera::detail
