#pragma once
// Checks the gradients autograd computes against central finite differences (as
// torch.autograd.gradcheck does): for ops of the library and for users' own compositions.
#include <functional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {
namespace autograd {

struct GradcheckOptions {
  double eps = 1e-6;   ///< finite-difference step
  double atol = 1e-5;  ///< |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-4;
};

struct GradcheckResult {
  bool ok = true;
  double max_error = 0;  ///< largest |analytic - numeric| seen
  std::string message;   ///< the first mismatch: input, element, both values
};

/// Differentiates loss = sum(fn(inputs) * w), with fixed weights w (so every output element
/// counts, differently), with backward() and with central differences in f64. Floating inputs are
/// checked; other inputs (indices) pass through unchanged. fn must be deterministic.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace autograd
}  // namespace tessera
