#pragma once
// The op table: every built-in op named once, with what the rest of Tessera needs to know about
// it. Pure metadata (no tensor, no data); the ops, sharding and dtensor layers expand these lists.
//
// Each family is an X-macro list. A row of the elementwise families generates the Tensor
// declaration and definition (ops/elementwise.*), the DTensor overloads (dtensor/ops*), the
// sharding rule (sharding/op_rules.cpp, from the linearity column) and the derivative
// (ops/internal/derivatives.hpp, from the formula columns). Adding an elementwise op is one row
// here plus its kernel functor in ops/detail/elementwise_kernels.hpp (named like the op, in
// namespace tessera::kernels) and its test; docs/architecture.md walks through it.
//
// Columns
//   dtype rule  numeric  (result keeps the dtype; b8 is refused)
//               keep     (result keeps the dtype, b8 included)
//               floating (integer and b8 inputs give f32)
//               promote  (binary: promote_types of both operands)
//               promote_floating (binary: as promote, then integer and b8 give f32)
//               predicate (binary: compared in the promoted dtype, result b8)
//   linearity   how Partial inputs pass through (sharding/op_rules.hpp, Linearity)
//   formulas    the gradient of each input, as expressions over the incoming gradient g, the
//               saved inputs (unary: x; binary: a, b; scalar forms: x and the Scalar s) and
//               the saved output y; written with ops both Tensor and DTensor provide, so a
//               DTensor's backward is itself sharded. Broadcast inputs are summed back to their
//               shape by the caller of the formula.
#include <cstddef>
#include <cstdint>

// X(name, dtype rule, linearity, d(out)/dx times g)
#define TESSERA_UNARY_OPS(X)                                                                 \
  X(neg, numeric, negating, neg(g))                                                          \
  X(abs, numeric, none, mul(g, sign(x)))                                                     \
  X(relu, numeric, monotone, where(gt(x, Scalar(0.0)), g, Scalar(0.0)))                      \
  X(sign, keep, none, mul(g, Scalar(0.0)))                                                   \
  X(exp, floating, monotone, mul(g, y))                                                      \
  X(log, floating, none, div(g, x))                                                          \
  X(sqrt, floating, none, div(mul(g, Scalar(0.5)), y))                                       \
  X(rsqrt, floating, none, mul(mul(g, Scalar(-0.5)), mul(y, mul(y, y))))                     \
  X(sin, floating, none, mul(g, cos(x)))                                                     \
  X(cos, floating, none, neg(mul(g, sin(x))))                                                \
  X(tanh, floating, monotone, mul(g, sub(Scalar(1.0), mul(y, y))))                           \
  X(sigmoid, floating, monotone, mul(g, mul(y, sub(Scalar(1.0), y))))                        \
  X(gelu, floating, none, gelu_grad(g, x, y))                                                \
  X(silu, floating, none, silu_grad(g, x))                                                   \
  X(log1p, floating, none, div(g, add(x, Scalar(1.0))))                                      \
  X(expm1, floating, monotone, mul(g, add(y, Scalar(1.0))))                                  \
  X(erf, floating, monotone, mul(g, mul(exp(neg(mul(x, x))), Scalar(1.1283791670955126))))   \
  X(softplus, floating, monotone, mul(g, sigmoid(x)))

