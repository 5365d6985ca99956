// max_pool2d and avg_pool2d: each loops over [planes = N * C, H, W] and records the gather it did
// (max: the argmax; avg: the window), so its backward is that gather's adjoint, a scatter-add.
// Computed in f32 (f64 for f64 inputs); f16/bf16 are converted and back.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/conv.hpp>
#include <tessera/ops/detail/spatial_common.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>

namespace tessera {

namespace {

using namespace detail::spatial;

// A 2-d pool over x seen as [planes, H, W].
struct PoolGeometry {
  int64_t planes = 1, H = 1, W = 1, OH = 1, OW = 1;
  Dims3 kernel{1, 1, 1}, stride{1, 1, 1}, padding{0, 0, 0};
};

PoolGeometry pool_geometry(const char* op, const Tensor& x, const std::vector<int64_t>& kernel,
                           std::vector<int64_t> stride, const std::vector<int64_t>& padding) {
  check_pool_input(op, x);
  if (stride.empty()) stride = kernel;
  PoolGeometry p;
  p.kernel = spatial_param(kernel, 2, 1, op, "kernel");
  p.stride = spatial_param(stride, 2, 1, op, "stride");
  p.padding = spatial_param(padding, 2, 0, op, "padding");
  TESSERA_CHECK(all_at_least(p.kernel, 1), ValueError, op, "kernel ", text(kernel), " has a value < 1; expected >= 1");
  TESSERA_CHECK(all_at_least(p.stride, 1), ValueError, op, "stride ", text(stride), " has a value < 1; expected >= 1");
  TESSERA_CHECK(all_at_least(p.padding, 0), ValueError, op, "padding ", text(padding),
                " has a negative value; expected >= 0");
  TESSERA_CHECK(2 * p.padding[1] <= p.kernel[1] && 2 * p.padding[2] <= p.kernel[2], ValueError, op, "padding ",
                text(padding), " is more than half of kernel ", text(kernel), "; expected padding <= kernel / 2");
  p.H = x.size(-2);
  p.W = x.size(-1);
  p.planes = x.numel() / (p.H * p.W);
  const int64_t span_h = p.H + 2 * p.padding[1] - p.kernel[1], span_w = p.W + 2 * p.padding[2] - p.kernel[2];
  TESSERA_CHECK(span_h >= 0 && span_w >= 0, ValueError, op, "output is empty for input ", x.shape().to_string(),
                " with kernel ", text(kernel), ", stride ", text(stride), ", padding ", text(padding),
                "; expected a kernel no larger than the padded input");
  p.OH = span_h / p.stride[1] + 1;
  p.OW = span_w / p.stride[2] + 1;
  return p;
}

Shape pooled_shape(const Shape& x, int64_t oh, int64_t ow) {
  Shape s = x;
  s[s.size() - 2] = oh;
  s[s.size() - 1] = ow;
  return s;
}

template <class C>
void max_pool_forward(const C* x, C* y, int64_t* index, const PoolGeometry& p) {
  for (int64_t pl = 0; pl < p.planes; ++pl) {
    const C* xp = x + pl * p.H * p.W;
    for (int64_t oh = 0; oh < p.OH; ++oh)
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        const int64_t h0 = oh * p.stride[1] - p.padding[1], w0 = ow * p.stride[2] - p.padding[2];
        const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h0 + p.kernel[1], p.H);
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w0 + p.kernel[2], p.W);
        C best = -std::numeric_limits<C>::infinity();
        int64_t at = hs * p.W + ws;
        // As torch: a NaN wins (the last one seen), otherwise the first maximum.
        for (int64_t h = hs; h < he; ++h)
          for (int64_t w = ws; w < we; ++w) {
            const C v = xp[h * p.W + w];
            if (v > best || std::isnan(v)) {
              best = v;
              at = h * p.W + w;
            }
          }
        const int64_t o = (pl * p.OH + oh) * p.OW + ow;
        y[o] = best;
        index[o] = at;
      }
  }
}

// The divisor of avg_pool2d with count_include_pad (torch's: the window clipped to the padded input).
inline int64_t avg_divisor(const PoolGeometry& p, int64_t h0, int64_t w0) {
  return (std::min(h0 + p.kernel[1], p.H + p.padding[1]) - h0) * (std::min(w0 + p.kernel[2], p.W + p.padding[2]) - w0);
}

