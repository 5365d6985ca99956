// scaled_dot_product_attention: the fused kernel equals the composition it fuses
// (softmax(q k^T * scale + mask) v, with dropout's mask in between) over shapes that cross the
// kernel's row and key blocks, every mask kind, causal, dtypes and dropout; its gradients pass
// gradcheck; every documented error.
#include <gtest/gtest.h>

#include <cmath>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Distinct smooth values in about [-1, 1].
Tensor values(const Shape& shape, int seed, DType dtype = DType::f32) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + 1.3 * seed);
  return from_vector(v, shape).to(dtype);
}

// The unfused reference in f64.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask, bool causal,
                 double scale, const std::optional<Tensor>& keep = std::nullopt, double p = 0) {
  const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64);
  Tensor scores = mul(matmul(q64, k64.transpose(-2, -1)), Scalar(scale));
  const int64_t L = q.shape()[q.ndim() - 2], S = k.shape()[k.ndim() - 2];
  if (causal) scores = masked_fill(scores, logical_not(tril(ones({L, S}, DType::b8))), -INFINITY);
  if (mask && mask->dtype() == DType::b8) scores = masked_fill(scores, logical_not(*mask), -INFINITY);
  if (mask && mask->dtype() != DType::b8) scores = add(scores, mask->to(DType::f64));
  Tensor weights = softmax(scores, -1);
  if (keep) weights = mul(where(*keep, weights, Scalar(0.0)), Scalar(1.0 / (1.0 - p)));
  return matmul(weights, v64);
}

struct Shapes {
  Shape q, k, v;
};

const std::vector<Shapes> kShapes = {
    {{5, 4}, {7, 4}, {7, 3}},                     // no batch dims
    {{2, 3, 70, 8}, {2, 3, 150, 8}, {2, 3, 150, 5}},  // crosses the 64-row and 128-key blocks
    {{1, 130, 16}, {1, 129, 16}, {1, 129, 16}},
    {{3, 1, 6}, {3, 200, 6}, {3, 200, 2}},        // one query row
};

}  // namespace

TEST(Attention, EqualsTheComposition) {
  for (const auto& s : kShapes) {
    const Tensor q = values(s.q, 1), k = values(s.k, 2), v = values(s.v, 3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.q[s.q.size() - 1]));
    EXPECT_TRUE(allclose(scaled_dot_product_attention(q, k, v).to(DType::f64), reference(q, k, v, {}, false, scale),
                         1e-5, 1e-5))
        << s.q.to_string();
    EXPECT_TRUE(allclose(scaled_dot_product_attention(q, k, v, std::nullopt, 0, true, 0.5).to(DType::f64),
                         reference(q, k, v, {}, true, 0.5), 1e-5, 1e-5))
        << "causal " << s.q.to_string();
    const int64_t L = s.q[s.q.size() - 2], S = s.k[s.k.size() - 2];
    // A boolean mask broadcast over the batch dims (every row keeps column 0, so none is empty),
    // and a float mask of the full score shape.
    const Tensor keep = logical_or(gt(values({L, S}, 4), 0.2), eq(arange(S).reshape({1, S}), 0));
    EXPECT_TRUE(allclose(scaled_dot_product_attention(q, k, v, keep).to(DType::f64),
                         reference(q, k, v, keep, false, scale), 1e-5, 1e-5))
        << "bool mask " << s.q.to_string();
    Shape scores = s.q;
    scores[scores.size() - 1] = S;
    const Tensor bias = values(scores, 5);
    EXPECT_TRUE(allclose(scaled_dot_product_attention(q, k, v, bias).to(DType::f64),
                         reference(q, k, v, bias, false, scale), 1e-5, 1e-5))
        << "float mask " << s.q.to_string();
  }
}

TEST(Attention, DtypesComputeInF32OrF64) {
  const Shapes s = kShapes[1];
  for (DType dtype : {DType::f64, DType::f16, DType::bf16}) {
    const Tensor q = values(s.q, 1, dtype), k = values(s.k, 2, dtype), v = values(s.v, 3, dtype);
    const Tensor out = scaled_dot_product_attention(q, k, v, std::nullopt, 0, true);
    EXPECT_EQ(out.dtype(), dtype);
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-2;
    EXPECT_TRUE(allclose(out.to(DType::f64), reference(q, k, v, {}, true, 1.0 / std::sqrt(8.0)), tol, tol))
        << name(dtype);
  }
}

