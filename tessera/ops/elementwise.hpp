#pragma once
// Elementwise ops with numpy broadcasting and type promotion (dtype.hpp: promote_types).
// Binary ops accept a Scalar on either side: `x + 2` keeps an integer x integral, `x + 2.5`
// makes it f32; a floating x keeps its dtype. f16/bf16 compute in f32.
// Throws ValueError naming the op and both shapes if shapes do not broadcast.
#include <tessera/core/tensor.hpp>

namespace tessera {

// --- binary arithmetic -------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// True division: integer inputs give f32 (as in PyTorch).
Tensor div(const Tensor& a, const Tensor& b);
/// a ** b; integer inputs stay integral (negative exponents of integers throw ValueError).
Tensor pow(const Tensor& a, const Tensor& b);
/// Elementwise max/min; NaN propagates.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, Scalar b);
Tensor add(Scalar a, const Tensor& b);
Tensor sub(const Tensor& a, Scalar b);
Tensor sub(Scalar a, const Tensor& b);
Tensor mul(const Tensor& a, Scalar b);
Tensor mul(Scalar a, const Tensor& b);
Tensor div(const Tensor& a, Scalar b);
Tensor div(Scalar a, const Tensor& b);
Tensor pow(const Tensor& a, Scalar b);
Tensor pow(Scalar a, const Tensor& b);
Tensor maximum(const Tensor& a, Scalar b);
Tensor minimum(const Tensor& a, Scalar b);

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

// --- comparisons (result b8) -----------------------------------------------------------------
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
/// Logical ops on anything (non-zero is true); result b8.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);

/// cond ? a : b elementwise, all three broadcast; cond is converted to b8.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
/// x with value wherever mask is true (mask broadcasts to x's shape).
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

// --- unary -------------------------------------------------------------------------------------
/// Keep the dtype (integer in, integer out). neg and abs throw ValueError for b8.
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor sign(const Tensor& x);
/// Floating results: integer and bool inputs give f32.
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
/// GELU, exact (erf) form, as PyTorch's default.
Tensor gelu(const Tensor& x);
/// SiLU (swish): x * sigmoid(x).
Tensor silu(const Tensor& x);
/// Clamps into [lo, hi].
Tensor clamp(const Tensor& x, Scalar lo, Scalar hi);

}  // namespace tessera
