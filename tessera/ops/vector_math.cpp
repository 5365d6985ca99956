#include <tessera/ops/detail/vector_math.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>

// libmvec's entry points (the x86_64 vector function ABI: b = SSE 4 lanes, d = AVX2 8 lanes,
// e = AVX-512 16 lanes), declared here rather than through math.h, which offers them only under
// -ffast-math.
extern "C" {
__m128 _ZGVbN4v_expf(__m128);
__m128 _ZGVbN4v_erff(__m128);
__m128 _ZGVbN4v_tanhf(__m128);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_expf(__m256);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_erff(__m256);
__attribute__((target("avx2"))) __m256 _ZGVdN8v_tanhf(__m256);
__attribute__((target("avx512f"))) __m512 _ZGVeN16v_expf(__m512);
__attribute__((target("avx512f"))) __m512 _ZGVeN16v_erff(__m512);
__attribute__((target("avx512f"))) __m512 _ZGVeN16v_tanhf(__m512);
}

namespace tessera::detail {

namespace {

enum class Width { sse, avx2, avx512 };

Width width() {
  static const Width w = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Width::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Width::avx2;
    return Width::sse;
  }();
  return w;
}

enum class Fn { exp, erf, tanh };

__attribute__((target("avx512f"))) void run512(Fn fn, const float* x, float* y, int64_t n) {
  const auto f = fn == Fn::exp ? _ZGVeN16v_expf : fn == Fn::erf ? _ZGVeN16v_erff : _ZGVeN16v_tanhf;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {  // the tail, padded with zeros through masked loads and stores
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, mask, f(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

__attribute__((target("avx2"))) void run256(Fn fn, const float* x, float* y, int64_t n) {
  const auto f = fn == Fn::exp ? _ZGVdN8v_expf : fn == Fn::erf ? _ZGVdN8v_erff : _ZGVdN8v_tanhf;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float pad[8] = {};
    std::memcpy(pad, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(pad, f(_mm256_load_ps(pad)));
    std::memcpy(y + i, pad, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void run128(Fn fn, const float* x, float* y, int64_t n) {
  const auto f = fn == Fn::exp ? _ZGVbN4v_expf : fn == Fn::erf ? _ZGVbN4v_erff : _ZGVbN4v_tanhf;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, f(_mm_loadu_ps(x + i)));
  if (i < n) {
    alignas(16) float pad[4] = {};
    std::memcpy(pad, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm_store_ps(pad, f(_mm_load_ps(pad)));
    std::memcpy(y + i, pad, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void run(Fn fn, const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  switch (width()) {
    case Width::avx512:
      return run512(fn, x, y, n);
    case Width::avx2:
      return run256(fn, x, y, n);
    case Width::sse:
      return run128(fn, x, y, n);
  }
}

}  // namespace

void vexp(const float* x, float* y, int64_t n) { run(Fn::exp, x, y, n); }
void verf(const float* x, float* y, int64_t n) { run(Fn::erf, x, y, n); }
void vtanh(const float* x, float* y, int64_t n) { run(Fn::tanh, x, y, n); }

}  // namespace tessera::detail

#else  // no libmvec entry points known here: libm, element by element

namespace tessera::detail {
void vexp(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}
void verf(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
}
void vtanh(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}
}  // namespace tessera::detail

#endif

namespace tessera::detail {

void vexp(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

namespace {

template <class C>
C exp_minus_max_of(C* v, int64_t n, C& max) {
  C m = -std::numeric_limits<C>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, v[i]);
  for (int64_t i = 0; i < n; ++i) v[i] -= m;
  vexp(v, v, n);
  C total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += v[i];
  max = m;
  return total;
}

}  // namespace

float exp_minus_max(float* v, int64_t n, float& max) { return exp_minus_max_of(v, n, max); }
double exp_minus_max(double* v, int64_t n, double& max) { return exp_minus_max_of(v, n, max); }

}  // namespace tessera::detail
