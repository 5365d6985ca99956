// Convolutions, pooling and resampling, with their derivatives.
//
// Convolution. Every conv is seen as a 3-d one (1-d and 2-d get leading spatial dims of size 1),
// described by a ConvGeometry: x [N, C, in...], weight [O, C / groups, k...], y [N, O, out...].
// Three kernels on that geometry serve the forward and backward of conv and conv_transpose:
//   forward       y_g  = W_g [O/g, C/g*K] @ im2col(x_g) [C/g*K, P]      (P = output positions)
//   input grad    dx_g = col2im(W_g^T @ dy_g)                            (= conv_transpose forward)
//   weight grad   dW_g += dy_g @ im2col(x_g)^T                           (summed over the batch)
// conv_transpose(x, W) is the input grad of the conv whose output x is, so its backward is the
// conv forward (for dx) and the weight grad with the roles of x and dy exchanged.
// im2col never materialises the whole [C/g*K, P] matrix: output positions go in chunks of about
// kColBytes, each chunk unfolded and multiplied while it is still in cache. A 1x1 kernel with
// stride 1 and no padding needs no unfolding at all: x_g is the matrix.
//
// The direct forward walks output channels in blocks of kDirectBlock and output rows; for each
// input channel and kernel tap it adds weight * (an input row) into the block's row accumulators
// (contiguous, vectorised loops when the stride is 1). The library is built for baseline x86-64
// (SSE2) while OpenBLAS picks AVX2/AVX-512 kernels at run time, so on x86-64 the direct loop is
// also compiled for AVX2+FMA and chosen when the CPU has them (1.5-2x over SSE2).
// ConvAlgorithm::automatic picks between the two by chosen_conv_algorithm; the measurement behind
// it is at that function.
//
// Everything is computed in f32 (f64 for f64 inputs); f16/bf16 are converted and back.

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/conv.hpp>
#include <tessera/ops/detail/conv_forward.hpp>
#include <tessera/ops/detail/gemm.hpp>
#include <tessera/ops/detail/spatial_common.hpp>
#include <tessera/ops/linalg.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>

namespace tessera {

namespace {

using namespace detail::spatial;

// Column chunk of im2col: about this many bytes of [C/g*K, cols] matrix per GEMM (kept in L2/L3
// between unfolding and multiplying), and never fewer than kMinChunkCols columns (narrower
// GEMMs lose their efficiency).
constexpr int64_t kColBytes = int64_t{1} << 21;
constexpr int64_t kMinChunkCols = 256;
// Output channels the direct kernel accumulates per pass over an input row.
constexpr int64_t kDirectBlock = 8;

using detail::gemm;

// "L", "H, W", "D, H, W" and the kernel's "K", "KH, KW", "KD, KH, KW".
const char* spatial_names(int spatial) { return spatial == 1 ? "L" : spatial == 2 ? "H, W" : "D, H, W"; }
const char* kernel_names(int spatial) { return spatial == 1 ? "K" : spatial == 2 ? "KH, KW" : "KD, KH, KW"; }

// ---- geometry ------------------------------------------------------------------------------------

// One convolution as a 3-d one: x [batch, in_channels, in], weight [out_channels,
// in_channels / groups, kernel], y [batch, out_channels, out]. `out` is given, not derived: a
// conv_transpose with output_padding >= stride has one more output than the floor formula.
struct ConvGeometry {
  int spatial = 2;
  int64_t batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  Dims3 in{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1}, padding{0, 0, 0}, dilation{1, 1, 1}, out{1, 1, 1};

