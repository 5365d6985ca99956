#include <tessera/ops/fused_backward.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/ops/detail/vector_math.hpp>

namespace tessera {

namespace {

// The dtype a kernel computes in: f64 stays, every other floating dtype goes through f32.
DType compute_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

Tensor as_compute(const Tensor& t) { return t.to(compute_dtype(t.dtype())).contiguous(); }

void check_pair(const char* op, const Tensor& grad, const Tensor& x) {
  TESSERA_CHECK(grad.defined() && x.defined() && grad.shape() == x.shape() && grad.dtype() == x.dtype() &&
                    is_floating(x.dtype()),
                ValueError, op, "grad ", grad.defined() ? grad.shape().to_string() : "undefined", " ",
                grad.defined() ? name(grad.dtype()) : "", " and x ", x.defined() ? x.shape().to_string() : "undefined",
                " ", x.defined() ? name(x.dtype()) : "", " must have one shape and one floating dtype");
}

template <class C>
void gelu_backward_run(const C* g, const C* x, C* out, int64_t n) {
  constexpr C kInvSqrt2 = static_cast<C>(0.70710678118654752440);
  const C inv_sqrt_2pi = static_cast<C>(1.0 / std::sqrt(2.0 * std::numbers::pi));
  if constexpr (std::is_same_v<C, float>) {
    // Blocks: erf and exp of a block through the vector math library, then one pass to combine.
    constexpr int64_t kBlock = 256;
    float e[kBlock], p[kBlock];
    for (int64_t start = 0; start < n; start += kBlock) {
      const int64_t m = std::min(kBlock, n - start);
      const float* xs = x + start;
      for (int64_t i = 0; i < m; ++i) e[i] = xs[i] * kInvSqrt2, p[i] = -0.5f * xs[i] * xs[i];
      detail::verf(e, e, m);
      detail::vexp(p, p, m);
      for (int64_t i = 0; i < m; ++i)
        out[start + i] = g[start + i] * (0.5f * (1.0f + e[i]) + xs[i] * p[i] * inv_sqrt_2pi);
    }
  } else {
    for (int64_t i = 0; i < n; ++i)
      out[i] = g[i] * (C(0.5) * (C(1) + std::erf(x[i] * kInvSqrt2)) + x[i] * std::exp(C(-0.5) * x[i] * x[i]) * inv_sqrt_2pi);
  }
}

// Per row of n: dx = rstd (gw - xhat mean(gw xhat) - [centred] mean(gw)), gw = g w; and g xhat.
template <class C>
void norm_backward_run(const C* g, const C* x, const C* w, C* dx, C* gxhat, int64_t rows, int64_t n, double eps,
                       bool centred) {
  std::vector<C> xhat(static_cast<size_t>(n)), gw(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const C* xr = x + r * n;
    const C* gr = g + r * n;
    double mean = 0;
    if (centred) {
      for (int64_t i = 0; i < n; ++i) mean += xr[i];
      mean /= static_cast<double>(n);
    }
    double squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += (xr[i] - mean) * (xr[i] - mean);
    const C rstd = static_cast<C>(1.0 / std::sqrt(squares / static_cast<double>(n) + eps));
    double dot = 0, total = 0;
#pragma omp simd reduction(+ : dot, total)
    for (int64_t i = 0; i < n; ++i) {
      xhat[i] = (xr[i] - static_cast<C>(mean)) * rstd;
      gw[i] = w ? gr[i] * w[i] : gr[i];
      dot += static_cast<double>(gw[i]) * static_cast<double>(xhat[i]);
      total += gw[i];
    }
    const C a = static_cast<C>(dot / static_cast<double>(n));
    const C b = centred ? static_cast<C>(total / static_cast<double>(n)) : C(0);
    C* dxr = dx + r * n;
    C* gxr = gxhat + r * n;
    for (int64_t i = 0; i < n; ++i) {
      dxr[i] = rstd * (gw[i] - xhat[i] * a - b);
      gxr[i] = gr[i] * xhat[i];
    }
  }
}

}  // namespace

Tensor gelu_backward(const Tensor& grad, const Tensor& x) {
  check_pair("gelu_backward", grad, x);
  const Tensor g = as_compute(grad), xc = as_compute(x);
  Tensor out = empty(x.shape(), g.dtype());
  if (g.dtype() == DType::f32)
    gelu_backward_run(g.data<float>(), xc.data<float>(), out.data<float>(), out.numel());
  else
    gelu_backward_run(g.data<double>(), xc.data<double>(), out.data<double>(), out.numel());
  return out.dtype() == x.dtype() ? out : out.to(x.dtype());
}

std::pair<Tensor, Tensor> norm_backward(const Tensor& grad, const Tensor& x, const std::optional<Tensor>& weight,
                                        int64_t count, double eps, bool centred) {
  const char* op = centred ? "layer_norm backward" : "rms_norm backward";
  check_pair(op, grad, x);
  TESSERA_CHECK(count >= 1 && count <= x.ndim(), ValueError, op, "cannot normalise the last ", count, " dims of ",
                x.shape().to_string());
  const Shape trailing(std::vector<int64_t>(x.shape().end() - count, x.shape().end()));
  TESSERA_CHECK(!weight || weight->shape() == trailing, ValueError, op, "weight ", weight ? weight->shape().to_string() : "",
                " must have the normalised shape ", trailing.to_string(), " of x ", x.shape().to_string());
  const Tensor g = as_compute(grad), xc = as_compute(x);
  const std::optional<Tensor> w = weight ? std::optional<Tensor>(weight->to(g.dtype()).contiguous()) : std::nullopt;
  const int64_t n = trailing.numel(), rows = n == 0 ? 0 : x.numel() / n;
  Tensor dx = empty(x.shape(), g.dtype()), gxhat = empty(x.shape(), g.dtype());
  if (g.dtype() == DType::f32)
    norm_backward_run(g.data<float>(), xc.data<float>(), w ? w->data<float>() : nullptr, dx.data<float>(),
                      gxhat.data<float>(), rows, n, eps, centred);
  else
    norm_backward_run(g.data<double>(), xc.data<double>(), w ? w->data<double>() : nullptr, dx.data<double>(),
                      gxhat.data<double>(), rows, n, eps, centred);
  if (dx.dtype() != x.dtype()) return {dx.to(x.dtype()), gxhat.to(x.dtype())};
  return {dx, gxhat};
}

}  // namespace tessera
