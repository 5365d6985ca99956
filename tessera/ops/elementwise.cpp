// Elementwise ops: dtype rules and broadcasting here, loops in detail/elementwise_kernels.hpp.
#include <tessera/ops/elementwise.hpp>

#include <cmath>
#include <type_traits>

#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/detail/elementwise_kernels.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

void check_defined(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.defined(), ValueError, op, "tensor is undefined (default-constructed)");
}

// Broadcasts a and b, converts both to `compute`, runs op into a fresh tensor of dtype `out`.
template <class Op>
Tensor binary(const char* op_name, const Tensor& a, const Tensor& b, DType compute, DType out, const Op& op) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op_name);
  const Tensor x = a.to(compute).expand(shape), y = b.to(compute).expand(shape);
  Tensor result = empty(shape, out);
  visit(compute, [&]<class In>(TypeTag<In>) {
    visit(out, [&]<class Out>(TypeTag<Out>) {
      if constexpr (std::is_same_v<Out, In> || std::is_same_v<Out, bool>) {
        detail::strided_loop<3>(shape, {&result.strides(), &x.strides(), &y.strides()},
                                {detail::bytes(result), detail::bytes(x), detail::bytes(y)},
                                {result.itemsize(), x.itemsize(), y.itemsize()},
                                [&](const detail::Run<3>& run) { detail::binary_run<In, Out>(run, op); });
      } else {
        TESSERA_ASSERT(false, "binary op ", op_name, " with output dtype ", name(out));
      }
    });
  });
  return result;
}

// Applies f to x and a scalar (as a 0-d tensor of the dtype the op computes in). With an
// f16/bf16 result the op runs in f32 and rounds once, as PyTorch does: rounding the scalar to
// 16 bits first would round twice (f16 * 0.1 differed from PyTorch for a third of inputs).
template <class F>
Tensor with_scalar(const Tensor& x, Scalar s, const char* op, bool scalar_first, F&& f) {
  check_defined(x, op);
  const DType dt = s.result_dtype(x.dtype());
  if (dt == DType::f16 || dt == DType::bf16) {
    const Tensor xs = x.to(DType::f32), st = scalar_tensor(s, DType::f32);
    const Tensor r = scalar_first ? f(st, xs) : f(xs, st);
    return r.dtype() == DType::f32 ? r.to(dt) : r;
  }
  const Tensor st = scalar_tensor(s, dt);
  return scalar_first ? f(st, x) : f(x, st);
}

DType floating_or_f32(DType dtype) { return is_floating(dtype) ? dtype : DType::f32; }

void check_not_bool(const Tensor& x, const char* op) {
  TESSERA_CHECK(x.dtype() != DType::b8, ValueError, op, "unsupported dtype b8 for input of shape ",
                x.shape().to_string(), "; expected a numeric dtype");
}

enum class DTypeRule { numeric, keep, floating, promote, promote_floating, predicate };

// The checks of particular ops beyond their dtype rule, before anything is computed.
void check_binary(OpId op, const Tensor& a, const Tensor& b) {
  if (op == OpId::sub) {
    TESSERA_CHECK(a.dtype() != DType::b8 || b.dtype() != DType::b8, ValueError, "sub", "subtracting two b8 tensors (shapes ",
                  a.shape().to_string(), " and ", b.shape().to_string(), ") is not supported; use logical_and/logical_not");
  } else if (op == OpId::pow && is_integral(promote_types(a.dtype(), b.dtype()))) {
    const bool negative = visit(b.dtype(), [&]<class T>(TypeTag<T>) {
      if constexpr (std::is_signed_v<T> && std::is_integral_v<T>) {
        for (T v : b.to_vector<T>())
          if (v < 0) return true;
      }
      return false;
    });
    TESSERA_CHECK(!negative, ValueError, "pow", "integer base of shape ", a.shape().to_string(),
                  " raised to a negative integer exponent; convert to a floating dtype first");
  }
}

// Checked before the scalar takes x's dtype: as u8, pow's exponent -1 would wrap to 255 and pass.
void check_scalar(OpId op, const Tensor& x, Scalar s, bool scalar_first) {
  if (op == OpId::pow && !scalar_first)
    TESSERA_CHECK(s.is_floating() || is_floating(x.dtype()) || s.to_int() >= 0, ValueError, "pow", "integer base of shape ",
                  x.shape().to_string(), " raised to a negative integer exponent; convert to a floating dtype first");
}

// The dtype rule is a template argument so that each kernel is instantiated only for the element
// types it can meet (exp never for integers, neg never for bool).
template <DTypeRule rule, class Kernel>
Tensor unary_op(OpId op, const Tensor& x, const Kernel& kernel) {
  const char* name = op_name(op);
  check_defined(x, name);
  if constexpr (rule == DTypeRule::numeric) check_not_bool(x, name);
  const DType dtype = rule == DTypeRule::floating ? floating_or_f32(x.dtype()) : x.dtype();
  const Tensor in = x.to(dtype);
  Tensor result = empty(x.shape(), dtype);
  const auto loop = [&]<class T>(TypeTag<T>) {
    detail::strided_loop<2>(x.shape(), {&result.strides(), &in.strides()}, {detail::bytes(result), detail::bytes(in)},
                            {result.itemsize(), in.itemsize()},
                            [&](const detail::Run<2>& run) { detail::unary_run<T, T>(run, kernel); });
  };
  if constexpr (rule == DTypeRule::floating)
    visit_floating(dtype, name, loop);
  else if constexpr (rule == DTypeRule::numeric)
    visit_numeric(dtype, name, loop);
  else
    visit(dtype, loop);
  return result;
}

