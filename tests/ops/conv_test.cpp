// Tests for tessera/ops/conv.hpp: convolutions, pools and interpolate against naive double loops
// written here (over strides, paddings, dilations, groups, odd sizes, batch 1 and 3, and both conv
// algorithms), values worked out by hand from PyTorch's semantics, gradcheck of every op in f64,
// and one test per documented error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <tessera/autograd/gradcheck.hpp>
#include <tessera/ops/detail/conv_forward.hpp>
#include <tessera/ops/ops.hpp>
#include <vector>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Deterministic values in [-1, 1).
std::vector<double> sample(int64_t n, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(n));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 12345;
  for (auto& v : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
  return out;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  return make(sample(shape.numel(), seed), shape, dtype);
}

// Distinct values (a permutation of 0.1 * k, shuffled): no ties in any window, so max_pool's
// argmax is stable under gradcheck's finite differences.
Tensor distinct_tensor(const Shape& shape) {
  const int64_t n = shape.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.1 * static_cast<double>((i * 7919 + 13) % n) - 0.05 * n;
  return make(v, shape, DType::f64);
}

std::string show(const Shape& s) { return s.to_string(); }

// ---- the reference convolution ----------------------------------------------------------------

// A convolution over `spatial` dims, every tap enumerated by plain loops: f(x index, weight index,
// y index) for each product x * w that contributes to y. The transposed conv is the adjoint of
// this one (the same taps, read the other way round).
struct RefConv {
  int64_t batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  std::vector<int64_t> in, kernel, stride, padding, dilation, out;

  int64_t plane(const std::vector<int64_t>& dims) const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  Shape x_shape() const { return with(batch, in_channels, in); }
  Shape y_shape() const { return with(batch, out_channels, out); }
  Shape w_shape() const { return with(out_channels, in_channels / groups, kernel); }
  static Shape with(int64_t a, int64_t b, const std::vector<int64_t>& rest) {
    Shape s{a, b};
    for (int64_t d : rest) s.push_back(d);
    return s;
  }

  template <class F>
  void taps(F&& f) const {
    const int64_t nd = static_cast<int64_t>(in.size());
    const int64_t cg = in_channels / groups, og = out_channels / groups;
    const int64_t out_plane = plane(out), kernel_plane = plane(kernel);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t o = 0; o < out_channels; ++o) {
        const int64_t g = o / og;
        for (int64_t p = 0; p < out_plane; ++p)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t k = 0; k < kernel_plane; ++k) {
              // Decompose p and k into per-dim indices (last dim fastest).
              int64_t rest_p = p, rest_k = k, x_index = 0;
              bool inside = true;
              std::vector<int64_t> pos(static_cast<size_t>(nd));
              for (int64_t d = nd - 1; d >= 0; --d) {
                const auto u = static_cast<size_t>(d);
                const int64_t od = rest_p % out[u], kd = rest_k % kernel[u];
                rest_p /= out[u];
                rest_k /= kernel[u];
                pos[u] = od * stride[u] - padding[u] + kd * dilation[u];
                inside = inside && pos[u] >= 0 && pos[u] < in[u];
              }
              if (!inside) continue;
              for (int64_t d = 0; d < nd; ++d)
                x_index = x_index * in[static_cast<size_t>(d)] + pos[static_cast<size_t>(d)];
              x_index += (n * in_channels + g * cg + c) * plane(in);
              const int64_t w_index = (o * cg + c) * kernel_plane + k;
              const int64_t y_index = (n * out_channels + o) * out_plane + p;
              f(x_index, w_index, y_index);
            }
      }
  }
};

// A conv's geometry from the shapes and arguments (one value per spatial dim).
RefConv ref_conv(const Shape& x, const Shape& w, std::vector<int64_t> stride, std::vector<int64_t> padding,
                 std::vector<int64_t> dilation, int64_t groups) {
  RefConv r;
  r.batch = x[0];
  r.in_channels = x[1];
  r.out_channels = w[0];
  r.groups = groups;
  for (int64_t d = 2; d < x.size(); ++d) {
    r.in.push_back(x[d]);
    r.kernel.push_back(w[d]);
    const auto u = static_cast<size_t>(d - 2);
    r.out.push_back((x[d] + 2 * padding[u] - dilation[u] * (w[d] - 1) - 1) / stride[u] + 1);
  }
  r.stride = stride;
  r.padding = padding;
  r.dilation = dilation;
  return r;
}

std::vector<double> ref_forward(const RefConv& r, const std::vector<double>& x, const std::vector<double>& w,
                                const std::vector<double>* bias) {
  std::vector<double> y(static_cast<size_t>(r.y_shape().numel()), 0.0);
  if (bias)
    for (size_t i = 0; i < y.size(); ++i) y[i] = (*bias)[(i / static_cast<size_t>(r.plane(r.out))) % r.out_channels];
  r.taps([&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

// conv_transpose2d by definition: the adjoint of the conv whose input has the transposed output's
// shape; x_t plays that conv's output.
std::vector<double> ref_transpose(const RefConv& r, const std::vector<double>& xt, const std::vector<double>& w,
                                  const std::vector<double>* bias) {
  std::vector<double> y(static_cast<size_t>(r.x_shape().numel()), 0.0);
  if (bias)
    for (size_t i = 0; i < y.size(); ++i) y[i] = (*bias)[(i / static_cast<size_t>(r.plane(r.in))) % r.in_channels];
  r.taps([&](int64_t xi, int64_t wi, int64_t yi) { y[xi] += xt[yi] * w[wi]; });
  return y;
}

constexpr Tol kF64{1e-12, 1e-12};
constexpr Tol kF32{1e-5, 1e-5};

// ---- reference pools and resampling -----------------------------------------------------------

// max / avg pool over [planes, H, W] (count_include_pad: divisor KH * KW).
std::vector<double> ref_pool(const std::vector<double>& x, int64_t planes, int64_t H, int64_t W, int64_t kh, int64_t kw,
                             int64_t sh, int64_t sw, int64_t ph, int64_t pw, bool max, int64_t& OH, int64_t& OW) {
  OH = (H + 2 * ph - kh) / sh + 1;
  OW = (W + 2 * pw - kw) / sw + 1;
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double best = -kInf, total = 0;
        for (int64_t a = 0; a < kh; ++a)
          for (int64_t b = 0; b < kw; ++b) {
            const int64_t h = oh * sh - ph + a, w = ow * sw - pw + b;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = x[static_cast<size_t>((p * H + h) * W + w)];
            best = std::max(best, v);
            total += v;
          }
        y.push_back(max ? best : total / static_cast<double>(kh * kw));
      }
  return y;
}

std::vector<double> ref_adaptive(const std::vector<double>& x, int64_t planes, int64_t H, int64_t W, int64_t OH,
                                 int64_t OW) {
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < OH; ++i)
      for (int64_t j = 0; j < OW; ++j) {
        const int64_t h0 = static_cast<int64_t>(std::floor(static_cast<double>(i * H) / OH));
        const int64_t h1 = static_cast<int64_t>(std::ceil(static_cast<double>((i + 1) * H) / OH));
        const int64_t w0 = static_cast<int64_t>(std::floor(static_cast<double>(j * W) / OW));
        const int64_t w1 = static_cast<int64_t>(std::ceil(static_cast<double>((j + 1) * W) / OW));
        double total = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) total += x[static_cast<size_t>((p * H + h) * W + w)];
        y.push_back(total / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
  return y;
}

// Nearest source index of torch's legacy mode: floor(dst * in / out) (clamped), f32 scale.
int64_t ref_nearest(int64_t dst, int64_t in, int64_t out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(dst) * scale)), in - 1);
}

