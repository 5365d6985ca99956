// Reductions. One mechanism: an accumulator tensor shaped like the output with the reduced
// dims kept as size 1, expanded over the input (stride 0 on reduced dims) and walked together
// with the input by strided_loop. A run along a reduced dim folds into one accumulator; a run
// along a kept dim updates a row of accumulators; both inner loops vectorise.
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/internal/composites.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <tessera/core/internal/strided_loop.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

struct ReducedDims {
  std::vector<bool> reduced;  // per input dim
  Shape kept_shape;           // reduced dims set to 1
  Shape out_shape;            // reduced dims removed, or kept_shape with keepdim
  int64_t count = 1;          // number of elements folded into each output
};

ReducedDims reduced_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  TESSERA_CHECK(x.defined(), ValueError, op, "tensor is undefined (default-constructed)");
  ReducedDims r;
  const int64_t ndim = x.ndim();
  r.reduced.assign(static_cast<size_t>(ndim), false);
  for (int64_t d : normalize_dims(dims, x.shape(), op)) r.reduced[static_cast<size_t>(d)] = true;
  r.kept_shape = x.shape();
  for (int64_t d = 0; d < ndim; ++d) {
    if (!r.reduced[static_cast<size_t>(d)]) {
      r.out_shape.push_back(x.shape()[d]);
      continue;
    }
    r.count *= x.shape()[d];
    r.kept_shape[d] = 1;
  }
  if (keepdim) r.out_shape = r.kept_shape;
  return r;
}

// Sums a contiguous run into `total` with 16 independent lanes per 1024-element block (so the
// compiler vectorises it), adding block totals in Acc (double for floats: accurate and cheap).
template <class T, class Acc>
Acc sum_contiguous(const T* x, int64_t n, Acc total) {
  using C = compute_t<T>;
  constexpr int64_t kLanes = 16, kBlock = 1024;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    C lanes[kLanes] = {};
    for (int64_t j = 0; j < kBlock; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<C>(x[i + j + l]);
    C block = 0;
    for (int64_t l = 0; l < kLanes; ++l) block += lanes[l];
    total += static_cast<Acc>(block);
  }
  for (; i < n; ++i) total += static_cast<Acc>(static_cast<C>(x[i]));
  return total;
}

// Integer sums wrap like add (through the unsigned type: signed overflow is undefined in C++).
struct SumOp {
  template <class A>
  A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <class A> A operator()(A a, A b) const { return a * b; }
};
struct MaxOp {
  template <class A> A operator()(A a, A b) const { return (a != a || a > b) ? a : b; }
};
struct MinOp {
  template <class A> A operator()(A a, A b) const { return (a != a || a < b) ? a : b; }
};

// Folds x into acc (shape kept_shape, dtype of Acc) with op.
template <class T, class Acc, class Op>
void fold(const Tensor& x, Tensor& acc, const Op& op) {
  const Tensor acc_view = acc.expand(x.shape());
  detail::strided_loop<2>(
      x.shape(), {&acc_view.strides(), &x.strides()}, {detail::bytes(acc_view), detail::bytes(x)},
      {acc.itemsize(), x.itemsize()}, [&](const detail::Run<2>& run) {
        auto* a = reinterpret_cast<Acc*>(run.ptr[0]);
        const auto* in = reinterpret_cast<const T*>(run.ptr[1]);
        const int64_t n = run.count;
        if (run.stride[0] == 0) {
          if constexpr (std::is_same_v<Op, SumOp> && is_floating_v<T>) {
            if (run.stride[1] == sizeof(T)) {
              *a = sum_contiguous<T, Acc>(in, n, *a);
              return;
            }
          }
          Acc total = *a;
          const char* p = run.ptr[1];
          for (int64_t i = 0; i < n; ++i, p += run.stride[1])
            total = op(total, static_cast<Acc>(static_cast<compute_t<T>>(*reinterpret_cast<const T*>(p))));
          *a = total;
        } else if (run.stride[0] == sizeof(Acc) && run.stride[1] == sizeof(T)) {
          for (int64_t i = 0; i < n; ++i) a[i] = op(a[i], static_cast<Acc>(static_cast<compute_t<T>>(in[i])));
        } else {
          char* pa = run.ptr[0];
          const char* p = run.ptr[1];
          for (int64_t i = 0; i < n; ++i, pa += run.stride[0], p += run.stride[1]) {
            Acc& slot = *reinterpret_cast<Acc*>(pa);
            slot = op(slot, static_cast<Acc>(static_cast<compute_t<T>>(*reinterpret_cast<const T*>(p))));
          }
        }
      });
}

