#pragma once
// The fused attention kernels on local tensors, shared by the Tensor op and the DTensor op (which
// runs them on blocks: `origin` places the block in the global score tensor, so causal masking
// and the dropout mask are the unsharded ones).
#include <array>

#include <tessera/core/tensor.hpp>
#include <tessera/ops/random.hpp>

namespace tessera::detail {

struct AttentionCall {
  const Tensor* mask = nullptr;  ///< broadcastable to this call's [batch..., L, S]; b8 or q's dtype
  bool is_causal = false;
  double scale = 1;
  double dropout_p = 0;
  RandomDraw draw;      ///< the keep-mask's draw when dropout_p > 0
  Shape scores_shape;   ///< the global [batch..., L, S]
  Shape origin;         ///< where this call's [batch..., L, S] starts in scores_shape
};

/// out [batch..., L, Ev] in q's dtype; `lse` receives the rows' log-sum-exp [batch..., L] in the
/// compute dtype (f32, or f64 for f64 inputs), which the backward reuses.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& call, Tensor& lse);

/// {dq, dk, dv} for the output gradient g, from the forward's out and lse.
std::array<Tensor, 3> attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& lse, const AttentionCall& call);

}  // namespace tessera::detail