template <class Kernel>
Tensor binary_op(OpId op, const Tensor& a, const Tensor& b, DTypeRule rule, const Kernel& kernel) {
  const char* name = op_name(op);
  check_defined(a, name);
  check_defined(b, name);
  check_binary(op, a, b);
  DType compute = promote_types(a.dtype(), b.dtype());
  if (rule == DTypeRule::promote_floating) compute = floating_or_f32(compute);
  return binary(name, a, b, compute, rule == DTypeRule::predicate ? DType::b8 : compute, kernel);
}

}  // namespace

// Every elementwise row of the op table: dtype rule, kernel (tessera::kernels), derivative.
#define TESSERA_DEFINE_UNARY(name, dtype_rule, ...)                                 \
  Tensor name(const Tensor& x) {                                                   \
    Tensor out = unary_op<DTypeRule::dtype_rule>(OpId::name, x, kernels::name{});     \
    derivatives::record_unary<OpId::name>(out, x);                                 \
    return out;                                                                    \
  }
TESSERA_UNARY_OPS(TESSERA_DEFINE_UNARY)
#undef TESSERA_DEFINE_UNARY

#define TESSERA_DEFINE_BINARY(name, dtype_rule, ...)                                                        \
  Tensor name(const Tensor& a, const Tensor& b) {                                                          \
    Tensor out = binary_op(OpId::name, a, b, DTypeRule::dtype_rule, kernels::name{});                      \
    derivatives::record_binary<OpId::name>(out, a, b);                                                     \
    return out;                                                                                            \
  }                                                                                                        \
  Tensor name(const Tensor& a, Scalar b) {                                                                 \
    check_scalar(OpId::name, a, b, false);                                                                 \
    return with_scalar(a, b, #name, false, [](const Tensor& x, const Tensor& y) { return name(x, y); });   \
  }                                                                                                        \
  Tensor name(Scalar a, const Tensor& b) {                                                                 \
    check_scalar(OpId::name, b, a, true);                                                                  \
    return with_scalar(b, a, #name, true, [](const Tensor& x, const Tensor& y) { return name(x, y); });    \
  }
TESSERA_BINARY_OPS(TESSERA_DEFINE_BINARY)
TESSERA_COMPARISON_OPS(TESSERA_DEFINE_BINARY)
#undef TESSERA_DEFINE_BINARY

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator-(Scalar a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator/(Scalar a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }

Tensor logical_not(const Tensor& a) {
  check_defined(a, "logical_not");
  return eq(a.to(DType::b8), scalar_tensor(false, DType::b8));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where");
  check_defined(a, "where");
  check_defined(b, "where");
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  const DType dt = promote_types(a.dtype(), b.dtype());
  const Tensor c = cond.to(DType::b8).expand(shape), x = a.to(dt).expand(shape), y = b.to(dt).expand(shape);
  Tensor result = empty(shape, dt);
  visit(dt, [&]<class T>(TypeTag<T>) {
    detail::strided_loop<4>(shape, {&result.strides(), &c.strides(), &x.strides(), &y.strides()},
                            {detail::bytes(result), detail::bytes(c), detail::bytes(x), detail::bytes(y)},
                            {result.itemsize(), 1, x.itemsize(), y.itemsize()}, detail::where_run<T>);
  });
  derivatives::record_where(result, cond, &a, &b);
  return result;
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  return with_scalar(a, b, "where", false, [&](const Tensor& x, const Tensor& y) { return where(cond, x, y); });
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) {
  return with_scalar(b, a, "where", true, [&](const Tensor& x, const Tensor& y) { return where(cond, x, y); });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  check_defined(x, "masked_fill");
  check_defined(mask, "masked_fill");
  TESSERA_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(), ValueError, "masked_fill",
                "mask shape ", mask.shape().to_string(), " does not broadcast to input shape ", x.shape().to_string());
  return where(mask, scalar_tensor(value, x.dtype()), x);  // the fill value takes x's dtype
}

Tensor clamp(const Tensor& x, Scalar lo, Scalar hi) {
  check_defined(x, "clamp");
  TESSERA_CHECK(lo.to_double() <= hi.to_double(), ValueError, "clamp", "lower bound ", lo.to_string(),
                " above upper bound ", hi.to_string(), " for input of shape ", x.shape().to_string());
  return minimum(maximum(x, lo), hi);
}

namespace autograd {
Tensor GradOps<Tensor>::add(const Tensor& a, const Tensor& b) { return tessera::add(a, b); }
}  // namespace autograd

}  // namespace tessera
