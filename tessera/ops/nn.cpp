// Neural-network ops: softmax family, normalisations, embedding, cross entropy.
//
// Every kernel reads a contiguous input viewed as [outer, n, inner], where n is the size of
// the normalised/reduced dim(s). inner == 1 (the reduced dim is innermost) is the fast path:
// plain loops over a row. inner > 1 walks the n rows of each [n, inner] block and keeps one
// accumulator per inner lane, so the inner loops still run over contiguous memory and no
// transposed copy is needed. Values are computed in compute_t<T> and stored back as T.
#include <tessera/ops/nn.hpp>

#include <tessera/ops/internal/composites.hpp>
#include <tessera/ops/indexing.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/ops/detail/class_targets.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/detail/vector_math.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/fused_backward.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

// A contiguous tensor seen as [outer, n, inner] around the reduced dim(s).
struct Split {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
};

// Dims [begin, end) of shape form n; dims before them outer, dims after them inner.
Split split_dims(const Shape& shape, int64_t begin, int64_t end) {
  Split s;
  for (int64_t d = 0; d < shape.size(); ++d) {
    if (d < begin) s.outer *= shape[d];
    else if (d < end) s.n *= shape[d];
    else s.inner *= shape[d];
  }
  return s;
}

void check_defined(const Tensor& t, const char* op, const char* what) {
  TESSERA_CHECK(t.defined(), ValueError, op, what, " tensor is undefined");
}

template <class C>
constexpr C neg_inf() {
  return -std::numeric_limits<C>::infinity();
}

// NaN never wins the comparison, so a NaN lane keeps a finite max and its exp() turns the
// whole lane into NaN downstream, which is the result we want.
template <class C>
inline C max_of(C a, C b) {
  return b > a ? b : a;
}

// ---- softmax / log_softmax -------------------------------------------------------------------

// A scratch row of n floats for this thread's softmax.
std::vector<float>& exp_buffer(int64_t n) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer;
}

