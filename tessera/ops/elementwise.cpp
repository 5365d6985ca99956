// Elementwise ops: dtype rules and broadcasting here, loops in detail/elementwise_kernels.hpp.
#include <tessera/ops/elementwise.hpp>

#include <cmath>
#include <type_traits>

#include <tessera/ops/detail/derivatives.hpp>
#include <tessera/ops/detail/elementwise_kernels.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

// Signed integer overflow is undefined in C++; tensors wrap like PyTorch's, so integer
// add/sub/mul/neg go through the unsigned type.
template <class T>
T wrap(auto op, T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return static_cast<T>(op(a, b));
  }
}

struct Add {
  template <class T> T operator()(T a, T b) const { return wrap([](auto x, auto y) { return x + y; }, a, b); }
};
struct Sub {
  template <class T> T operator()(T a, T b) const { return wrap([](auto x, auto y) { return x - y; }, a, b); }
};
struct Mul {
  template <class T> T operator()(T a, T b) const { return wrap([](auto x, auto y) { return x * y; }, a, b); }
};
struct Div {
  template <class T> T operator()(T a, T b) const { return a / b; }  // floating only
};
struct Pow {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return std::pow(a, b);
    } else if constexpr (std::is_same_v<T, bool>) {
      return a || !b;
    } else {  // exponentiation by squaring, wrapping like the other integer ops
      T result = 1;
      for (T e = b, base = a; e > 0; e = static_cast<T>(e >> 1)) {
        if (e & 1) result = Mul{}(result, base);
        base = Mul{}(base, base);
      }
      return result;
    }
  }
};
// NaN propagates: a NaN operand wins.
struct Maximum {
  template <class T> T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct Minimum {
  template <class T> T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};
struct Eq { template <class T> bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <class T> bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <class T> bool operator()(T a, T b) const { return a < b; } };
struct Le { template <class T> bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <class T> bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <class T> bool operator()(T a, T b) const { return a >= b; } };
struct And { template <class T> bool operator()(T a, T b) const { return a != T(0) && b != T(0); } };
struct Or { template <class T> bool operator()(T a, T b) const { return a != T(0) || b != T(0); } };

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

// The public binary entry points, each in one line: dtype rule then kernel.
template <class Op>
Tensor arithmetic(const char* op_name, const Tensor& a, const Tensor& b, const Op& op) {
  check_defined(a, op_name);
  check_defined(b, op_name);
  const DType dt = promote_types(a.dtype(), b.dtype());
  return binary(op_name, a, b, dt, dt, op);
}

template <class Op>
Tensor comparison(const char* op_name, const Tensor& a, const Tensor& b, const Op& op) {
  check_defined(a, op_name);
  check_defined(b, op_name);
  return binary(op_name, a, b, promote_types(a.dtype(), b.dtype()), DType::b8, op);
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

template <class Op>
Tensor unary(const char* op_name, const Tensor& x, DType dtype, const Op& op) {
  check_defined(x, op_name);
  const Tensor in = x.to(dtype);
  Tensor result = empty(x.shape(), dtype);
  visit(dtype, [&]<class T>(TypeTag<T>) {
    detail::strided_loop<2>(x.shape(), {&result.strides(), &in.strides()}, {detail::bytes(result), detail::bytes(in)},
                            {result.itemsize(), in.itemsize()},
                            [&](const detail::Run<2>& run) { detail::unary_run<T, T>(run, op); });
  });
  return result;
}

template <class Op>
Tensor floating_unary(const char* op_name, const Tensor& x, const Op& op) {
  check_defined(x, op_name);
  return unary(op_name, x, floating_or_f32(x.dtype()), op);
}

void check_not_bool(const Tensor& x, const char* op) {
  TESSERA_CHECK(x.dtype() != DType::b8, ValueError, op, "unsupported dtype b8 for input of shape ",
                x.shape().to_string(), "; expected a numeric dtype");
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = arithmetic("add", a, b, Add{});
  derivatives::record_add(out, a, b);
  return out;
}
Tensor sub(const Tensor& a, const Tensor& b) {
  check_defined(a, "sub");
  check_defined(b, "sub");
  TESSERA_CHECK(a.dtype() != DType::b8 || b.dtype() != DType::b8, ValueError, "sub",
                "subtracting two b8 tensors (shapes ", a.shape().to_string(), " and ", b.shape().to_string(),
                ") is not supported; use logical_and/logical_not");
  Tensor out = arithmetic("sub", a, b, Sub{});
  derivatives::record_sub(out, a, b);
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = arithmetic("mul", a, b, Mul{});
  derivatives::record_mul(out, a, b);
  return out;
}
Tensor div(const Tensor& a, const Tensor& b) {
  check_defined(a, "div");
  check_defined(b, "div");
  const DType dt = floating_or_f32(promote_types(a.dtype(), b.dtype()));
  Tensor out = binary("div", a, b, dt, dt, Div{});
  derivatives::record_div(out, a, b);
  return out;
}
Tensor pow(const Tensor& a, const Tensor& b) {
  check_defined(a, "pow");
  check_defined(b, "pow");
  const DType dt = promote_types(a.dtype(), b.dtype());
  if (is_integral(dt)) {
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
  Tensor out = binary("pow", a, b, dt, dt, Pow{});
  derivatives::record_pow(out, a, b);
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = arithmetic("maximum", a, b, Maximum{});
  derivatives::record_extremum("maximum", out, a, b, true);
  return out;
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = arithmetic("minimum", a, b, Minimum{});
  derivatives::record_extremum("minimum", out, a, b, false);
  return out;
}

Tensor add(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "add", false, [](const Tensor& x, const Tensor& y) { return add(x, y); });
}
Tensor add(Scalar a, const Tensor& b) {
  return with_scalar(b, a, "add", true, [](const Tensor& x, const Tensor& y) { return add(x, y); });
}
Tensor sub(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "sub", false, [](const Tensor& x, const Tensor& y) { return sub(x, y); });
}
Tensor sub(Scalar a, const Tensor& b) {
  return with_scalar(b, a, "sub", true, [](const Tensor& x, const Tensor& y) { return sub(x, y); });
}
Tensor mul(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "mul", false, [](const Tensor& x, const Tensor& y) { return mul(x, y); });
}
Tensor mul(Scalar a, const Tensor& b) {
  return with_scalar(b, a, "mul", true, [](const Tensor& x, const Tensor& y) { return mul(x, y); });
}
Tensor div(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "div", false, [](const Tensor& x, const Tensor& y) { return div(x, y); });
}
Tensor div(Scalar a, const Tensor& b) {
  return with_scalar(b, a, "div", true, [](const Tensor& x, const Tensor& y) { return div(x, y); });
}
Tensor pow(const Tensor& a, Scalar b) {
  // Checked before the scalar takes a's dtype: as u8, -1 would wrap to 255 and pass pow's check.
  check_defined(a, "pow");
  TESSERA_CHECK(b.is_floating() || is_floating(a.dtype()) || b.to_int() >= 0, ValueError, "pow", "integer base of shape ",
                a.shape().to_string(), " raised to a negative integer exponent; convert to a floating dtype first");
  return with_scalar(a, b, "pow", false, [](const Tensor& x, const Tensor& y) { return pow(x, y); });
}
Tensor pow(Scalar a, const Tensor& b) {
  return with_scalar(b, a, "pow", true, [](const Tensor& x, const Tensor& y) { return pow(x, y); });
}
Tensor maximum(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "maximum", false, [](const Tensor& x, const Tensor& y) { return maximum(x, y); });
}
Tensor minimum(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "minimum", false, [](const Tensor& x, const Tensor& y) { return minimum(x, y); });
}

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

