// Gradients of every op of the library on Tensor against central finite differences (f64), plus
// the engine's semantics: accumulation, no-grad scopes, shared subexpressions, errors.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using autograd::gradcheck;

namespace {

// Distinct values (no ties, nothing at the kinks of relu/abs/clamp): k * 0.37 mod 2.3 - 1.1 + 0.013k.
Tensor values(const Shape& shape, int seed, double low = -1.1, double width = 2.3) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    const double k = static_cast<double>(i + static_cast<size_t>(seed) * 7 + 1);
    v[i] = low + std::fmod(k * 0.37, width) + 0.013 * k;
  }
  return from_vector(v, shape);
}
Tensor positive(const Shape& shape, int seed) { return values(shape, seed, 0.3, 2.0); }

#define EXPECT_GRADCHECK(fn, ...)                            \
  do {                                                       \
    const auto result = gradcheck(fn, {__VA_ARGS__});        \
    EXPECT_TRUE(result.ok) << #fn << ": " << result.message; \
  } while (0)

using Inputs = const std::vector<Tensor>&;

}  // namespace

TEST(TensorGrad, BinaryOpsWithBroadcasting) {
  for (const auto& [sa, sb] :
       std::vector<std::pair<Shape, Shape>>{{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 3}, {4, 1}}}) {
    const Tensor a = values(sa, 1), b = values(sb, 2), pb = positive(sb, 3), pa = positive(sa, 4);
    EXPECT_GRADCHECK([](Inputs x) { return add(x[0], x[1]); }, a, b);
    EXPECT_GRADCHECK([](Inputs x) { return sub(x[0], x[1]); }, a, b);
    EXPECT_GRADCHECK([](Inputs x) { return mul(x[0], x[1]); }, a, b);
    EXPECT_GRADCHECK([](Inputs x) { return div(x[0], x[1]); }, a, pb);
    EXPECT_GRADCHECK([](Inputs x) { return pow(x[0], x[1]); }, pa, b);
    EXPECT_GRADCHECK([](Inputs x) { return maximum(x[0], x[1]); }, a, b);
    EXPECT_GRADCHECK([](Inputs x) { return minimum(x[0], x[1]); }, a, b);
    EXPECT_GRADCHECK([](Inputs x) { return x[0] * x[1] + x[0] / (x[1] * x[1] + 1.0) - x[1]; }, a, b);
  }
}

TEST(TensorGrad, ScalarOperandsOnEitherSide) {
  const Tensor x = values({2, 3}, 5), p = positive({2, 3}, 6);
  EXPECT_GRADCHECK([](Inputs t) { return add(t[0], Scalar(2.5)); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return sub(Scalar(2.5), t[0]); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return mul(Scalar(-1.5), t[0]); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return div(t[0], Scalar(4.0)); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return div(Scalar(3.0), t[0]); }, p);
  EXPECT_GRADCHECK([](Inputs t) { return pow(t[0], Scalar(3.0)); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return pow(Scalar(1.7), t[0]); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return maximum(t[0], Scalar(0.05)); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return minimum(t[0], Scalar(0.05)); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return 2.0 - t[0] * 3.0 + 1.0 / (t[0] * t[0] + 2.0); }, x);
}

