#pragma once
// Neural-network ops. Floating inputs only (ValueError naming the op otherwise); f16/bf16
// compute in f32 and return their own dtype.
#include <optional>
#include <string_view>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/reduction.hpp>

namespace tessera TESSERA_API {

/// exp(x) / sum(exp(x)) along dim, computed stably (max subtracted); a row of -inf gives NaN.
/// A 0-d input takes dim 0 or -1. Throws ValueError if dim is out of range.
Tensor softmax(const Tensor& x, int64_t dim);
/// x - logsumexp(x) along dim (max subtracted first). Throws ValueError if dim is out of range.
Tensor log_softmax(const Tensor& x, int64_t dim);
/// Normalises over the trailing dims given by normalized_shape (biased variance), then
/// applies weight and bias (each of shape normalized_shape) when given.
/// Throws ValueError if normalized_shape is empty or differs from the trailing dims of x, or if
/// weight/bias differ from normalized_shape in shape or from x in dtype.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5);
/// x / sqrt(mean(x^2) + eps) over the trailing normalized_shape dims, times weight when given.
/// Throws ValueError as layer_norm does.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight = std::nullopt,
                double eps = 1e-6);
/// Rows of weight [num_embeddings, dim] picked by integer indices of any shape: result
/// indices.shape + [dim], of weight's dtype (any dtype). Throws ValueError if weight is not 2-d,
/// for non-integer indices (i32, i64, u8 accepted) or for an index out of [0, num_embeddings).
/// padding_idx (as torch.nn.functional.embedding): the forward is unchanged, but row padding_idx
/// gets no gradient (indices equal to it contribute nothing). Negative counts from the end;
/// throws ValueError (see embedding_padding_index) when it is out of [-num_embeddings, num_embeddings).
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx = std::nullopt);
/// padding_idx of embedding normalised to [0, num_embeddings) for a 2-d weight of weight_shape:
/// Throws ValueError naming [embedding], the value and the shape when it is out of
/// [-num_embeddings, num_embeddings). Pure; shared by the Tensor and DTensor embedding and nn::Embedding.
std::optional<int64_t> embedding_padding_index(std::optional<int64_t> padding_idx, const Shape& weight_shape);


/// Cross entropy of logits [N, C] (or [C], or [N, C, d1, ...]) with integer class targets
/// [N] (or [], or [N, d1, ...]). Targets equal to ignore_index contribute nothing; the mean
/// divides by the number of non-ignored targets (NaN when there are none, as in PyTorch).
/// Returns logits' dtype: 0-d for mean and sum, target's shape for none (0 where ignored).
/// Throws ValueError for mismatched shapes, non-integer targets or a target out of [0, C).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

/// Negative log likelihood of log-probabilities [N, C] (or [C], or [N, C, d1, ...]) at integer
/// class targets: -log_probs[target], ignore_index contributing nothing, reduced as cross_entropy
/// (cross_entropy(x, t) == nll_loss(log_softmax(x, 1), t)). Throws ValueError as cross_entropy.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::mean);
/// Mean (sum, none) of (input - target)^2; the shapes broadcast. Throws ValueError for non-floating
/// inputs or shapes that do not broadcast.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

/// The class dim of logits for class targets of `target` shape (0 for [C], else 1), checking the
/// shapes and dtypes: Throws ValueError naming op. Pure; shared by the Tensor and DTensor losses.
int64_t class_dim_of(const Shape& logits, DType logits_dtype, const Shape& target, DType target_dtype, const char* op);

namespace detail {
/// The gradient of embedding: [rows, dim] zeros with each row of grad ([..., dim]) added into row
/// indices[...] (int64, same leading shape); indices outside [0, rows) are skipped, and so are
/// indices equal to skip_row when given (the padding row stays zero). Accumulates in f64.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t rows, DType dtype,
                          std::optional<int64_t> skip_row = std::nullopt);
}  // namespace detail

}  // namespace tessera