// Nearest resampling of [planes, in...] (any number of spatial dims) to out.
std::vector<double> ref_interpolate_nearest(const std::vector<double>& x, int64_t planes,
                                            const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  int64_t in_plane = 1, out_plane = 1;
  for (size_t d = 0; d < in.size(); ++d) in_plane *= in[d], out_plane *= out[d];
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t q = 0; q < out_plane; ++q) {
      int64_t rest = q, src = 0, mult = 1;
      for (int64_t d = static_cast<int64_t>(in.size()) - 1; d >= 0; --d) {
        const auto u = static_cast<size_t>(d);
        src += ref_nearest(rest % out[u], in[u], out[u]) * mult;
        rest /= out[u];
        mult *= in[u];
      }
      y.push_back(x[static_cast<size_t>(p * in_plane + src)]);
    }
  return y;
}

// Bilinear (align_corners=False) of [planes, H, W] to [OH, OW], in double from the definition.
std::vector<double> ref_bilinear(const std::vector<double>& x, int64_t planes, int64_t H, int64_t W, int64_t OH,
                                 int64_t OW) {
  const auto source = [](int64_t dst, int64_t in, int64_t out, int64_t& i0, int64_t& i1, double& l1) {
    double s = (static_cast<double>(dst) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5;
    if (s < 0) s = 0;
    i0 = std::min(static_cast<int64_t>(std::floor(s)), in - 1);
    i1 = std::min(i0 + 1, in - 1);
    l1 = std::min(s - static_cast<double>(i0), 1.0);
  };
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < OH; ++i)
      for (int64_t j = 0; j < OW; ++j) {
        int64_t h0, h1, w0, w1;
        double lh, lw;
        source(i, H, OH, h0, h1, lh);
        source(j, W, OW, w0, w1, lw);
        const auto at = [&](int64_t h, int64_t w) { return x[static_cast<size_t>((p * H + h) * W + w)]; };
        y.push_back((1 - lh) * ((1 - lw) * at(h0, w0) + lw * at(h0, w1)) +
                    lh * ((1 - lw) * at(h1, w0) + lw * at(h1, w1)));
      }
  return y;
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      const std::string& what) {
  const auto result = autograd::gradcheck(fn, inputs);
  EXPECT_TRUE(result.ok) << what << ": " << result.message;
}

}  // namespace

// ---- convolution: reference sweeps ---------------------------------------------------------------

TEST(ConvReference, Conv2dOverStridesPaddingsDilationsGroupsAndBothAlgorithms) {
  struct Channels {
    int64_t c, o, groups;
  };
  const std::vector<Channels> channels = {{1, 1, 1}, {3, 4, 1}, {4, 6, 2}, {4, 4, 4}, {6, 3, 3}};
  const std::vector<std::vector<int64_t>> kernels = {{1, 1}, {3, 3}, {2, 3}};
  const std::vector<std::vector<int64_t>> strides = {{1, 1}, {2, 2}, {1, 2}};
  const std::vector<std::vector<int64_t>> paddings = {{0, 0}, {1, 1}, {2, 1}};
  const std::vector<std::vector<int64_t>> dilations = {{1, 1}, {2, 1}};
  const std::vector<std::vector<int64_t>> sizes = {{7, 5}, {5, 9}};
  int cases = 0;
  uint64_t seed = 1;
  for (int64_t batch : {1, 3})
    for (const auto& ch : channels)
      for (const auto& k : kernels)
        for (const auto& s : strides)
          for (const auto& p : paddings)
            for (const auto& d : dilations) {
              const auto& hw = sizes[static_cast<size_t>(cases % 2)];
              const Shape xs{batch, ch.c, hw[0], hw[1]}, ws{ch.o, ch.c / ch.groups, k[0], k[1]};
              const RefConv r = ref_conv(xs, ws, s, p, d, ch.groups);
              const Tensor x = random_tensor(xs, ++seed), w = random_tensor(ws, ++seed),
                           b = random_tensor({ch.o}, ++seed);
              const auto xv = values(x), wv = values(w), bv = values(b);
              const auto expected = ref_forward(r, xv, wv, cases % 3 == 0 ? nullptr : &bv);
              const std::optional<Tensor> bias = cases % 3 == 0 ? std::nullopt : std::optional<Tensor>(b);
              const std::string what = "x " + show(xs) + " w " + show(ws) + " stride " + show(s) + " padding " +
                                       show(p) + " dilation " + show(d) + " groups " + std::to_string(ch.groups);
              EXPECT_TRUE(matches(conv2d(x, w, bias, s, p, d, ch.groups), r.y_shape(), DType::f64, expected, kF64))
                  << what;
              for (ConvAlgorithm a : {ConvAlgorithm::im2col, ConvAlgorithm::direct})
                EXPECT_TRUE(matches(detail::conv_forward(x, w, bias, s, p, d, ch.groups, a), r.y_shape(), DType::f64,
                                    expected, kF64))
                    << what << (a == ConvAlgorithm::im2col ? " im2col" : " direct");
              // f32 through the same kernels.
              EXPECT_TRUE(
                  matches(conv2d(x.to(DType::f32), w.to(DType::f32),
                                 bias ? std::optional<Tensor>(bias->to(DType::f32)) : std::nullopt, s, p, d, ch.groups),
                          r.y_shape(), DType::f32, expected, kF32))
                  << what << " f32";
              ++cases;
            }
  EXPECT_EQ(cases, 2 * 5 * 3 * 3 * 3 * 2);
}

TEST(ConvReference, Conv1dAndConv3dMatchTheReference) {
  uint64_t seed = 100;
  for (int64_t batch : {1, 3})
    for (int64_t groups : {1, 2})
      for (int64_t stride : {1, 3})
        for (int64_t padding : {0, 2})
          for (int64_t dilation : {1, 2}) {
            {  // conv1d
              const Shape xs{batch, 4, 11}, ws{6, 4 / groups, 3};
              const RefConv r = ref_conv(xs, ws, {stride}, {padding}, {dilation}, groups);
              const Tensor x = random_tensor(xs, ++seed), w = random_tensor(ws, ++seed), b = random_tensor({6}, ++seed);
              const auto bv = values(b);
              const auto expected = ref_forward(r, values(x), values(w), &bv);
              for (ConvAlgorithm a : {ConvAlgorithm::automatic, ConvAlgorithm::im2col, ConvAlgorithm::direct})
                EXPECT_TRUE(matches(detail::conv_forward(x, w, b, {stride}, {padding}, {dilation}, groups, a),
                                    r.y_shape(), DType::f64, expected, kF64))
                    << "conv1d " << show(xs) << " " << show(ws) << " s" << stride << " p" << padding << " d"
                    << dilation;
              EXPECT_TRUE(matches(conv1d(x, w, b, {stride}, {padding}, {dilation}, groups), r.y_shape(), DType::f64,
                                  expected, kF64));
            }
            {  // conv3d, odd sizes, per-dim arguments
              const Shape xs{batch, 2, 5, 4, 7}, ws{4, 2 / groups, 2, 3, 2};
              const std::vector<int64_t> s{stride, 1, 2}, p{padding, 1, 0}, d{dilation, 1, 2};
              const RefConv r = ref_conv(xs, ws, s, p, d, groups);
              const Tensor x = random_tensor(xs, ++seed), w = random_tensor(ws, ++seed);
              const auto expected = ref_forward(r, values(x), values(w), nullptr);
              for (ConvAlgorithm a : {ConvAlgorithm::im2col, ConvAlgorithm::direct})
                EXPECT_TRUE(matches(detail::conv_forward(x, w, std::nullopt, s, p, d, groups, a), r.y_shape(),
                                    DType::f64, expected, kF64))
                    << "conv3d " << show(xs) << " " << show(ws) << " s" << show(s) << " p" << show(p) << " d"
                    << show(d);
              EXPECT_TRUE(
                  matches(conv3d(x, w, std::nullopt, s, p, d, groups), r.y_shape(), DType::f64, expected, kF64));
            }
          }
}

