// index_add's alpha (torch.index_add(x, dim, index, source, alpha=1)): alpha scales the source
// rows before they are added, in values and in the source's gradient; an integer input takes an
// integer alpha only; callers without alpha keep alpha = 1.
#include <gtest/gtest.h>

#include <vector>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Exact: the values are small integers and halves.
::testing::AssertionResult is(const Tensor& t, const Shape& shape, DType dtype, const std::vector<double>& want) {
  return matches(t, shape, dtype, want, Tol{0, 0});
}

}  // namespace

TEST(IndexAddAlpha, ScalesTheSourceRows) {
  const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  const Tensor rows = make({1, 1, 0}, {3}, DType::i64);
  const Tensor src = make({1, 2, 3, 10, 20, 30, 100, 200, 300}, {3, 3}, DType::f32);
  // Row 1 gets 2.5 * (src[0] + src[1]), row 0 gets 2.5 * src[2].
  EXPECT_TRUE(is(index_add(x, 0, rows, src, 2.5), {2, 3}, DType::f32, {251, 502, 753, 31.5, 60, 88.5}));
  EXPECT_TRUE(is(index_add(x, 0, rows, src, -1), {2, 3}, DType::f32, {-99, -198, -297, -7, -17, -27}));
  EXPECT_TRUE(is(index_add(x, 0, rows, src, 0), {2, 3}, DType::f32, {1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(equal(index_add(x, 0, rows, src), index_add(x, 0, rows, src, 1)));
  // Along dim 1, negative dim.
  EXPECT_TRUE(is(index_add(x, -1, make({2}, {1}, DType::i64), make({1, 1}, {2, 1}, DType::f32), 3), {2, 3},
                         DType::f32, {1, 2, 6, 4, 5, 9}));
  // Integer input, integer alpha: stays integral.
  const Tensor xi = make({1, 2, 3, 4}, {2, 2}, DType::i64);
  EXPECT_TRUE(is(index_add(xi, 0, make({0}, {1}, DType::i64), make({5, 6}, {1, 2}, DType::i64), 3), {2, 2},
                         DType::i64, {16, 20, 3, 4}));
}

TEST(IndexAddAlpha, GradientOfTheSourceIsScaled) {
  const Tensor x = make({0.5, -1, 2, 0.25, 1.5, -0.75}, {3, 2}, DType::f64);
  const Tensor src = make({0.3, -0.7, 1.1, 0.9}, {2, 2}, DType::f64);
  const Tensor rows = make({2, 0}, {2}, DType::i64);
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& t) { return index_add(t[0], 0, rows, t[1], -1.75); }, {x, src});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(IndexAddAlpha, AFloatingAlphaOnAnIntegerInputIsAnError) {
  const Tensor xi = make({1, 2, 3, 4}, {2, 2}, DType::i64);
  EXPECT_TRUE(value_error([&] { (void)index_add(xi, 0, make({0}, {1}, DType::i64), ones({1, 2}, DType::i64), 0.5); },
                          {"[index_add]", "alpha 0.5 is floating for an input of dtype i64", "integer alpha"}));
}