  int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  int64_t out_plane() const { return out[0] * out[1] * out[2]; }
  int64_t out_rows() const { return out[0] * out[1]; }
  int64_t kernel_volume() const { return kernel[0] * kernel[1] * kernel[2]; }
  int64_t group_in() const { return in_channels / groups; }
  int64_t group_out() const { return out_channels / groups; }
  int64_t col_rows() const { return group_in() * kernel_volume(); }
  // x_g is already the im2col matrix.
  bool pointwise() const { return kernel_volume() == 1 && stride == Dims3{1, 1, 1} && padding == Dims3{0, 0, 0}; }
  Shape shape_of(int64_t channels, const Dims3& dims) const {
    Shape s{batch, channels};
    for (int i = 3 - spatial; i < 3; ++i) s.push_back(dims[static_cast<size_t>(i)]);
    return s;
  }
  Shape x_shape() const { return shape_of(in_channels, in); }
  Shape y_shape() const { return shape_of(out_channels, out); }
  Shape weight_shape() const {
    Shape s{out_channels, group_in()};
    for (int i = 3 - spatial; i < 3; ++i) s.push_back(kernel[static_cast<size_t>(i)]);
    return s;
  }
};

void check_blas_range(const ConvGeometry& g, const char* op) {
  TESSERA_CHECK(g.out_plane() <= INT_MAX && g.in_plane() <= INT_MAX && g.col_rows() <= INT_MAX, ValueError, op,
                "input ", g.x_shape().to_string(), " and weight ", g.weight_shape().to_string(),
                " exceed the 32-bit BLAS index range");
}

// The checks every conv and conv_transpose share: defined operands of one floating dtype, x of
// spatial + 1 or spatial + 2 dims, weight of spatial + 2 dims with no empty kernel dim, groups >= 1.
// Returns whether x is unbatched.
bool check_conv_operands(const char* op, int spatial, const Tensor& x, const Tensor& weight,
                         const std::optional<Tensor>& bias, int64_t groups, const char* weight_layout) {
  check_defined(x, op, "input");
  check_defined(weight, op, "weight");
  if (bias) check_defined(*bias, op, "bias");
  check_floating(x, op);
  TESSERA_CHECK(weight.dtype() == x.dtype(), ValueError, op, "weight dtype ", name(weight.dtype()),
                " differs from input dtype ", name(x.dtype()), "; convert it with .to(", name(x.dtype()), ")");
  TESSERA_CHECK(!bias || bias->dtype() == x.dtype(), ValueError, op, "bias dtype ", name(bias->dtype()),
                " differs from input dtype ", name(x.dtype()), "; convert it with .to(", name(x.dtype()), ")");
  TESSERA_CHECK(x.ndim() == spatial + 1 || x.ndim() == spatial + 2, ValueError, op, "input shape ",
                x.shape().to_string(), " is not ", spatial + 1, "-d or ", spatial + 2, "-d; expected [N, C, ",
                spatial_names(spatial), "] or unbatched [C, ", spatial_names(spatial), "]");
  TESSERA_CHECK(weight.ndim() == spatial + 2, ValueError, op, "weight shape ", weight.shape().to_string(), " is not ",
                spatial + 2, "-d; expected [", weight_layout, ", ", kernel_names(spatial), "]");
  for (int64_t d = 2; d < weight.ndim(); ++d)
    TESSERA_CHECK(weight.size(d) > 0, ValueError, op, "weight shape ", weight.shape().to_string(),
                  " has an empty kernel dim; expected kernel sizes >= 1");
  TESSERA_CHECK(groups >= 1, ValueError, op, "groups ", groups, " is not positive; expected groups >= 1");
  return x.ndim() == spatial + 1;
}

void check_conv_params(const char* op, int spatial, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, ConvGeometry& g) {
  g.stride = spatial_param(stride, spatial, 1, op, "stride");
  g.padding = spatial_param(padding, spatial, 0, op, "padding");
  g.dilation = spatial_param(dilation, spatial, 1, op, "dilation");
  TESSERA_CHECK(all_at_least(g.stride, 1), ValueError, op, "stride ", text(stride), " has a value < 1; expected >= 1");
  TESSERA_CHECK(all_at_least(g.padding, 0), ValueError, op, "padding ", text(padding),
                " has a negative value; expected >= 0");
  TESSERA_CHECK(all_at_least(g.dilation, 1), ValueError, op, "dilation ", text(dilation),
                " has a value < 1; expected >= 1");
}

// Validates a conv's arguments and returns its geometry (batched, even for unbatched x).
ConvGeometry conv_geometry(const char* op, int spatial, const Tensor& x, const Tensor& weight,
                           const std::optional<Tensor>& bias, const std::vector<int64_t>& stride,
                           const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
                           bool& unbatched) {
  unbatched = check_conv_operands(op, spatial, x, weight, bias, groups, "out_channels, in_channels / groups");
  ConvGeometry g;
  g.spatial = spatial;
  g.groups = groups;
  const int64_t lead = unbatched ? 0 : 1;
  g.batch = unbatched ? 1 : x.size(0);
  g.in_channels = x.size(lead);
  g.out_channels = weight.size(0);
  g.in = spatial_dims(x.shape(), spatial, lead + 1);
  g.kernel = spatial_dims(weight.shape(), spatial, 2);
  check_conv_params(op, spatial, stride, padding, dilation, g);
  TESSERA_CHECK(g.out_channels % groups == 0, ValueError, op, "groups ", groups, " does not divide out_channels ",
                g.out_channels, " of weight ", weight.shape().to_string());
  TESSERA_CHECK(g.in_channels % groups == 0, ValueError, op, "groups ", groups, " does not divide in_channels ",
                g.in_channels, " of input ", x.shape().to_string());
  TESSERA_CHECK(weight.size(1) * groups == g.in_channels, ValueError, op, "input ", x.shape().to_string(), " has ",
                g.in_channels, " channels, but weight ", weight.shape().to_string(), " with groups ", groups,
                " expects ", weight.size(1) * groups, " (weight.shape[1] * groups)");
  TESSERA_CHECK(!bias || (bias->ndim() == 1 && bias->size(0) == g.out_channels), ValueError, op, "bias shape ",
                bias->shape().to_string(), " does not match weight ", weight.shape().to_string(), "; expected [",
                g.out_channels, "]");
  for (int i = 3 - spatial; i < 3; ++i) {
    const auto d = static_cast<size_t>(i);
    const int64_t padded = g.in[d] + 2 * g.padding[d], span = g.dilation[d] * (g.kernel[d] - 1) + 1;
    TESSERA_CHECK(span <= padded, ValueError, op, "kernel of weight ", weight.shape().to_string(), " spans ", span,
                  " (dilation ", text(dilation), ") in spatial dim ", i - (3 - spatial),
                  ", more than the padded input ", padded, " of input ", x.shape().to_string(), " (padding ",
                  text(padding), "); expected a kernel no larger than the padded input");
    g.out[d] = (padded - span) / g.stride[d] + 1;
  }
  check_blas_range(g, op);
  return g;
}

// conv_transpose's arguments as the geometry of the conv it is the input grad of: that conv's
// input is the transposed conv's output (out_channels = weight.shape[1] * groups) and its output
// is x.
ConvGeometry conv_transpose_geometry(const char* op, int spatial, const Tensor& x, const Tensor& weight,
                                     const std::optional<Tensor>& bias, const std::vector<int64_t>& stride,
                                     const std::vector<int64_t>& padding, const std::vector<int64_t>& output_padding,
                                     int64_t groups, const std::vector<int64_t>& dilation, bool& unbatched) {
  unbatched = check_conv_operands(op, spatial, x, weight, bias, groups, "in_channels, out_channels / groups");
  ConvGeometry g;
  g.spatial = spatial;
  g.groups = groups;
  const int64_t lead = unbatched ? 0 : 1;
  g.batch = unbatched ? 1 : x.size(0);
  const int64_t channels = x.size(lead);
  g.out_channels = weight.size(0);  // the conv's output: x
  g.in_channels = weight.size(1) * groups;
  g.out = spatial_dims(x.shape(), spatial, lead + 1);
  g.kernel = spatial_dims(weight.shape(), spatial, 2);
  check_conv_params(op, spatial, stride, padding, dilation, g);
  const Dims3 extra = spatial_param(output_padding, spatial, 0, op, "output_padding");
  TESSERA_CHECK(all_at_least(extra, 0), ValueError, op, "output_padding ", text(output_padding),
                " has a negative value; expected >= 0");
  for (size_t d = 0; d < 3; ++d)
    TESSERA_CHECK(extra[d] < g.stride[d] || extra[d] < g.dilation[d], ValueError, op, "output_padding ",
                  text(output_padding), " is not smaller than stride ", text(stride), " or dilation ", text(dilation),
                  "; expected output_padding < max(stride, dilation) in every dim");
  TESSERA_CHECK(channels % groups == 0, ValueError, op, "groups ", groups, " does not divide in_channels ", channels,
                " of input ", x.shape().to_string());
  TESSERA_CHECK(channels == weight.size(0), ValueError, op, "input ", x.shape().to_string(), " has ", channels,
                " channels, but weight ", weight.shape().to_string(), " expects ", weight.size(0),
                " (weight.shape[0])");
  TESSERA_CHECK(!bias || (bias->ndim() == 1 && bias->size(0) == g.in_channels), ValueError, op, "bias shape ",
                bias->shape().to_string(), " does not match weight ", weight.shape().to_string(), " with groups ",
                groups, "; expected [", g.in_channels, "]");
  for (size_t d = 0; d < 3; ++d)
    g.in[d] = (g.out[d] - 1) * g.stride[d] - 2 * g.padding[d] + g.dilation[d] * (g.kernel[d] - 1) + extra[d] + 1;
  TESSERA_CHECK(all_at_least(g.in, 1), ValueError, op, "output size ", g.x_shape().to_string(), " of input ",
                x.shape().to_string(), " and weight ", weight.shape().to_string(), " (stride ", text(stride),
                ", padding ", text(padding), ") is empty; expected every output dim >= 1");
  check_blas_range(g, op);
  return g;
}

// ---- im2col / col2im ----------------------------------------------------------------------------

// The output columns ow with 0 <= ow * stride + offset < size, as [lo, hi) within [0, out).
inline void valid_columns(int64_t offset, int64_t stride, int64_t size, int64_t out, int64_t& lo, int64_t& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  hi = size - 1 - offset < 0 ? 0 : (size - 1 - offset) / stride + 1;
  hi = std::min(hi, out);
  lo = std::min(lo, hi);
}

// Walks the im2col matrix of one group: rows (c, kd, kh, kw) over the output positions
// [p0, p1), calling f(col_row, x_row, a, l, h, b, off, sw) per (matrix row, output row): col_row
// points at output column 0 of that output row within the chunk, x_row at the input row the tap
// reads (null when it lies in the padding); [a, b) are the output row's columns inside the chunk
// and [l, h) the ones whose tap lies inside the input. Column ow reads x_row[ow * sw + off].
template <class X, class Col, class F>
void walk_columns(X* x, const ConvGeometry& g, int64_t p0, int64_t p1, Col* col, F&& f) {
  const int64_t cols = p1 - p0, OW = g.out[2], OH = g.out[1];
  const int64_t D = g.in[0], H = g.in[1], W = g.in[2];
  Col* dst = col;
  for (int64_t c = 0; c < g.group_in(); ++c)
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd)
      for (int64_t kh = 0; kh < g.kernel[1]; ++kh)
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw, dst += cols) {
          const int64_t off = kw * g.dilation[2] - g.padding[2];
          int64_t lo, hi;
          valid_columns(off, g.stride[2], W, OW, lo, hi);
          for (int64_t row = p0 / OW; row * OW < p1; ++row) {
            const int64_t a = std::max<int64_t>(p0 - row * OW, 0), b = std::min(p1 - row * OW, OW);
            const int64_t od = row / OH, oh = row % OH;
            const int64_t id = od * g.stride[0] - g.padding[0] + kd * g.dilation[0];
            const int64_t ih = oh * g.stride[1] - g.padding[1] + kh * g.dilation[1];
            X* src = id < 0 || id >= D || ih < 0 || ih >= H ? nullptr : x + ((c * D + id) * H + ih) * W;
            const int64_t l = std::clamp(lo, a, b), h = std::clamp(hi, l, b);
            f(dst + (row * OW - p0), src, a, l, h, b, off, g.stride[2]);
          }
        }
}

