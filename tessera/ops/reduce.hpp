#pragma once
// Reductions over any set of dims. An empty dims list means all dims. Negative dims count
// from the end. Throws ValueError naming the op and shape for a dim out of range or repeated.
#include <optional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/values_indices.hpp>

namespace tessera TESSERA_API {

/// Sum; integer and bool inputs accumulate and return i64, f16/bf16 accumulate in f32.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Mean; integer and bool inputs give f32. The mean of zero elements is NaN.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Product; integer and bool inputs return i64.
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Max / min; NaN propagates. Throws ValueError when reducing a zero-size dim.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Variance with Bessel-style correction (divides by N - correction); floating only, integers give f32.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
/// Index (i64) of the first maximum along dim, or in the flattened tensor when dim is empty.
/// NaN counts as the maximum. Throws ValueError for a zero-size reduction.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
/// Same as argmax for the minimum.
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);

/// log(sum(exp(x))) over dims, computed with the maximum shifted out (no overflow); -inf for an
/// empty reduction.
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Standard deviation: sqrt(var) with the same correction.
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
/// ||x||_ord over dims (all when empty): ord 2 (default), 1, inf, -inf, 0 (count of non-zeros) or
/// any other p, as torch.linalg.vector_norm. Throws ValueError for non-floating x.
Tensor vector_norm(const Tensor& x, double ord = 2, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Whether all / any elements over dims are non-zero (b8).
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// The maximum (minimum) along dim and the i64 index of its first occurrence (torch.max(x, dim)).
/// Throws ValueError for a 0-d x or a zero-size dim.
ValuesIndices<Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices<Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace tessera