Tensor eq(const Tensor& a, const Tensor& b) { return comparison("eq", a, b, Eq{}); }
Tensor ne(const Tensor& a, const Tensor& b) { return comparison("ne", a, b, Ne{}); }
Tensor lt(const Tensor& a, const Tensor& b) { return comparison("lt", a, b, Lt{}); }
Tensor le(const Tensor& a, const Tensor& b) { return comparison("le", a, b, Le{}); }
Tensor gt(const Tensor& a, const Tensor& b) { return comparison("gt", a, b, Gt{}); }
Tensor ge(const Tensor& a, const Tensor& b) { return comparison("ge", a, b, Ge{}); }
Tensor eq(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "eq", false, [](const Tensor& x, const Tensor& y) { return eq(x, y); });
}
Tensor ne(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "ne", false, [](const Tensor& x, const Tensor& y) { return ne(x, y); });
}
Tensor lt(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "lt", false, [](const Tensor& x, const Tensor& y) { return lt(x, y); });
}
Tensor le(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "le", false, [](const Tensor& x, const Tensor& y) { return le(x, y); });
}
Tensor gt(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "gt", false, [](const Tensor& x, const Tensor& y) { return gt(x, y); });
}
Tensor ge(const Tensor& a, Scalar b) {
  return with_scalar(a, b, "ge", false, [](const Tensor& x, const Tensor& y) { return ge(x, y); });
}
Tensor logical_and(const Tensor& a, const Tensor& b) { return comparison("logical_and", a, b, And{}); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return comparison("logical_or", a, b, Or{}); }
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

