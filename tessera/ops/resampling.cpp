// Resampling: interpolate (nearest, bilinear) and adaptive_avg_pool2d, as separable taps per
// spatial dim (source indices and weights). Each loops over [planes = N * C, spatial...] and
// records its taps, so its backward is their adjoint, a scatter-add. Computed in f32 (f64 for f64
// inputs); f16/bf16 are converted and back.
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

// Per output index o of one spatial dim: taps [o * count, o * count + used(o)) of source indices
// and weights (used(o) = count unless `used` says otherwise).
template <class C>
struct Taps {
  int64_t count = 1;
  std::vector<int64_t> index;  // [out * count]
  std::vector<C> weight;
  std::vector<int64_t> used;  // empty: every output uses count taps
  int64_t used_by(int64_t o) const { return used.empty() ? count : used[static_cast<size_t>(o)]; }
};

template <class C>
Taps<C> identity_taps() {
  Taps<C> t;
  t.index = {0};
  t.weight = {C(1)};
  return t;
}

// torch's legacy nearest source index (UpSample.h, nearest_idx), in f32 as torch computes it.
// scale: interpolate_scale's factor, 0 for none (then in / out).
template <class C>
Taps<C> nearest_taps(int64_t in, int64_t out, double scale) {
  Taps<C> t;
  t.index.resize(static_cast<size_t>(out));
  t.weight.assign(static_cast<size_t>(out), C(1));
  const float s = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    if (out == in)
      t.index[o] = o;
    else if (out == 2 * in)
      t.index[o] = o >> 1;
    else
      t.index[o] = std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * s)), in - 1);
  }
  return t;
}

// torch's linear source taps with align_corners=False (area_pixel_compute_source_index and
// compute_indices_weights_linear), in the compute type.
template <class C>
Taps<C> linear_taps(int64_t in, int64_t out, double scale) {
  Taps<C> t;
  t.count = 2;
  t.index.resize(static_cast<size_t>(2 * out));
  t.weight.resize(static_cast<size_t>(2 * out));
  const C s = scale > 0 ? static_cast<C>(1.0 / scale) : static_cast<C>(in) / static_cast<C>(out);
  for (int64_t o = 0; o < out; ++o) {
    C src = s * (static_cast<C>(o) + C(0.5)) - C(0.5);
    if (src < 0) src = 0;
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const C lambda1 = std::min(std::max(src - static_cast<C>(i0), C(0)), C(1));
    t.index[2 * o] = i0;
    t.index[2 * o + 1] = i0 + (i0 < in - 1 ? 1 : 0);
    t.weight[2 * o] = C(1) - lambda1;
    t.weight[2 * o + 1] = lambda1;
  }
  return t;
}

// Adaptive average pooling as taps: output i averages [floor(i * in / out), ceil((i + 1) * in / out)).
template <class C>
Taps<C> adaptive_taps(int64_t in, int64_t out) {
  Taps<C> t;
  int64_t widest = 0;
  for (int64_t o = 0; o < out; ++o) widest = std::max(widest, ((o + 1) * in + out - 1) / out - o * in / out);
  t.count = widest;
  t.index.assign(static_cast<size_t>(out * widest), 0);
  t.weight.assign(static_cast<size_t>(out * widest), C(0));
  t.used.resize(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = o * in / out, end = ((o + 1) * in + out - 1) / out;
    t.used[static_cast<size_t>(o)] = end - start;
    for (int64_t i = start; i < end; ++i) {
      t.index[o * widest + i - start] = i;
      t.weight[o * widest + i - start] = C(1) / static_cast<C>(end - start);
    }
  }
  return t;
}