// softmax: y = exp(x - max) / sum(exp(x - max)); the exps are kept in a buffer so each is
// computed once. log_softmax: y = (x - max) - log(sum(exp(x - max))), subtracting the max
// first so that large-magnitude rows keep their precision.
template <class T, bool kLog>
void softmax_kernel(const T* x, T* y, const Split& s) {
  using C = compute_t<T>;
  const int64_t n = s.n, inner = s.inner;
  if (inner == 1) {
    std::vector<C> e(static_cast<size_t>(n));
    for (int64_t o = 0; o < s.outer; ++o) {
      const T* xr = x + o * n;
      T* yr = y + o * n;
      C m = neg_inf<C>();
      for (int64_t i = 0; i < n; ++i) {
        e[i] = static_cast<C>(xr[i]);
        m = max_of(m, e[i]);
      }
      for (int64_t i = 0; i < n; ++i) e[i] -= m;
      C total = 0;
      if constexpr (kLog) {
        if constexpr (std::is_same_v<C, float>) {
          std::vector<float>& p = exp_buffer(n);
          detail::vexp(e.data(), p.data(), n);
          for (int64_t i = 0; i < n; ++i) total += p[i];
        } else {
          for (int64_t i = 0; i < n; ++i) total += std::exp(e[i]);
        }
        const C log_total = std::log(total);
        for (int64_t i = 0; i < n; ++i) yr[i] = T(e[i] - log_total);
      } else {
        if constexpr (std::is_same_v<C, float>)
          detail::vexp(e.data(), e.data(), n);
        else
          for (int64_t i = 0; i < n; ++i) e[i] = std::exp(e[i]);
        for (int64_t i = 0; i < n; ++i) total += e[i];
        const C scale = C(1) / total;
        for (int64_t i = 0; i < n; ++i) yr[i] = T(e[i] * scale);
      }
    }
    return;
  }
  std::vector<C> e(static_cast<size_t>(n * inner)), m(static_cast<size_t>(inner)), total(static_cast<size_t>(inner));
  for (int64_t o = 0; o < s.outer; ++o) {
    const T* xb = x + o * n * inner;
    T* yb = y + o * n * inner;
    std::fill(m.begin(), m.end(), neg_inf<C>());
    std::fill(total.begin(), total.end(), C(0));
    for (int64_t i = 0; i < n; ++i) {
      const T* xr = xb + i * inner;
      C* er = e.data() + i * inner;
      for (int64_t j = 0; j < inner; ++j) {
        er[j] = static_cast<C>(xr[j]);
        m[j] = max_of(m[j], er[j]);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      C* er = e.data() + i * inner;
      for (int64_t j = 0; j < inner; ++j) {
        er[j] -= m[j];
        total[j] += std::exp(er[j]);
      }
    }
    if constexpr (kLog) {
      for (int64_t j = 0; j < inner; ++j) total[j] = std::log(total[j]);
      for (int64_t i = 0; i < n; ++i) {
        const C* er = e.data() + i * inner;
        T* yr = yb + i * inner;
        for (int64_t j = 0; j < inner; ++j) yr[j] = T(er[j] - total[j]);
      }
    } else {
      for (int64_t j = 0; j < inner; ++j) total[j] = C(1) / total[j];
      for (int64_t i = 0; i < n; ++i) {
        const C* er = e.data() + i * inner;
        T* yr = yb + i * inner;
        for (int64_t j = 0; j < inner; ++j) yr[j] = T(std::exp(er[j]) * total[j]);
      }
    }
  }
}

template <bool kLog>
Tensor softmax_impl(const Tensor& x, int64_t dim, const char* op) {
  check_defined(x, op, "input");
  const int64_t d = normalize_dim(dim, x.ndim(), op, x.shape());
  return visit_floating(x.dtype(), op, [&]<class T>(TypeTag<T>) {
    Tensor out = empty(x.shape(), x.dtype());
    if (x.numel() == 0) return out;
    const Tensor in = x.contiguous();
    const Split s = split_dims(x.shape(), d, d + 1);  // a 0-d tensor is one row of one element
    softmax_kernel<T, kLog>(in.data<T>(), out.data<T>(), s);
    return out;
  });
}

// ---- layer_norm / rms_norm -------------------------------------------------------------------

// Checks normalized_shape against x and an optional affine parameter; returns the start of the
// normalised trailing dims.
int64_t check_normalized_shape(const Tensor& x, const Shape& normalized_shape, const char* op) {
  check_defined(x, op, "input");
  TESSERA_CHECK(!normalized_shape.empty(), ValueError, op, "normalized_shape [] is empty; expected at least one ",
                "trailing dim of input shape ", x.shape().to_string());
  const int64_t k = normalized_shape.size();
  bool match = k <= x.ndim();
  for (int64_t i = 0; match && i < k; ++i) match = x.shape()[x.ndim() - k + i] == normalized_shape[i];
  TESSERA_CHECK(match, ValueError, op, "normalized_shape ", normalized_shape.to_string(),
                " does not match the trailing dims of input shape ", x.shape().to_string());
  return x.ndim() - k;
}

void check_affine(const std::optional<Tensor>& param, const char* what, const Tensor& x, const Shape& normalized_shape,
                  const char* op) {
  if (!param) return;
  check_defined(*param, op, what);
  TESSERA_CHECK(param->shape() == normalized_shape, ValueError, op, what, " shape ", param->shape().to_string(),
                " does not match normalized_shape ", normalized_shape.to_string(), " (input shape ",
                x.shape().to_string(), ")");
  TESSERA_CHECK(param->dtype() == x.dtype(), ValueError, op, what, " dtype ", name(param->dtype()),
                " does not match input dtype ", name(x.dtype()), "; convert it with .to(", name(x.dtype()), ")");
}

// The affine parameter as n compute-type values; `fill` stands in for an absent one (1 for a
// weight, 0 for a bias, both exact no-ops) so the row loop has no branches.
template <class T>
std::vector<compute_t<T>> affine_values(const std::optional<Tensor>& param, int64_t n, compute_t<T> fill) {
  std::vector<compute_t<T>> values(static_cast<size_t>(n), fill);
  if (param) {
    const Tensor c = param->contiguous();
    const T* p = c.data<T>();
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<compute_t<T>>(p[i]);
  }
  return values;
}

// Rows of n contiguous elements; the mean and variance use two passes (stabler than E[x^2]-E[x]^2).
template <class T>
void layer_norm_kernel(const T* x, T* y, int64_t rows, int64_t n, const compute_t<T>* w, const compute_t<T>* b,
                       compute_t<T> eps) {
  using C = compute_t<T>;
  std::vector<C> v(static_cast<size_t>(n));
  const C inv_n = C(1) / static_cast<C>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    C total = 0;
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = static_cast<C>(xr[i]);
      total += v[i];
    }
    const C mean = total * inv_n;
    C squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) {
      v[i] -= mean;
      squares += v[i] * v[i];
    }
    const C rstd = C(1) / std::sqrt(squares * inv_n + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = T(v[i] * rstd * w[i] + b[i]);
  }
}