// col [col_rows, p1 - p0] = the im2col columns [p0, p1) of x (one group's channels).
template <class C>
void im2col(const C* x, const ConvGeometry& g, int64_t p0, int64_t p1, C* col) {
  walk_columns(x, g, p0, p1, col,
               [](C* out, const C* src, int64_t a, int64_t l, int64_t h, int64_t b, int64_t off, int64_t sw) {
                 if (!src) {
                   std::fill(out + a, out + b, C(0));
                   return;
                 }
                 std::fill(out + a, out + l, C(0));
                 if (sw == 1) {
                   if (h > l) std::memcpy(out + l, src + (l + off), static_cast<size_t>(h - l) * sizeof(C));
                 } else {
                   for (int64_t ow = l; ow < h; ++ow) out[ow] = src[ow * sw + off];
                 }
                 std::fill(out + h, out + b, C(0));
               });
}

// x (one group's channels) += col2im of col [col_rows, p1 - p0]: the adjoint of im2col.
template <class C>
void col2im_add(C* x, const ConvGeometry& g, int64_t p0, int64_t p1, const C* col) {
  walk_columns(x, g, p0, p1, col,
               [](const C* in, C* dst, int64_t, int64_t l, int64_t h, int64_t, int64_t off, int64_t sw) {
                 if (!dst) return;
                 if (sw == 1) {
                   for (int64_t ow = l; ow < h; ++ow) dst[ow + off] += in[ow];
                 } else {
                   for (int64_t ow = l; ow < h; ++ow) dst[ow * sw + off] += in[ow];
                 }
               });
}