// y[p, od, oh, ow] = sum_d wd * (sum_h wh * (sum_w ww * x[p, id, ih, iw])) over each dim's taps
// (torch's order of the bilinear sums; each sum starts from its first term, so a one-tap nearest
// copies values bit for bit). x [planes, in], y [planes, out].
template <class C>
void taps_forward(const C* x, C* y, int64_t planes, const Dims3& in, const std::array<Taps<C>, 3>& t,
                  const Dims3& out) {
  for (int64_t pl = 0; pl < planes; ++pl) {
    const C* xp = x + pl * in[0] * in[1] * in[2];
    C* yp = y + pl * out[0] * out[1] * out[2];
    for (int64_t od = 0; od < out[0]; ++od)
      for (int64_t oh = 0; oh < out[1]; ++oh)
        for (int64_t ow = 0; ow < out[2]; ++ow) {
          C total_d = 0;
          for (int64_t a = 0; a < t[0].used_by(od); ++a) {
            const int64_t id = t[0].index[od * t[0].count + a];
            C total_h = 0;
            for (int64_t b = 0; b < t[1].used_by(oh); ++b) {
              const int64_t ih = t[1].index[oh * t[1].count + b];
              const C* row = xp + (id * in[1] + ih) * in[2];
              const int64_t k = ow * t[2].count;
              C total_w = t[2].weight[k] * row[t[2].index[k]];
              for (int64_t c = 1; c < t[2].used_by(ow); ++c) total_w += t[2].weight[k + c] * row[t[2].index[k + c]];
              const C term_h = t[1].weight[oh * t[1].count + b] * total_w;
              total_h = b == 0 ? term_h : total_h + term_h;
            }
            const C term_d = t[0].weight[od * t[0].count + a] * total_h;
            total_d = a == 0 ? term_d : total_d + term_d;
          }
          yp[(od * out[1] + oh) * out[2] + ow] = total_d;
        }
  }
}

// The adjoint: dx[p, id, ih, iw] += wd * wh * ww * dy[p, od, oh, ow]. dx zeroed.
template <class C>
void taps_backward(const C* dy, C* dx, int64_t planes, const Dims3& in, const std::array<Taps<C>, 3>& t,
                   const Dims3& out) {
  for (int64_t pl = 0; pl < planes; ++pl) {
    C* xp = dx + pl * in[0] * in[1] * in[2];
    const C* yp = dy + pl * out[0] * out[1] * out[2];
    for (int64_t od = 0; od < out[0]; ++od)
      for (int64_t oh = 0; oh < out[1]; ++oh)
        for (int64_t ow = 0; ow < out[2]; ++ow) {
          const C g = yp[(od * out[1] + oh) * out[2] + ow];
          for (int64_t a = 0; a < t[0].used_by(od); ++a) {
            const int64_t id = t[0].index[od * t[0].count + a];
            const C gd = g * t[0].weight[od * t[0].count + a];
            for (int64_t b = 0; b < t[1].used_by(oh); ++b) {
              const int64_t ih = t[1].index[oh * t[1].count + b];
              const C gh = gd * t[1].weight[oh * t[1].count + b];
              C* row = xp + (id * in[1] + ih) * in[2];
              for (int64_t c = 0; c < t[2].used_by(ow); ++c)
                row[t[2].index[ow * t[2].count + c]] += gh * t[2].weight[ow * t[2].count + c];
            }
          }
        }
  }
}

enum class TapKind { nearest, linear, adaptive };

// Resamples x [N, C, spatial...] (contiguous planes) to `out` with the taps of `kind` per
// spatial dim, recording the adjoint. scale: interpolate_scale's factors (one per spatial dim).
Tensor resample(const char* op, const Tensor& x, int spatial, const Dims3& out, TapKind kind,
                const std::optional<std::array<double, 3>>& scale) {
  const Dims3 in = spatial_dims(x.shape(), spatial, x.ndim() - spatial);
  int64_t planes = 1;
  for (int64_t d = 0; d < x.ndim() - spatial; ++d) planes *= x.size(d);
  Shape out_shape = x.shape();
  for (int i = 0; i < spatial; ++i) out_shape[x.ndim() - spatial + i] = out[static_cast<size_t>(3 - spatial + i)];
  // The taps for the compute type C, built once per call (forward and backward share them).
  const auto taps_of = [=]<class C>(TypeTag<C>) {
    std::array<Taps<C>, 3> t{identity_taps<C>(), identity_taps<C>(), identity_taps<C>()};
    for (int i = 3 - spatial; i < 3; ++i) {
      const auto d = static_cast<size_t>(i);
      const double s = scale ? (*scale)[d] : 0.0;
      t[d] = kind == TapKind::nearest  ? nearest_taps<C>(in[d], out[d], s)
             : kind == TapKind::linear ? linear_taps<C>(in[d], out[d], s)
                                       : adaptive_taps<C>(in[d], out[d]);
    }
    return t;
  };
  const DType cdt = compute_dtype(x.dtype());
  Tensor y = empty(out_shape, cdt);
  if (y.numel() > 0) {
    const Tensor xc = compute_copy(x);
    on_compute_type(x.dtype(), [&]<class C>(TypeTag<C> tag) {
      taps_forward<C>(xc.data<C>(), y.data<C>(), planes, in, taps_of(tag), out);
    });
  }
  y = y.to(x.dtype());
  if (autograd::needs_grad<Tensor>({&x}))
    autograd::record<Tensor>(op, y, {&x}, [=, shape = x.shape(), dtype = x.dtype()](const Tensor& grad) {
      Tensor dx = zeros(shape, cdt);
      if (dx.numel() > 0 && grad.numel() > 0) {
        const Tensor dy = compute_copy(grad);
        on_compute_type(dtype, [&]<class C>(TypeTag<C> tag) {
          taps_backward<C>(dy.data<C>(), dx.data<C>(), planes, in, taps_of(tag), out);
        });
      }
      return std::vector<Tensor>{dx.to(dtype)};
    });
  return y;
}

