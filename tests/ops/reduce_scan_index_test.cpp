// The reductions built from others (logsumexp, std, vector_norm, all, any, max/min with indices),
// the scans and sorting (cumsum, cumprod, sort, topk) and the indexing ops (gather, scatter,
// scatter_add, index_select, index_add) on Tensor: hand-computed values, torch semantics at the
// edges (NaN, ties, empty dims), and one test per documented error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <tessera/ops/ops.hpp>

#include <test_util.hpp>

using namespace tessera;
using tessera::testing::kInf;
using tessera::testing::kNaN;
using tessera::testing::make;
using tessera::testing::value_error;

namespace {

::testing::AssertionResult values_are(const Tensor& t, const Shape& shape, DType dtype, const std::vector<double>& want,
                                      double tol = 1e-6) {
  return tessera::testing::matches(t, shape, dtype, want, tessera::testing::Tol{tol, tol});
}

Tensor i64(const std::vector<double>& v, const Shape& shape) { return make(v, shape, DType::i64); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// Reductions built from others
// ------------------------------------------------------------------------------------------------

TEST(CompositeReductions, LogsumexpIsStableAndMatchesTheDefinition) {
  const Tensor x = make({1, 2, 3, 1000, 1000, -kInf}, {2, 3}, DType::f64);
  const double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_TRUE(values_are(logsumexp(x, {1}), {2}, DType::f64, {row0, 1000 + std::log(2.0)}));
  EXPECT_TRUE(values_are(logsumexp(x, {1}, true), {2, 1}, DType::f64, {row0, 1000 + std::log(2.0)}));
  // All -inf: -inf (the shift is 0, not NaN); an empty reduction: -inf, as in PyTorch.
  EXPECT_TRUE(values_are(logsumexp(make({-kInf, -kInf}, {2}, DType::f32)), {}, DType::f32, {-kInf}));
  EXPECT_TRUE(values_are(logsumexp(zeros({2, 0}), {1}), {2}, DType::f32, {-kInf, -kInf}));
  EXPECT_TRUE(value_error([&] { (void)logsumexp(x, {2}); }, {"[logsumexp]", "dim 2 out of range", "[2, 3]"}));
}

TEST(CompositeReductions, StdAndVectorNorm) {
  const Tensor x = make({3, -4, 0, 1, 2, -2}, {2, 3}, DType::f64);
  EXPECT_TRUE(values_are(tessera::std(x, {1}), {2}, DType::f64,
                         {std::sqrt((std::pow(3 + 1 / 3.0, 2) + std::pow(-4 + 1 / 3.0, 2) + std::pow(1 / 3.0, 2)) / 2),
                          std::sqrt((std::pow(1 - 1 / 3.0, 2) + std::pow(2 - 1 / 3.0, 2) + std::pow(-2 - 1 / 3.0, 2)) / 2)}));
  EXPECT_TRUE(values_are(tessera::std(x, {1}, 0), {2}, DType::f64, {std::sqrt(var(x, {1}, 0).to_vector<double>()[0]),
                                                           std::sqrt(var(x, {1}, 0).to_vector<double>()[1])}));
  EXPECT_TRUE(values_are(vector_norm(x, 2, {1}), {2}, DType::f64, {5, 3}));
  EXPECT_TRUE(values_are(vector_norm(x, 1, {1}), {2}, DType::f64, {7, 5}));
  EXPECT_TRUE(values_are(vector_norm(x, kInf, {1}), {2}, DType::f64, {4, 2}));
  EXPECT_TRUE(values_are(vector_norm(x, -kInf, {1}), {2}, DType::f64, {0, 1}));
  EXPECT_TRUE(values_are(vector_norm(x, 0, {1}), {2}, DType::f64, {2, 3}));
  EXPECT_TRUE(values_are(vector_norm(x, 3, {1}), {2}, DType::f64, {std::cbrt(27 + 64.0), std::cbrt(1 + 8 + 8.0)}));
  EXPECT_TRUE(values_are(vector_norm(x), {}, DType::f64, {std::sqrt(9 + 16 + 1 + 4 + 4.0)}));
  EXPECT_TRUE(value_error([] { (void)vector_norm(arange(4)); }, {"[vector_norm]", "floating", "i64"}));
  EXPECT_TRUE(value_error([] { (void)vector_norm(zeros({0}), kInf); }, {"[vector_norm]", "zero elements"}));
}

TEST(CompositeReductions, AllAndAny) {
  const Tensor x = make({1, 0, 2, 3, 4, 5}, {2, 3}, DType::f32);
  EXPECT_TRUE(values_are(all(x, {1}), {2}, DType::b8, {0, 1}));
  EXPECT_TRUE(values_are(any(x, {1}, true), {2, 1}, DType::b8, {1, 1}));
  EXPECT_TRUE(values_are(all(x), {}, DType::b8, {0}));
  EXPECT_TRUE(values_are(any(zeros({2, 2})), {}, DType::b8, {0}));
  EXPECT_TRUE(values_are(all(zeros({0})), {}, DType::b8, {1}));  // vacuous truth, as torch.all
  EXPECT_TRUE(values_are(all(make({1, 1}, {2}, DType::b8)), {}, DType::b8, {1}));
  EXPECT_TRUE(value_error([&] { (void)any(x, {0, 0}); }, {"[any]", "more than once"}));
}

TEST(CompositeReductions, MaxAndMinAlongADimGiveValuesAndFirstIndices) {
  const Tensor x = make({1, 5, 5, 7, kNaN, 2}, {2, 3}, DType::f32);
  const auto [v, i] = max(x, 1);
  EXPECT_TRUE(values_are(v, {2}, DType::f32, {5, kNaN}));
  EXPECT_TRUE(values_are(i, {2}, DType::i64, {1, 1}));  // first of the tied 5s; NaN is the max
  const auto lo = min(x, 0, true);
  EXPECT_TRUE(values_are(lo.values, {1, 3}, DType::f32, {1, kNaN, 2}));
  EXPECT_TRUE(values_are(lo.indices, {1, 3}, DType::i64, {0, 1, 1}));
  EXPECT_TRUE(value_error([] { (void)max(zeros({}), 0); }, {"[max]", "at least 1 dim"}));
  EXPECT_TRUE(value_error([] { (void)min(zeros({2, 0}), 1); }, {"[min]", "zero-size dim 1", "[2, 0]"}));
  EXPECT_TRUE(value_error([&] { (void)max(x, 2); }, {"[max]", "dim 2 out of range"}));
}

// ------------------------------------------------------------------------------------------------
// Scans and sorting
// ------------------------------------------------------------------------------------------------

TEST(Scans, CumsumAndCumprodAlongEitherDim) {
  const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  EXPECT_TRUE(values_are(cumsum(x, 1), {2, 3}, DType::f32, {1, 3, 6, 4, 9, 15}));
  EXPECT_TRUE(values_are(cumsum(x, 0), {2, 3}, DType::f32, {1, 2, 3, 5, 7, 9}));
  EXPECT_TRUE(values_are(cumprod(x, -1), {2, 3}, DType::f32, {1, 2, 6, 4, 20, 120}));
  EXPECT_TRUE(values_are(cumsum(x.t(), 1), {3, 2}, DType::f32, {1, 5, 2, 7, 3, 9}));  // strided input
  // Integers and bools give i64, as in PyTorch; a 0-d tensor is its own scan; empty stays empty.
  EXPECT_TRUE(values_are(cumsum(arange(4, DType::i32), 0), {4}, DType::i64, {0, 1, 3, 6}));
  EXPECT_TRUE(values_are(cumsum(make({1, 0, 1}, {3}, DType::b8), 0), {3}, DType::i64, {1, 1, 2}));
  EXPECT_TRUE(values_are(cumprod(full({}, 3.0), 0), {}, DType::f32, {3}));
  EXPECT_TRUE(values_are(cumsum(zeros({0, 2}), 0), {0, 2}, DType::f32, {}));
  EXPECT_TRUE(value_error([&] { (void)cumsum(x, 2); }, {"[cumsum]", "dim 2 out of range", "[2, 3]"}));
  EXPECT_TRUE(value_error([] { (void)cumprod(Tensor(), 0); }, {"[cumprod]", "undefined"}));
}

TEST(Sorting, SortIsStableWithNaNLargest) {
  const Tensor x = make({3, 1, kNaN, 1, 2}, {5}, DType::f32);
  const auto up = sort(x);
  EXPECT_TRUE(values_are(up.values, {5}, DType::f32, {1, 1, 2, 3, kNaN}));
  EXPECT_TRUE(values_are(up.indices, {5}, DType::i64, {1, 3, 4, 0, 2}));
  const auto down = sort(x, 0, true);
  EXPECT_TRUE(values_are(down.values, {5}, DType::f32, {kNaN, 3, 2, 1, 1}));
  EXPECT_TRUE(values_are(down.indices, {5}, DType::i64, {2, 0, 4, 1, 3}));
  const auto cols = sort(make({4, 1, 2, 3}, {2, 2}, DType::i32), 0);
  EXPECT_TRUE(values_are(cols.values, {2, 2}, DType::i32, {2, 1, 4, 3}));
  EXPECT_TRUE(values_are(cols.indices, {2, 2}, DType::i64, {1, 0, 0, 1}));
  EXPECT_TRUE(value_error([&] { (void)sort(x, 1); }, {"[sort]", "dim 1 out of range"}));
}

TEST(Sorting, TopkLargestAndSmallest) {
  const Tensor x = make({5, 1, 4, 4, 9, 0}, {2, 3}, DType::f64);
  const auto [v, i] = topk(x, 2);
  EXPECT_TRUE(values_are(v, {2, 2}, DType::f64, {5, 4, 9, 4}));
  EXPECT_TRUE(values_are(i, {2, 2}, DType::i64, {0, 2, 1, 0}));
  const auto low = topk(x, 1, 0, false);
  EXPECT_TRUE(values_are(low.values, {1, 3}, DType::f64, {4, 1, 0}));
  EXPECT_TRUE(values_are(low.indices, {1, 3}, DType::i64, {1, 0, 1}));
  EXPECT_TRUE(values_are(topk(x, 0).values, {2, 0}, DType::f64, {}));
  EXPECT_TRUE(value_error([&] { (void)topk(x, 4); }, {"[topk]", "k = 4 out of range", "size 3"}));
  EXPECT_TRUE(value_error([&] { (void)topk(x, -1); }, {"[topk]", "k = -1"}));
  EXPECT_TRUE(value_error([] { (void)topk(full({}, 1.0), 2); }, {"[topk]", "0-d", "expected 1"}));
}

// ------------------------------------------------------------------------------------------------
// Indexing
// ------------------------------------------------------------------------------------------------

TEST(Indexing, GatherAndScatterFollowTorch) {
  const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  EXPECT_TRUE(values_are(gather(x, 1, i64({2, 0, 1, 1}, {2, 2})), {2, 2}, DType::f32, {3, 1, 5, 5}));
  EXPECT_TRUE(values_are(gather(x, 0, i64({1, 0, 1}, {1, 3})), {1, 3}, DType::f32, {4, 2, 6}));
  const Tensor src = make({10, 20, 30, 40}, {2, 2}, DType::f32);
  EXPECT_TRUE(values_are(scatter(x, 1, i64({2, 0, 1, 1}, {2, 2}), src), {2, 3}, DType::f32, {20, 2, 10, 4, 40, 6}));
  EXPECT_TRUE(values_are(scatter_add(x, 1, i64({2, 0, 1, 1}, {2, 2}), src), {2, 3}, DType::f32, {21, 2, 13, 4, 75, 6}));
  EXPECT_TRUE(value_error([&] { (void)gather(x, 1, i64({3}, {1, 1})); }, {"[gather]", "index 3 out of range", "size 3"}));
  EXPECT_TRUE(value_error([&] { (void)gather(x, 1, make({0}, {1, 1}, DType::f32)); }, {"[gather]", "integer tensor"}));
  EXPECT_TRUE(value_error([&] { (void)gather(x, 1, i64({0, 0, 0}, {3, 1})); }, {"[gather]", "larger than the input"}));
  EXPECT_TRUE(value_error([&] { (void)gather(x, 1, i64({0}, {1})); }, {"[gather]", "as many dims"}));
  EXPECT_TRUE(value_error([&] { (void)scatter(x, 1, i64({0, 0}, {1, 2}), make({1}, {1, 1}, DType::f32)); },
                          {"[scatter]", "larger than src"}));
}

TEST(Indexing, IndexSelectAndIndexAdd) {
  const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  EXPECT_TRUE(values_are(index_select(x, 1, i64({2, 0, 2}, {3})), {2, 3}, DType::f32, {3, 1, 3, 6, 4, 6}));
  EXPECT_TRUE(values_are(index_select(x, 0, i64({1}, {1})), {1, 3}, DType::f32, {4, 5, 6}));
  EXPECT_TRUE(values_are(index_add(x, 0, i64({1, 1}, {2}), ones({2, 3})), {2, 3}, DType::f32, {1, 2, 3, 6, 7, 8}));
  EXPECT_TRUE(value_error([&] { (void)index_select(x, 0, i64({0, 2}, {2})); }, {"[index_select]", "index 2 out of range"}));
  EXPECT_TRUE(value_error([&] { (void)index_select(x, 0, i64({0}, {1, 1})); }, {"[index_select]", "1-d"}));
  EXPECT_TRUE(value_error([&] { (void)index_add(x, 1, i64({0}, {1}), ones({2, 3})); }, {"[index_add]", "expected [2, 1]"}));
  EXPECT_TRUE(value_error([] { (void)index_select(full({}, 1.0), 0, i64({0}, {1})); }, {"[index_select]", "at least 1 dim"}));
}