// Output positions per im2col chunk.
template <class C>
int64_t chunk_cols(const ConvGeometry& g) {
  const int64_t by_bytes = kColBytes / static_cast<int64_t>(sizeof(C)) / std::max<int64_t>(g.col_rows(), 1);
  return std::min(std::max(by_bytes, kMinChunkCols), g.out_plane());
}

// ---- the three conv kernels ---------------------------------------------------------------------

template <class C>
void forward_im2col(const C* x, const C* w, const C* bias, C* y, const ConvGeometry& g) {
  const int64_t P = g.out_plane(), K = g.col_rows(), Og = g.group_out(), Cg = g.group_in();
  const int64_t chunk = chunk_cols<C>(g);
  std::vector<C> col(g.pointwise() ? 0 : static_cast<size_t>(K * chunk));
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const C* xg = x + (n * g.in_channels + gi * Cg) * g.in_plane();
      const C* wg = w + gi * Og * K;
      C* yg = y + (n * g.out_channels + gi * Og) * P;
      if (bias)
        for (int64_t o = 0; o < Og; ++o) std::fill(yg + o * P, yg + (o + 1) * P, bias[gi * Og + o]);
      const C beta = bias ? C(1) : C(0);
      if (g.pointwise()) {
        gemm(false, false, Og, P, K, C(1), wg, K, xg, P, beta, yg, P);
        continue;
      }
      for (int64_t p0 = 0; p0 < P; p0 += chunk) {
        const int64_t p1 = std::min(P, p0 + chunk);
        im2col(xg, g, p0, p1, col.data());
        gemm(false, false, Og, p1 - p0, K, C(1), wg, K, col.data(), p1 - p0, beta, yg + p0, P);
      }
    }
}