// Checks interpolate's input and mode; returns the number of spatial dims and the tap kind.
int check_interpolate(const Tensor& x, std::string_view mode, TapKind& kind) {
  constexpr const char* op = "interpolate";
  check_defined(x, op, "input");
  check_floating(x, op);
  TESSERA_CHECK(x.ndim() >= 3 && x.ndim() <= 5, ValueError, op, "input shape ", x.shape().to_string(),
                " is not 3-d, 4-d or 5-d; expected [N, C, L], [N, C, H, W] or [N, C, D, H, W]");
  TESSERA_CHECK(mode == "nearest" || mode == "bilinear", ValueError, op, "mode \"", std::string(mode),
                "\" is not supported; expected \"nearest\" or \"bilinear\"");
  TESSERA_CHECK(mode != "bilinear" || x.ndim() == 4, ValueError, op,
                "mode \"bilinear\" needs a 4-d input [N, C, H, W], got ", x.shape().to_string());
  kind = mode == "nearest" ? TapKind::nearest : TapKind::linear;
  return static_cast<int>(x.ndim()) - 2;
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size) {
  constexpr const char* op = "adaptive_avg_pool2d";
  check_pool_input(op, x);
  const Dims3 out = spatial_param(output_size, 2, 1, op, "output_size");
  TESSERA_CHECK(all_at_least(out, 1), ValueError, op, "output_size ", text(output_size),
                " has a value < 1; expected >= 1");
  return resample(op, x, 2, out, TapKind::adaptive, std::nullopt);
}

Tensor interpolate(const Tensor& x, std::vector<int64_t> size, std::string_view mode) {
  TapKind kind{};
  const int spatial = check_interpolate(x, mode, kind);
  const Dims3 out = spatial_param(size, spatial, 1, "interpolate", "size");
  TESSERA_CHECK(all_at_least(out, 1), ValueError, "interpolate", "size ", text(size),
                " has a value < 1; expected >= 1");
  return resample("interpolate", x, spatial, out, kind, std::nullopt);
}

Tensor interpolate_scale(const Tensor& x, std::vector<double> scale, std::string_view mode) {
  constexpr const char* op = "interpolate";
  TapKind kind{};
  const int spatial = check_interpolate(x, mode, kind);
  const auto count = static_cast<int64_t>(scale.size());
  TESSERA_CHECK(count == 1 || count == spatial, ValueError, op, "scale ", text(scale), " has ", count,
                " values; expected 1", spatial == 1 ? "" : detail::concat(" or ", spatial));
  std::array<double, 3> factors{1, 1, 1};
  Dims3 out{1, 1, 1};
  for (int i = 0; i < spatial; ++i) {
    const auto d = static_cast<size_t>(3 - spatial + i);
    factors[d] = scale[static_cast<size_t>(count == 1 ? 0 : i)];
    TESSERA_CHECK(factors[d] > 0, ValueError, op, "scale ", text(scale), " has a value <= 0; expected > 0");
    out[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.size(2 + i)) * factors[d]));
    TESSERA_CHECK(out[d] >= 1, ValueError, op, "scale ", text(scale), " gives an empty output for input ",
                  x.shape().to_string(), "; expected floor(size * scale) >= 1");
  }
  return resample(op, x, spatial, out, kind, factors);
}

}  // namespace tessera
