// Elementwise ops on DTensor.
#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/detail/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>

namespace tessera {

namespace detail {

DTensor replicated_operand(const Tensor& t, const DTensor& like, const char* op) {
  TESSERA_CHECK(t.defined() && t.ndim() == 0, ShardingError, op, "a plain Tensor of shape ",
                t.defined() ? t.shape().to_string() : std::string("(undefined)"), " beside DTensor ",
                like.layout().to_string(), "; only 0-d Tensors and scalars count as replicated: distribute it first");
  return DTensor::from_local(t, like.device_mesh(), Placements(static_cast<size_t>(like.device_mesh().ndim()), Replicate{}));
}

std::vector<int64_t> normalized_dims(const std::vector<int64_t>& dims, const Shape& shape, const char* op) {
  const int64_t nd = shape.size();
  std::vector<int64_t> out;
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) out.push_back(d);
  for (int64_t d : dims) {
    TESSERA_CHECK(d >= -nd && d < nd, ValueError, op, "dim ", d, " out of range for shape ", shape.to_string());
    const int64_t n = d < 0 ? d + nd : d;
    TESSERA_CHECK(std::find(out.begin(), out.end(), n) == out.end(), ValueError, op, "dim ", d,
                  " repeated for shape ", shape.to_string());
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t normalized_dim(int64_t dim, int64_t ndim, const Shape& shape, const char* op) {
  TESSERA_CHECK(dim >= -ndim && dim < ndim, ValueError, op, "dim ", dim, " out of range for shape ",
                shape.to_string());
  return dim < 0 ? dim + ndim : dim;
}

}  // namespace detail

using detail::call_op;
using detail::op_id;
using Locals = std::span<const Tensor>;

namespace {

int64_t kind(const Scalar& s) { return static_cast<int64_t>(s.kind()); }

// Which derivative a scalar form has (derivatives::ScalarOp, shifted by one for `none`).
enum class ScalarGrad { none, add, sub, rsub, mul, div, rdiv, pow, rpow, maximum, minimum };

void record_scalar(const char* name, DTensor& out, const DTensor& x, Scalar s, ScalarGrad grad) {
  if (grad == ScalarGrad::none) return;
  derivatives::record_scalar(name, out, x, s, static_cast<derivatives::ScalarOp>(static_cast<int>(grad) - 1));
}

}  // namespace

// scalar_left: the Tensor expression for `a op x` (some Tensor ops only take the scalar right).
// record(out, a, b) records the two-DTensor form; right/left: the ScalarOp of x op s / s op x
// (none: not differentiable, e.g. comparisons).
#define TESSERA_DTENSOR_BINARY(name, scalar_left, record, right, left)                                          \
  DTensor name(const DTensor& a, const DTensor& b) {                                                            \
    static const int id = op_id(#name);                                                                         \
    DTensor out = call_op(id, {&a, &b}, DimVector{kNoScalar}, [](Locals l) { return name(l[0], l[1]); });       \
    record;                                                                                                     \
    return out;                                                                                                 \
  }                                                                                                             \
  DTensor name(const DTensor& x, Scalar b) {                                                                    \
    static const int id = op_id(#name);                                                                         \
    DTensor out = call_op(id, {&x}, DimVector{kScalarRight, kind(b)}, [&](Locals l) { return name(l[0], b); }); \
    record_scalar(#name, out, x, b, ScalarGrad::right);                                                         \
    return out;                                                                                                 \
  }                                                                                                             \
  DTensor name(Scalar a, const DTensor& x) {                                                                    \
    static const int id = op_id(#name);                                                                         \
    DTensor out = call_op(id, {&x}, DimVector{kScalarLeft, kind(a)}, [&](Locals l) {                            \
      const Tensor& t = l[0];                                                                                   \
      return scalar_left;                                                                                       \
    });                                                                                                         \
    record_scalar(#name, out, x, a, ScalarGrad::left);                                                          \
    return out;                                                                                                 \
  }                                                                                                             \
  DTensor name(const DTensor& a, const Tensor& b) { return name(a, detail::replicated_operand(b, a, #name)); }  \
  DTensor name(const Tensor& a, const DTensor& b) { return name(detail::replicated_operand(a, b, #name), b); }

TESSERA_DTENSOR_BINARY(add, add(a, t), derivatives::record_add(out, a, b), add, add)
TESSERA_DTENSOR_BINARY(sub, sub(a, t), derivatives::record_sub(out, a, b), sub, rsub)
TESSERA_DTENSOR_BINARY(mul, mul(a, t), derivatives::record_mul(out, a, b), mul, mul)
TESSERA_DTENSOR_BINARY(div, div(a, t), derivatives::record_div(out, a, b), div, rdiv)
TESSERA_DTENSOR_BINARY(pow, pow(a, t), derivatives::record_pow(out, a, b), pow, rpow)
TESSERA_DTENSOR_BINARY(maximum, maximum(t, a), derivatives::record_extremum("maximum", out, a, b, true), maximum,
                       maximum)
TESSERA_DTENSOR_BINARY(minimum, minimum(t, a), derivatives::record_extremum("minimum", out, a, b, false), minimum,
                       minimum)
TESSERA_DTENSOR_BINARY(eq, eq(t, a), (void)0, none, none)
TESSERA_DTENSOR_BINARY(ne, ne(t, a), (void)0, none, none)
TESSERA_DTENSOR_BINARY(lt, gt(t, a), (void)0, none, none)
TESSERA_DTENSOR_BINARY(le, ge(t, a), (void)0, none, none)
TESSERA_DTENSOR_BINARY(gt, lt(t, a), (void)0, none, none)
TESSERA_DTENSOR_BINARY(ge, le(t, a), (void)0, none, none)
#undef TESSERA_DTENSOR_BINARY

DTensor logical_and(const DTensor& a, const DTensor& b) {
  static const int id = op_id("logical_and");
  return call_op(id, {&a, &b}, DimVector{kNoScalar}, [](Locals l) { return logical_and(l[0], l[1]); });
}
DTensor logical_or(const DTensor& a, const DTensor& b) {
  static const int id = op_id("logical_or");
  return call_op(id, {&a, &b}, DimVector{kNoScalar}, [](Locals l) { return logical_or(l[0], l[1]); });
}

DTensor operator+(const DTensor& a, const DTensor& b) { return add(a, b); }
DTensor operator-(const DTensor& a, const DTensor& b) { return sub(a, b); }
DTensor operator*(const DTensor& a, const DTensor& b) { return mul(a, b); }
DTensor operator/(const DTensor& a, const DTensor& b) { return div(a, b); }
DTensor operator+(const DTensor& a, Scalar b) { return add(a, b); }
DTensor operator+(Scalar a, const DTensor& b) { return add(a, b); }
DTensor operator-(const DTensor& a, Scalar b) { return sub(a, b); }
DTensor operator-(Scalar a, const DTensor& b) { return sub(a, b); }
DTensor operator*(const DTensor& a, Scalar b) { return mul(a, b); }
DTensor operator*(Scalar a, const DTensor& b) { return mul(a, b); }
DTensor operator/(const DTensor& a, Scalar b) { return div(a, b); }
DTensor operator/(Scalar a, const DTensor& b) { return div(a, b); }
DTensor operator-(const DTensor& x) { return neg(x); }

#define TESSERA_DTENSOR_UNARY(name)                                                             \
  DTensor name(const DTensor& x) {                                                              \
    static const int id = op_id(#name);                                                         \
    DTensor out = call_op(id, {&x}, DimVector{kNoScalar}, [](Locals l) { return name(l[0]); }); \
    derivatives::record_unary(#name, derivatives::Unary::name, out, x);                         \
    return out;                                                                                 \
  }
TESSERA_DTENSOR_UNARY(neg)
TESSERA_DTENSOR_UNARY(abs)
TESSERA_DTENSOR_UNARY(relu)
TESSERA_DTENSOR_UNARY(sign)
TESSERA_DTENSOR_UNARY(exp)
TESSERA_DTENSOR_UNARY(log)
TESSERA_DTENSOR_UNARY(sqrt)
TESSERA_DTENSOR_UNARY(rsqrt)
TESSERA_DTENSOR_UNARY(sin)
TESSERA_DTENSOR_UNARY(cos)
TESSERA_DTENSOR_UNARY(tanh)
TESSERA_DTENSOR_UNARY(sigmoid)
TESSERA_DTENSOR_UNARY(gelu)
TESSERA_DTENSOR_UNARY(silu)
#undef TESSERA_DTENSOR_UNARY

DTensor logical_not(const DTensor& x) {
  static const int id = op_id("logical_not");
  return call_op(id, {&x}, DimVector{kNoScalar}, [](Locals l) { return logical_not(l[0]); });
}

DTensor clamp(const DTensor& x, Scalar lo, Scalar hi) {
  static const int id = op_id("clamp");
  return detail::recorded(
      call_op(id, {&x}, DimVector{kNoScalar, kind(lo), kind(hi)}, [&](Locals l) { return clamp(l[0], lo, hi); }),
      [&](DTensor& out) { derivatives::record_clamp(out, x, lo, hi); });
}

DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b) {
  static const int id = op_id("where");
  return detail::recorded(
      call_op(id, {&cond, &a, &b}, DimVector{kNoScalar}, [](Locals l) { return where(l[0], l[1], l[2]); }),
      [&](DTensor& out) { derivatives::record_where(out, cond, &a, &b); });
}
DTensor where(const DTensor& cond, const DTensor& a, Scalar b) {
  static const int id = op_id("where");
  return detail::recorded(
      call_op(id, {&cond, &a}, DimVector{kScalarRight, kind(b)}, [&](Locals l) { return where(l[0], l[1], b); }),
      [&](DTensor& out) { derivatives::record_where(out, cond, &a, static_cast<const DTensor*>(nullptr)); });
}
DTensor where(const DTensor& cond, Scalar a, const DTensor& b) {
  static const int id = op_id("where");
  return detail::recorded(
      call_op(id, {&cond, &b}, DimVector{kScalarLeft, kind(a)}, [&](Locals l) { return where(l[0], a, l[1]); }),
      [&](DTensor& out) { derivatives::record_where(out, cond, static_cast<const DTensor*>(nullptr), &b); });
}
DTensor masked_fill(const DTensor& x, const DTensor& mask, Scalar value) {
  static const int id = op_id("masked_fill");
  return detail::recorded(
      call_op(id, {&x, &mask}, DimVector{kScalarRight, kind(value)},
              [&](Locals l) { return masked_fill(l[0], l[1], value); }),
      [&](DTensor& out) { derivatives::record_where(out, mask, static_cast<const DTensor*>(nullptr), &x); });
}

}  // namespace tessera