TEST(ConvReference, SingleValuesApplyToEverySpatialDim) {
  const Tensor x = random_tensor({2, 3, 9, 8}, 1), w = random_tensor({4, 3, 3, 2}, 2);
  EXPECT_TRUE(allclose(conv2d(x, w, std::nullopt, {2}, {1}, {2}), conv2d(x, w, std::nullopt, {2, 2}, {1, 1}, {2, 2})));
  const Tensor x3 = random_tensor({1, 2, 5, 6, 7}, 3), w3 = random_tensor({2, 2, 2, 2, 2}, 4);
  EXPECT_TRUE(allclose(conv3d(x3, w3, std::nullopt, {2}, {1}), conv3d(x3, w3, std::nullopt, {2, 2, 2}, {1, 1, 1})));
}

TEST(ConvReference, UnbatchedInputsGiveTheBatchOfOne) {
  const Tensor w1 = random_tensor({5, 3, 3}, 1), w2 = random_tensor({5, 3, 3, 3}, 2),
               w3 = random_tensor({5, 3, 2, 2, 2}, 3);
  const Tensor x1 = random_tensor({3, 10}, 4), x2 = random_tensor({3, 6, 7}, 5), x3 = random_tensor({3, 4, 5, 3}, 6);
  const Tensor y1 = conv1d(x1, w1, std::nullopt, {2}, {1});
  EXPECT_EQ(y1.shape(), (Shape{5, 5}));
  EXPECT_TRUE(allclose(y1, conv1d(x1.unsqueeze(0), w1, std::nullopt, {2}, {1}).squeeze(0)));
  const Tensor y2 = conv2d(x2, w2, std::nullopt, {1}, {1});
  EXPECT_EQ(y2.shape(), (Shape{5, 6, 7}));
  EXPECT_TRUE(allclose(y2, conv2d(x2.unsqueeze(0), w2, std::nullopt, {1}, {1}).squeeze(0)));
  const Tensor y3 = conv3d(x3, w3);
  EXPECT_EQ(y3.shape(), (Shape{5, 3, 4, 2}));
  EXPECT_TRUE(allclose(y3, conv3d(x3.unsqueeze(0), w3).squeeze(0)));
  const Tensor wt = random_tensor({3, 2, 3, 3}, 7);
  EXPECT_TRUE(allclose(conv_transpose2d(x2, wt, std::nullopt, {2}),
                       conv_transpose2d(x2.unsqueeze(0), wt, std::nullopt, {2}).squeeze(0)));
}

// Wide channels make im2col work in several column chunks whose borders fall inside output rows;
// the backward (col2im, the weight product) takes the same chunks.
TEST(ConvReference, ChunkedIm2colForwardAndBackwardMatchTheReference) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (int64_t stride : {1, 2}) {
      const Shape xs{2, 64, 45, 47}, ws{5, 64, 3, 3};
      const RefConv r = ref_conv(xs, ws, {stride, stride}, {1, 1}, {1, 1}, 1);
      const Tensor x = random_tensor(xs, 1, dtype), w = random_tensor(ws, 2, dtype);
      const auto xv = values(x), wv = values(w);
      const Tol tol = dtype == DType::f64 ? kF64 : Tol{1e-4, 1e-4};
      const auto expected = ref_forward(r, xv, wv, nullptr);
      for (ConvAlgorithm a : {ConvAlgorithm::im2col, ConvAlgorithm::direct})
        EXPECT_TRUE(matches(detail::conv_forward(x, w, std::nullopt, {stride}, {1}, {1}, 1, a), r.y_shape(), dtype,
                            expected, tol))
            << name(dtype) << " stride " << stride;
      // Backward against the tap-by-tap adjoint.
      Tensor xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_();
      const Tensor g = random_tensor(r.y_shape(), 3, dtype);
      conv2d(xg, wg, std::nullopt, {stride}, {1}).backward(g);
      const auto gv = values(g);
      std::vector<double> dx(xv.size(), 0.0), dw(wv.size(), 0.0);
      r.taps([&](int64_t xi, int64_t wi, int64_t yi) {
        dx[xi] += wv[wi] * gv[yi];
        dw[wi] += xv[xi] * gv[yi];
      });
      const Tol grad_tol = dtype == DType::f64 ? kF64 : Tol{1e-3, 1e-3};
      EXPECT_TRUE(matches(xg.grad(), xs, dtype, dx, grad_tol)) << name(dtype) << " stride " << stride << " dx";
      EXPECT_TRUE(matches(wg.grad(), ws, dtype, dw, grad_tol)) << name(dtype) << " stride " << stride << " dw";
    }
  }
}

TEST(ConvReference, PointwiseKernelsNeedNoUnfolding) {
  const Shape xs{3, 8, 5, 7}, ws{6, 4, 1, 1};
  const RefConv r = ref_conv(xs, ws, {1, 1}, {0, 0}, {1, 1}, 2);
  const Tensor x = random_tensor(xs, 1), w = random_tensor(ws, 2), b = random_tensor({6}, 3);
  const auto bv = values(b);
  EXPECT_TRUE(matches(conv2d(x, w, b, {1}, {0}, {1}, 2), r.y_shape(), DType::f64,
                      ref_forward(r, values(x), values(w), &bv), kF64));
  expect_gradcheck([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], {1}, {0}, {1}, 2); },
                   {random_tensor({2, 8, 3, 2}, 4), w, b}, "pointwise");
}

TEST(ConvReference, HalfPrecisionComputesInF32AndKeepsItsDtype) {
  const Shape xs{2, 3, 6, 5}, ws{4, 3, 3, 3};
  const RefConv r = ref_conv(xs, ws, {1, 1}, {1, 1}, {1, 1}, 1);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Tensor x = random_tensor(xs, 1, dtype), w = random_tensor(ws, 2, dtype);
    const auto expected = ref_forward(r, values(x), values(w), nullptr);
    const Tol tol = dtype == DType::f16 ? Tol{5e-3, 5e-3} : Tol{2e-2, 2e-2};
    EXPECT_TRUE(matches(conv2d(x, w, std::nullopt, {1}, {1}), r.y_shape(), dtype, expected, tol)) << name(dtype);
  }
}

