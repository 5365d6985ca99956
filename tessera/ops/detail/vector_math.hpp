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
/// The same for f64, through libm element by element (libmvec's f64 forms are not used).
void vexp(const double* x, double* y, int64_t n);
/// v[i] = exp(v[i] - max(v)) in place, the max (NaN skipped: a NaN still reaches the sum, so the
/// result is NaN all the same) returned in `max`; returns the sum of the exps. A softmax's or
/// log-sum-exp's numerators over one contiguous lane; n >= 1.
float exp_minus_max(float* v, int64_t n, float& max);
double exp_minus_max(double* v, int64_t n, double& max);
/// y[i] = erf(x[i]).
void verf(const float* x, float* y, int64_t n);
/// y[i] = tanh(x[i]).
void vtanh(const float* x, float* y, int64_t n);

}  // namespace tessera::detail