// Every unary row of the op table; ops defined on positive reals only get positive inputs.
TEST(TensorGrad, UnaryOps) {
  const Tensor x = values({3, 4}, 7), p = positive({3, 4}, 8);
  const std::vector<std::string> positive_only = {"log", "sqrt", "rsqrt", "log1p"};
#define TESSERA_UNARY_GRADCHECK(name, ...)                                                             \
  {                                                                                                    \
    const bool on_positive = std::find(positive_only.begin(), positive_only.end(), #name) != positive_only.end(); \
    EXPECT_GRADCHECK([](Inputs t) { return name(t[0]); }, on_positive ? p : x);                        \
  }
  TESSERA_UNARY_OPS(TESSERA_UNARY_GRADCHECK)
#undef TESSERA_UNARY_GRADCHECK
  EXPECT_GRADCHECK([](Inputs t) { return clamp(t[0], Scalar(-0.5), Scalar(0.6)); }, x);
}

TEST(TensorGrad, SelectionOps) {
  const Tensor x = values({3, 4}, 9), y = values({3, 4}, 10);
  const Tensor cond = gt(values({3, 4}, 11), Scalar(0.0));
  EXPECT_GRADCHECK([&](Inputs t) { return where(cond, t[0], t[1]); }, x, y);
  EXPECT_GRADCHECK([&](Inputs t) { return where(cond, t[0], Scalar(2.0)); }, x);
  EXPECT_GRADCHECK([&](Inputs t) { return where(cond, Scalar(2.0), t[0]); }, x);
  EXPECT_GRADCHECK([&](Inputs t) { return masked_fill(t[0], cond, Scalar(-3.0)); }, x);
  EXPECT_GRADCHECK([&](Inputs t) { return where(gt(cond, Scalar(0)), t[0], values({4}, 12)); }, x);
}

TEST(TensorGrad, Reductions) {
  const Tensor x = values({2, 3, 4}, 13), p = positive({2, 3, 4}, 14);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1, 2}, {-1}}) {
    for (bool keepdim : {false, true}) {
      EXPECT_GRADCHECK([&](Inputs t) { return sum(t[0], dims, keepdim); }, x);
      EXPECT_GRADCHECK([&](Inputs t) { return mean(t[0], dims, keepdim); }, x);
      EXPECT_GRADCHECK([&](Inputs t) { return prod(t[0], dims, keepdim); }, p);
      EXPECT_GRADCHECK([&](Inputs t) { return amax(t[0], dims, keepdim); }, x);
      EXPECT_GRADCHECK([&](Inputs t) { return amin(t[0], dims, keepdim); }, x);
      EXPECT_GRADCHECK([&](Inputs t) { return var(t[0], dims, 1, keepdim); }, x);
    }
  }
}

TEST(TensorGrad, CompositeReductionsScansAndSorting) {
  const Tensor x = values({3, 4}, 21), p = positive({3, 4}, 22);
  EXPECT_GRADCHECK([](Inputs t) { return logsumexp(t[0], {1}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return logsumexp(t[0]); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return tessera::std(t[0], {0}, 1, true); }, x);
  for (double ord : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()})
    EXPECT_GRADCHECK([ord](Inputs t) { return vector_norm(t[0], ord, {1}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return max(t[0], 1).values; }, x);
  EXPECT_GRADCHECK([](Inputs t) { return min(t[0], 0, true).values; }, x);
  EXPECT_GRADCHECK([](Inputs t) { return cumsum(t[0], 1); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return cumsum(t[0], 0); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return cumprod(t[0], 1); }, p);
  EXPECT_GRADCHECK([](Inputs t) { return sort(t[0], 1, true).values; }, x);
  EXPECT_GRADCHECK([](Inputs t) { return topk(t[0], 2, 0).values; }, x);
}

TEST(TensorGrad, IndexingOps) {
  const Tensor x = values({3, 4}, 23), src = values({3, 2}, 24);
  const Tensor index = from_vector<int64_t>({3, 0, 1, 1, 2, 3}, {3, 2});
  const Tensor distinct = from_vector<int64_t>({3, 0, 1, 2, 2, 3}, {3, 2});
  const Tensor rows = from_vector<int64_t>({2, 0, 2});
  EXPECT_GRADCHECK([&](Inputs t) { return gather(t[0], 1, index); }, x);
  EXPECT_GRADCHECK([&](Inputs t) { return scatter(t[0], 1, distinct, t[1]); }, x, src);
  EXPECT_GRADCHECK([&](Inputs t) { return scatter_add(t[0], 1, index, t[1]); }, x, src);
  EXPECT_GRADCHECK([&](Inputs t) { return index_select(t[0], 0, rows); }, x);
  EXPECT_GRADCHECK([&](Inputs t) { return index_add(t[0], 0, rows, t[1]); }, x, values({3, 4}, 25));
}

TEST(TensorGrad, LossesAndProducts) {
  const Tensor x = values({4, 3}, 26), y = values({4, 3}, 27);
  const Tensor target = from_vector<int64_t>({2, 0, -100, 1});
  EXPECT_GRADCHECK([&](Inputs t) { return nll_loss(log_softmax(t[0], 1), target); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return mse_loss(t[0], t[1]); }, x, y);
  EXPECT_GRADCHECK([](Inputs t) { return addmm(t[0], t[1], t[2], 0.5, 2.0); }, values({3}, 28), x, values({3, 3}, 29));
  EXPECT_GRADCHECK([](Inputs t) { return baddbmm(t[0], t[1], t[2]); }, values({2, 2, 3}, 30), values({2, 2, 4}, 31),
                   values({2, 4, 3}, 32));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("ij,jk->ik", t); }, x, values({3, 2}, 33));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("bij,bj->i", t); }, values({2, 3, 4}, 34), values({2, 4}, 35));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("ij,k->ik", t); }, x, values({5}, 36));
}

