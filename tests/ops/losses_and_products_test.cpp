// nll_loss, mse_loss, addmm and baddbmm on Tensor: against their definitions through other ops
// (cross_entropy, matmul), torch semantics at the edges, one test per documented error.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <tessera/ops/ops.hpp>

#include <test_util.hpp>

using namespace tessera;
using tessera::testing::kNaN;
using tessera::testing::make;
using tessera::testing::value_error;

TEST(Losses, NllLossIsCrossEntropyOfLogSoftmax) {
  const Tensor logits = make({0.5, -1, 2, 0.1, 0.3, -0.2, 1.5, 0, -2, 0.7, 0.7, 0.7}, {4, 3}, DType::f64);
  const Tensor target = from_vector<int64_t>({2, 0, -100, 1});
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none})
    EXPECT_TRUE(allclose(nll_loss(log_softmax(logits, 1), target, -100, r), cross_entropy(logits, target, -100, r)));
  // [N, C, d] layout: the class dim is 1.
  const Tensor x3 = logits.reshape({2, 3, 2});
  const Tensor t3 = from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  EXPECT_TRUE(allclose(nll_loss(x3, t3, -100, Reduction::none),
                       from_vector<double>({-0.5, 0.2, 2, -0.7}, {2, 2})));
  // Every target ignored: the mean is NaN, as in PyTorch.
  EXPECT_TRUE(std::isnan(nll_loss(logits, from_vector<int64_t>({-1, -1, -1, -1}), -1).item()));
  EXPECT_TRUE(value_error([&] { (void)nll_loss(logits, from_vector<int64_t>({0, 3, 0, 0})); },
                          {"[nll_loss]", "1 target is out of [0, 3)"}));
  EXPECT_TRUE(value_error([&] { (void)nll_loss(logits, from_vector<int64_t>({0, 1, 2})); },
                          {"[nll_loss]", "target shape [3] does not match input shape [4, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)nll_loss(logits, make({0, 1, 2, 0}, {4}, DType::f32)); }, {"[nll_loss]", "integer"}));
  EXPECT_TRUE(value_error([&] { (void)nll_loss(arange(3), from_vector<int64_t>({0}, {})); }, {"[nll_loss]", "floating"}));
}

TEST(Losses, MseLossBroadcastsAndReduces) {
  const Tensor a = make({1, 2, 3, 4}, {2, 2}, DType::f32), b = make({0, 4}, {2}, DType::f32);
  EXPECT_TRUE(allclose(mse_loss(a, b, Reduction::none), make({1, 4, 9, 0}, {2, 2}, DType::f32)));
  EXPECT_NEAR(mse_loss(a, b).item(), 3.5, 1e-6);
  EXPECT_NEAR(mse_loss(a, b, Reduction::sum).item(), 14, 1e-6);
  EXPECT_TRUE(value_error([&] { (void)mse_loss(a, make({1, 2, 3}, {3}, DType::f32)); }, {"[mse_loss]", "[2, 2]", "[3]"}));
  EXPECT_TRUE(value_error([&] { (void)mse_loss(arange(2), arange(2)); }, {"[mse_loss]", "floating"}));
}

TEST(Products, AddmmAndBaddbmm) {
  const Tensor m1 = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64), m2 = make({1, 0, 0, 1, 1, 1}, {3, 2}, DType::f64);
  const Tensor bias = make({10, 20}, {2}, DType::f64);
  EXPECT_TRUE(allclose(addmm(bias, m1, m2), add(matmul(m1, m2), bias)));
  EXPECT_TRUE(allclose(addmm(bias, m1, m2, 0.5, 2.0), add(mul(matmul(m1, m2), 2.0), mul(bias, 0.5))));
  // beta == 0 ignores the input, NaN included.
  EXPECT_TRUE(allclose(addmm(full({2, 2}, kNaN, DType::f64), m1, m2, 0.0), matmul(m1, m2)));
  const Tensor b1 = stack({m1, mul(m1, 2.0)}), b2 = stack({m2, m2});
  EXPECT_TRUE(allclose(baddbmm(ones({2, 2}, DType::f64), b1, b2, 1.0, -1.0), sub(ones({2, 2}, DType::f64), bmm(b1, b2))));
  EXPECT_TRUE(value_error([&] { (void)addmm(bias, m1, m1); }, {"[addmm]", "cannot multiply [2, 3] by [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)addmm(ones({3}), m1, m2); }, {"[addmm]", "shapes [3] and [2, 2] cannot be broadcast"}));
  EXPECT_TRUE(value_error([&] { (void)baddbmm(bias, m1, m2); }, {"[baddbmm]", "[B, n, m] and [B, m, p]"}));
}

TEST(Einsum, MatchesTheOpsItNames) {
  const Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64), b = make({1, 0, 2, 1, -1, 3}, {3, 2}, DType::f64);
  EXPECT_TRUE(allclose(einsum("ij,jk->ik", {a, b}), matmul(a, b)));
  EXPECT_TRUE(allclose(einsum("ij , jk", {a, b}), matmul(a, b)));  // implicit output: letters used once, sorted
  EXPECT_TRUE(allclose(einsum("ij->ji", {a}), a.t()));
  EXPECT_TRUE(allclose(einsum("ij->j", {a}), sum(a, {0})));
  EXPECT_TRUE(allclose(einsum("ij,ij->", {a, a}), sum(mul(a, a))));
  EXPECT_TRUE(allclose(einsum("ij,kj->ik", {a, a}), matmul(a, a.t())));
  EXPECT_TRUE(allclose(einsum("i,j->ij", {a.select(0, 0), b.select(1, 0)}),
                       mul(a.select(0, 0).unsqueeze(1), b.select(1, 0).unsqueeze(0))));
  const Tensor c = make({1, -1, 2, 0.5}, {2, 2}, DType::f64);
  EXPECT_TRUE(allclose(einsum("ij,jk,kl->il", {a, b, c}), matmul(matmul(a, b), c)));
  const Tensor x = stack({a, mul(a, 2.0)}), y = stack({b, b});
  EXPECT_TRUE(allclose(einsum("bij,bjk->bik", {x, y}), bmm(x, y)));
  EXPECT_TRUE(allclose(einsum("bij,bjk->ik", {x, y}), sum(bmm(x, y), {0})));
  EXPECT_EQ(parse_einsum("ij,jk", {{2, 3}, {3, 4}}).equation, "ij,jk->ik");
}

TEST(Einsum, Errors) {
  const Tensor a = ones({2, 3}), b = ones({4, 2});
  EXPECT_TRUE(value_error([&] { (void)einsum("ij,jk->ik", {a, b}); }, {"[einsum]", "letter 'j' has sizes 3 and 4"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ijk->i", {a}); }, {"[einsum]", "term 'ijk' has 3 letters", "2 dims"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ii->i", {a}); }, {"[einsum]", "letter 'i' has sizes 2 and 3"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ij->iz", {a}); }, {"[einsum]", "output letter 'z' appears in no operand"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ij->ii", {a}); }, {"[einsum]", "output letter 'i' repeats"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ij,jk->ik", {a}); }, {"[einsum]", "2 operand terms for 1 operands"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("..i->i", {a}); }, {"[einsum]", "term '..i' has a '.' outside one '...'"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ij,jk->ik", {a, ones({3, 2}, DType::f64)}); }, {"[einsum]", "dtypes"}));
}