template <class T>
void rms_norm_kernel(const T* x, T* y, int64_t rows, int64_t n, const compute_t<T>* w, compute_t<T> eps) {
  using C = compute_t<T>;
  const C inv_n = C(1) / static_cast<C>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    C squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) {
      const C v = static_cast<C>(xr[i]);
      squares += v * v;
    }
    const C rrms = C(1) / std::sqrt(squares * inv_n + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = T(static_cast<C>(xr[i]) * rrms * w[i]);
  }
}

// ---- cross_entropy ---------------------------------------------------------------------------

// For each lane (o, j) of a contiguous [outer, n, inner] block: the lane max and
// log(sum(exp(x - max))), kept apart so that a loss (max + log_sum) - x loses no precision
// when the logits are large.
template <class T>
void lane_logsumexp(const T* x, const Split& s, std::vector<compute_t<T>>& max_out,
                    std::vector<compute_t<T>>& log_sum_out) {
  using C = compute_t<T>;
  const int64_t n = s.n, inner = s.inner;
  max_out.assign(static_cast<size_t>(s.outer * inner), neg_inf<C>());
  log_sum_out.assign(static_cast<size_t>(s.outer * inner), C(0));
  if constexpr (std::is_same_v<C, float>) {
    if (inner == 1) {  // rows: shifted into a buffer, exponentiated by the vector math library
      std::vector<float> e(static_cast<size_t>(n));
      for (int64_t o = 0; o < s.outer; ++o) {
        const T* xr = x + o * n;
        for (int64_t i = 0; i < n; ++i) e[i] = static_cast<C>(xr[i]);
        log_sum_out[o] = std::log(detail::exp_minus_max(e.data(), n, max_out[o]));
      }
      return;
    }
  }
  for (int64_t o = 0; o < s.outer; ++o) {
    const T* xb = x + o * n * inner;
    C* m = max_out.data() + o * inner;
    C* total = log_sum_out.data() + o * inner;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) m[j] = max_of(m[j], static_cast<C>(xb[i * inner + j]));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) total[j] += std::exp(static_cast<C>(xb[i * inner + j]) - m[j]);
    for (int64_t j = 0; j < inner; ++j) total[j] = std::log(total[j]);
  }
}

void record_embedding(Tensor& out, const Tensor& weight, const Tensor& ids, std::optional<int64_t> padding_idx) {
  if (!autograd::needs_grad<Tensor>({&weight})) return;
  autograd::record<Tensor>("embedding", out, {&weight},
                           [rows = weight.size(0), dtype = weight.dtype(), ids, padding_idx](const Tensor& g) {
                             return std::vector<Tensor>{detail::embedding_backward(g, ids, rows, dtype, padding_idx)};
                           });
}

// The gradient of cross_entropy: (softmax - one_hot(target)) on kept targets, scaled by the
// reduction (1 / kept for mean), in one fused pass (cross_entropy_backward).
void record_cross_entropy(Tensor& out, const Tensor& logits, const Tensor& target, int64_t ignore_index,
                          Reduction reduction) {
  if (!autograd::needs_grad<Tensor>({&logits})) return;
  autograd::record<Tensor>(
      "cross_entropy", out, {&logits}, [x = logits.detach(), target, ignore_index, reduction](const Tensor& g) {
        Tensor per_target = g;
        if (reduction == Reduction::mean)
          per_target = div(g, sum(ne(target, Scalar(ignore_index))).to(g.dtype())).expand(target.shape());
        else if (reduction == Reduction::sum)
          per_target = g.expand(target.shape());
        return std::vector<Tensor>{cross_entropy_backward(per_target, x, target, ignore_index)};
      });
}

}  // namespace