template <class C>
[[gnu::always_inline]] inline void forward_direct_body(const C* x, const C* w, const C* bias, C* y,
                                                       const ConvGeometry& g) {
  const int64_t P = g.out_plane(), KV = g.kernel_volume(), Og = g.group_out(), Cg = g.group_in();
  const int64_t OW = g.out[2], OH = g.out[1], D = g.in[0], H = g.in[1], W = g.in[2], sw = g.stride[2];
  std::vector<C> acc(static_cast<size_t>(kDirectBlock * OW));
  // Per kernel column: its offset into an input row and the output columns it reaches.
  std::vector<int64_t> offs(static_cast<size_t>(g.kernel[2])), los(offs.size()), his(offs.size());
  for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
    offs[kw] = kw * g.dilation[2] - g.padding[2];
    valid_columns(offs[kw], sw, W, OW, los[kw], his[kw]);
  }
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const C* xg = x + (n * g.in_channels + gi * Cg) * g.in_plane();
      for (int64_t o0 = 0; o0 < Og; o0 += kDirectBlock) {
        const int64_t nb = std::min(kDirectBlock, Og - o0);
        const C* wb = w + (gi * Og + o0) * Cg * KV;
        C* yb = y + (n * g.out_channels + gi * Og + o0) * P;
        for (int64_t row = 0; row < g.out_rows(); ++row) {
          const int64_t od = row / OH, oh = row % OH;
          for (int64_t b = 0; b < nb; ++b)
            std::fill(acc.begin() + b * OW, acc.begin() + (b + 1) * OW, bias ? bias[gi * Og + o0 + b] : C(0));
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
              const int64_t id = od * g.stride[0] - g.padding[0] + kd * g.dilation[0];
              if (id < 0 || id >= D) continue;
              for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
                const int64_t ih = oh * g.stride[1] - g.padding[1] + kh * g.dilation[1];
                if (ih < 0 || ih >= H) continue;
                const C* __restrict src = xg + ((c * D + id) * H + ih) * W;
                const C* taps = wb + c * KV + (kd * g.kernel[1] + kh) * g.kernel[2];
                for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
                  const int64_t off = offs[kw], lo = los[kw], hi = his[kw];
                  for (int64_t b = 0; b < nb; ++b) {
                    const C wv = taps[b * Cg * KV + kw];
                    C* __restrict a = acc.data() + b * OW;
                    if (sw == 1) {
                      for (int64_t ow = lo; ow < hi; ++ow) a[ow] += wv * src[ow + off];
                    } else {
                      for (int64_t ow = lo; ow < hi; ++ow) a[ow] += wv * src[ow * sw + off];
                    }
                  }
                }
              }
            }
          for (int64_t b = 0; b < nb; ++b)
            std::memcpy(yb + b * P + row * OW, acc.data() + b * OW, static_cast<size_t>(OW) * sizeof(C));
        }
      }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TESSERA_CONV_DIRECT_AVX2 1