TEST(TensorGrad, MatmulBmmLinear) {
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{3, 4}, {4, 2}},
                                                                   {{4}, {4, 2}},
                                                                   {{3, 4}, {4}},
                                                                   {{4}, {4}},
                                                                   {{2, 3, 4}, {4, 5}},
                                                                   {{2, 1, 3, 4}, {3, 4, 2}}}) {
    EXPECT_GRADCHECK([](Inputs t) { return matmul(t[0], t[1]); }, values(sa, 15), values(sb, 16));
  }
  EXPECT_GRADCHECK([](Inputs t) { return bmm(t[0], t[1]); }, values({2, 3, 4}, 17), values({2, 4, 2}, 18));
  EXPECT_GRADCHECK([](Inputs t) { return linear(t[0], t[1], t[2]); }, values({2, 3, 4}, 19), values({5, 4}, 20),
                   values({5}, 21));
  EXPECT_GRADCHECK([](Inputs t) { return linear(t[0], t[1]); }, values({4}, 22), values({5, 4}, 23));
}

TEST(TensorGrad, NnOps) {
  const Tensor x = values({3, 5}, 24);
  EXPECT_GRADCHECK([](Inputs t) { return softmax(t[0], 1); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return softmax(t[0], 0); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return log_softmax(t[0], -1); }, x);
  const Tensor h = values({2, 3, 4}, 25), w = values({4}, 26), b = values({4}, 27), w2 = values({3, 4}, 28);
  EXPECT_GRADCHECK([](Inputs t) { return layer_norm(t[0], {4}, t[1], t[2]); }, h, w, b);
  EXPECT_GRADCHECK([](Inputs t) { return layer_norm(t[0], {3, 4}, t[1]); }, h, w2);
  EXPECT_GRADCHECK([](Inputs t) { return layer_norm(t[0], {4}); }, h);
  EXPECT_GRADCHECK([](Inputs t) { return rms_norm(t[0], {4}, t[1]); }, h, w);
  EXPECT_GRADCHECK([](Inputs t) { return rms_norm(t[0], {3, 4}); }, h);
  const Tensor ids = from_vector(std::vector<int64_t>{2, 0, 2, 4, 1, 2}, Shape{2, 3});
  EXPECT_GRADCHECK([&](Inputs t) { return embedding(t[0], ids); }, values({5, 3}, 29));
  const Tensor target = from_vector(std::vector<int64_t>{1, 4, -100, 0}, Shape{4});
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    EXPECT_GRADCHECK([&](Inputs t) { return cross_entropy(t[0], target, -100, r); }, values({4, 5}, 30));
    EXPECT_GRADCHECK(
        [&](Inputs t) {
          return cross_entropy(t[0], from_vector(std::vector<int64_t>{3, 1, 0, 2, 2, 1}, Shape{2, 3}), -100, r);
        },
        values({2, 4, 3}, 31));
  }
}

