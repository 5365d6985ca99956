// The layers: each forward is the single-device formula on DTensors; sharding propagation and
// the styles' input/output placements decide what moves.
#include <tessera/nn/layers.hpp>

#include <cmath>
#include <string>

#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

namespace tessera::nn {

namespace {

Placements replicated(const DeviceMesh& mesh) { return Placements(static_cast<size_t>(mesh.ndim()), Replicate{}); }

// Uniform in [-bound, bound): the same values for any mesh (DTensor rand equals the unsharded draw).
DTensor uniform(const Shape& shape, double bound, const DeviceMesh& mesh, DType dtype) {
  return sub(mul(rand(shape, mesh, replicated(mesh), dtype), Scalar(2 * bound)), Scalar(bound));
}

}  // namespace

Linear::Linear(const DeviceMesh& mesh, int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : UnaryModule(mesh), in_(in_features), out_(out_features), bias_(bias) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  register_parameter("weight", uniform({out_features, in_features}, bound, mesh, dtype));
  if (bias) register_parameter("bias", uniform({out_features}, bound, mesh, dtype));
}

DTensor Linear::forward(const DTensor& x) const {
  const ForwardScope scope(*this);
  const DTensor in = prepare_input(x);
  const DTensor y = bias_ ? linear(in, use("weight"), use("bias")) : linear(in, use("weight"));
  return finish_output(y);
}

Embedding::Embedding(const DeviceMesh& mesh, int64_t num_embeddings, int64_t dim, DType dtype,
                     std::optional<int64_t> padding_idx)
    : UnaryModule(mesh), padding_idx_(embedding_padding_index(padding_idx, Shape{num_embeddings, dim})) {
  DTensor weight = randn({num_embeddings, dim}, mesh, replicated(mesh), dtype);
  if (padding_idx_) {
    // Replicated: the local is the whole table (empty on a rank outside the mesh).
    Tensor local = weight.to_local();
    if (local.ndim() == 2 && local.size(0) == num_embeddings) local.select(0, *padding_idx_).fill_(Scalar(0.0));
  }
  register_parameter("weight", weight);
}

DTensor Embedding::forward(const DTensor& indices) const {
  const ForwardScope scope(*this);
  return finish_output(embedding(use("weight"), prepare_input(indices), padding_idx_));
}

LayerNorm::LayerNorm(const DeviceMesh& mesh, int64_t dim, double eps, DType dtype)
    : UnaryModule(mesh), dim_(dim), eps_(eps) {
  register_parameter("weight", ones({dim}, mesh, replicated(mesh), dtype));
  register_parameter("bias", zeros({dim}, mesh, replicated(mesh), dtype));
}

DTensor LayerNorm::forward(const DTensor& x) const {
  const ForwardScope scope(*this);
  return finish_output(layer_norm(prepare_input(x), {dim_}, use("weight"), use("bias"), eps_));
}

RMSNorm::RMSNorm(const DeviceMesh& mesh, int64_t dim, double eps, DType dtype)
    : UnaryModule(mesh), dim_(dim), eps_(eps) {
  register_parameter("weight", ones({dim}, mesh, replicated(mesh), dtype));
}

DTensor RMSNorm::forward(const DTensor& x) const {
  const ForwardScope scope(*this);
  return finish_output(rms_norm(prepare_input(x), {dim_}, use("weight"), eps_));
}

MLP::MLP(const DeviceMesh& mesh, int64_t dim, int64_t hidden, DType dtype) : UnaryModule(mesh) {
  fc1_ = register_module("fc1", std::make_shared<Linear>(mesh, dim, hidden, true, dtype));
  fc2_ = register_module("fc2", std::make_shared<Linear>(mesh, hidden, dim, true, dtype));
}

DTensor MLP::forward(const DTensor& x) const {
  const ForwardScope scope(*this);
  return finish_output(fc2_->forward(gelu(fc1_->forward(prepare_input(x)))));
}

MultiheadAttention::MultiheadAttention(const DeviceMesh& mesh, int64_t dim, int64_t heads, DType dtype)
    : UnaryModule(mesh), dim_(dim), heads_(heads) {
  TESSERA_CHECK(heads > 0 && dim % heads == 0, ValueError, "MultiheadAttention", "dim ", dim,
                " is not divisible by heads ", heads);
  q_ = register_module("q", std::make_shared<Linear>(mesh, dim, dim, true, dtype));
  k_ = register_module("k", std::make_shared<Linear>(mesh, dim, dim, true, dtype));
  v_ = register_module("v", std::make_shared<Linear>(mesh, dim, dim, true, dtype));
  o_ = register_module("o", std::make_shared<Linear>(mesh, dim, dim, true, dtype));
}

DTensor MultiheadAttention::forward(const DTensor& x_in) const {
  const ForwardScope scope(*this);
  const DTensor x = prepare_input(x_in);
  TESSERA_CHECK(x.ndim() == 3 && x.shape()[2] == dim_, ValueError, "MultiheadAttention", "input ", x.to_string(),
                " must be [batch, seq, ", dim_, "]");
  const int64_t batch = x.shape()[0], seq = x.shape()[1], head_dim = dim_ / heads_;
  // [batch, seq, dim] -> [batch, heads, seq, head_dim]
  const auto split_heads = [&](const DTensor& t) { return permute(reshape(t, {batch, seq, heads_, head_dim}), {0, 2, 1, 3}); };
  const DTensor q = split_heads(q_->forward(x)), k = split_heads(k_->forward(x)), v = split_heads(v_->forward(x));
  // Causal (position i attends to j <= i), scaled by 1/sqrt(head_dim), as one fused kernel with
  // its backward: the [seq, seq] scores of a head are never formed.
  const DTensor attended = scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true);
  const DTensor merged = reshape(permute(attended, {0, 2, 1, 3}), {batch, seq, dim_});
  return finish_output(o_->forward(merged));
}

