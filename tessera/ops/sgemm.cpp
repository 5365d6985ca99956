// f32 matrix products: oneDNN's sgemm for the larger ones, OpenBLAS's for the rest.
//
// Measured on this project's machine (Zen 4, one thread): oneDNN's JIT sgemm is 5-17% faster than
// OpenBLAS's on the training step's products ([1024, 128] x [128, 512] and the like), which spend
// time in OpenBLAS's packing copies; OpenBLAS's unpacked small-matrix kernels are 2-4x faster on
// the attention tiles (32 x 64 x 16), where oneDNN's per-call setup dominates. The crossover is
// near m n k = 2^21. Without oneDNN (TESSERA_ONEDNN off or not found) everything goes to OpenBLAS.
#include <tessera/ops/detail/gemm.hpp>

#include <tessera/ops/linalg.hpp>

#ifdef TESSERA_HAVE_ONEDNN
#include <dnnl.h>
#include <omp.h>
#endif

namespace tessera::detail {

namespace {

[[maybe_unused]] constexpr int64_t kOneDnnMinWork = int64_t{1} << 21;  // m * n * k

#ifdef TESSERA_HAVE_ONEDNN
// oneDNN runs its products on OpenMP threads, as many as the calling thread's OpenMP thread count:
// ranks are threads, so each rank's is set to its BLAS thread count (1 by default) before its
// first product and whenever set_blas_threads changes it.
void match_openmp_threads() {
  thread_local int configured = 0;
  const int n = blas_threads();
  if (configured != n) {
    omp_set_num_threads(n);
    configured = n;
  }
}
#endif

}  // namespace

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  ensure_blas_configured();
#ifdef TESSERA_HAVE_ONEDNN
  if (m * n * k >= kOneDnnMinWork) {
    match_openmp_threads();
    // Row-major, as cblas_sgemm's CblasRowMajor. A failure (never expected for arguments BLAS
    // takes) falls through to OpenBLAS.
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == dnnl_success)
      return;
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace tessera::detail