TEST(ConvReference, AutomaticPicksTheDocumentedAlgorithm) {
  // Direct only for one output channel per group with 25+ taps or a stride.
  EXPECT_EQ(detail::chosen_conv_algorithm({8, 1, 3, 3}, {1}, 8), ConvAlgorithm::im2col);
  EXPECT_EQ(detail::chosen_conv_algorithm({8, 1, 3, 3}, {1, 2}, 8), ConvAlgorithm::direct);
  EXPECT_EQ(detail::chosen_conv_algorithm({8, 1, 5, 5}, {1}, 8), ConvAlgorithm::direct);
  EXPECT_EQ(detail::chosen_conv_algorithm({16, 1, 5, 5}, {2}, 8), ConvAlgorithm::im2col);
  EXPECT_EQ(detail::chosen_conv_algorithm({64, 64, 7, 7}, {2}, 1), ConvAlgorithm::im2col);
  EXPECT_EQ(detail::chosen_conv_algorithm({1, 1, 3, 3}, {2}, 1), ConvAlgorithm::direct);
  // Whatever it picks, the result is that algorithm's.
  for (const std::vector<int64_t>& stride : {std::vector<int64_t>{1}, {2}}) {
    const Tensor x = random_tensor({1, 8, 12, 12}, 1), w = random_tensor({8, 1, 3, 3}, 2);
    const ConvAlgorithm chosen = detail::chosen_conv_algorithm(w.shape(), stride, 8);
    EXPECT_TRUE(equal(detail::conv_forward(x, w, std::nullopt, stride, {1}, {1}, 8, ConvAlgorithm::automatic),
                      detail::conv_forward(x, w, std::nullopt, stride, {1}, {1}, 8, chosen)));
  }
}

TEST(ConvTranspose2dReference, MatchesTheAdjointOfConv2d) {
  struct Case {
    int64_t c, o, groups;
    std::vector<int64_t> kernel, stride, padding, output_padding, dilation;
  };
  const std::vector<Case> cases = {
      {1, 1, 1, {2, 2}, {1, 1}, {0, 0}, {0, 0}, {1, 1}}, {3, 4, 1, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}},
      {4, 6, 2, {3, 2}, {2, 3}, {1, 0}, {0, 2}, {1, 1}}, {4, 4, 4, {3, 3}, {1, 1}, {1, 1}, {0, 0}, {2, 2}},
      {2, 3, 1, {2, 3}, {1, 2}, {0, 1}, {1, 1}, {2, 1}},  // output_padding >= stride, < dilation in dim 0
  };
  uint64_t seed = 1;
  for (int64_t batch : {1, 3})
    for (const Case& k : cases) {
      const Shape xs{batch, k.c, 5, 4}, ws{k.c, k.o / k.groups, k.kernel[0], k.kernel[1]};
      // The conv whose adjoint this is: input = the transposed output, output = x.
      RefConv r;
      r.batch = batch;
      r.in_channels = k.o;
      r.out_channels = k.c;
      r.groups = k.groups;
      r.kernel = k.kernel;
      r.stride = k.stride;
      r.padding = k.padding;
      r.dilation = k.dilation;
      r.out = {5, 4};
      for (size_t d = 0; d < 2; ++d)
        r.in.push_back((r.out[d] - 1) * k.stride[d] - 2 * k.padding[d] + k.dilation[d] * (k.kernel[d] - 1) +
                       k.output_padding[d] + 1);
      const Tensor x = random_tensor(xs, ++seed), w = random_tensor(ws, ++seed), b = random_tensor({k.o}, ++seed);
      const auto bv = values(b);
      const auto expected = ref_transpose(r, values(x), values(w), &bv);
      EXPECT_TRUE(matches(conv_transpose2d(x, w, b, k.stride, k.padding, k.output_padding, k.groups, k.dilation),
                          r.x_shape(), DType::f64, expected, kF64))
          << "x " << show(xs) << " w " << show(ws) << " stride " << show(k.stride);
    }
}

// ---- convolution: values by hand (PyTorch semantics) -------------------------------------------

TEST(ConvValues, OneChannel4x4WithAKnownKernel) {
  // x = 1..16 as one 4x4 channel; w = [[1, 2], [3, 4]]: each step right adds sum(w) = 10, down 40.
  const Tensor x = make(iota(16, 1), {1, 1, 4, 4}, DType::f32);
  const Tensor w = make({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f32);
  EXPECT_TRUE(matches(conv2d(x, w), {1, 1, 3, 3}, DType::f32, {44, 54, 64, 84, 94, 104, 124, 134, 144}, kF32));
  EXPECT_TRUE(matches(conv2d(x, w, make({1}, {1}, DType::f32)), {1, 1, 3, 3}, DType::f32,
                      {45, 55, 65, 85, 95, 105, 125, 135, 145}, kF32));
  // stride 2, padding 1: windows start at -1, 1, 3; the padding reads 0.
  EXPECT_TRUE(matches(conv2d(x, w, std::nullopt, {2}, {1}), {1, 1, 3, 3}, DType::f32,
                      {4, 18, 12, 46, 94, 44, 26, 44, 16}, kF32));
  // [[1, 0], [0, -1]]: x[i, j] - x[i + 1, j + 1] = -5 everywhere.
  EXPECT_TRUE(matches(conv2d(x, make({1, 0, 0, -1}, {1, 1, 2, 2}, DType::f32)), {1, 1, 3, 3}, DType::f32,
                      std::vector<double>(9, -5.0), kF32));
}

TEST(ConvValues, DilatedConv1dAndDepthwiseGroups) {
  const Tensor x = make({1, 2, 3, 4, 5}, {1, 1, 5}, DType::f64);
  const Tensor w = make({1, 0, -1}, {1, 1, 3}, DType::f64);
  // Dilation 2 spans 5: x[0] - x[4].
  EXPECT_TRUE(matches(conv1d(x, w, std::nullopt, {1}, {0}, {2}), {1, 1, 1}, DType::f64, {-4}, kF64));
  // Padding 2: y[i] = x[i - 2] - x[i + 2].
  EXPECT_TRUE(matches(conv1d(x, w, std::nullopt, {1}, {2}, {2}), {1, 1, 5}, DType::f64, {-3, -4, -4, 2, 3}, kF64));
  // groups 2: channel 0 meets w[0], channel 1 meets w[1] only.
  const Tensor x2 = make({1, 2, 3, 10, 20, 30}, {2, 3}, DType::f64);
  const Tensor w2 = make({1, 1, 2, -1}, {2, 1, 2}, DType::f64);
  EXPECT_TRUE(matches(conv1d(x2, w2, std::nullopt, {1}, {0}, {1}, 2), {2, 2}, DType::f64, {3, 5, 0, 10}, kF64));
}

TEST(ConvValues, TransposedConvSpreadsEachInputOverTheKernel) {
  const Tensor x = make({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f32);
  const Tensor w = make({1, 1, 1, 1}, {1, 1, 2, 2}, DType::f32);
  // Stride 2: each value fills its own 2x2 block.
  EXPECT_TRUE(matches(conv_transpose2d(x, w, std::nullopt, {2}), {1, 1, 4, 4}, DType::f32,
                      {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, kF32));
  // Stride 1: the blocks overlap and add.
  EXPECT_TRUE(matches(conv_transpose2d(x, w), {1, 1, 3, 3}, DType::f32, {1, 3, 2, 4, 10, 6, 3, 7, 4}, kF32));
  // Padding 1 crops one ring: the centre.
  EXPECT_TRUE(matches(conv_transpose2d(x, w, std::nullopt, {1}, {1}), {1, 1, 1, 1}, DType::f32, {10}, kF32));
  // output_padding 1 adds a last row and column that only the bias reaches.
  EXPECT_TRUE(matches(conv_transpose2d(x, w, make({0.5}, {1}, DType::f32), {2}, {0}, {1}), {1, 1, 5, 5}, DType::f32,
                      {1.5, 1.5, 2.5, 2.5, 0.5, 1.5, 1.5, 2.5, 2.5, 0.5, 3.5, 3.5, 4.5,
                       4.5, 0.5, 3.5, 3.5, 4.5, 4.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5},
                      kF32));
}

// ---- convolution: gradients -------------------------------------------------------------------

TEST(ConvGrad, EveryConvPassesGradcheck) {
  expect_gradcheck([](const std::vector<Tensor>& in) { return conv1d(in[0], in[1], in[2], {2}, {1}, {2}, 2); },
                   {random_tensor({2, 4, 9}, 1), random_tensor({6, 2, 3}, 2), random_tensor({6}, 3)}, "conv1d");
  expect_gradcheck([](const std::vector<Tensor>& in) { return conv1d(in[0], in[1]); },
                   {random_tensor({3, 5}, 4), random_tensor({2, 3, 2}, 5)}, "conv1d unbatched, no bias");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv2d(in[0], in[1], in[2], {2, 1}, {1, 2}, {1, 2}, 1);
      },
      {random_tensor({2, 3, 5, 6}, 6), random_tensor({2, 3, 3, 2}, 7), random_tensor({2}, 8)}, "conv2d");
  expect_gradcheck([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], {1}, {1}, {1}, 3); },
                   {random_tensor({1, 3, 4, 5}, 9), random_tensor({3, 1, 3, 3}, 10), random_tensor({3}, 11)},
                   "conv2d depthwise");
  expect_gradcheck([](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], std::nullopt, {2}, {0}); },
                   {random_tensor({2, 5, 5}, 12), random_tensor({3, 2, 2, 3}, 13)}, "conv2d unbatched");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv3d(in[0], in[1], in[2], {1, 2, 1}, {1, 0, 1}, {1}, 2);
      },
      {random_tensor({1, 2, 3, 4, 3}, 14), random_tensor({2, 1, 2, 2, 2}, 15), random_tensor({2}, 16)}, "conv3d");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return conv_transpose2d(in[0], in[1], in[2], {2}, {1}, {1}, 2, {1}); },
      {random_tensor({2, 4, 3, 3}, 17), random_tensor({4, 1, 3, 3}, 18), random_tensor({2}, 19)}, "conv_transpose2d");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return conv_transpose2d(in[0], in[1], std::nullopt, {1, 2}, {0, 1}, {1, 0}, 1, {2, 1});
      },
      {random_tensor({2, 3, 4}, 20), random_tensor({2, 3, 2, 3}, 21)}, "conv_transpose2d unbatched, dilated");
}