Tensor neg(const Tensor& x) {
  check_defined(x, "neg");
  check_not_bool(x, "neg");
  Tensor out = unary("neg", x, x.dtype(), [](auto v) { return Sub{}(decltype(v)(0), v); });
  derivatives::record_unary("neg", derivatives::Unary::neg, out, x);
  return out;
}
Tensor abs(const Tensor& x) {
  check_defined(x, "abs");
  check_not_bool(x, "abs");
  Tensor out = unary("abs", x, x.dtype(), [](auto v) { return v < decltype(v)(0) ? Sub{}(decltype(v)(0), v) : v; });
  derivatives::record_unary("abs", derivatives::Unary::abs, out, x);
  return out;
}
Tensor relu(const Tensor& x) {
  check_defined(x, "relu");
  check_not_bool(x, "relu");
  Tensor out = unary("relu", x, x.dtype(), [](auto v) { return v > decltype(v)(0) || v != v ? v : decltype(v)(0); });
  derivatives::record_unary("relu", derivatives::Unary::relu, out, x);
  return out;
}
Tensor sign(const Tensor& x) {
  check_defined(x, "sign");
  Tensor out = unary("sign", x, x.dtype(), [](auto v) {
    using T = decltype(v);
    if constexpr (std::is_same_v<T, bool>)
      return v;
    else
      return v != v ? v : static_cast<T>((T(0) < v) - (v < T(0)));
  });
  derivatives::record_unary("sign", derivatives::Unary::sign, out, x);
  return out;
}
Tensor exp(const Tensor& x) {
  Tensor out = floating_unary("exp", x, [](auto v) { return std::exp(v); });
  derivatives::record_unary("exp", derivatives::Unary::exp, out, x);
  return out;
}
Tensor log(const Tensor& x) {
  Tensor out = floating_unary("log", x, [](auto v) { return std::log(v); });
  derivatives::record_unary("log", derivatives::Unary::log, out, x);
  return out;
}
Tensor sqrt(const Tensor& x) {
  Tensor out = floating_unary("sqrt", x, [](auto v) { return std::sqrt(v); });
  derivatives::record_unary("sqrt", derivatives::Unary::sqrt, out, x);
  return out;
}
Tensor rsqrt(const Tensor& x) {
  Tensor out = floating_unary("rsqrt", x, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
  derivatives::record_unary("rsqrt", derivatives::Unary::rsqrt, out, x);
  return out;
}
Tensor sin(const Tensor& x) {
  Tensor out = floating_unary("sin", x, [](auto v) { return std::sin(v); });
  derivatives::record_unary("sin", derivatives::Unary::sin, out, x);
  return out;
}
Tensor cos(const Tensor& x) {
  Tensor out = floating_unary("cos", x, [](auto v) { return std::cos(v); });
  derivatives::record_unary("cos", derivatives::Unary::cos, out, x);
  return out;
}
Tensor tanh(const Tensor& x) {
  Tensor out = floating_unary("tanh", x, [](auto v) { return std::tanh(v); });
  derivatives::record_unary("tanh", derivatives::Unary::tanh, out, x);
  return out;
}
Tensor sigmoid(const Tensor& x) {
  Tensor out = floating_unary("sigmoid", x, [](auto v) { return decltype(v)(1) / (decltype(v)(1) + std::exp(-v)); });
  derivatives::record_unary("sigmoid", derivatives::Unary::sigmoid, out, x);
  return out;
}
Tensor gelu(const Tensor& x) {
  Tensor out = floating_unary("gelu", x, [](auto v) {
    using T = decltype(v);
    return T(0.5) * v * (T(1) + std::erf(v * T(0.70710678118654752440)));
  });
  derivatives::record_unary("gelu", derivatives::Unary::gelu, out, x);
  return out;
}
Tensor silu(const Tensor& x) {
  Tensor out = floating_unary("silu", x, [](auto v) { return v / (decltype(v)(1) + std::exp(-v)); });
  derivatives::record_unary("silu", derivatives::Unary::silu, out, x);
  return out;
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
