#pragma once
// Matrix products through BLAS (sgemm/dgemm; f16/bf16 computed via f32; integers by a plain loop).
//
// Threads: BLAS runs one thread per calling thread by default, because ranks are threads and
// nested BLAS threads would oversubscribe the cores. Call set_blas_threads(n) or set the
// environment variable TESSERA_BLAS_THREADS=n before the first matmul to give BLAS n threads;
// the kernels that split their work use as many (ops/detail/parallel.hpp).
#include <optional>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// torch.matmul semantics: 1-d x 1-d dot product, 2-d x 2-d matrix product, 1-d operands are
/// promoted to a matrix and the added dim removed, batch dims broadcast.
/// Throws ValueError naming both shapes if inner dims differ or batch dims do not broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
/// Batched matrix product of two 3-d tensors with equal batch size (no broadcasting).
Tensor bmm(const Tensor& a, const Tensor& b);
/// x @ weight^T + bias, weight [out, in], bias [out] (optional).
Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt);

/// Number of threads BLAS uses per call (default 1). Throws ValueError if n < 1.
void set_blas_threads(int n);
int blas_threads();

/// beta * input + alpha * (mat1 @ mat2) with 2-d mat1, mat2; input broadcasts to the product.
Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, double beta = 1.0, double alpha = 1.0);
/// beta * input + alpha * bmm(batch1, batch2) with 3-d batches.
Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, double beta = 1.0, double alpha = 1.0);

}  // namespace tessera
