#pragma once
// Elementwise ops with numpy broadcasting and type promotion (dtype.hpp: promote_types).
// Binary ops accept a Scalar on either side: `x + 2` keeps an integer x integral, `x + 2.5`
// makes it f32; a floating x keeps its dtype. f16/bf16 compute in f32.
// Throws ValueError naming the op and both shapes if shapes do not broadcast.
#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/op_table.hpp>

namespace tessera TESSERA_API {

// --- the elementwise rows of the op table (ops/op_table.hpp) -----------------------------------
// Unary: neg abs relu sign exp log sqrt rsqrt sin cos tanh sigmoid gelu (exact erf form) silu
// log1p expm1 erf. neg, abs and relu keep the dtype and refuse b8; sign keeps any dtype; the
// others give floating results (integer and b8 inputs give f32).
#define TESSERA_DECLARE_UNARY(name, ...) Tensor name(const Tensor& x);
TESSERA_UNARY_OPS(TESSERA_DECLARE_UNARY)
#undef TESSERA_DECLARE_UNARY

// Binary, each also with a Scalar on either side: add sub mul div (true division: integers give
// f32) pow (integers stay integral; a negative integer exponent throws ValueError) maximum
// minimum (NaN propagates); comparisons eq ne lt le gt ge and logical_and logical_or (non-zero is
// true) give b8.
#define TESSERA_DECLARE_BINARY(name, ...)         \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(const Tensor& a, Scalar b);        \
  Tensor name(Scalar a, const Tensor& b);
TESSERA_BINARY_OPS(TESSERA_DECLARE_BINARY)
TESSERA_COMPARISON_OPS(TESSERA_DECLARE_BINARY)
#undef TESSERA_DECLARE_BINARY

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a);

/// Logical not (non-zero is true); result b8.
Tensor logical_not(const Tensor& a);

/// cond ? a : b elementwise, all three broadcast; cond is converted to b8.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
/// x with value wherever mask is true (mask broadcasts to x's shape).
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

/// Clamps into [lo, hi].
Tensor clamp(const Tensor& x, Scalar lo, Scalar hi);

}  // namespace tessera