TEST(ConvGrad, HalfPrecisionGradientsKeepTheirDtypes) {
  Tensor x = random_tensor({1, 2, 5, 5}, 1, DType::bf16).requires_grad_();
  Tensor w = random_tensor({3, 2, 3, 3}, 2, DType::bf16).requires_grad_();
  Tensor b = random_tensor({3}, 3, DType::bf16).requires_grad_();
  conv2d(x, w, b, {1}, {1}).backward(ones({1, 3, 5, 5}, DType::bf16));
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  EXPECT_EQ(b.grad().dtype(), DType::bf16);
  EXPECT_TRUE(matches(b.grad(), {3}, DType::bf16, {25, 25, 25}, kF32));
}

// ---- convolution: errors (one per documented error) ---------------------------------------------

TEST(ConvErrors, UndefinedOperands) {
  const Tensor w = zeros({1, 1, 3, 3});
  EXPECT_TRUE(value_error([&] { conv2d(Tensor(), w); }, {"[conv2d] ", "input tensor is undefined"}));
  EXPECT_TRUE(value_error([&] { conv2d(zeros({1, 1, 4, 4}), Tensor()); }, {"[conv2d] ", "weight tensor is undefined"}));
}

TEST(ConvErrors, NonFloatingDtype) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}, DType::i64), zeros({1, 1, 3, 3}, DType::i64));
      },
      {"[conv2d] ", "unsupported dtype i64 of input [1, 1, 4, 4]", "floating"}));
}

TEST(ConvErrors, OperandDtypesDiffer) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}, DType::f64));
      },
      {"[conv2d] ", "weight dtype f64 differs from input dtype f32"}));
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), zeros({1}, DType::f64));
      },
      {"[conv2d] ", "bias dtype f64 differs from input dtype f32"}));
}

TEST(ConvErrors, WrongNdim) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({4, 4}), zeros({1, 1, 3, 3}));
      },
      {"[conv2d] ", "input shape [4, 4] is not 3-d or 4-d", "[N, C, H, W]"}));
  EXPECT_TRUE(value_error(
      [] {
        conv1d(zeros({1, 1, 1, 4}), zeros({1, 1, 3}));
      },
      {"[conv1d] ", "input shape [1, 1, 1, 4] is not 2-d or 3-d", "[N, C, L]"}));
  EXPECT_TRUE(value_error(
      [] {
        conv3d(zeros({1, 1, 4, 4, 4}), zeros({1, 1, 3, 3}));
      },
      {"[conv3d] ", "weight shape [1, 1, 3, 3] is not 5-d", "KD, KH, KW"}));
}

TEST(ConvErrors, EmptyKernelDim) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 0, 3}));
      },
      {"[conv2d] ", "weight shape [1, 1, 0, 3] has an empty kernel dim"}));
}

TEST(ConvErrors, GroupsNotPositive) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 2, 4, 4}), zeros({2, 2, 3, 3}), std::nullopt, {1}, {0}, {1}, 0);
      },
      {"[conv2d] ", "groups 0 is not positive"}));
}

TEST(ConvErrors, GroupsNotDividingChannels) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 4, 4, 4}), zeros({3, 2, 3, 3}), std::nullopt, {1}, {0}, {1}, 2);
      },
      {"[conv2d] ", "groups 2 does not divide out_channels 3 of weight [3, 2, 3, 3]"}));
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 5, 4, 4}), zeros({4, 2, 3, 3}), std::nullopt, {1}, {0}, {1}, 2);
      },
      {"[conv2d] ", "groups 2 does not divide in_channels 5 of input [1, 5, 4, 4]"}));
}

TEST(ConvErrors, ChannelMismatch) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 3, 8, 8}), zeros({8, 2, 3, 3}));
      },
      {"[conv2d] ", "input [1, 3, 8, 8] has 3 channels, but weight [8, 2, 3, 3] with groups 1 expects 2"}));
}

TEST(ConvErrors, BiasShape) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 3, 8, 8}), zeros({8, 3, 3, 3}), zeros({3}));
      },
      {"[conv2d] ", "bias shape [3] does not match weight [8, 3, 3, 3]; expected [8]"}));
}

