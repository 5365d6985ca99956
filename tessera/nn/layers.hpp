#pragma once
// Layers on DTensor: Linear, Embedding, LayerNorm, RMSNorm, MLP, causal multi-head attention, a
// pre-norm transformer block and a small decoder-only language model. Parameters start
// Replicate on every mesh dim, initialised from the default generator (manual_seed) so that a
// model built after the same seed has the same values on any mesh; parallelize_module and
// fully_shard then move them.
#include <memory>
#include <optional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/nn/module.hpp>

namespace tessera TESSERA_API {
namespace nn {

/// y = x W^T + b, W [out, in] uniform in +-1/sqrt(in) (PyTorch's default), b likewise.
class Linear : public UnaryModule {
 public:
  Linear(const DeviceMesh& mesh, int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32);
  DTensor forward(const DTensor& x) const override;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  bool bias_;
};

/// Rows of a [num, dim] table (normal(0, 1) init) looked up by integer indices. With padding_idx
/// (negative counts from the end), as torch.nn.Embedding: that row starts at zeros and gets no
/// gradient. Throws ValueError naming [embedding] when padding_idx is out of [-num, num).
class Embedding : public UnaryModule {
 public:
  Embedding(const DeviceMesh& mesh, int64_t num_embeddings, int64_t dim, DType dtype = DType::f32,
            std::optional<int64_t> padding_idx = std::nullopt);
  DTensor forward(const DTensor& indices) const override;
  /// The normalised padding row (in [0, num_embeddings)), if any.
  std::optional<int64_t> padding_idx() const { return padding_idx_; }

 private:
  std::optional<int64_t> padding_idx_;
};

/// Normalisation over the last dim, with a weight (ones) and, for LayerNorm, a bias (zeros).
class LayerNorm : public UnaryModule {
 public:
  LayerNorm(const DeviceMesh& mesh, int64_t dim, double eps = 1e-5, DType dtype = DType::f32);
  DTensor forward(const DTensor& x) const override;

 private:
  int64_t dim_;
  double eps_;
};

class RMSNorm : public UnaryModule {
 public:
  RMSNorm(const DeviceMesh& mesh, int64_t dim, double eps = 1e-6, DType dtype = DType::f32);
  DTensor forward(const DTensor& x) const override;

 private:
  int64_t dim_;
  double eps_;
};

/// fc2(gelu(fc1(x))): the Megatron pair (fc1 column-parallel, fc2 row-parallel).
class MLP : public UnaryModule {
 public:
  MLP(const DeviceMesh& mesh, int64_t dim, int64_t hidden, DType dtype = DType::f32);
  DTensor forward(const DTensor& x) const override;

 private:
  std::shared_ptr<Linear> fc1_, fc2_;
};

/// Causal self-attention over [batch, seq, dim] with `heads` heads: q, k, v and o projections.
/// With q/k/v column-parallel and o row-parallel the heads are split over the mesh dim and
/// nothing moves until o's reduction.
class MultiheadAttention : public UnaryModule {
 public:
  MultiheadAttention(const DeviceMesh& mesh, int64_t dim, int64_t heads, DType dtype = DType::f32);
  DTensor forward(const DTensor& x) const override;

 private:
  int64_t dim_, heads_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
};

/// x + attn(norm1(x)), then x + mlp(norm2(x)) (pre-norm, RMSNorm).
class TransformerBlock : public UnaryModule {
 public:
  TransformerBlock(const DeviceMesh& mesh, int64_t dim, int64_t heads, int64_t hidden, DType dtype = DType::f32);
  DTensor forward(const DTensor& x) const override;

 private:
  std::shared_ptr<RMSNorm> norm1_, norm2_;
  std::shared_ptr<MultiheadAttention> attn_;
  std::shared_ptr<MLP> mlp_;
};

struct TransformerConfig {
  int64_t vocab = 64;
  int64_t dim = 32;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t max_seq = 16;
  int64_t hidden = 128;
  DType dtype = DType::f32;
};

/// A decoder-only language model: token and position embeddings, `layers` blocks, a final
/// RMSNorm and an untied output head. Submodule paths: tok, pos, blocks.<i>.{norm1, attn.{q,k,v,o},
/// norm2, mlp.{fc1, fc2}}, norm, head.
class TransformerLM : public UnaryModule {
 public:
  TransformerLM(const DeviceMesh& mesh, const TransformerConfig& config);
  /// Logits [batch, seq, vocab] for token ids [batch, seq].
  DTensor forward(const DTensor& tokens) const override;
  /// Mean next-token cross-entropy of forward(tokens) against targets [batch, seq].
  DTensor loss(const DTensor& tokens, const DTensor& targets) const;
  /// The mean next-token cross-entropy of logits [batch, seq, vocab] against targets [batch, seq].
  DTensor next_token_loss(const DTensor& logits, const DTensor& targets) const;

  /// The model as a chain of units, what pipeline stages take whole: unit 0 the embeddings (tok,
  /// pos), unit 1 + i block i, the last unit the final norm and head. forward(tokens) is
  /// forward_units(0, units(), tokens).
  int64_t units() const { return config_.layers + 2; }
  /// Units [first, end) applied to x: token ids [batch, seq] when first is 0, else hidden states
  /// [batch, seq, dim]; logits when end is units(). Throws ValueError for a bad range or tokens.
  DTensor forward_units(int64_t first, int64_t end, const DTensor& x) const;
  const TransformerConfig& config() const { return config_; }

 private:
  TransformerConfig config_;
  std::shared_ptr<Embedding> tok_, pos_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> head_;
};

}  // namespace nn
}  // namespace tessera
