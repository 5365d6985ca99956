#pragma once
// The fused attention kernels on local tensors, shared by the Tensor op and the DTensor op (which
// runs them on blocks: `origin` places the block in the global score tensor, so causal masking
// and the dropout mask are the unsharded ones).
#include <array>
#include <optional>

#include <tessera/core/error.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/attention.hpp>
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

/// The operands' metadata (T: Tensor or DTensor). Throws ValueError naming `op` when attn_mask
/// requires a gradient: the op gives it none.
template <class T>
AttentionOperands attention_operands(const T& q, const T& k, const T& v, const std::optional<T>& mask, const char* op) {
  AttentionOperands operands{q.shape(), k.shape(), v.shape(), q.dtype(), k.dtype(), v.dtype(), std::nullopt};
  if (mask) {
    operands.mask = mask->shape();
    operands.mask_dtype = mask->dtype();
    TESSERA_CHECK(!mask->requires_grad(), ValueError, op,
                  "attn_mask requires a gradient, which this op does not give; pass attn_mask.detach()");
  }
  return operands;
}

/// Checks the operands (attention_output_shape) and prepares the call of the whole problem: the
/// scale (default 1 / sqrt(E)), the global scores shape, origin 0 and, when dropout_p > 0, the
/// keep-mask's draw from the calling thread's generator. The mask pointer is left to the caller.
AttentionCall attention_call(const AttentionOperands& operands, double dropout_p, bool is_causal,
                             std::optional<double> scale, const char* op);

/// out [batch..., L, Ev] in q's dtype; `lse` receives the rows' log-sum-exp [batch..., L] in the
/// compute dtype (f32, or f64 for f64 inputs), which the backward reuses. With `probs`, it
/// receives the softmax P itself when each row's scores fit one tile (S <= 128 keys), else an
/// undefined tensor: given to this call's backward, P is read instead of recomputed (its scores
/// gemm and exp), for memory of L * S per batch entry, at most 128 values per query row.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& call, Tensor& lse,
                         Tensor* probs = nullptr);

/// {dq, dk, dv} for the output gradient g, from the forward's out and lse, and its probs when
/// defined (only those of the forward of these same operands and call).
std::array<Tensor, 3> attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& lse, const AttentionCall& call,
                                         const Tensor& probs = Tensor());

}  // namespace tessera::detail