// X(name, dtype rule, linearity, d/da, d/db, d/dx of (x op s), d/dx of (s op x))
#define TESSERA_BINARY_OPS(X)                                                                          \
  X(add, promote, additive, g, g, g, g)                                                                \
  X(sub, promote, additive, g, neg(g), g, neg(g))                                                      \
  X(mul, promote, scaling, mul(g, b), mul(g, a), mul(g, s), mul(g, s))                                 \
  X(div, promote_floating, dividing, div(g, b), neg(mul(div(g, b), div(a, b))), div(g, s),             \
    neg(mul(g, div(y, x))))                                                                            \
  X(pow, promote, none, mul(mul(g, b), pow(a, sub(b, Scalar(1.0)))),                                   \
    where(gt(a, Scalar(0.0)), mul(mul(g, y), log(a)), Scalar(0.0)),                                    \
    mul(mul(g, s), pow(x, Scalar(s.to_double() - 1.0))), mul(mul(g, y), Scalar(std::log(s.to_double())))) \
  X(maximum, promote, max_like, share_of(g, gt(a, b), eq(a, b)), share_of(g, gt(b, a), eq(a, b)),      \
    share_of(g, gt(x, s), eq(x, s)), share_of(g, gt(x, s), eq(x, s)))                                  \
  X(minimum, promote, min_like, share_of(g, lt(a, b), eq(a, b)), share_of(g, lt(b, a), eq(a, b)),      \
    share_of(g, lt(x, s), eq(x, s)), share_of(g, lt(x, s), eq(x, s)))

// Comparisons and logical ops: b8 results (computed in the promoted dtype), no gradient, Partial
// inputs reduced first. X(name, dtype rule, linearity), the leading columns of a binary row.
#define TESSERA_COMPARISON_OPS(X)                                                   \
  X(eq, predicate, none) X(ne, predicate, none) X(lt, predicate, none)              \
  X(le, predicate, none) X(gt, predicate, none) X(ge, predicate, none)              \
  X(logical_and, predicate, none) X(logical_or, predicate, none)

// The families whose Tensor and DTensor functions are written by hand (structured arguments,
// several outputs, kernels that read the dispatch decision). Each op still has one rule
// (sharding/op_rules.cpp and the family's rules file) and one derivative; X(name).
#define TESSERA_SELECTION_OPS(X) X(logical_not) X(where) X(masked_fill) X(clamp)
#define TESSERA_REDUCTION_OPS(X) X(sum) X(mean) X(prod) X(amax) X(amin) X(var) X(argmax) X(argmin)
#define TESSERA_LINALG_OPS(X) X(matmul) X(bmm) X(linear) X(einsum)
#define TESSERA_NN_OPS(X) \
  X(softmax) X(log_softmax) X(layer_norm) X(rms_norm) X(embedding) X(class_pick) X(embedding_backward) X(class_pick_backward) \
  X(cross_entropy) X(cross_entropy_backward) X(scaled_dot_product_attention)
#define TESSERA_VIEW_OPS(X) X(reshape) X(expand) X(permute) X(narrow) X(cat) X(stack)
// Shape ops that copy (sharding/shape_rules.cpp).
#define TESSERA_SHAPE_OPS(X) X(flip) X(roll) X(tril) X(triu) X(repeat) X(pad)

// Indexing along one dim with index tensors (sharding/index_rules.cpp).
#define TESSERA_INDEX_OPS(X) X(gather) X(scatter) X(scatter_add) X(index_select) X(index_add)

#define TESSERA_STRUCTURED_OPS(X)                                                              \
  TESSERA_SELECTION_OPS(X) TESSERA_REDUCTION_OPS(X) TESSERA_LINALG_OPS(X) TESSERA_NN_OPS(X)    \
  TESSERA_VIEW_OPS(X) TESSERA_SHAPE_OPS(X) TESSERA_INDEX_OPS(X)

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// The id of every built-in op, in table order. User ops (register_sharding) are named by
/// strings and get ids after OpId::count.
enum class OpId : uint16_t {
#define TESSERA_OP_ENUMERATOR(name, ...) name,
  TESSERA_UNARY_OPS(TESSERA_OP_ENUMERATOR) TESSERA_BINARY_OPS(TESSERA_OP_ENUMERATOR)
      TESSERA_COMPARISON_OPS(TESSERA_OP_ENUMERATOR) TESSERA_STRUCTURED_OPS(TESSERA_OP_ENUMERATOR)
#undef TESSERA_OP_ENUMERATOR
  count
};

inline constexpr int kBuiltinOpCount = static_cast<int>(OpId::count);

/// The op's name as users spell it ("add", "layer_norm").
const char* op_name(OpId op);

}  // namespace tessera
