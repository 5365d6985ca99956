// Elementwise ops on DTensor.
#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
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

}  // namespace

// scalar_left: the Tensor expression for `a op x` (some Tensor ops only take the scalar right).
#define TESSERA_DTENSOR_BINARY(name, scalar_left)                                                         \
  DTensor name(const DTensor& a, const DTensor& b) {                                                     \
    static const int id = op_id(#name);                                                                   \
    return call_op(id, {&a, &b}, DimVector{kNoScalar}, [](Locals l) { return name(l[0], l[1]); });        \
  }                                                                                                       \
  DTensor name(const DTensor& x, Scalar b) {                                                             \
    static const int id = op_id(#name);                                                                   \
    return call_op(id, {&x}, DimVector{kScalarRight, kind(b)}, [&](Locals l) { return name(l[0], b); }); \
  }                                                                                                       \
  DTensor name(Scalar a, const DTensor& x) {                                                             \
    static const int id = op_id(#name);                                                                   \
    return call_op(id, {&x}, DimVector{kScalarLeft, kind(a)}, [&](Locals l) {                            \
      const Tensor& t = l[0];                                                                             \
      return scalar_left;                                                                                 \
    });                                                                                                   \
  }                                                                                                       \
  DTensor name(const DTensor& a, const Tensor& b) { return name(a, detail::replicated_operand(b, a, #name)); } \
  DTensor name(const Tensor& a, const DTensor& b) { return name(detail::replicated_operand(a, b, #name), b); }

TESSERA_DTENSOR_BINARY(add, add(a, t))
TESSERA_DTENSOR_BINARY(sub, sub(a, t))
TESSERA_DTENSOR_BINARY(mul, mul(a, t))
TESSERA_DTENSOR_BINARY(div, div(a, t))
TESSERA_DTENSOR_BINARY(pow, pow(a, t))
TESSERA_DTENSOR_BINARY(maximum, maximum(t, a))
TESSERA_DTENSOR_BINARY(minimum, minimum(t, a))
TESSERA_DTENSOR_BINARY(eq, eq(t, a))
TESSERA_DTENSOR_BINARY(ne, ne(t, a))
TESSERA_DTENSOR_BINARY(lt, gt(t, a))
TESSERA_DTENSOR_BINARY(le, ge(t, a))
TESSERA_DTENSOR_BINARY(gt, lt(t, a))
TESSERA_DTENSOR_BINARY(ge, le(t, a))
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

#define TESSERA_DTENSOR_UNARY(name)                                                              \
  DTensor name(const DTensor& x) {                                                              \
    static const int id = op_id(#name);                                                          \
    return call_op(id, {&x}, DimVector{kNoScalar}, [](Locals l) { return name(l[0]); });         \
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
TESSERA_DTENSOR_UNARY(logical_not)
#undef TESSERA_DTENSOR_UNARY

DTensor clamp(const DTensor& x, Scalar lo, Scalar hi) {
  static const int id = op_id("clamp");
  return call_op(id, {&x}, DimVector{kNoScalar, kind(lo), kind(hi)}, [&](Locals l) { return clamp(l[0], lo, hi); });
}

DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b) {
  static const int id = op_id("where");
  return call_op(id, {&cond, &a, &b}, DimVector{kNoScalar}, [](Locals l) { return where(l[0], l[1], l[2]); });
}
DTensor where(const DTensor& cond, const DTensor& a, Scalar b) {
  static const int id = op_id("where");
  return call_op(id, {&cond, &a}, DimVector{kScalarRight, kind(b)}, [&](Locals l) { return where(l[0], l[1], b); });
}
DTensor where(const DTensor& cond, Scalar a, const DTensor& b) {
  static const int id = op_id("where");
  return call_op(id, {&cond, &b}, DimVector{kScalarLeft, kind(a)}, [&](Locals l) { return where(l[0], a, l[1]); });
}
DTensor masked_fill(const DTensor& x, const DTensor& mask, Scalar value) {
  static const int id = op_id("masked_fill");
  return call_op(id, {&x, &mask}, DimVector{kScalarRight, kind(value)},
                 [&](Locals l) { return masked_fill(l[0], l[1], value); });
}

}  // namespace tessera
