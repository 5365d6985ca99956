#pragma once
// Backward kernels in one pass (ATen's gelu_backward, native_layer_norm_backward, the
// log_softmax + nll_loss backward of cross_entropy): what the op-by-op gradient formulas compute
// with a dozen temporaries, read and written once. Autograd calls them; the DTensor forms (dtensor/ops.hpp) run them on each rank's block.
#include <optional>
#include <utility>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// grad * d/dx gelu(x) (the exact, erf form): grad * (Phi(x) + x phi(x)). grad and x of one shape
/// and one floating dtype. Throws ValueError naming both otherwise.
Tensor gelu_backward(const Tensor& grad, const Tensor& x);
/// The same with y = gelu(x), the forward's output: for f32, Phi(x) is read off it as y / x, so
/// the backward evaluates no erf (only phi's exp). Other dtypes ignore y. y of x's shape and
/// dtype; throws ValueError naming the shapes otherwise.
Tensor gelu_backward(const Tensor& grad, const Tensor& x, const Tensor& y);

/// The gradients of layer_norm (centred) or rms_norm over x's trailing `count` dims, with the
/// statistics recomputed: {d loss / dx, grad * xhat} (the second summed over the leading dims is
/// the weight's gradient). weight: the trailing dims' shape, or none. grad and x of one shape and
/// one floating dtype. Throws ValueError naming the shapes otherwise.
std::pair<Tensor, Tensor> norm_backward(const Tensor& grad, const Tensor& x, const std::optional<Tensor>& weight,
                                        int64_t count, double eps, bool centred);

/// The gradient of cross_entropy's per-target losses (reduction none) for the logits, in one pass
/// per target: grad[k] * (softmax(logits)[k] - one_hot(target[k])) along the class dim (1, or 0
/// for [C] logits), zero where the target is ignore_index. grad and target of the losses' shape
/// (the logits' without the class dim); logits' dtype. Throws ValueError naming the shapes
/// otherwise, or a target out of [0, C).
Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, int64_t ignore_index);

}  // namespace tessera
