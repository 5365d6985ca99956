#pragma once
// The small language model and token batches the nn tests train: sizes that divide unevenly over
// 2, 3, 4 and 6 ranks, f64 so that sharded and unsharded runs agree to 1e-10.
#include <utility>
#include <vector>

#include <tessera/core/tensor.hpp>
#include <tessera/nn/layers.hpp>

namespace tessera::testing {

inline nn::TransformerConfig tiny() {
  nn::TransformerConfig c;
  c.vocab = 10;
  c.dim = 12;
  c.heads = 2;
  c.layers = 2;
  c.max_seq = 6;
  c.hidden = 20;
  c.dtype = DType::f64;
  return c;
}

// Token ids [4, 6] and next-token targets, different for each step.
inline std::pair<Tensor, Tensor> batch(int64_t vocab, int step) {
  std::vector<int64_t> ids(24), next(24);
  for (int64_t i = 0; i < 24; ++i) {
    ids[static_cast<size_t>(i)] = (i * 7 + 3 + step * 5) % vocab;
    next[static_cast<size_t>(i)] = (i * 7 + 10 + step * 5) % vocab;
  }
  return {from_vector(ids, Shape{4, 6}), from_vector(next, Shape{4, 6})};
}

}  // namespace tessera::testing