Tensor detail::checked_class_targets(const Tensor& target, int64_t classes, int64_t ignore_index, const Shape& logits,
                                     const char* op) {
  const Tensor t = target.to(DType::i64).contiguous();
  const int64_t count = t.numel();
  const int64_t* ts = count > 0 ? t.data<int64_t>() : nullptr;
  for (int64_t k = 0; k < count; ++k)
    TESSERA_CHECK(ts[k] == ignore_index || (ts[k] >= 0 && ts[k] < classes), ValueError, op, "target ", ts[k],
                  " out of range for logits shape ", logits.to_string(), " with ", classes,
                  " classes; expected a class in [0, ", classes, ") or ignore_index ", ignore_index);
  return t;
}

std::optional<int64_t> embedding_padding_index(std::optional<int64_t> padding_idx, const Shape& weight_shape) {
  if (!padding_idx) return std::nullopt;
  const int64_t num = weight_shape.size() >= 1 ? weight_shape[0] : 0, p = *padding_idx;
  TESSERA_CHECK(p >= -num && p < num, ValueError, "embedding", "padding_idx ", p, " out of range for weight shape ",
                weight_shape.to_string(), "; expected padding_idx in [", -num, ", ", num, ")");
  return p < 0 ? p + num : p;
}

Tensor detail::embedding_backward(const Tensor& grad, const Tensor& indices, int64_t rows, DType dtype,
                                  std::optional<int64_t> skip_row) {
  const int64_t dim = grad.ndim() == 0 ? 1 : grad.shape()[grad.ndim() - 1], count = indices.numel();
  Tensor acc = zeros({rows, dim}, DType::f64);
  // Rows summed in f64, read in their own dtype when f32 or f64 (no widened copy of the gradient).
  const DType read = grad.dtype() == DType::f32 ? DType::f32 : DType::f64;
  const Tensor src_rows = grad.to(read).reshape({count, dim}).contiguous();
  const Tensor ids = indices.to(DType::i64).contiguous();
  const int64_t* id = count > 0 ? ids.data<int64_t>() : nullptr;
  double* dst = acc.data<double>();
  const auto scatter = [&]<class S>(const S* src) {
    for (int64_t k = 0; k < count; ++k) {
      if (id[k] < 0 || id[k] >= rows || (skip_row && id[k] == *skip_row)) continue;
      for (int64_t j = 0; j < dim; ++j) dst[id[k] * dim + j] += src[k * dim + j];
    }
  };
  if (count > 0 && read == DType::f32) scatter(src_rows.data<float>());
  else if (count > 0) scatter(src_rows.data<double>());
  return acc.to(dtype);
}

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = softmax_impl<false>(x, dim, "softmax");
  derivatives::record_softmax(out, x, dim, /*log_of=*/false);
  return out;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor out = softmax_impl<true>(x, dim, "log_softmax");
  derivatives::record_softmax(out, x, dim, /*log_of=*/true);
  return out;
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps) {
  constexpr const char* op = "layer_norm";
  const int64_t begin = check_normalized_shape(x, normalized_shape, op);
  check_affine(weight, "weight", x, normalized_shape, op);
  check_affine(bias, "bias", x, normalized_shape, op);
  Tensor result = visit_floating(x.dtype(), op, [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    Tensor out = empty(x.shape(), x.dtype());
    if (x.numel() == 0) return out;
    const Split s = split_dims(x.shape(), begin, x.ndim());
    const std::vector<C> w = affine_values<T>(weight, s.n, C(1));
    const std::vector<C> b = affine_values<T>(bias, s.n, C(0));
    const Tensor in = x.contiguous();
    layer_norm_kernel<T>(in.data<T>(), out.data<T>(), s.outer, s.n, w.data(), b.data(), static_cast<C>(eps));
    return out;
  });
  derivatives::record_norm("layer_norm", result, x, normalized_shape.size(), weight, bias, eps, /*centred=*/true);
  return result;
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight, double eps) {
  constexpr const char* op = "rms_norm";
  const int64_t begin = check_normalized_shape(x, normalized_shape, op);
  check_affine(weight, "weight", x, normalized_shape, op);
  Tensor result = visit_floating(x.dtype(), op, [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    Tensor out = empty(x.shape(), x.dtype());
    if (x.numel() == 0) return out;
    const Split s = split_dims(x.shape(), begin, x.ndim());
    const std::vector<C> w = affine_values<T>(weight, s.n, C(1));
    const Tensor in = x.contiguous();
    rms_norm_kernel<T>(in.data<T>(), out.data<T>(), s.outer, s.n, w.data(), static_cast<C>(eps));
    return out;
  });
  derivatives::record_norm("rms_norm", result, x, normalized_shape.size(), weight, std::optional<Tensor>(), eps,
                           /*centred=*/false);
  return result;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  constexpr const char* op = "embedding";
  check_defined(weight, op, "weight");
  check_defined(indices, op, "indices");
  TESSERA_CHECK(weight.ndim() == 2, ValueError, op, "weight shape ", weight.shape().to_string(),
                " is not 2-d; expected [num_embeddings, embedding_dim]");
  TESSERA_CHECK(is_integral(indices.dtype()), ValueError, op, "indices of shape ", indices.shape().to_string(),
                " have dtype ", name(indices.dtype()), "; expected an integer dtype (i32, i64 or u8)");
  const std::optional<int64_t> pad = embedding_padding_index(padding_idx, weight.shape());
  const int64_t rows = weight.size(0), dim = weight.size(1);
  const Tensor idx = indices.to(DType::i64).contiguous();
  const int64_t count = idx.numel();
  const int64_t* ids = count > 0 ? idx.data<int64_t>() : nullptr;
  for (int64_t k = 0; k < count; ++k)
    TESSERA_CHECK(ids[k] >= 0 && ids[k] < rows, ValueError, op, "index ", ids[k], " out of range for weight shape ",
                  weight.shape().to_string(), "; expected an index in [0, ", rows, ")");

  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, weight.dtype());
  record_embedding(out, weight, idx, pad);
  if (out.numel() == 0) return out;
  // A gather of whole rows: bytes are all that move, so no dtype dispatch is needed.
  const int64_t item = weight.itemsize();
  const int64_t row_stride = weight.stride(0) * item, col_stride = weight.stride(1) * item;
  const char* src = static_cast<const char*>(weight.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const size_t row_bytes = static_cast<size_t>(dim * item);
  for (int64_t k = 0; k < count; ++k, dst += row_bytes) {
    const char* row = src + ids[k] * row_stride;
    if (col_stride == item || dim == 1) {
      std::memcpy(dst, row, row_bytes);
    } else {
      for (int64_t j = 0; j < dim; ++j) std::memcpy(dst + j * item, row + j * col_stride, static_cast<size_t>(item));
    }
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  constexpr const char* op = "cross_entropy";
  check_defined(logits, op, "logits");
  check_defined(target, op, "target");
  TESSERA_CHECK(logits.ndim() >= 1, ValueError, op, "logits shape [] has no class dim; expected [C], [N, C] or ",
                "[N, C, d1, ...]");
  // Target shape: logits shape without the class dim (dim 0 for [C], dim 1 otherwise).
  const int64_t class_dim = logits.ndim() == 1 ? 0 : 1;
  Shape expected = logits.shape();
  expected.erase(class_dim);
  TESSERA_CHECK(target.shape() == expected, ValueError, op, "target shape ", target.shape().to_string(),
                " does not match logits shape ", logits.shape().to_string(), "; expected target shape ",
                expected.to_string());
  TESSERA_CHECK(is_integral(target.dtype()), ValueError, op, "target of shape ", target.shape().to_string(),
                " has dtype ", name(target.dtype()), "; expected class indices of an integer dtype (i32, i64 or u8)");
  const int64_t classes = logits.size(class_dim);
  const Tensor tgt = detail::checked_class_targets(target, classes, ignore_index, logits.shape(), op);
  const int64_t count = tgt.numel();
  const int64_t* t = count > 0 ? tgt.data<int64_t>() : nullptr;

  Tensor result = visit_floating(logits.dtype(), op, [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    if (reduction == Reduction::none && count == 0) return empty(target.shape(), logits.dtype());
    const Split s = split_dims(logits.shape(), class_dim, class_dim + 1);
    const Tensor in = logits.contiguous();
    const T* x = in.numel() > 0 ? in.data<T>() : nullptr;
    std::vector<C> m, log_sum;
    lane_logsumexp<T>(x, s, m, log_sum);

    // Target element k = (o, j) picks logits[o, t[k], j].
    Tensor losses = reduction == Reduction::none ? empty(target.shape(), logits.dtype()) : Tensor();
    T* loss_out = reduction == Reduction::none ? losses.data<T>() : nullptr;
    double total = 0;  // across rows in double: a long mean in f32 would drift
    int64_t kept = 0;
    for (int64_t k = 0; k < count; ++k) {
      C loss = 0;
      if (t[k] != ignore_index) {
        const int64_t o = k / s.inner, j = k % s.inner;
        const C picked = static_cast<C>(x[(o * s.n + t[k]) * s.inner + j]);
        loss = log_sum[k] - (picked - m[k]);
        total += static_cast<double>(loss);
        ++kept;
      }
      if (loss_out) loss_out[k] = T(loss);
    }
    if (reduction == Reduction::none) return losses;
    if (reduction == Reduction::sum) return scalar_tensor(total, logits.dtype());
    // 0 / 0 is NaN when every target is ignored, as in PyTorch.
    return scalar_tensor(total / static_cast<double>(kept), logits.dtype());
  });
  record_cross_entropy(result, logits, tgt.reshape(target.shape()), ignore_index, reduction);
  return result;
}

int64_t class_dim_of(const Shape& logits, DType logits_dtype, const Shape& target, DType target_dtype, const char* op) {
  TESSERA_CHECK(logits.size() >= 1, ValueError, op,
                "input shape [] has no class dim; expected [C], [N, C] or [N, C, d1, ...]");
  const int64_t class_dim = logits.size() == 1 ? 0 : 1;
  Shape expected = logits;
  expected.erase(class_dim);
  TESSERA_CHECK(target == expected, ValueError, op, "target shape ", target.to_string(), " does not match input shape ",
                logits.to_string(), "; expected target shape ", expected.to_string());
  TESSERA_CHECK(is_floating(logits_dtype), ValueError, op, "input must be floating, got ", name(logits_dtype));
  TESSERA_CHECK(target_dtype == DType::i32 || target_dtype == DType::i64 || target_dtype == DType::u8, ValueError, op,
                "target of shape ", target.to_string(), " has dtype ", name(target_dtype),
                "; expected class indices of an integer dtype (i32, i64 or u8)");
  return class_dim;
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index, Reduction reduction) {
  check_defined(log_probs, "nll_loss", "input");
  check_defined(target, "nll_loss", "target");
  const int64_t class_dim =
      class_dim_of(log_probs.shape(), log_probs.dtype(), target.shape(), target.dtype(), "nll_loss");
  const int64_t classes = log_probs.shape()[class_dim];
  const Tensor t = target.to(DType::i64);
  const Tensor bad = logical_and(logical_or(lt(t, Scalar(0)), ge(t, Scalar(classes))), ne(t, Scalar(ignore_index)));
  const int64_t found = t.numel() == 0 ? 0 : sum(bad).item<int64_t>();
  TESSERA_CHECK(found == 0, ValueError, "nll_loss", found, found == 1 ? " target is" : " targets are", " out of [0, ",
                classes, ") and not ignore_index ", ignore_index, " for input shape ", log_probs.shape().to_string());
  // Ignored targets pick class 0 and are zeroed after.
  const Tensor safe = where(ne(t, Scalar(ignore_index)), t, Scalar(int64_t{0})).unsqueeze(class_dim);
  const Tensor picked = gather(log_probs, class_dim, safe).squeeze(class_dim);
  return composites::masked_nll(picked, target, ignore_index, reduction);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  TESSERA_CHECK(input.defined() && target.defined(), ValueError, "mse_loss",
                "an input tensor is undefined (default-constructed)");
  return composites::mse_loss(input, target, reduction);
}

}  // namespace tessera