TEST(Attention, FullyMaskedRowIsNaNAsSoftmaxGives) {
  const Tensor q = values({3, 4}, 1), k = values({5, 4}, 2), v = values({5, 2}, 3);
  Tensor keep = ones({3, 5}, DType::b8);
  keep = masked_fill(keep, eq(arange(3).reshape({3, 1}), 1), false);  // row 1 attends to nothing
  const Tensor out = scaled_dot_product_attention(q, k, v, keep);
  const auto got = out.to_vector<float>();
  EXPECT_TRUE(std::isnan(got[2]) && std::isnan(got[3]));
  EXPECT_FALSE(std::isnan(got[0]) || std::isnan(got[5]));
}

TEST(Attention, DropoutUsesOneDrawOfTheDropoutMask) {
  const Shapes s = kShapes[1];
  const Tensor q = values(s.q, 1), k = values(s.k, 2), v = values(s.v, 3);
  manual_seed(11);
  const Tensor out = scaled_dot_product_attention(q, k, v, std::nullopt, 0.3, true);
  manual_seed(11);
  const Tensor keep = dropout_mask({2, 3, 70, 150}, 0.3);
  EXPECT_TRUE(allclose(out.to(DType::f64), reference(q, k, v, {}, true, 1.0 / std::sqrt(8.0), keep, 0.3), 1e-5, 1e-5));
  EXPECT_EQ(default_generator().offset(), 1u);  // one draw, as dropout_mask takes
  // No dropout: no draw.
  scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(default_generator().offset(), 1u);
}

TEST(Attention, GradientsPassGradcheck) {
  const auto check = [](const Shapes& s, const std::optional<Tensor>& mask, bool causal, double p) {
    const auto fn = [&](const std::vector<Tensor>& x) {
      manual_seed(5);  // the same dropout mask on every evaluation
      return scaled_dot_product_attention(x[0], x[1], x[2], mask, p, causal, 0.7);
    };
    const auto result = autograd::gradcheck(
        fn, {values(s.q, 1, DType::f64), values(s.k, 2, DType::f64), values(s.v, 3, DType::f64)});
    EXPECT_TRUE(result.ok) << s.q.to_string() << " causal " << causal << " p " << p << ": " << result.message;
  };
  check({{5, 3}, {6, 3}, {6, 2}}, std::nullopt, false, 0);
  check({{2, 4, 3}, {2, 6, 3}, {2, 6, 2}}, std::nullopt, true, 0);
  check({{2, 4, 3}, {2, 6, 3}, {2, 6, 2}}, values({4, 6}, 7, DType::f64), false, 0);
  check({{2, 4, 3}, {2, 6, 3}, {2, 6, 2}}, gt(values({2, 1, 6}, 8), -0.5), false, 0.25);
  check({{1, 70, 2}, {1, 130, 2}, {1, 130, 2}}, std::nullopt, true, 0);  // several blocks
}

TEST(AttentionErrors, EachDocumentedError) {
  const Tensor q = values({2, 4, 3}, 1), k = values({2, 5, 3}, 2), v = values({2, 5, 6}, 3);
  const std::string op = "[scaled_dot_product_attention]";
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q.to(DType::i32), k.to(DType::i32), v.to(DType::i32)); },
                                      {op, "unsupported dtype i32"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k.to(DType::f64), v); }, {op, "dtype"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, values({5, 3}, 2), v); },
                                      {op, "q [2, 4, 3], k [5, 3], v [2, 5, 6]", "same number of dims"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, values({3, 5, 3}, 2), values({3, 5, 6}, 3)); },
                                      {op, "leading (batch, head) dims"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, values({2, 5, 4}, 2), v); },
                                      {op, "last dim E"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, values({2, 6, 6}, 3)); },
                                      {op, "sequence dim S"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, v, std::nullopt, 1.0); },
                                      {op, "dropout_p = 1"}));
  const Tensor keep = ones({4, 5}, DType::b8);
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, v, keep, 0, true); },
                                      {op, "is_causal and attn_mask"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, v, ones({4, 5}, DType::i64)); },
                                      {op, "attn_mask dtype i64"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, v, ones({4, 4}, DType::b8)); },
                                      {op, "attn_mask [4, 4]", "does not broadcast to the scores [2, 4, 5]"}));
  Tensor bias = zeros({4, 5});
  bias.requires_grad_();
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, v, bias); },
                                      {op, "attn_mask requires a gradient"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, Tensor(), v); }, {op, "undefined"}));
}