__attribute__((target("avx2,fma"))) void forward_direct_avx2(const float* x, const float* w, const float* bias,
                                                             float* y, const ConvGeometry& g) {
  forward_direct_body<float>(x, w, bias, y, g);
}
__attribute__((target("avx2,fma"))) void forward_direct_avx2(const double* x, const double* w, const double* bias,
                                                             double* y, const ConvGeometry& g) {
  forward_direct_body<double>(x, w, bias, y, g);
}
#endif

template <class C>
void forward_direct(const C* x, const C* w, const C* bias, C* y, const ConvGeometry& g) {
#ifdef TESSERA_CONV_DIRECT_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return forward_direct_avx2(x, w, bias, y, g);
#endif
  forward_direct_body<C>(x, w, bias, y, g);
}

// dx (zeroed, [N, C, in]) from dy [N, O, out]: col2im(W_g^T dy_g) per group.
template <class C>
void input_grad(const C* dy, const C* w, C* dx, const ConvGeometry& g) {
  const int64_t P = g.out_plane(), K = g.col_rows(), Og = g.group_out(), Cg = g.group_in();
  const int64_t chunk = chunk_cols<C>(g);
  std::vector<C> col(g.pointwise() ? 0 : static_cast<size_t>(K * chunk));
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      C* xg = dx + (n * g.in_channels + gi * Cg) * g.in_plane();
      const C* wg = w + gi * Og * K;
      const C* yg = dy + (n * g.out_channels + gi * Og) * P;
      if (g.pointwise()) {
        gemm(true, false, K, P, Og, C(1), wg, K, yg, P, C(0), xg, P);
        continue;
      }
      for (int64_t p0 = 0; p0 < P; p0 += chunk) {
        const int64_t p1 = std::min(P, p0 + chunk);
        gemm(true, false, K, p1 - p0, Og, C(1), wg, K, yg + p0, P, C(0), col.data(), p1 - p0);
        col2im_add(xg, g, p0, p1, col.data());
      }
    }
}

// dW (zeroed, [O, C/g, k]) += dy_g im2col(x_g)^T over the batch.
template <class C>
void weight_grad(const C* dy, const C* x, C* dw, const ConvGeometry& g) {
  const int64_t P = g.out_plane(), K = g.col_rows(), Og = g.group_out(), Cg = g.group_in();
  const int64_t chunk = chunk_cols<C>(g);
  std::vector<C> col(g.pointwise() ? 0 : static_cast<size_t>(K * chunk));
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const C* xg = x + (n * g.in_channels + gi * Cg) * g.in_plane();
      C* wg = dw + gi * Og * K;
      const C* yg = dy + (n * g.out_channels + gi * Og) * P;
      if (g.pointwise()) {
        gemm(false, true, Og, K, P, C(1), yg, P, xg, P, C(1), wg, K);
        continue;
      }
      for (int64_t p0 = 0; p0 < P; p0 += chunk) {
        const int64_t p1 = std::min(P, p0 + chunk);
        im2col(xg, g, p0, p1, col.data());
        gemm(false, true, Og, K, p1 - p0, C(1), yg + p0, P, col.data(), p1 - p0, C(1), wg, K);
      }
    }
}

ConvAlgorithm resolve(ConvAlgorithm algorithm, const ConvGeometry& g);

// y = conv(x, w) + bias in the compute dtype of x (operands already compute copies).
Tensor run_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const ConvGeometry& g,
                   ConvAlgorithm algorithm) {
  blas_threads();  // configures BLAS threads once (tessera/ops/linalg.hpp)
  Tensor y = empty(g.y_shape(), x.dtype());
  if (y.numel() == 0) return y;
  const bool direct = resolve(algorithm, g) == ConvAlgorithm::direct;
  const auto run = [&]<class C>(TypeTag<C>) {
    const C* b = bias ? bias->data<C>() : nullptr;
    if (g.col_rows() == 0) {  // no input channels: the bias (or zeros) everywhere
      C* out = y.data<C>();
      for (int64_t i = 0; i < y.numel(); ++i) out[i] = b ? b[(i / g.out_plane()) % g.out_channels] : C(0);
    } else if (direct) {
      forward_direct<C>(x.data<C>(), w.data<C>(), b, y.data<C>(), g);
    } else {
      forward_im2col<C>(x.data<C>(), w.data<C>(), b, y.data<C>(), g);
    }
  };
  if (x.dtype() == DType::f64)
    run(TypeTag<double>{});
  else
    run(TypeTag<float>{});
  return y;
}