TEST(ConvErrors, SpatialArguments) {
  const Tensor x = zeros({1, 1, 6, 6}), w = zeros({1, 1, 3, 3});
  EXPECT_TRUE(value_error(
      [&] {
        conv2d(x, w, std::nullopt, {1, 1, 1});
      },
      {"[conv2d] ", "stride [1, 1, 1] has 3 values; expected 1 or 2"}));
  EXPECT_TRUE(value_error(
      [&] {
        conv1d(zeros({1, 1, 6}), zeros({1, 1, 3}), std::nullopt, {1}, {1, 1});
      },
      {"[conv1d] ", "padding [1, 1] has 2 values; expected 1"}));
  EXPECT_TRUE(value_error([&] { conv2d(x, w, std::nullopt, {1, 0}); }, {"[conv2d] ", "stride [1, 0] has a value < 1"}));
  EXPECT_TRUE(
      value_error([&] { conv2d(x, w, std::nullopt, {1}, {-1}); }, {"[conv2d] ", "padding [-1] has a negative value"}));
  EXPECT_TRUE(
      value_error([&] { conv2d(x, w, std::nullopt, {1}, {0}, {0}); }, {"[conv2d] ", "dilation [0] has a value < 1"}));
}

TEST(ConvErrors, KernelLargerThanPaddedInput) {
  EXPECT_TRUE(value_error(
      [] {
        conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5}));
      },
      {"[conv2d] ", "kernel of weight [1, 1, 5, 5] spans 5", "more than the padded input 4", "input [1, 1, 4, 4]"}));
  // Dilation counts: 3 taps 2 apart span 5 > 4.
  EXPECT_TRUE(value_error(
      [] {
        conv1d(zeros({1, 1, 4}), zeros({1, 1, 3}), std::nullopt, {1}, {0}, {2});
      },
      {"[conv1d] ", "spans 5 (dilation [2])"}));
  // Padding helps: 4 + 2 * 1 >= 5.
  EXPECT_EQ(conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 5, 5}), std::nullopt, {1}, {1}).shape(), (Shape{1, 1, 2, 2}));
}

TEST(ConvErrors, TransposedConvArguments) {
  const Tensor x = zeros({1, 4, 3, 3});
  EXPECT_TRUE(value_error(
      [&] {
        conv_transpose2d(x, zeros({3, 2, 3, 3}));
      },
      {"[conv_transpose2d] ", "input [1, 4, 3, 3] has 4 channels, but weight [3, 2, 3, 3] expects 3"}));
  EXPECT_TRUE(value_error(
      [&] {
        conv_transpose2d(zeros({1, 3, 3, 3}), zeros({3, 2, 3, 3}), std::nullopt, {1}, {0}, {0}, 2);
      },
      {"[conv_transpose2d] ", "groups 2 does not divide in_channels 3"}));
  EXPECT_TRUE(value_error(
      [&] {
        conv_transpose2d(x, zeros({4, 2, 3, 3}), std::nullopt, {2}, {0}, {2});
      },
      {"[conv_transpose2d] ", "output_padding [2] is not smaller than stride [2] or dilation [1]"}));
  EXPECT_TRUE(value_error(
      [&] {
        conv_transpose2d(x, zeros({4, 2, 3, 3}), std::nullopt, {2}, {0}, {-1});
      },
      {"[conv_transpose2d] ", "output_padding [-1] has a negative value"}));
  EXPECT_TRUE(value_error(
      [&] {
        conv_transpose2d(zeros({1, 4, 1, 1}), zeros({4, 2, 1, 1}), std::nullopt, {1}, {1});
      },
      {"[conv_transpose2d] ", "output size [1, 2, -1, -1]", "is empty"}));
  EXPECT_TRUE(value_error(
      [&] {
        conv_transpose2d(x, zeros({4, 2, 3, 3}), zeros({4}));
      },
      {"[conv_transpose2d] ", "bias shape [4] does not match weight [4, 2, 3, 3] with groups 1; expected [2]"}));
}

// ---- pools ------------------------------------------------------------------------------------

TEST(PoolReference, MaxAndAvgPoolOverKernelsStridesAndPaddings) {
  uint64_t seed = 1;
  for (const Shape& xs : {Shape{1, 2, 7, 5}, Shape{3, 1, 6, 9}})
    for (const std::vector<int64_t>& k : {std::vector<int64_t>{2, 2}, {3, 3}, {3, 2}, {1, 1}})
      for (const std::vector<int64_t>& s : {std::vector<int64_t>{}, {1, 1}, {2, 1}, {3, 3}})
        for (const std::vector<int64_t>& p : {std::vector<int64_t>{0, 0}, {1, 1}, {1, 0}}) {
          if (2 * p[0] > k[0] || 2 * p[1] > k[1]) continue;
          const std::vector<int64_t> stride = s.empty() ? k : s;
          const Tensor x = random_tensor(xs, ++seed);
          int64_t OH = 0, OW = 0;
          const auto xv = values(x);
          const auto mx =
              ref_pool(xv, xs[0] * xs[1], xs[2], xs[3], k[0], k[1], stride[0], stride[1], p[0], p[1], true, OH, OW);
          const auto av =
              ref_pool(xv, xs[0] * xs[1], xs[2], xs[3], k[0], k[1], stride[0], stride[1], p[0], p[1], false, OH, OW);
          const Shape ys{xs[0], xs[1], OH, OW};
          const std::string what = show(xs) + " kernel " + show(k) + " stride " + show(s) + " padding " + show(p);
          EXPECT_TRUE(matches(max_pool2d(x, k, s, p), ys, DType::f64, mx, kF64)) << what;
          EXPECT_TRUE(matches(avg_pool2d(x, k, s, p), ys, DType::f64, av, kF64)) << what;
          EXPECT_TRUE(matches(max_pool2d(x.to(DType::f32), k, s, p), ys, DType::f32, mx, kF32)) << what;
        }
}

TEST(PoolReference, AdaptiveAvgPoolOverDivisibleAndUnevenSizes) {
  uint64_t seed = 1;
  for (const Shape& xs : {Shape{1, 2, 7, 5}, Shape{3, 1, 6, 9}, Shape{2, 8, 8}})
    for (const std::vector<int64_t>& out : {std::vector<int64_t>{1}, {3}, {2, 4}, {7, 5}, {4, 3}, {9, 11}}) {
      const Tensor x = random_tensor(xs, ++seed);
      const int64_t H = xs[xs.size() - 2], W = xs[xs.size() - 1], planes = xs.numel() / (H * W);
      const int64_t OH = out[0], OW = out.size() == 1 ? out[0] : out[1];
      Shape ys = xs;
      ys[ys.size() - 2] = OH;
      ys[ys.size() - 1] = OW;
      EXPECT_TRUE(
          matches(adaptive_avg_pool2d(x, out), ys, DType::f64, ref_adaptive(values(x), planes, H, W, OH, OW), kF64))
          << show(xs) << " -> " << show(out);
    }
}

TEST(PoolValues, FourByFourByHand) {
  const Tensor x = make(iota(16, 1), {1, 1, 4, 4}, DType::f32);
  EXPECT_TRUE(matches(max_pool2d(x, {2}), {1, 1, 2, 2}, DType::f32, {6, 8, 14, 16}, kF32));
  EXPECT_TRUE(matches(max_pool2d(x, {3}, {1}, {1}), {1, 1, 4, 4}, DType::f32,
                      {6, 7, 8, 8, 10, 11, 12, 12, 14, 15, 16, 16, 14, 15, 16, 16}, kF32));
  EXPECT_TRUE(matches(avg_pool2d(x, {2}), {1, 1, 2, 2}, DType::f32, {3.5, 5.5, 11.5, 13.5}, kF32));
  // count_include_pad: the padding's zeros count in the divisor 9.
  EXPECT_TRUE(
      matches(avg_pool2d(x, {3}, {2}, {1}), {1, 1, 2, 2}, DType::f32, {14.0 / 9, 30.0 / 9, 57.0 / 9, 11}, kF32));
  // Windows [0, 2), [1, 3), [2, 4) in both dims.
  EXPECT_TRUE(matches(adaptive_avg_pool2d(x, {3}), {1, 1, 3, 3}, DType::f32,
                      {3.5, 4.5, 5.5, 7.5, 8.5, 9.5, 11.5, 12.5, 13.5}, kF32));
  // 5 columns into 3: [0, 2), [1, 4), [3, 5).
  EXPECT_TRUE(matches(adaptive_avg_pool2d(make({1, 2, 3, 4, 5}, {1, 1, 5}, DType::f32), {1, 3}), {1, 1, 3}, DType::f32,
                      {1.5, 3, 4.5}, kF32));
}

