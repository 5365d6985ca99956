#pragma once
// The small transformer LM and the synthetic task that train_lm and train_pipeline share: each
// sequence counts up from a start with a stride (mod vocab), and the model learns the next token.
#include <cstdint>
#include <utility>
#include <vector>

#include <tessera/nn/layers.hpp>
#include <tessera/tessera.hpp>

namespace examples {

inline tessera::nn::TransformerConfig lm_config() {
  tessera::nn::TransformerConfig c;
  c.vocab = 32;
  c.dim = 32;
  c.heads = 4;
  c.layers = 2;
  c.max_seq = 16;
  c.hidden = 64;
  return c;
}

/// Step `step`'s batch of `rows` sequences: token ids and the next tokens, [rows, seq] each. The
/// same on every rank (then distributed).
inline std::pair<tessera::Tensor, tessera::Tensor> counting_batch(int step, int64_t rows, int64_t seq, int64_t vocab) {
  std::vector<int64_t> ids(static_cast<size_t>(rows * seq)), next(ids.size());
  uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(step + 1);
  for (int64_t b = 0; b < rows; ++b) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t start = static_cast<int64_t>(state >> 33) % vocab, stride = 1 + static_cast<int64_t>(state >> 40) % 3;
    for (int64_t t = 0; t < seq; ++t) {
      ids[static_cast<size_t>(b * seq + t)] = (start + t * stride) % vocab;
      next[static_cast<size_t>(b * seq + t)] = (start + (t + 1) * stride) % vocab;
    }
  }
  return {tessera::from_vector(ids, tessera::Shape{rows, seq}), tessera::from_vector(next, tessera::Shape{rows, seq})};
}

}  // namespace examples