Tensor run_input_grad(const Tensor& dy, const Tensor& w, const ConvGeometry& g) {
  blas_threads();
  Tensor dx = zeros(g.x_shape(), dy.dtype());
  if (dx.numel() == 0 || dy.numel() == 0 || g.group_out() == 0) return dx;
  if (dy.dtype() == DType::f64)
    input_grad<double>(dy.data<double>(), w.data<double>(), dx.data<double>(), g);
  else
    input_grad<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), g);
  return dx;
}

Tensor run_weight_grad(const Tensor& dy, const Tensor& x, const ConvGeometry& g) {
  blas_threads();
  Tensor dw = zeros(g.weight_shape(), dy.dtype());
  if (dw.numel() == 0 || dy.numel() == 0) return dw;
  if (dy.dtype() == DType::f64)
    weight_grad<double>(dy.data<double>(), x.data<double>(), dw.data<double>(), g);
  else
    weight_grad<float>(dy.data<float>(), x.data<float>(), dw.data<float>(), g);
  return dw;
}

// Sum of dy [N, O, ...] over every dim but 1, in f64, as dtype.
Tensor bias_grad(const Tensor& dy, DType dtype) {
  const Tensor d = dy.to(DType::f64).contiguous();
  const int64_t batch = d.size(0), channels = d.size(1), plane = d.numel() / std::max<int64_t>(batch * channels, 1);
  Tensor out = zeros({channels}, DType::f64);
  double* o = out.data<double>();
  const double* v = d.numel() ? d.data<double>() : nullptr;
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      double total = 0;
      for (int64_t p = 0; p < plane; ++p) total += v[(n * channels + c) * plane + p];
      o[c] += total;
    }
  return out.to(dtype);
}

// Records conv (transposed = false) or conv_transpose over x (batched), weight and bias.
void record_conv(const char* op, Tensor& out, const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                 const ConvGeometry& g, bool transposed) {
  const Tensor* b = bias ? &*bias : nullptr;
  if (!autograd::needs_grad<Tensor>({&x, &weight, b})) return;
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = b && b->requires_grad();
  autograd::record<Tensor>(
      op, out, {&x, &weight, b},
      [x = x.detach(), w = weight.detach(), g, transposed, need_x, need_w, need_b,
       bias_dtype = b ? b->dtype() : x.dtype()](const Tensor& grad) {
        const Tensor dy = compute_copy(grad);
        std::vector<Tensor> grads(3);
        const Tensor wc = compute_copy(w);
        if (need_x)
          grads[0] =
              (transposed ? run_forward(dy, wc, nullptr, g, ConvAlgorithm::automatic) : run_input_grad(dy, wc, g))
                  .to(x.dtype());
        if (need_w) {
          const Tensor xc = compute_copy(x);
          grads[1] = (transposed ? run_weight_grad(xc, dy, g) : run_weight_grad(dy, xc, g)).to(w.dtype());
        }
        if (need_b) grads[2] = bias_grad(dy, bias_dtype);
        return grads;
      });
}

Tensor conv_nd(const char* op, int spatial, const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
               const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
               const std::vector<int64_t>& dilation, int64_t groups) {
  bool unbatched = false;
  const ConvGeometry g = conv_geometry(op, spatial, x, weight, bias, stride, padding, dilation, groups, unbatched);
  const Tensor xb = unbatched ? x.unsqueeze(0) : x;
  const Tensor bc = bias ? compute_copy(*bias) : Tensor();
  Tensor out = run_forward(compute_copy(xb), compute_copy(weight), bias ? &bc : nullptr, g, ConvAlgorithm::automatic)
                   .to(x.dtype());
  record_conv(op, out, xb, weight, bias, g, /*transposed=*/false);
  return unbatched ? out.squeeze(0) : out;
}

}  // namespace

// ---- public ops ---------------------------------------------------------------------------------