TEST(PoolValues, MaxPoolPropagatesNaNAndPadsWithMinusInfinity) {
  const Tensor x = make({1, kNaN, 3, 4}, {1, 2, 2}, DType::f64);
  const auto y = values(max_pool2d(x, {2}));
  EXPECT_TRUE(std::isnan(y[0]));
  const Tensor neg = make({-5, -6, -7, -8}, {1, 2, 2}, DType::f64);
  EXPECT_TRUE(
      matches(max_pool2d(neg, {2}, {1}, {1}), {1, 3, 3}, DType::f64, {-5, -5, -6, -5, -5, -6, -7, -7, -8}, kF64));
}

TEST(PoolGrad, EveryPoolPassesGradcheck) {
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1});
      },
      {distinct_tensor({2, 2, 5, 6})}, "max_pool2d");
  expect_gradcheck([](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2}); }, {distinct_tensor({3, 4, 5})},
                   "max_pool2d unbatched");
  expect_gradcheck([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3}, {2}, {1}); },
                   {random_tensor({2, 2, 5, 6}, 1)}, "avg_pool2d");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return avg_pool2d(in[0], {2, 3}, {1, 2}, {1, 0});
      },
      {random_tensor({3, 4, 5}, 2)}, "avg_pool2d unbatched");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return adaptive_avg_pool2d(in[0], {3, 4});
      },
      {random_tensor({2, 2, 7, 5}, 3)}, "adaptive_avg_pool2d");
  expect_gradcheck([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {6}); },
                   {random_tensor({2, 4, 3}, 4)}, "adaptive_avg_pool2d upsampling");
}

TEST(PoolGrad, MaxPoolGradientGoesToTheFirstMaximum) {
  Tensor x = make({2, 2, 1, 2}, {1, 2, 2}, DType::f64).requires_grad_();
  max_pool2d(x, {2}).backward(ones({1, 1, 1}, DType::f64));
  EXPECT_TRUE(matches(x.grad(), {1, 2, 2}, DType::f64, {1, 0, 0, 0}, kF64));
}

TEST(PoolErrors, Input) {
  EXPECT_TRUE(value_error([] { max_pool2d(Tensor(), {2}); }, {"[max_pool2d] ", "input tensor is undefined"}));
  EXPECT_TRUE(value_error(
      [] {
        max_pool2d(zeros({1, 4, 4}, DType::i32), {2});
      },
      {"[max_pool2d] ", "unsupported dtype i32 of input [1, 4, 4]"}));
  EXPECT_TRUE(value_error(
      [] {
        avg_pool2d(zeros({4, 4}), {2});
      },
      {"[avg_pool2d] ", "input shape [4, 4] is not 3-d or 4-d"}));
  EXPECT_TRUE(value_error(
      [] {
        avg_pool2d(zeros({1, 0, 4}), {1});
      },
      {"[avg_pool2d] ", "input shape [1, 0, 4] has an empty spatial dim"}));
}

TEST(PoolErrors, Arguments) {
  const Tensor x = zeros({1, 1, 6, 6});
  EXPECT_TRUE(value_error(
      [&] {
        max_pool2d(x, {2, 2, 2});
      },
      {"[max_pool2d] ", "kernel [2, 2, 2] has 3 values; expected 1 or 2"}));
  EXPECT_TRUE(value_error([&] { max_pool2d(x, {2}, {1, 1, 1}); }, {"[max_pool2d] ", "stride [1, 1, 1] has 3 values"}));
  EXPECT_TRUE(value_error(
      [&] {
        max_pool2d(x, {2}, {}, {0, 0, 0});
      },
      {"[max_pool2d] ", "padding [0, 0, 0] has 3 values"}));
  EXPECT_TRUE(value_error([&] { avg_pool2d(x, {0, 2}); }, {"[avg_pool2d] ", "kernel [0, 2] has a value < 1"}));
  EXPECT_TRUE(value_error([&] { avg_pool2d(x, {2}, {0}); }, {"[avg_pool2d] ", "stride [0] has a value < 1"}));
  EXPECT_TRUE(
      value_error([&] { avg_pool2d(x, {2}, {}, {-1}); }, {"[avg_pool2d] ", "padding [-1] has a negative value"}));
  EXPECT_TRUE(value_error([&] { max_pool2d(x, {3}, {1}, {2}); },
                          {"[max_pool2d] ", "padding [2] is more than half of kernel [3]"}));
  EXPECT_TRUE(value_error(
      [&] {
        max_pool2d(zeros({1, 3, 8}), {4});
      },
      {"[max_pool2d] ", "output is empty for input [1, 3, 8] with kernel [4]"}));
}

TEST(PoolErrors, AdaptiveArguments) {
  EXPECT_TRUE(value_error(
      [] {
        adaptive_avg_pool2d(zeros({1, 4, 4}, DType::i64), {2});
      },
      {"[adaptive_avg_pool2d] ", "unsupported dtype i64"}));
  EXPECT_TRUE(value_error([] { adaptive_avg_pool2d(zeros({4}), {2}); },
                          {"[adaptive_avg_pool2d] ", "input shape [4] is not 3-d or 4-d"}));
  EXPECT_TRUE(value_error(
      [] {
        adaptive_avg_pool2d(zeros({1, 4, 4}), {2, 2, 2});
      },
      {"[adaptive_avg_pool2d] ", "output_size [2, 2, 2] has 3 values"}));
  EXPECT_TRUE(value_error(
      [] {
        adaptive_avg_pool2d(zeros({1, 4, 4}), {0});
      },
      {"[adaptive_avg_pool2d] ", "output_size [0] has a value < 1"}));
  EXPECT_TRUE(value_error(
      [] {
        adaptive_avg_pool2d(zeros({1, 0, 4}), {2});
      },
      {"[adaptive_avg_pool2d] ", "input shape [1, 0, 4] has an empty spatial dim"}));
}

// ---- interpolate ------------------------------------------------------------------------------

TEST(InterpolateReference, NearestOverEveryRankAndSize) {
  uint64_t seed = 1;
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 3, 5}, {8}},       {{2, 3, 5}, {3}},         {{2, 3, 5}, {10}},
      {{1, 1, 7}, {7}},       {{1, 2, 4, 5}, {7, 3}},   {{3, 1, 3, 3}, {6}},
      {{1, 2, 5, 4}, {2, 9}}, {{1, 1, 6, 5}, {13, 11}}, {{1, 2, 3, 4, 5}, {5, 3, 7}},
      {{2, 1, 2, 3, 2}, {4}},
  };
  for (const auto& [xs, size] : cases) {
    const Tensor x = random_tensor(xs, ++seed);
    std::vector<int64_t> in, out;
    int64_t planes = xs[0] * xs[1];
    for (int64_t d = 2; d < xs.size(); ++d) {
      in.push_back(xs[d]);
      out.push_back(size.size() == 1 ? size[0] : size[static_cast<size_t>(d - 2)]);
    }
    Shape ys{xs[0], xs[1]};
    for (int64_t o : out) ys.push_back(o);
    // Nearest copies values: exact.
    EXPECT_TRUE(
        matches(interpolate(x, size), ys, DType::f64, ref_interpolate_nearest(values(x), planes, in, out), Tol{0, 0}))
        << show(xs) << " -> " << show(size);
  }
}

