#pragma once
// Backward kernels in one pass (ATen's gelu_backward, native_layer_norm_backward): what the
// op-by-op gradient formulas compute with a dozen temporaries, read and written once. Autograd
// calls them; the DTensor forms (dtensor/ops.hpp) run them on each rank's block.
#include <optional>
#include <utility>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// grad * d/dx gelu(x) (the exact, erf form): grad * (Phi(x) + x phi(x)). grad and x of one shape
/// and one floating dtype. Throws ValueError naming both otherwise.
Tensor gelu_backward(const Tensor& grad, const Tensor& x);

/// The gradients of layer_norm (centred) or rms_norm over x's trailing `count` dims, with the
/// statistics recomputed: {d loss / dx, grad * xhat} (the second summed over the leading dims is
/// the weight's gradient). weight: the trailing dims' shape, or none. grad and x of one shape and
/// one floating dtype. Throws ValueError naming the shapes otherwise.
std::pair<Tensor, Tensor> norm_backward(const Tensor& grad, const Tensor& x, const std::optional<Tensor>& weight,
                                        int64_t count, double eps, bool centred);

}  // namespace tessera
