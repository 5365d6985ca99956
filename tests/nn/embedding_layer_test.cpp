// nn::Embedding with padding_idx: as torch.nn.Embedding, the padding row starts at zeros and
// gets no gradient; the other rows train as without it. Replicated and vocabulary-sharded tables.
#include <gtest/gtest.h>

#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST(EmbeddingLayer, PaddingRowIsZeroAtInitAndGetsNoGradient) {
  for_each_world({1, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Tensor ids = from_vector(std::vector<int64_t>{1, 5, 6, 5, 0, 6}, Shape{2, 3});
    // (padding_idx, the row it names)
    for (const auto& [pad, row] : std::vector<std::pair<int64_t, int64_t>>{{5, 5}, {-1, 6}, {0, 0}}) {
      manual_seed(7);
      nn::Embedding plain(mesh, 7, 4, DType::f64);
      manual_seed(7);
      nn::Embedding padded(mesh, 7, 4, DType::f64, pad);
      EXPECT_EQ(padded.padding_idx(), std::optional<int64_t>(row));
      EXPECT_EQ(plain.padding_idx(), std::nullopt);
      const Tensor w0 = plain.parameter("weight").full_tensor().detach();
      const Tensor wp = padded.parameter("weight").full_tensor().detach();
      const Tensor keep = ne(arange(7), Scalar(row)).to(DType::f64).reshape({7, 1});
      // The padding row is zeros; the others are the draw without padding_idx.
      EXPECT_TRUE(allclose(wp.select(0, row), zeros({4}, DType::f64))) << pad;
      EXPECT_TRUE(allclose(wp, mul(w0, keep))) << pad;

      // The padding row is looked up (zeros) and gets no gradient.
      const DTensor di = distribute_tensor(ids, mesh, {Replicate{}});
      const DTensor out = padded.forward(di);
      EXPECT_TRUE(allclose(out.full_tensor(), embedding(wp, ids))) << pad;
      const Tensor up = arange(24).to(DType::f64).reshape({2, 3, 4});
      sum(mul(out, distribute_tensor(up, mesh, {Replicate{}}))).backward();
      Tensor expected = w0.detach().clone().requires_grad_();
      sum(mul(embedding(expected, ids), up)).backward();
      const Tensor grad = padded.parameter("weight").grad().full_tensor();
      EXPECT_TRUE(allclose(grad.select(0, row), zeros({4}, DType::f64))) << pad;
      EXPECT_TRUE(allclose(grad, mul(expected.grad(), keep))) << pad;
    }
  });
}

TEST(EmbeddingLayer, VocabularyShardedPaddingRowGetsNoGradient) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Tensor ids = from_vector(std::vector<int64_t>{8, 3, 8, 0, 1, 2}, Shape{6});
    manual_seed(3);
    nn::Embedding emb(mesh, 9, 2, DType::f64, 8);
    DTensor weight = emb.parameter("weight");
    const Tensor w = weight.full_tensor().detach();
    EXPECT_TRUE(allclose(w.select(0, 8), zeros({2}, DType::f64)));
    // Move the table to Shard(0) (the rows split across ranks; row 8 on the last one).
    DTensor sharded = distribute_tensor(w, mesh, {Shard{0}});
    sharded.requires_grad_();
    const DTensor out = embedding(sharded, distribute_tensor(ids, mesh, {Replicate{}}), emb.padding_idx());
    sum(out).backward();
    const Tensor grad = sharded.grad().full_tensor();
    EXPECT_EQ(sharded.grad().placements(), (Placements{Shard{0}}));
    EXPECT_EQ(grad.to_vector<double>(),
              (std::vector<double>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  });
}

TEST(EmbeddingLayer, RejectsPaddingIdxOutOfRange) {
  for_each_world({1}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::Embedding(mesh, 7, 4, DType::f32, 7); },
                                        {"[embedding]", "padding_idx 7", "[7, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::Embedding(mesh, 7, 4, DType::f32, -8); },
                                        {"[embedding]", "padding_idx -8", "[7, 4]"}));
  });
}
