// Matrix products through BLAS. Operands that are transposed views go to BLAS as transposed
// operands instead of being copied; only views BLAS cannot describe are made contiguous.
#include <tessera/ops/linalg.hpp>

#include <tessera/ops/internal/composites.hpp>
#include <tessera/ops/detail/gemm.hpp>

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {
std::once_flag blas_init;
int blas_thread_count = 1;
}  // namespace

namespace detail {

// Ranks are threads: BLAS gets one thread per calling thread unless the user asks otherwise.
// Every path into BLAS comes here first (matmul and linear, and the attention and convolution
// kernels through detail::gemm), so OpenBLAS never starts its own default of one thread per core.
void ensure_blas_configured() {
  std::call_once(blas_init, [] {
    if (const char* env = std::getenv("TESSERA_BLAS_THREADS")) {
      const int n = std::atoi(env);
      if (n >= 1) blas_thread_count = n;
    }
    openblas_set_num_threads(blas_thread_count);
  });
}

}  // namespace detail

using detail::ensure_blas_configured;

namespace {

// How BLAS sees a 2-d view: NoTrans with row stride ld, Trans with column stride ld, or neither.
struct BlasOperand {
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

bool blas_layout(const Tensor& m, BlasOperand& op) {
  const int64_t rows = m.shape()[0], cols = m.shape()[1];
  const int64_t rs = m.strides()[0], cs = m.strides()[1];
  if ((cs == 1 || cols == 1) && (rs >= std::max<int64_t>(cols, 1) || rows == 1)) {
    op = {CblasNoTrans, std::max<int64_t>(rows == 1 ? cols : rs, 1)};
    return op.ld <= INT_MAX;  // BLAS takes 32-bit strides: larger ones go through a copy
  }
  if ((rs == 1 || rows == 1) && (cs >= std::max<int64_t>(rows, 1) || cols == 1)) {
    op = {CblasTrans, std::max<int64_t>(cols == 1 ? rows : cs, 1)};
    return op.ld <= INT_MAX;
  }
  return false;
}

void check_blas_size(int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, ValueError, "matmul", "matrix dims of ",
                a.shape().to_string(), " @ ", b.shape().to_string(), " exceed the 32-bit BLAS index range");
}

// out (contiguous [m, n]) = a [m, k] @ b [k, n] + beta * out. a, b, out share a dtype.
void gemm_2d(const Tensor& a_in, const Tensor& b_in, Tensor& out, double beta) {
  const int64_t m = a_in.shape()[0], k = a_in.shape()[1], n = b_in.shape()[1];
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0) out.fill_(0);
    return;
  }
  check_blas_size(m, n, k, a_in, b_in);
  BlasOperand oa{}, ob{};
  const Tensor a = blas_layout(a_in, oa) ? a_in : a_in.contiguous();
  const Tensor b = blas_layout(b_in, ob) ? b_in : b_in.contiguous();
  if (!a.is_same(a_in)) blas_layout(a, oa);
  if (!b.is_same(b_in)) blas_layout(b, ob);
  const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  switch (out.dtype()) {
    case DType::f32:
      detail::gemm(oa.trans == CblasTrans, ob.trans == CblasTrans, M, N, K, 1.0f, a.data<float>(), oa.ld,
                   b.data<float>(), ob.ld, static_cast<float>(beta), out.data<float>(), N);
      return;
    case DType::f64:
      detail::gemm(oa.trans == CblasTrans, ob.trans == CblasTrans, M, N, K, 1.0, a.data<double>(), oa.ld,
                   b.data<double>(), ob.ld, beta, out.data<double>(), N);
      return;
    default:
      break;
  }
  // Integers: a plain i-k-j loop (wrapping like the elementwise integer ops).
  visit(out.dtype(), [&]<class T>(TypeTag<T>) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      using U = std::make_unsigned_t<T>;
      const Tensor ac = a.contiguous(), bc = b.contiguous();
      const T *pa = ac.data<T>(), *pb = bc.data<T>();
      T* po = out.data<T>();
      if (beta == 0) out.fill_(0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) {
          const U av = static_cast<U>(pa[i * k + p]);
          for (int64_t j = 0; j < n; ++j)
            po[i * n + j] = static_cast<T>(static_cast<U>(po[i * n + j]) + av * static_cast<U>(pb[p * n + j]));
        }
    } else {
      TESSERA_ASSERT(false, "gemm_2d on dtype ", name(out.dtype()));
    }
  });
}

