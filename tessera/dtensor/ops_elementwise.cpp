// Elementwise ops on DTensor.
#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>

namespace tessera {

namespace detail {

DTensor replicated_operand(const Tensor& t, const DTensor& like, const char* op) {
  TESSERA_CHECK(t.defined() && t.ndim() == 0, ShardingError, op, "a plain Tensor of shape ",
                t.defined() ? t.shape().to_string() : std::string("(undefined)"), " beside DTensor ",
                like.layout().to_string(), "; only 0-d Tensors and scalars count as replicated: distribute it first");
  return DTensor::from_local(t, like.device_mesh(), Placements(static_cast<size_t>(like.device_mesh().ndim()), Replicate{}));
}

}  // namespace detail

using detail::call_op;
using Locals = std::span<const Tensor>;

// Every elementwise row of the op table: the Tensor op on the shards under the row's rule, then
// the row's derivative.
#define TESSERA_DTENSOR_UNARY(name, ...)                                                               \
  DTensor name(const DTensor& x) {                                                                     \
    DTensor out = call_op(OpId::name, {&x}, ElementwiseArgs{}, [](Locals l) { return name(l[0]); });   \
    derivatives::record_unary<OpId::name>(out, x);                                                     \
    return out;                                                                                        \
  }
TESSERA_UNARY_OPS(TESSERA_DTENSOR_UNARY)
#undef TESSERA_DTENSOR_UNARY

#define TESSERA_DTENSOR_BINARY(name, ...)                                                                            \
  DTensor name(const DTensor& a, const DTensor& b) {                                                                 \
    DTensor out = call_op(OpId::name, {&a, &b}, ElementwiseArgs{}, [](Locals l) { return name(l[0], l[1]); });       \
    derivatives::record_binary<OpId::name>(out, a, b);                                                               \
    return out;                                                                                                      \
  }                                                                                                                  \
  DTensor name(const DTensor& x, Scalar s) {                                                                         \
    DTensor out = call_op(OpId::name, {&x}, ElementwiseArgs::scalar(ScalarSlot::right, s),                           \
                          [&](Locals l) { return name(l[0], s); });                                                  \
    derivatives::record_scalar<OpId::name>(out, x, s, false);                                                        \
    return out;                                                                                                      \
  }                                                                                                                  \
  DTensor name(Scalar s, const DTensor& x) {                                                                         \
    DTensor out = call_op(OpId::name, {&x}, ElementwiseArgs::scalar(ScalarSlot::left, s),                            \
                          [&](Locals l) { return name(s, l[0]); });                                                  \
    derivatives::record_scalar<OpId::name>(out, x, s, true);                                                         \
    return out;                                                                                                      \
  }                                                                                                                  \
  DTensor name(const DTensor& a, const Tensor& b) { return name(a, detail::replicated_operand(b, a, #name)); }       \
  DTensor name(const Tensor& a, const DTensor& b) { return name(detail::replicated_operand(a, b, #name), b); }
TESSERA_BINARY_OPS(TESSERA_DTENSOR_BINARY)
TESSERA_COMPARISON_OPS(TESSERA_DTENSOR_BINARY)
#undef TESSERA_DTENSOR_BINARY

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

DTensor logical_not(const DTensor& x) {
  return call_op(OpId::logical_not, {&x}, ElementwiseArgs{}, [](Locals l) { return logical_not(l[0]); });
}

DTensor clamp(const DTensor& x, Scalar lo, Scalar hi) {
  const ElementwiseArgs args{ScalarSlot::none, {static_cast<int8_t>(lo.kind()), static_cast<int8_t>(hi.kind())}};
  return detail::recorded(call_op(OpId::clamp, {&x}, args, [&](Locals l) { return clamp(l[0], lo, hi); }),
                          [&](DTensor& out) { derivatives::record_clamp(out, x, lo, hi); });
}

DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b) {
  return detail::recorded(
      call_op(OpId::where, {&cond, &a, &b}, ElementwiseArgs{}, [](Locals l) { return where(l[0], l[1], l[2]); }),
      [&](DTensor& out) { derivatives::record_where(out, cond, &a, &b); });
}
DTensor where(const DTensor& cond, const DTensor& a, Scalar b) {
  return detail::recorded(call_op(OpId::where, {&cond, &a}, ElementwiseArgs::scalar(ScalarSlot::right, b),
                                  [&](Locals l) { return where(l[0], l[1], b); }),
                          [&](DTensor& out) { derivatives::record_where(out, cond, &a, static_cast<const DTensor*>(nullptr)); });
}
DTensor where(const DTensor& cond, Scalar a, const DTensor& b) {
  return detail::recorded(call_op(OpId::where, {&cond, &b}, ElementwiseArgs::scalar(ScalarSlot::left, a),
                                  [&](Locals l) { return where(l[0], a, l[1]); }),
                          [&](DTensor& out) { derivatives::record_where(out, cond, static_cast<const DTensor*>(nullptr), &b); });
}
DTensor masked_fill(const DTensor& x, const DTensor& mask, Scalar value) {
  return detail::recorded(call_op(OpId::masked_fill, {&x, &mask}, ElementwiseArgs::scalar(ScalarSlot::right, value),
                                  [&](Locals l) { return masked_fill(l[0], l[1], value); }),
                          [&](DTensor& out) { derivatives::record_where(out, mask, static_cast<const DTensor*>(nullptr), &x); });
}

}  // namespace tessera