namespace detail {

// Measured with tessera_conv_bench (f32 forward, batch 1, one BLAS thread, GFLOP/s of thread CPU
// time; AMD EPYC (Cooper Lake ISA, AVX-512) VM, OpenBLAS 'Cooperlake' kernels, direct loop in AVX2):
//   shape                       O/g    K=C/g*KV   im2col  direct
//   64->64 3x3 128x128           64     576        82.6    22.3
//   128->128 3x3 32x32          128    1152        85.0    13.7
//   256->256 1x1 28x28          256     256       104.3    10.9
//   3->32 3x3 s2 224x224         32      27        53.0    10.1
//   16->16 3x3 64x64             16     144        52.6    19.9
//   64->64 3x3 g8 56x56           8      72        37.8    18.3
//   32->32 3x3 g16 28x28          2      18        11.1     8.2
//   1->1 3x3 32x32                1       9         5.6     5.3
//   depthwise 64 3x3 56x56        1       9         9.8     9.7
//   depthwise 128 3x3 14x14       1       9         4.1     3.1
//   depthwise 32 3x3 s2 64x64     1       9         3.3     4.8
//   depthwise 32 5x5 64x64        1      25         8.0    11.1
//   depthwise 32 5x5 s2 64x64     1      25         3.0     5.0
//   depthwise 32 7x7 112x112      1      49        11.1    16.3
// im2col + GEMM wins wherever a group has several output channels (the GEMM's M), by 1.4-10x. With
// one output channel per group (depthwise) the GEMM is a matrix-vector product and the unfolding
// dominates: the direct loop clearly wins (1.4-1.7x) once the kernel has 25+ taps or a stride
// skips columns (im2col then gathers element by element), and ties or loses (0-30%) on 3x3
// stride 1, where im2col stays. Other classes (1-d, 3-d) follow the same rule, unmeasured.
ConvAlgorithm chosen_conv_algorithm(const Shape& weight, const std::vector<int64_t>& stride, int64_t groups) {
  if (groups < 1 || weight.size() < 3 || weight[0] != groups) return ConvAlgorithm::im2col;
  int64_t taps = 1;
  for (int64_t d = 2; d < weight.size(); ++d) taps *= weight[d];
  const bool strided = std::any_of(stride.begin(), stride.end(), [](int64_t s) { return s > 1; });
  return taps >= 25 || strided ? ConvAlgorithm::direct : ConvAlgorithm::im2col;
}

Tensor conv_forward(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                    const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                    const std::vector<int64_t>& dilation, int64_t groups, ConvAlgorithm algorithm) {
  check_defined(weight, "conv", "weight");
  const int spatial = static_cast<int>(std::clamp<int64_t>(weight.ndim() - 2, 1, 3));
  const char* op = spatial == 1 ? "conv1d" : spatial == 2 ? "conv2d" : "conv3d";
  bool unbatched = false;
  const ConvGeometry g = conv_geometry(op, spatial, x, weight, bias, stride, padding, dilation, groups, unbatched);
  const Tensor bc = bias ? compute_copy(*bias) : Tensor();
  const Tensor xb = unbatched ? x.detach().unsqueeze(0) : x;
  const Tensor out =
      run_forward(compute_copy(xb), compute_copy(weight), bias ? &bc : nullptr, g, algorithm).to(x.dtype());
  return unbatched ? out.squeeze(0) : out;
}

}  // namespace detail

namespace {
ConvAlgorithm resolve(ConvAlgorithm algorithm, const ConvGeometry& g) {
  if (algorithm != ConvAlgorithm::automatic) return algorithm;
  return detail::chosen_conv_algorithm(
      g.weight_shape(), std::vector<int64_t>(g.stride.begin() + (3 - g.spatial), g.stride.end()), g.groups);
}
}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  return conv_nd("conv1d", 1, x, weight, bias, stride, padding, dilation, groups);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  return conv_nd("conv2d", 2, x, weight, bias, stride, padding, dilation, groups);
}

Tensor conv3d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  return conv_nd("conv3d", 3, x, weight, bias, stride, padding, dilation, groups);
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                        std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> output_padding,
                        int64_t groups, std::vector<int64_t> dilation) {
  constexpr const char* op = "conv_transpose2d";
  bool unbatched = false;
  const ConvGeometry g =
      conv_transpose_geometry(op, 2, x, weight, bias, stride, padding, output_padding, groups, dilation, unbatched);
  const Tensor xb = unbatched ? x.unsqueeze(0) : x;
  Tensor out = run_input_grad(compute_copy(xb), compute_copy(weight), g);
  if (bias && out.numel() > 0) {
    const Tensor b = compute_copy(*bias);
    on_compute_type(x.dtype(), [&]<class C>(TypeTag<C>) {
      C* o = out.data<C>();
      const C* bv = b.data<C>();
      const int64_t plane = g.in_plane();
      for (int64_t i = 0; i < out.numel(); ++i) o[i] += bv[(i / plane) % g.in_channels];
    });
  }
  out = out.to(x.dtype());
  record_conv(op, out, xb, weight, bias, g, /*transposed=*/true);
  return unbatched ? out.squeeze(0) : out;
}

}  // namespace tessera