// The rows of a contiguous [rows, n] block summed into n accumulators (a bias's or a norm
// weight's gradient: the leading dims reduced): eight rows at a time in the compute type, then
// into Acc, so that the inner loop is one vector add per element and one conversion per eight.
template <class T, class Acc>
void sum_leading_rows(const T* x, int64_t rows, int64_t n, Acc* acc) {
  using C = compute_t<T>;
  constexpr int64_t kRowsPerBlock = 8;
  std::vector<C> block(static_cast<size_t>(n));
  for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerBlock) {
    const int64_t end = std::min(rows, r0 + kRowsPerBlock);
    for (int64_t j = 0; j < n; ++j) block[j] = static_cast<C>(x[r0 * n + j]);
    for (int64_t r = r0 + 1; r < end; ++r)
      for (int64_t j = 0; j < n; ++j) block[j] += static_cast<C>(x[r * n + j]);
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<Acc>(block[j]);
  }
}

// Whether x is contiguous with exactly its leading dims reduced (and at least one kept).
bool reduces_leading_dims(const Tensor& x, const std::vector<bool>& reduced) {
  if (!x.is_contiguous() || reduced.empty() || !reduced.front() || reduced.back()) return false;
  size_t d = 0;
  while (d < reduced.size() && reduced[d]) ++d;
  for (; d < reduced.size(); ++d)
    if (reduced[d]) return false;
  return true;
}

// Reduces x with op into an accumulator of dtype acc_dtype initialised to `identity`, then
// converts to out_dtype (dividing by the count first when `average`).
template <class Op>
Tensor reduce(const char* name, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType acc_dtype,
              DType out_dtype, double identity, const Op& op, bool average = false) {
  const ReducedDims r = reduced_dims(x, dims, keepdim, name);
  Tensor acc = full(r.kept_shape, identity, acc_dtype);
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    visit(acc_dtype, [&]<class Acc>(TypeTag<Acc>) {
      // Only the accumulators the callers ask for (f64 or i64) are instantiated.
      if constexpr (std::is_same_v<Op, SumOp> && is_floating_v<T> && std::is_same_v<Acc, double>) {
        if (x.numel() > 0 && reduces_leading_dims(x, r.reduced)) {
          const int64_t n = acc.numel();
          sum_leading_rows<T, Acc>(x.data<T>(), x.numel() / n, n, acc.data<Acc>());
          return;
        }
      }
      if constexpr (std::is_same_v<Acc, double> || std::is_same_v<Acc, int64_t>)
        fold<T, Acc>(x, acc, op);
      else
        TESSERA_ASSERT(false, name, ": accumulator ", tessera::name(acc_dtype), " for ", tessera::name(x.dtype()));
    });
  });
  if (average) acc = div(acc, static_cast<double>(r.count));  // 0 / 0 gives NaN for empty means
  return acc.to(out_dtype).reshape(r.out_shape);
}

DType float_acc(DType dtype) { return is_floating(dtype) ? DType::f64 : DType::i64; }

void check_nonempty(const char* op, const Tensor& x, const ReducedDims& r) {
  TESSERA_CHECK(r.count > 0, ValueError, op, "cannot reduce over zero elements (input shape ", x.shape().to_string(),
                "); the operation has no identity");
}

Tensor extremum(const char* name, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_max) {
  const ReducedDims r = reduced_dims(x, dims, keepdim, name);
  check_nonempty(name, x, r);
  // Start from the first element along the reduced dims: no identity needed, NaN-safe.
  Tensor acc = x;
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (r.reduced[static_cast<size_t>(d)]) acc = acc.narrow(d, 0, 1);
  const DType acc_dtype = x.dtype() == DType::f16 || x.dtype() == DType::bf16 ? DType::f32 : x.dtype();
  acc = acc.to(acc_dtype).clone();
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    if (is_max) fold<T, compute_t<T>>(x, acc, MaxOp{});
    else fold<T, compute_t<T>>(x, acc, MinOp{});
  });
  return acc.to(x.dtype()).reshape(r.out_shape);
}

