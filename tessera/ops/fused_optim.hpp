#pragma once
// Optimizer kernels as one pass over memory each (PyTorch's fused AdamW, foreach norms): the
// update of a parameter reads and writes each of its arrays once, instead of a dozen
// elementwise ops with a temporary each.
#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// AdamW's hyperparameters for one step: the bias corrections are 1 - beta^step.
struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double correction1 = 1, correction2 = 1;
};

/// One AdamW step in place, elementwise: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// param = param (1 - lr wd) - lr (m / c1) / (sqrt(v / c2) + eps). f32 computes in float, f64 in
/// double. Throws ValueError naming the shapes and dtypes unless the four are contiguous, of one
/// shape and one dtype (f32 or f64).
void adamw_update_(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWStep& step);

/// Whether adamw_update_ takes these (contiguous, one shape, f32 or f64).
bool adamw_fusable(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad);

/// The sum of t's squared elements, accumulated in double, in one pass (any layout; floating
/// dtypes). Throws ValueError for a non-floating dtype.
double sum_of_squares(const Tensor& t);

}  // namespace tessera
