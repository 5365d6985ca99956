#include <tessera/ops/fused_backward.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/ops/detail/class_targets.hpp>
#include <tessera/ops/detail/parallel.hpp>
#include <tessera/ops/detail/vector_math.hpp>

namespace tessera {

namespace {

// The kernels run over a rank's intra-op threads (ops/detail/parallel.hpp): elementwise passes in
// chunks of at least kElementGrain elements, row kernels in chunks of at least kRowGrain rows.
constexpr int64_t kElementGrain = 1 << 14;
constexpr int64_t kRowGrain = 64;

Tensor as_compute(const Tensor& t) { return t.to(compute_dtype(t.dtype())).contiguous(); }

void check_pair(const char* op, const Tensor& grad, const Tensor& x) {
  TESSERA_CHECK(grad.defined() && x.defined() && grad.shape() == x.shape() && grad.dtype() == x.dtype() &&
                    is_floating(x.dtype()),
                ValueError, op, "grad ", grad.defined() ? grad.shape().to_string() : "undefined", " ",
                grad.defined() ? name(grad.dtype()) : "", " and x ", x.defined() ? x.shape().to_string() : "undefined",
                " ", x.defined() ? name(x.dtype()) : "", " must have one shape and one floating dtype");
}

template <class C>
void gelu_backward_block(const C* g, const C* x, C* out, int64_t n) {
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

// f32 with y = gelu(x) = x Phi(x): Phi(x) = y / x, exact to a few ulp wherever x is not tiny
// (there Phi is 1/2 to f32 precision), so only phi's exp is evaluated.
void gelu_backward_from_output_block(const float* g, const float* x, const float* y, float* out, int64_t n) {
  const float inv_sqrt_2pi = static_cast<float>(1.0 / std::sqrt(2.0 * std::numbers::pi));
  constexpr int64_t kBlock = 256;
  float p[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const float* xs = x + start;
    const float* ys = y + start;
    for (int64_t i = 0; i < m; ++i) p[i] = -0.5f * xs[i] * xs[i];
    detail::vexp(p, p, m);
    for (int64_t i = 0; i < m; ++i) {
      const float cdf = std::fabs(xs[i]) < 1e-30f ? 0.5f : ys[i] / xs[i];
      out[start + i] = g[start + i] * (cdf + xs[i] * p[i] * inv_sqrt_2pi);
    }
  }
}

// Per row of n: dx = rstd (gw - xhat mean(gw xhat) - [centred] mean(gw)), gw = g w; and g xhat.
template <class C>
void norm_backward_rows(const C* g, const C* x, const C* w, C* dx, C* gxhat, int64_t rows, int64_t n, double eps,
                        bool centred) {
  std::vector<C> xhat(static_cast<size_t>(n)), gw(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const C* xr = x + r * n;
    const C* gr = g + r * n;
    double mean = 0;
    if (centred) {
#pragma omp simd reduction(+ : mean)
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

// Logits [outer, n, inner] with class dim n; target and grad [outer, inner]. Each lane's classes
// are copied out once (contiguous for the vector exp), shifted by their max and exponentiated;
// the gradient is written from them in one more pass. kRows: inner == 1 (a row per target, the
// usual [N, C]), so that the lane's loops run over contiguous memory and vectorise.
template <bool kRows, class C>
void cross_entropy_backward_run(const C* g, const C* x, const int64_t* t, C* out, int64_t outer, int64_t n,
                                int64_t inner_dims, int64_t ignore_index) {
  const int64_t inner = kRows ? 1 : inner_dims;
  std::vector<C> e(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t k = o * inner + j;
      const C* xl = x + o * n * inner + j;
      C* ol = out + o * n * inner + j;
      if (t[k] == ignore_index) {
        for (int64_t i = 0; i < n; ++i) ol[i * inner] = C(0);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) e[i] = xl[i * inner];
      C max = 0;
      const C scale = g[k] / detail::exp_minus_max(e.data(), n, max);
      for (int64_t i = 0; i < n; ++i) ol[i * inner] = e[i] * scale;
      ol[t[k] * inner] -= g[k];
    }
  }
}

template <class C>
void cross_entropy_backward_lanes(const C* g, const C* x, const int64_t* t, C* out, int64_t outer, int64_t n,
                                  int64_t inner, int64_t ignore_index) {
  detail::parallel_for(outer, kRowGrain, [&](int64_t b, int64_t e) {
    const int64_t lane = b * inner, element = b * n * inner;
    if (inner == 1)
      cross_entropy_backward_run<true>(g + lane, x + element, t + lane, out + element, e - b, n, inner, ignore_index);
    else
      cross_entropy_backward_run<false>(g + lane, x + element, t + lane, out + element, e - b, n, inner, ignore_index);
  });
}

template <class C>
void gelu_backward_run(const C* g, const C* x, C* out, int64_t n) {
  detail::parallel_for(n, kElementGrain,
                       [&](int64_t b, int64_t e) { gelu_backward_block(g + b, x + b, out + b, e - b); });
}

void gelu_backward_from_output(const float* g, const float* x, const float* y, float* out, int64_t n) {
  detail::parallel_for(n, kElementGrain, [&](int64_t b, int64_t e) {
    gelu_backward_from_output_block(g + b, x + b, y + b, out + b, e - b);
  });
}

template <class C>
void norm_backward_run(const C* g, const C* x, const C* w, C* dx, C* gxhat, int64_t rows, int64_t n, double eps,
                       bool centred) {
  detail::parallel_for(rows, kRowGrain, [&](int64_t b, int64_t e) {
    norm_backward_rows(g + b * n, x + b * n, w, dx + b * n, gxhat + b * n, e - b, n, eps, centred);
  });
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

Tensor gelu_backward(const Tensor& grad, const Tensor& x, const Tensor& y) {
  check_pair("gelu_backward", grad, x);
  TESSERA_CHECK(y.defined() && y.shape() == x.shape() && y.dtype() == x.dtype(), ValueError, "gelu_backward", "y ",
                y.defined() ? y.shape().to_string() : "undefined", " must have the shape ", x.shape().to_string(),
                " and dtype ", name(x.dtype()), " of x");
  if (x.dtype() != DType::f32) return gelu_backward(grad, x);
  const Tensor g = grad.contiguous(), xc = x.contiguous(), yc = y.contiguous();
  Tensor out = empty(x.shape(), DType::f32);
  gelu_backward_from_output(g.data<float>(), xc.data<float>(), yc.data<float>(), out.data<float>(), out.numel());
  return out;
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

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  constexpr const char* op = "cross_entropy backward";
  TESSERA_CHECK(grad.defined() && logits.defined() && target.defined() && logits.ndim() >= 1, ValueError, op,
                "needs grad, logits with a class dim and target");
  const int64_t class_dim = logits.ndim() == 1 ? 0 : 1;
  Shape losses = logits.shape();
  losses.erase(class_dim);
  TESSERA_CHECK(grad.shape() == losses && target.shape() == losses && is_floating(logits.dtype()) &&
                    is_integral(target.dtype()),
                ValueError, op, "grad ", grad.shape().to_string(), " and target ", target.shape().to_string(),
                " must have the shape ", losses.to_string(), " of logits ", logits.shape().to_string(),
                " without the class dim (floating logits, integer targets)");
  const int64_t classes = logits.size(class_dim);
  const Tensor t = detail::checked_class_targets(target, classes, ignore_index, logits.shape(), op);
  const int64_t* ts = t.numel() > 0 ? t.data<int64_t>() : nullptr;
  const Tensor x = as_compute(logits), g = grad.to(x.dtype()).contiguous();
  Tensor out = empty(logits.shape(), x.dtype());
  if (out.numel() > 0) {
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < class_dim; ++d) outer *= logits.size(d);
    for (int64_t d = class_dim + 1; d < logits.ndim(); ++d) inner *= logits.size(d);
    if (x.dtype() == DType::f32)
      cross_entropy_backward_lanes(g.data<float>(), x.data<float>(), ts, out.data<float>(), outer, classes, inner,
                                   ignore_index);
    else
      cross_entropy_backward_lanes(g.data<double>(), x.data<double>(), ts, out.data<double>(), outer, classes,
                                   inner, ignore_index);
  }
  return out.dtype() == logits.dtype() ? out : out.to(logits.dtype());
}

}  // namespace tessera