TransformerBlock::TransformerBlock(const DeviceMesh& mesh, int64_t dim, int64_t heads, int64_t hidden, DType dtype)
    : UnaryModule(mesh) {
  norm1_ = register_module("norm1", std::make_shared<RMSNorm>(mesh, dim, 1e-6, dtype));
  attn_ = register_module("attn", std::make_shared<MultiheadAttention>(mesh, dim, heads, dtype));
  norm2_ = register_module("norm2", std::make_shared<RMSNorm>(mesh, dim, 1e-6, dtype));
  mlp_ = register_module("mlp", std::make_shared<MLP>(mesh, dim, hidden, dtype));
}

DTensor TransformerBlock::forward(const DTensor& x_in) const {
  const ForwardScope scope(*this);
  const DTensor x = prepare_input(x_in);
  const DTensor h = add(x, attn_->forward(norm1_->forward(x)));
  return finish_output(add(h, mlp_->forward(norm2_->forward(h))));
}

TransformerLM::TransformerLM(const DeviceMesh& mesh, const TransformerConfig& config)
    : UnaryModule(mesh), config_(config) {
  tok_ = register_module("tok", std::make_shared<Embedding>(mesh, config.vocab, config.dim, config.dtype));
  pos_ = register_module("pos", std::make_shared<Embedding>(mesh, config.max_seq, config.dim, config.dtype));
  for (int64_t i = 0; i < config.layers; ++i)
    blocks_.push_back(register_module("blocks." + std::to_string(i),
                                      std::make_shared<TransformerBlock>(mesh, config.dim, config.heads, config.hidden,
                                                                         config.dtype)));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(mesh, config.dim, 1e-6, config.dtype));
  head_ = register_module("head", std::make_shared<Linear>(mesh, config.dim, config.vocab, false, config.dtype));
}

DTensor TransformerLM::forward(const DTensor& tokens) const { return forward_units(0, units(), tokens); }

DTensor TransformerLM::forward_units(int64_t first, int64_t end, const DTensor& input) const {
  TESSERA_CHECK(0 <= first && first <= end && end <= units(), ValueError, "TransformerLM::forward_units", "units [",
                first, ", ", end, ") are not within the model's ", units());
  const ForwardScope scope(*this);  // a pipeline stage's units count against the model too
  DTensor x = input;
  for (int64_t u = first; u < end; ++u) {
    if (u == 0) {
      TESSERA_CHECK(x.ndim() == 2 && x.shape()[1] <= config_.max_seq, ValueError, "TransformerLM", "tokens ",
                    x.to_string(), " must be [batch, seq] with seq <= ", config_.max_seq);
      const DTensor positions = DTensor::from_local(arange(x.shape()[1]), mesh(), replicated(mesh()));
      x = add(tok_->forward(x), pos_->forward(positions));
    } else if (u == units() - 1) {
      x = head_->forward(norm_->forward(x));
    } else {
      x = blocks_[static_cast<size_t>(u - 1)]->forward(x);
    }
  }
  return x;
}

DTensor TransformerLM::next_token_loss(const DTensor& logits, const DTensor& targets) const {
  const int64_t rows = logits.shape()[0] * logits.shape()[1];
  return cross_entropy(reshape(logits, {rows, logits.shape()[2]}), reshape(targets, {rows}));
}

DTensor TransformerLM::loss(const DTensor& tokens, const DTensor& targets) const {
  return next_token_loss(forward(tokens), targets);
}

}  // namespace tessera::nn