// Visits every pooling window: f(output index, plane offset, hs, he, ws, we, h0, w0).
template <class F>
void for_windows(const PoolGeometry& p, F&& f) {
  for (int64_t pl = 0; pl < p.planes; ++pl)
    for (int64_t oh = 0; oh < p.OH; ++oh)
      for (int64_t ow = 0; ow < p.OW; ++ow) {
        const int64_t h0 = oh * p.stride[1] - p.padding[1], w0 = ow * p.stride[2] - p.padding[2];
        f((pl * p.OH + oh) * p.OW + ow, pl * p.H * p.W, std::max<int64_t>(h0, 0), std::min(h0 + p.kernel[1], p.H),
          std::max<int64_t>(w0, 0), std::min(w0 + p.kernel[2], p.W), h0, w0);
      }
}

}  // namespace

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding) {
  constexpr const char* op = "max_pool2d";
  const PoolGeometry p = pool_geometry(op, x, kernel, stride, padding);
  const DType cdt = compute_dtype(x.dtype());
  Tensor y = empty(pooled_shape(x.shape(), p.OH, p.OW), cdt);
  Tensor index = empty(y.shape(), DType::i64);
  if (y.numel() > 0) {
    const Tensor xc = compute_copy(x);
    on_compute_type(x.dtype(), [&]<class C>(TypeTag<C>) {
      max_pool_forward<C>(xc.data<C>(), y.data<C>(), index.data<int64_t>(), p);
    });
  }
  y = y.to(x.dtype());
  if (autograd::needs_grad<Tensor>({&x}))
    autograd::record<Tensor>(op, y, {&x}, [p, index, shape = x.shape(), dtype = x.dtype(), cdt](const Tensor& grad) {
      Tensor dx = zeros(shape, cdt);
      if (dx.numel() > 0 && grad.numel() > 0) {
        const Tensor dy = compute_copy(grad);
        on_compute_type(dtype, [&]<class C>(TypeTag<C>) {
          const C* g = dy.data<C>();
          C* d = dx.data<C>();
          const int64_t* at = index.data<int64_t>();
          const int64_t per_plane = p.OH * p.OW;
          for (int64_t o = 0; o < dy.numel(); ++o) d[(o / per_plane) * p.H * p.W + at[o]] += g[o];
        });
      }
      return std::vector<Tensor>{dx.to(dtype)};
    });
  return y;
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding) {
  constexpr const char* op = "avg_pool2d";
  const PoolGeometry p = pool_geometry(op, x, kernel, stride, padding);
  const DType cdt = compute_dtype(x.dtype());
  Tensor y = empty(pooled_shape(x.shape(), p.OH, p.OW), cdt);
  if (y.numel() > 0) {
    const Tensor xc = compute_copy(x);
    on_compute_type(x.dtype(), [&]<class C>(TypeTag<C>) {
      const C* xv = xc.data<C>();
      C* yv = y.data<C>();
      for_windows(p,
                  [&](int64_t o, int64_t base, int64_t hs, int64_t he, int64_t ws, int64_t we, int64_t h0, int64_t w0) {
                    C total = 0;
                    for (int64_t h = hs; h < he; ++h)
                      for (int64_t w = ws; w < we; ++w) total += xv[base + h * p.W + w];
                    yv[o] = total / static_cast<C>(avg_divisor(p, h0, w0));
                  });
    });
  }
  y = y.to(x.dtype());
  if (autograd::needs_grad<Tensor>({&x}))
    autograd::record<Tensor>(op, y, {&x}, [p, shape = x.shape(), dtype = x.dtype(), cdt](const Tensor& grad) {
      Tensor dx = zeros(shape, cdt);
      if (dx.numel() > 0 && grad.numel() > 0) {
        const Tensor dy = compute_copy(grad);
        on_compute_type(dtype, [&]<class C>(TypeTag<C>) {
          const C* g = dy.data<C>();
          C* d = dx.data<C>();
          for_windows(
              p, [&](int64_t o, int64_t base, int64_t hs, int64_t he, int64_t ws, int64_t we, int64_t h0, int64_t w0) {
                const C share = g[o] / static_cast<C>(avg_divisor(p, h0, w0));
                for (int64_t h = hs; h < he; ++h)
                  for (int64_t w = ws; w < we; ++w) d[base + h * p.W + w] += share;
              });
        });
      }
      return std::vector<Tensor>{dx.to(dtype)};
    });
  return y;
}

}  // namespace tessera
