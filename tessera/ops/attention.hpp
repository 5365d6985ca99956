#pragma once
// Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention) as one fused
// CPU kernel: query rows in blocks, keys in blocks, an online softmax; the [L, S] score matrix of
// a head is never formed. The backward is fused the same way (flash-attention's recurrences).
#include <optional>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// softmax(q @ k^T * scale + mask) @ v over the last two dims: q [..., L, E], k [..., S, E],
/// v [..., S, Ev] -> [..., L, Ev], the leading (batch, head) dims equal in all three.
/// - attn_mask: b8 (true = attend) or q's dtype (added to the scores), broadcastable to
///   [..., L, S]; it gets no gradient.
/// - is_causal: row i attends to columns j <= i (PyTorch's top-left tril); not with attn_mask.
/// - scale: default 1 / sqrt(E).
/// - dropout_p: attention weights dropped with probability p and the rest scaled by 1 / (1 - p).
///   The keep-mask is one draw of dropout_mask([..., L, S], dropout_p) from the calling thread's
///   generator, so the result equals softmax, then dropout with that mask, then the product.
/// A row whose every score is masked gives NaN, as softmax of a row of -inf does.
/// Throws ValueError naming the op and the shapes for mismatched shapes or dtypes, a non-floating
/// input, a mask that does not broadcast, is_causal with a mask, dropout_p outside [0, 1), or a
/// floating mask that requires a gradient.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& attn_mask = std::nullopt, double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

/// The operands of scaled_dot_product_attention as metadata.
struct AttentionOperands {
  Shape q, k, v;
  DType dtype;  ///< q's
  DType k_dtype, v_dtype;
  std::optional<Shape> mask;
  DType mask_dtype = DType::b8;
};

/// Checks the operands as scaled_dot_product_attention documents and returns the output shape.
/// Pure; shared by the Tensor and the DTensor op, so both give the same error text.
Shape attention_output_shape(const AttentionOperands& operands, double dropout_p, bool is_causal, const char* op);

}  // namespace tessera