TEST(TensorGrad, ViewsAndJoins) {
  const Tensor x = values({2, 3, 4}, 32);
  EXPECT_GRADCHECK([](Inputs t) { return reshape(t[0], {6, 4}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return t[0].view({4, -1}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return transpose(t[0], 0, 2).reshape({-1}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return permute(t[0], {1, 2, 0}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return narrow(t[0], 1, 1, 2); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return select(t[0], 2, -1); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return unsqueeze(t[0], 1).squeeze(); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return flatten(t[0], 1); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return expand(narrow(t[0], 0, 0, 1), {3, 3, 4}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return t[0].t().contiguous(); }, values({3, 2}, 33));
  EXPECT_GRADCHECK([](Inputs t) { return cat({t[0], t[1], t[0]}, 1); }, x, values({2, 1, 4}, 34));
  EXPECT_GRADCHECK([](Inputs t) { return stack({t[0], t[1]}, 1); }, x, values({2, 3, 4}, 35));
  EXPECT_GRADCHECK(
      [](Inputs t) {
        const auto pieces = split(t[0], 3, 2);
        return mul(pieces[0], Scalar(2.0)) + pieces[1];
      },
      x);
  EXPECT_GRADCHECK(
      [](Inputs t) {
        const auto pieces = chunk(t[0], 2, 0);
        return mul(pieces[0], pieces[1]);
      },
      x);
}

TEST(TensorGrad, DropoutWithAFixedMask) {
  // The mask is a pure function of the seed: reseeding before each call keeps fn deterministic.
  EXPECT_GRADCHECK([](Inputs t) {
    manual_seed(11);
    return dropout(t[0], 0.4, true);
  }, values({4, 5}, 37));
  EXPECT_GRADCHECK([](Inputs t) { return dropout(t[0], 0.4, false); }, values({4, 5}, 38));
}

TEST(TensorGrad, GradcheckCatchesAWrongDerivative) {
  // A recorded op whose backward is off by a factor of two must fail the check.
  const auto doubled_wrongly = [](Inputs t) {
    Tensor out = mul(t[0].detach(), Scalar(3.0));
    if (t[0].requires_grad())
      autograd::record<Tensor>("wrong", out, {&t[0]},
                               [](const Tensor& g) { return std::vector<Tensor>{mul(g, Scalar(6.0))}; });
    return out;
  };
  const auto result = gradcheck(doubled_wrongly, {values({3}, 36)});
  EXPECT_FALSE(result.ok);
  EXPECT_TRUE(contains(result.message, "backward gives")) << result.message;
  EXPECT_NEAR(result.max_error, 3.0 * 1.5, 1.6);  // weights are in [0.5, 1.5)
}

TEST(TensorGrad, AccumulationSharingAndNoGrad) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3}).requires_grad_();
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
  const Tensor y = mul(x, x) + x;  // x used three times: dy/dx = 2x + 1
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn_name(), "add");
  sum(y).backward();
  EXPECT_TRUE(allclose(x.grad(), from_vector(std::vector<double>{3, 5, 7})));
  sum(mul(x, Scalar(2.0))).backward();  // gradients accumulate
  EXPECT_TRUE(allclose(x.grad(), from_vector(std::vector<double>{5, 7, 9})));
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
  {
    autograd::NoGradGuard no_grad;
    const Tensor z = mul(x, x);
    EXPECT_FALSE(z.requires_grad());
  }
  EXPECT_TRUE(mul(x, x).requires_grad());
  const Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_FALSE(mul(d, d).requires_grad());
  // A non-scalar output takes an explicit gradient.
  const Tensor w = mul(x, Scalar(3.0));
  w.backward(from_vector(std::vector<double>{1, 0, 2}));
  EXPECT_TRUE(allclose(x.grad(), from_vector(std::vector<double>{3, 0, 6})));
  // Only the inputs that require gradients get them.
  Tensor a = from_vector(std::vector<double>{2, 3}).requires_grad_();
  const Tensor b = from_vector(std::vector<double>{5, 7});
  sum(mul(a, b)).backward();
  EXPECT_TRUE(allclose(a.grad(), b));
  EXPECT_FALSE(b.grad().defined());
  // f32 leaves get f32 gradients through f64 computations.
  Tensor f = from_vector(std::vector<float>{1, 2}).requires_grad_();
  sum(f.to(DType::f64) * 2.0).backward();
  EXPECT_EQ(f.grad().dtype(), DType::f32);
  EXPECT_TRUE(allclose(f.grad(), from_vector(std::vector<float>{2, 2})));
}

TEST(TensorGrad, Errors) {
  EXPECT_TRUE(throws_with<ValueError>([] { arange(3).requires_grad_(); }, {"[requires_grad_]", "floating", "i64"}));
  EXPECT_TRUE(throws_with<ValueError>([] { ones({2}).backward(); }, {"[backward]", "does not require a gradient"}));
  Tensor x = ones({2, 2}).requires_grad_();
  EXPECT_TRUE(throws_with<ValueError>([&] { mul(x, x).backward(); }, {"[backward]", "[2, 2]", "one-element"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { mul(x, x).backward(ones({3})); }, {"[backward]", "[3]", "[2, 2]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { x.fill_(2.0); }, {"[fill_]", "requires a gradient", "NoGradGuard"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { x.copy_(zeros({2, 2})); }, {"[copy_]", "requires a gradient"}));
  EXPECT_TRUE(
      throws_with<ValueError>([&] { mul(x, x).requires_grad_(false); }, {"[requires_grad_]", "non-leaf", "mul"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { x.as_strided({2}, {1}, 0); }, {"[as_strided]", "not differentiable"}));
  autograd::NoGradGuard no_grad;
  x.fill_(2.0);  // allowed without recording (optimizer updates)
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 2, 2, 2}));
}

TEST(TensorGrad, ShapeOpsThatCopy) {
  const Tensor x = values({3, 4}, 40), b = values({2, 3, 4}, 41);
  EXPECT_GRADCHECK([](Inputs t) { return flip(t[0], {0, -1}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return roll(t[0], {1, -3}, {0, 1}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return roll(t[0], {5}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return tril(t[0], -1); }, b);
  EXPECT_GRADCHECK([](Inputs t) { return triu(t[0], 1); }, b);
  EXPECT_GRADCHECK([](Inputs t) { return repeat(t[0], {2, 1, 3}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return tile(t[0], {2}); }, x);
  EXPECT_GRADCHECK([](Inputs t) { return pad(t[0], {1, 2, -1, 1}, PadMode::constant, 0.5); }, x);
  for (PadMode mode : {PadMode::reflect, PadMode::replicate, PadMode::circular})
    EXPECT_GRADCHECK([mode](Inputs t) { return pad(t[0], {2, 3, 1, 2}, mode); }, x);
}

TEST(TensorGrad, EmbeddingPaddingIdx) {
  // Row padding_idx gets no gradient; the other rows get what plain embedding (gradchecked above)
  // gives them. The forward is unchanged.
  const Tensor ids = from_vector(std::vector<int64_t>{2, 0, 2, 4, 1, 2}, Shape{2, 3});
  const Tensor w = values({5, 3}, 29), up = values({2, 3, 3}, 30);
  for (const auto& [pad, row] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {-1, 4}, {-5, 0}, {3, 3}}) {
    Tensor plain = w.clone().requires_grad_(), padded = w.clone().requires_grad_();
    sum(mul(embedding(plain, ids), up)).backward();
    const Tensor out = embedding(padded, ids, pad);
    EXPECT_TRUE(equal(out.detach(), embedding(w, ids)));
    sum(mul(out, up)).backward();
    const Tensor keep = ne(arange(5), Scalar(row)).to(DType::f64).reshape({5, 1});
    EXPECT_TRUE(allclose(padded.grad(), mul(plain.grad(), keep))) << "padding_idx " << pad;
    EXPECT_TRUE(allclose(padded.grad().select(0, row), zeros({3}, DType::f64))) << "padding_idx " << pad;
  }
}

// The backward runs the reachable nodes in the reverse of their creation order, whatever the
// graph's shape (a breadth-first walk would run q before r here): the order the ranks of an
// SPMD program run their communicating nodes in depends only on the program's order.
TEST(TensorGrad, NodesRunInTheReverseOfTheirCreationOrder) {
  std::vector<std::string> ran;
  const auto op = [&ran](const char* name, std::initializer_list<const Tensor*> inputs) {
    Tensor out = from_vector(std::vector<double>{1});
    autograd::record<Tensor>(name, out, inputs, [&ran, name, n = inputs.size()](const Tensor& g) {
      ran.emplace_back(name);
      return std::vector<Tensor>(n, g);
    });
    return out;
  };
  Tensor x = from_vector(std::vector<double>{1}).requires_grad_();
  const Tensor p = op("p", {&x});
  const Tensor q = op("q", {&p});
  const Tensor r = op("r", {&x});
  op("out", {&q, &r}).backward();
  EXPECT_EQ(ran, (std::vector<std::string>{"out", "r", "q", "p"}));
  EXPECT_TRUE(allclose(x.grad(), from_vector(std::vector<double>{2})));
}