// The dtype BLAS computes in for a promoted dtype (f16/bf16 go through f32).
DType gemm_dtype(DType dtype, const char* op, const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(dtype != DType::b8, ValueError, op, "unsupported dtype b8 for ", a.shape().to_string(), " @ ",
                b.shape().to_string(), "; expected a numeric dtype");
  return dtype == DType::f16 || dtype == DType::bf16 ? DType::f32 : dtype;
}

void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  TESSERA_CHECK(a.defined() && b.defined(), ValueError, op, "tensor is undefined (default-constructed)");
  TESSERA_CHECK(a.ndim() >= 1 && b.ndim() >= 1, ValueError, op, "both operands need at least 1 dim, got shapes ",
                a.shape().to_string(), " and ", b.shape().to_string());
}

}  // namespace

void set_blas_threads(int n) {
  TESSERA_CHECK(n >= 1, ValueError, "set_blas_threads", "thread count ", n, " must be at least 1");
  ensure_blas_configured();
  blas_thread_count = n;
  openblas_set_num_threads(n);
}

int blas_threads() {
  ensure_blas_configured();
  return blas_thread_count;
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_operands(a_in, b_in, "matmul");
  ensure_blas_configured();
  const DType out_dtype = promote_types(a_in.dtype(), b_in.dtype());
  const DType dt = gemm_dtype(out_dtype, "matmul", a_in, b_in);
  // 1-d operands become a row (a) or a column (b); the added dim is removed at the end.
  // Detached: the kernel's internal views are not part of the graph; matmul records itself.
  const Tensor a = a_in.ndim() == 1 ? a_in.detach().unsqueeze(0) : a_in.detach();
  const Tensor b = b_in.ndim() == 1 ? b_in.detach().unsqueeze(1) : b_in.detach();
  const int64_t m = a.shape()[a.ndim() - 2], k = a.shape()[a.ndim() - 1];
  const int64_t kb = b.shape()[b.ndim() - 2], n = b.shape()[b.ndim() - 1];
  TESSERA_CHECK(k == kb, ValueError, "matmul", "inner dims differ: ", a_in.shape().to_string(), " @ ",
                b_in.shape().to_string(), " (", k, " vs ", kb, ")");
  const Shape a_batch(a.shape().data(), a.ndim() - 2), b_batch(b.shape().data(), b.ndim() - 2);
  // Checked here so the message names both operands, not only their batch dims.
  bool batch_ok = true;
  for (int64_t i = 1; i <= std::min(a_batch.size(), b_batch.size()); ++i) {
    const int64_t da = a_batch[a_batch.size() - i], db = b_batch[b_batch.size() - i];
    batch_ok = batch_ok && (da == db || da == 1 || db == 1);
  }
  TESSERA_CHECK(batch_ok, ValueError, "matmul", "batch dims of ", a_in.shape().to_string(), " @ ",
                b_in.shape().to_string(), " cannot be broadcast together (", a_batch.to_string(), " vs ",
                b_batch.to_string(), ")");
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = empty(out_shape, dt);
  const Tensor ac = a.to(dt), bc = b.to(dt);
  if (out.numel() == 0) {
    // nothing to compute
  } else if (k == 0) {
    out.fill_(0);
  } else if (b_batch.numel() == 1 && batch == a_batch) {
    // b is one matrix: fold a's batch into its rows for a single GEMM.
    const Tensor b2 = bc.reshape({k, n});
    Tensor out2 = out.view({-1, n});
    gemm_2d(ac.reshape({-1, k}), b2, out2, 0.0);
  } else {
    Shape a_full = batch, b_full = batch;
    a_full.push_back(m), a_full.push_back(k);
    b_full.push_back(k), b_full.push_back(n);
    const Tensor a3 = ac.expand(a_full).reshape({-1, m, k}), b3 = bc.expand(b_full).reshape({-1, k, n});
    Tensor out3 = out.view({-1, m, n});
    for (int64_t i = 0; i < out3.shape()[0]; ++i) {
      Tensor slot = out3.select(0, i);
      gemm_2d(a3.select(0, i), b3.select(0, i), slot, 0.0);
    }
  }
  if (a_in.ndim() == 1) out = out.squeeze(-2);
  if (b_in.ndim() == 1) out = out.squeeze(-1);
  out = out.to(out_dtype);
  derivatives::record_matmul("matmul", out, a_in, b_in);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands(a, b, "bmm");
  TESSERA_CHECK(a.ndim() == 3 && b.ndim() == 3 && a.shape()[0] == b.shape()[0], ValueError, "bmm",
                "expects two 3-d tensors with equal batch size, got ", a.shape().to_string(), " and ",
                b.shape().to_string());
  TESSERA_CHECK(a.shape()[2] == b.shape()[1], ValueError, "bmm", "inner dims differ: ", a.shape().to_string(), " @ ",
                b.shape().to_string(), " (", a.shape()[2], " vs ", b.shape()[1], ")");
  return matmul(a, b);
}

Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  check_operands(x, weight, "linear");
  TESSERA_CHECK(weight.ndim() == 2, ValueError, "linear", "weight must be 2-d [out, in], got ",
                weight.shape().to_string());
  const int64_t in = weight.shape()[1], out_features = weight.shape()[0];
  TESSERA_CHECK(x.shape()[x.ndim() - 1] == in, ValueError, "linear", "input shape ", x.shape().to_string(),
                " does not end in in_features ", in, " of weight ", weight.shape().to_string());
  if (!bias) {
    gemm_dtype(promote_types(x.dtype(), weight.dtype()), "linear", x, weight);  // name linear, not matmul
    Tensor out = matmul(x.detach(), weight.detach().t());
    derivatives::record_linear(out, x, weight, bias);
    return out;
  }
  TESSERA_CHECK(bias->defined() && bias->ndim() == 1 && bias->shape()[0] == out_features, ValueError, "linear",
                "bias shape ", bias->defined() ? bias->shape().to_string() : "undefined", " must be [",
                out_features, "] for weight ", weight.shape().to_string());
  const DType out_dtype = promote_types(promote_types(x.dtype(), weight.dtype()), bias->dtype());
  const DType dt = gemm_dtype(out_dtype, "linear", x, weight);
  ensure_blas_configured();
  // out = bias broadcast, then GEMM accumulates into it (beta = 1): no extra pass for the add.
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  Tensor out = empty(out_shape, dt);
  // Rows counted explicitly: a -1 cannot be inferred when in or out_features is 0.
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.ndim(); ++d) rows *= x.shape()[d];
  Tensor out2 = out.view({rows, out_features});
  const Tensor b = bias->detach().to(dt).contiguous();
  const size_t row_bytes = static_cast<size_t>(out_features * out2.itemsize());
  char* dst = rows > 0 && out_features > 0 ? static_cast<char*>(out2.raw_data()) : nullptr;
  for (int64_t r = 0; r < rows && dst; ++r) std::memcpy(dst + r * row_bytes, b.raw_data(), row_bytes);
  gemm_2d(x.detach().to(dt).reshape({rows, in}), weight.detach().to(dt).t(), out2, 1.0);
  out = out.to(out_dtype);
  derivatives::record_linear(out, x, weight, bias);
  return out;
}

Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, double beta, double alpha) {
  TESSERA_CHECK(input.defined() && mat1.defined() && mat2.defined(), ValueError, "addmm", "an input tensor is undefined");
  return composites::add_product(input, mat1, mat2, beta, alpha, false);
}
Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, double beta, double alpha) {
  TESSERA_CHECK(input.defined() && batch1.defined() && batch2.defined(), ValueError, "baddbmm", "an input tensor is undefined");
  return composites::add_product(input, batch1, batch2, beta, alpha, true);
}

}  // namespace tessera
