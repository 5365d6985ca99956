#pragma once
// Ops defined by other ops, written once for Tensor and DTensor (T), like the derivatives: their
// sharding follows from the ops they are made of (a sharded reduced dim becomes a Partial, reduced
// once, on the small result), and so do their gradients. Validation comes first, with the op's
// own name, through the shape functions of core/shape.hpp.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/core/scalar.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/ops/reduction.hpp>
#include <tessera/ops/values_indices.hpp>

namespace tessera {

namespace composites {

inline int64_t count_of(const Shape& shape, const DimVector& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

/// log(sum(exp(x))) over dims, shifted by the (detached) maximum for range; -inf for an empty
/// reduction, as in PyTorch.
template <class T>
T logsumexp(const T& x, const std::vector<int64_t>& dims, bool keepdim) {
  const DimVector reduced = normalize_dims(dims, x.shape(), "logsumexp");
  const double inf = std::numeric_limits<double>::infinity();
  if (count_of(x.shape(), reduced) == 0) return sub(sum(x, reduced.vec(), keepdim), Scalar(inf));
  T shift = amax(x.detach(), reduced.vec(), /*keepdim=*/true);
  shift = where(eq(abs(shift), Scalar(inf)), Scalar(0.0), shift);  // rows of +-inf: shift by 0
  const T out = add(log(sum(exp(sub(x, shift)), reduced.vec(), /*keepdim=*/true)), shift);
  return keepdim ? out : reshape(out, reduced_shape(x.shape(), reduced, false));
}

/// Standard deviation: sqrt of var with the same correction.
template <class T>
T std_dev(const T& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

/// ||x||_ord over dims (all when empty): ord 2, 1, inf, -inf, 0 (count of non-zeros) or any other
/// p. Floating inputs only (as torch.linalg.vector_norm).
template <class T>
T vector_norm(const T& x, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  TESSERA_CHECK(is_floating(x.dtype()), ValueError, "vector_norm", "expects a floating tensor, got ", name(x.dtype()),
                " of shape ", x.shape().to_string());
  const std::vector<int64_t> reduced = normalize_dims(dims, x.shape(), "vector_norm").vec();
  if (std::isinf(ord)) {
    TESSERA_CHECK(count_of(x.shape(), DimVector(reduced)) > 0, ValueError, "vector_norm", "ord ", ord,
                  " over zero elements of shape ", x.shape().to_string(), " has no identity");
    return ord > 0 ? amax(abs(x), reduced, keepdim) : amin(abs(x), reduced, keepdim);
  }
  if (ord == 2) return sqrt(sum(mul(x, x), reduced, keepdim));
  if (ord == 1) return sum(abs(x), reduced, keepdim);
  if (ord == 0) return sum(ne(x, Scalar(0.0)), reduced, keepdim).to(x.dtype());
  return pow(sum(pow(abs(x), Scalar(ord)), reduced, keepdim), Scalar(1.0 / ord));
}

/// Whether every (all) or some (any) element is non-zero over dims; b8.
template <class T>
T all(const T& x, const std::vector<int64_t>& dims, bool keepdim) {
  return eq(sum(logical_not(x), normalize_dims(dims, x.shape(), "all").vec(), keepdim), Scalar(0));
}
template <class T>
T any(const T& x, const std::vector<int64_t>& dims, bool keepdim) {
  return gt(sum(ne(x, Scalar(0)), normalize_dims(dims, x.shape(), "any").vec(), keepdim), Scalar(0));
}

/// The maximum (minimum) along dim and the index of its first occurrence; NaN counts as largest.
template <class T>
ValuesIndices<T> max_along(const T& x, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  TESSERA_CHECK(x.ndim() > 0, ValueError, op, "expects a tensor with at least 1 dim for a reduction along a dim");
  const int64_t d = normalize_dim(dim, x.ndim(), op, x.shape());
  TESSERA_CHECK(x.shape()[d] > 0, ValueError, op, "cannot reduce over the zero-size dim ", d, " of shape ",
                x.shape().to_string());
  if (is_max) return {amax(x, {d}, keepdim), argmax(x, d, keepdim)};
  return {amin(x, {d}, keepdim), argmin(x, d, keepdim)};
}

/// A loss per element reduced as `reduction` says.
template <class T>
T reduce_loss(const T& loss, Reduction reduction) {
  if (reduction == Reduction::mean) return mean(loss);
  if (reduction == Reduction::sum) return sum(loss);
  return loss;
}

/// (input - target)^2, reduced.
template <class T>
T mse_loss(const T& input, const T& target, Reduction reduction) {
  TESSERA_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), ValueError, "mse_loss",
                "expects floating input and target, got ", name(input.dtype()), " and ", name(target.dtype()));
  (void)broadcast_shapes(input.shape(), target.shape(), "mse_loss");
  const T d = sub(input, target);
  return reduce_loss(mul(d, d), reduction);
}

/// The negative picked log-probabilities with ignored targets zeroed, reduced like cross_entropy:
/// the mean divides by the number of kept targets.
template <class T>
T masked_nll(const T& picked, const T& target, int64_t ignore_index, Reduction reduction) {
  const T valid = ne(target, Scalar(ignore_index));
  const T kept = where(valid, neg(picked), Scalar(0));
  if (reduction == Reduction::none) return kept;
  if (reduction == Reduction::sum) return sum(kept);
  return div(sum(kept), sum(valid));
}

/// beta * input + alpha * (a @ b): a matrix product (addmm: a, b 2-d) or a batch of them
/// (baddbmm: a, b 3-d); input broadcasts to the product's shape. With beta == 0 input is ignored
/// (NaN in it does not propagate), as in PyTorch.
template <class T>
T add_product(const T& input, const T& a, const T& b, double beta, double alpha, bool batched) {
  const char* op = batched ? "baddbmm" : "addmm";
  const int64_t nd = batched ? 3 : 2;
  TESSERA_CHECK(a.ndim() == nd && b.ndim() == nd && a.shape()[nd - 1] == b.shape()[nd - 2] &&
                    (!batched || a.shape()[0] == b.shape()[0]),
                ValueError, op, "cannot multiply ", a.shape().to_string(), " by ", b.shape().to_string(), "; expected ",
                batched ? "[B, n, m] and [B, m, p]" : "[n, m] and [m, p]");
  Shape out = a.shape();
  out[nd - 1] = b.shape()[nd - 1];
  TESSERA_CHECK(broadcast_shapes(input.shape(), out, op) == out, ValueError, op, "input of shape ",
                input.shape().to_string(), " does not broadcast to the product's shape ", out.to_string());
  T product = batched ? bmm(a, b) : matmul(a, b);
  if (alpha != 1.0) product = mul(product, Scalar(alpha));
  if (beta == 0.0) return product;
  return add(beta == 1.0 ? input : mul(input, Scalar(beta)), product);
}

}  // namespace composites
}  // namespace tessera