TEST(InterpolateReference, BilinearUpAndDown) {
  uint64_t seed = 1;
  for (const Shape& xs : {Shape{1, 1, 2, 2}, Shape{2, 3, 5, 4}, Shape{1, 2, 7, 9}})
    for (const std::vector<int64_t>& size : {std::vector<int64_t>{4}, {3, 8}, {11, 5}, {2, 2}, {1, 1}}) {
      const Tensor x = random_tensor(xs, ++seed);
      const int64_t OH = size[0], OW = size.size() == 1 ? size[0] : size[1];
      const auto expected = ref_bilinear(values(x), xs[0] * xs[1], xs[2], xs[3], OH, OW);
      EXPECT_TRUE(matches(interpolate(x, size, "bilinear"), {xs[0], xs[1], OH, OW}, DType::f64, expected, kF64))
          << show(xs) << " -> " << show(size);
      EXPECT_TRUE(
          matches(interpolate(x.to(DType::f32), size, "bilinear"), {xs[0], xs[1], OH, OW}, DType::f32, expected, kF32))
          << show(xs) << " -> " << show(size) << " f32";
    }
}

TEST(InterpolateValues, ByHand) {
  // Nearest, 3 -> 5: sources floor(d * 0.6) = 0, 0, 1, 1, 2.
  EXPECT_TRUE(
      matches(interpolate(make({1, 2, 3}, {1, 1, 3}, DType::f32), {5}), {1, 1, 5}, DType::f32, {1, 1, 2, 2, 3}, kF32));
  // 5 -> 2: floor(d * 2.5) = 0, 2.
  EXPECT_TRUE(
      matches(interpolate(make({1, 2, 3, 4, 5}, {1, 1, 5}, DType::f32), {2}), {1, 1, 2}, DType::f32, {1, 3}, kF32));
  // Bilinear [[1, 2], [3, 4]] -> 4x4 (align_corners=False), as torch gives.
  EXPECT_TRUE(matches(interpolate(make({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f32), {4}, "bilinear"), {1, 1, 4, 4},
                      DType::f32, {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4},
                      kF32));
  EXPECT_TRUE(matches(interpolate_scale(make({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f32), {2.0}, "bilinear"), {1, 1, 4, 4},
                      DType::f32, {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4},
                      kF32));
  // Scale 1.7 on 4: 6 outputs whose sources use 1 / 1.7 (torch's scale), not 4 / 6:
  // floor(d / 1.7) = 0, 0, 1, 1, 2, 2 (4 / 6 would give 0, 0, 1, 2, 2, 3).
  EXPECT_TRUE(matches(interpolate_scale(make({10, 20, 30, 40}, {1, 1, 4}, DType::f32), {1.7}), {1, 1, 6}, DType::f32,
                      {10, 10, 20, 20, 30, 30}, kF32));
  // Per-dim scales on 5-d: out = floor(in * scale).
  EXPECT_EQ(interpolate_scale(zeros({1, 1, 2, 3, 4}), {1.5, 2.0, 0.5}).shape(), (Shape{1, 1, 3, 6, 2}));
}

TEST(InterpolateGrad, EveryModePassesGradcheck) {
  expect_gradcheck([](const std::vector<Tensor>& in) { return interpolate(in[0], {7}); }, {random_tensor({2, 2, 4}, 1)},
                   "nearest 1-d up");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return interpolate(in[0], {3, 5});
      },
      {random_tensor({1, 2, 5, 3}, 2)}, "nearest 2-d");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return interpolate(in[0], {3, 2, 5});
      },
      {random_tensor({1, 1, 2, 4, 3}, 3)}, "nearest 3-d");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return interpolate(in[0], {5, 7}, "bilinear");
      },
      {random_tensor({2, 1, 3, 4}, 4)}, "bilinear up");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return interpolate(in[0], {2, 3}, "bilinear");
      },
      {random_tensor({1, 2, 5, 7}, 5)}, "bilinear down");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return interpolate_scale(in[0], {1.7, 0.6}, "bilinear");
      },
      {random_tensor({1, 1, 4, 5}, 6)}, "bilinear by scale");
  expect_gradcheck([](const std::vector<Tensor>& in) { return interpolate_scale(in[0], {2.5}); },
                   {random_tensor({1, 2, 3}, 7)}, "nearest by scale");
}

TEST(InterpolateErrors, Input) {
  EXPECT_TRUE(value_error([] { interpolate(Tensor(), {2}); }, {"[interpolate] ", "input tensor is undefined"}));
  EXPECT_TRUE(value_error(
      [] {
        interpolate(zeros({1, 1, 4}, DType::i64), {2});
      },
      {"[interpolate] ", "unsupported dtype i64 of input [1, 1, 4]"}));
  EXPECT_TRUE(value_error(
      [] {
        interpolate(zeros({1, 4}), {2});
      },
      {"[interpolate] ", "input shape [1, 4] is not 3-d, 4-d or 5-d"}));
}

TEST(InterpolateErrors, Mode) {
  EXPECT_TRUE(value_error(
      [] {
        interpolate(zeros({1, 1, 4, 4}), {2}, "bicubic");
      },
      {"[interpolate] ", "mode \"bicubic\" is not supported; expected \"nearest\" or \"bilinear\""}));
  EXPECT_TRUE(value_error(
      [] {
        interpolate(zeros({1, 1, 4}), {2}, "bilinear");
      },
      {"[interpolate] ", "mode \"bilinear\" needs a 4-d input [N, C, H, W], got [1, 1, 4]"}));
}

TEST(InterpolateErrors, Size) {
  EXPECT_TRUE(value_error(
      [] {
        interpolate(zeros({1, 1, 4, 4}), {2, 2, 2});
      },
      {"[interpolate] ", "size [2, 2, 2] has 3 values; expected 1 or 2"}));
  EXPECT_TRUE(value_error(
      [] {
        interpolate(zeros({1, 1, 4, 4}), {2, 0});
      },
      {"[interpolate] ", "size [2, 0] has a value < 1"}));
}

TEST(InterpolateErrors, Scale) {
  EXPECT_TRUE(value_error(
      [] {
        interpolate_scale(zeros({1, 1, 4, 4}), {2.0, 2.0, 2.0});
      },
      {"[interpolate] ", "scale [2, 2, 2] has 3 values; expected 1 or 2"}));
  EXPECT_TRUE(value_error(
      [] {
        interpolate_scale(zeros({1, 1, 4, 4}), {0.0});
      },
      {"[interpolate] ", "scale [0] has a value <= 0"}));
  EXPECT_TRUE(value_error(
      [] {
        interpolate_scale(zeros({1, 1, 4, 4}), {0.2});
      },
      {"[interpolate] ", "scale [0.2] gives an empty output for input [1, 1, 4, 4]"}));
}
