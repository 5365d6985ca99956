#pragma once
// exp, erf and tanh over arrays of floats through glibc's vector math library (libmvec), at the
// widest vector width this CPU runs (AVX-512, AVX2, else SSE), chosen once. Every element goes
// through the same vector code, the tail too (padded), so an element's result never depends on
// where it sits in the array: a sharded op equals the unsharded one bit for bit. libmvec's
// results are within a few ulp of the scalar libm ones.
#include <cstdint>

namespace tessera::detail {

/// y[i] = exp(x[i]) for i < n; y may be x.
void vexp(const float* x, float* y, int64_t n);
/// y[i] = erf(x[i]).
void verf(const float* x, float* y, int64_t n);
/// y[i] = tanh(x[i]).
void vtanh(const float* x, float* y, int64_t n);

}  // namespace tessera::detail
