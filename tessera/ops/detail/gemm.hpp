#pragma once
// Row-major GEMM for matmul and for the kernels that call BLAS on raw buffers (attention, conv):
// C = alpha * op(A) op(B) + beta * C, one overload per floating dtype; and OpenBLAS's
// out-of-place transpose, several times faster than a strided loop on small matrices.
#include <cblas.h>

#include <cstdint>

namespace tessera::detail {

/// Sets OpenBLAS's thread count once (TESSERA_BLAS_THREADS, default 1 per calling rank thread).
void ensure_blas_configured();

/// The f32 product, through oneDNN or OpenBLAS by its size (sgemm.cpp); the f64 one through
/// OpenBLAS. Dims and strides must fit BLAS's 32-bit ints.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc);
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  ensure_blas_configured();
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

/// b [cols, rows] (leading dimension ldb) = a [rows, cols]^T (leading dimension lda), row-major.
inline void transpose(int64_t rows, int64_t cols, const float* a, int64_t lda, float* b, int64_t ldb) {
  cblas_somatcopy(CblasRowMajor, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), 1.0f, a,
                  static_cast<int>(lda), b, static_cast<int>(ldb));
}
inline void transpose(int64_t rows, int64_t cols, const double* a, int64_t lda, double* b, int64_t ldb) {
  cblas_domatcopy(CblasRowMajor, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), 1.0, a,
                  static_cast<int>(lda), b, static_cast<int>(ldb));
}

}  // namespace tessera::detail