// Heads split off [b, s, h, d] by a permute are read in place: the output and the gradients equal
// those of contiguous operands, and the output comes out in q's layout, so that permuting back to
// [b, s, h, d] is a view.
TEST(Attention, ReadsPermutedHeadsInPlace) {
  const auto heads = [](const Tensor& t) { return t.permute({0, 2, 1, 3}); };  // [b, s, h, d] -> [b, h, s, d]
  for (const bool causal : {false, true}) {
    const Tensor q_bshd = values({2, 70, 3, 8}, 1), k_bshd = values({2, 150, 3, 8}, 2), v_bshd = values({2, 150, 3, 5}, 3);
    Tensor q = heads(q_bshd).detach(), k = heads(k_bshd).detach(), v = heads(v_bshd).detach();
    ASSERT_FALSE(q.is_contiguous());
    q.requires_grad_();
    k.requires_grad_();
    v.requires_grad_();
    Tensor qc = q.contiguous().detach(), kc = k.contiguous().detach(), vc = v.contiguous().detach();
    qc.requires_grad_();
    kc.requires_grad_();
    vc.requires_grad_();
    const Tensor out = scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, causal);
    const Tensor expected = scaled_dot_product_attention(qc, kc, vc, std::nullopt, 0.0, causal);
    EXPECT_TRUE(allclose(out, expected, 1e-6, 1e-6)) << "causal " << causal;
    EXPECT_TRUE(heads(out).is_contiguous());
    const Tensor g = heads(values({2, 70, 3, 5}, 4));
    out.backward(g);
    expected.backward(g.contiguous());
    EXPECT_TRUE(allclose(q.grad(), qc.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(allclose(k.grad(), kc.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(allclose(v.grad(), vc.grad(), 1e-5, 1e-6));
  }
}

// The backward reads the probabilities its forward kept when every row's keys fit one tile (S <=
// 128), and recomputes them otherwise; either way its gradients are those of the composition, in
// f32, over shapes that cross the row blocks, causal or not, with a mask or with dropout.
TEST(Attention, GradientsEqualThoseOfTheComposition) {
  const std::vector<Shapes> shapes = {
      {{5, 4}, {7, 4}, {7, 3}},                       // kept
      {{2, 3, 70, 8}, {2, 3, 100, 8}, {2, 3, 100, 5}},  // kept, several row blocks
      {{1, 64, 16}, {1, 128, 16}, {1, 128, 16}},        // kept, the widest tile
      {{2, 3, 70, 8}, {2, 3, 150, 8}, {2, 3, 150, 5}},  // recomputed
  };
  const auto leaf = [](const Tensor& t) {
    Tensor x = t.detach();
    x.requires_grad_();
    return x;
  };
  for (const auto& s : shapes) {
    const int64_t L = s.q[s.q.size() - 2], S = s.k[s.k.size() - 2];
    Shape out_shape = s.q;
    out_shape[out_shape.size() - 1] = s.v[s.v.size() - 1];
    Shape scores = s.q;
    scores[scores.size() - 1] = S;
    const Tensor mask = logical_or(gt(values({L, S}, 4), 0.2), eq(arange(S).reshape({1, S}), 0));
    manual_seed(9);
    const Tensor dropped = dropout_mask(scores, 0.3);
    struct Case {
      const char* name;
      std::optional<Tensor> mask;
      bool causal;
      double p;
    };
    for (const Case& c : {Case{"plain", std::nullopt, false, 0}, Case{"causal", std::nullopt, true, 0},
                          Case{"mask", mask, false, 0}, Case{"causal dropout", std::nullopt, true, 0.3}}) {
      const Tensor q = leaf(values(s.q, 1)), k = leaf(values(s.k, 2)), v = leaf(values(s.v, 3));
      const Tensor q64 = leaf(q.to(DType::f64)), k64 = leaf(k.to(DType::f64)), v64 = leaf(v.to(DType::f64));
      const Tensor g = values(out_shape, 6);
      const double scale = 0.6;
      manual_seed(9);
      scaled_dot_product_attention(q, k, v, c.mask, c.p, c.causal, scale).backward(g);
      const std::optional<Tensor> keep = c.p > 0 ? std::optional<Tensor>(dropped) : std::nullopt;
      reference(q64, k64, v64, c.mask, c.causal, scale, keep, c.p).backward(g.to(DType::f64));
      EXPECT_TRUE(allclose(q.grad().to(DType::f64), q64.grad(), 1e-4, 1e-5)) << c.name << " " << s.k.to_string();
      EXPECT_TRUE(allclose(k.grad().to(DType::f64), k64.grad(), 1e-4, 1e-5)) << c.name << " " << s.k.to_string();
      EXPECT_TRUE(allclose(v.grad().to(DType::f64), v64.grad(), 1e-4, 1e-5)) << c.name << " " << s.k.to_string();
    }
  }
}