Tensor arg_extremum(const char* name, const Tensor& x, std::optional<int64_t> dim, bool keepdim, bool is_max) {
  TESSERA_CHECK(x.defined(), ValueError, name, "tensor is undefined (default-constructed)");
  Tensor rows;  // [outer, n]: reduce along the last dim
  Shape out_shape;
  if (!dim) {
    rows = x.reshape({1, x.numel()});
    out_shape = keepdim ? Shape::filled(x.ndim(), 1) : Shape{};
  } else {
    const int64_t d = normalize_dim(*dim, x.ndim(), name, x.shape());
    if (x.ndim() == 0) return zeros({}, DType::i64);
    // Move d last keeping the other dims in order (a transpose would swap d with the last dim
    // and lay the rows out in the wrong order); the row count is explicit because -1 cannot be
    // inferred when dim d has size 0.
    std::vector<int64_t> order;
    int64_t outer = 1;
    for (int64_t i = 0; i < x.ndim(); ++i) {
      if (i == d) continue;
      order.push_back(i);
      outer *= x.shape()[i];
    }
    order.push_back(d);
    rows = x.permute(order).contiguous().reshape({outer, x.shape()[d]});
    out_shape = x.shape();
    if (keepdim) out_shape[d] = 1;
    else out_shape.erase(d);
  }
  const int64_t n = rows.shape()[1];
  TESSERA_CHECK(n > 0 || rows.shape()[0] == 0, ValueError, name, "cannot reduce over zero elements (input shape ",
                x.shape().to_string(), ")");
  Tensor out = empty({rows.shape()[0]}, DType::i64);
  int64_t* o = out.data<int64_t>();
  const Tensor c = rows.contiguous();
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    const T* p = static_cast<const T*>(c.raw_data());
    for (int64_t row = 0; row < c.shape()[0]; ++row, p += n) {
      int64_t best = 0;
      C value = static_cast<C>(p[0]);
      for (int64_t i = 1; i < n && value == value; ++i) {  // the first NaN wins and stops the scan
        const C v = static_cast<C>(p[i]);
        if (v != v || (is_max ? v > value : v < value)) {
          best = i;
          value = v;
        }
      }
      o[row] = best;
    }
  });
  return out.reshape(out_shape);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  TESSERA_CHECK(x.defined(), ValueError, "sum", "tensor is undefined (default-constructed)");
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  Tensor result = reduce("sum", x.detach(), dims, keepdim, float_acc(x.dtype()), out, 0.0, SumOp{});
  derivatives::record_sum(result, x, dims, keepdim, /*mean_of=*/false);
  return result;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  TESSERA_CHECK(x.defined(), ValueError, "mean", "tensor is undefined (default-constructed)");
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  Tensor result = reduce("mean", x.detach(), dims, keepdim, DType::f64, out, 0.0, SumOp{}, /*average=*/true);
  derivatives::record_sum(result, x, dims, keepdim, /*mean_of=*/true);
  return result;
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  TESSERA_CHECK(x.defined(), ValueError, "prod", "tensor is undefined (default-constructed)");
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  if (!is_floating(x.dtype())) {  // integer products wrap like the other integer ops
    const ReducedDims r = reduced_dims(x, dims, keepdim, "prod");
    Tensor acc = ones(r.kept_shape, DType::i64);
    const Tensor xi = x.to(DType::i64);
    fold<int64_t, int64_t>(xi, acc, [](int64_t a, int64_t b) {
      return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    });
    return acc.reshape(r.out_shape);
  }
  Tensor result = reduce("prod", x.detach(), dims, keepdim, DType::f64, out, 1.0, ProdOp{});
  derivatives::record_prod(result, x, dims, keepdim);
  return result;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor result = extremum("amax", x.detach(), dims, keepdim, true);
  derivatives::record_extreme_reduction("amax", result, x, dims, keepdim);
  return result;
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor result = extremum("amin", x.detach(), dims, keepdim, false);
  derivatives::record_extreme_reduction("amin", result, x, dims, keepdim);
  return result;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const ReducedDims r = reduced_dims(x, dims, keepdim, "var");
  TESSERA_CHECK(correction >= 0, ValueError, "var", "negative correction ", correction, " for input of shape ",
                x.shape().to_string());
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  // Two passes in f64 (mean first, then squared deviations): stable for large offsets.
  const Tensor xd = x.to(DType::f64);
  const Tensor deviation = sub(xd, mean(xd, dims, /*keepdim=*/true));
  const double denominator = static_cast<double>(std::max<int64_t>(r.count - correction, 0));
  return div(sum(mul(deviation, deviation), dims, keepdim), denominator).to(out);
}

Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum("argmax", x, dim, keepdim, true);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum("argmin", x, dim, keepdim, false);
}

namespace autograd {
Tensor GradOps<Tensor>::sum_to(const Tensor& grad, const Shape& shape) { return derivatives::sum_to(grad, shape); }
}  // namespace autograd

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return composites::logsumexp(x, dims, keepdim);
}
Tensor std(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return composites::std_dev(x, dims, correction, keepdim);
}
Tensor vector_norm(const Tensor& x, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  return composites::vector_norm(x, ord, dims, keepdim);
}
Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return composites::all(x, dims, keepdim); }
Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return composites::any(x, dims, keepdim); }
ValuesIndices<Tensor> max(const Tensor& x, int64_t dim, bool keepdim) { return composites::max_along(x, dim, keepdim, true); }
ValuesIndices<Tensor> min(const Tensor& x, int64_t dim, bool keepdim) { return composites::max_along(x, dim, keepdim, false); }

}  // namespace tessera
