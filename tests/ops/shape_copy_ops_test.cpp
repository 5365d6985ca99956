// The shape ops that copy (flip, roll, tril, triu, repeat, tile, pad) against hand-computed values
// in torch semantics, and one test per documented error.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <tessera/core/tensor.hpp>
#include <tessera/ops/ops.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// [0, 1, ..., numel-1] in shape, as f64.
Tensor iota_of(const Shape& shape, DType dtype = DType::f64) { return arange(shape.numel()).reshape(shape).to(dtype); }

void expect_values(const Tensor& got, const Shape& shape, const std::vector<double>& values) {
  EXPECT_EQ(got.shape(), shape);
  EXPECT_EQ(got.to(DType::f64).to_vector<double>(), values);
}

}  // namespace

TEST(ShapeCopyOps, FlipReversesTheGivenDims) {
  const Tensor x = iota_of({3, 4});
  expect_values(flip(x, {0}), {3, 4}, {8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3});
  expect_values(flip(x, {-1, 0}), {3, 4}, {11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  expect_values(flip(x, {}), {3, 4}, x.to_vector<double>());
  // A strided view, an integer dtype and a 0-d tensor.
  expect_values(flip(x.t(), {1}), {4, 3}, {8, 4, 0, 9, 5, 1, 10, 6, 2, 11, 7, 3});
  EXPECT_EQ(flip(iota_of({3}, DType::i32), {0}).to_vector<int32_t>(), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(flip(full({}, 4.0), {0}).item(), 4.0);
  EXPECT_FALSE(flip(x, {0}).is_same(x));
}

TEST(ShapeCopyOps, RollShiftsWithWrapAroundAndFlattensWithoutDims) {
  const Tensor x = iota_of({3, 4});
  expect_values(roll(x, {1, -1}, {0, 1}), {3, 4}, {9, 10, 11, 8, 1, 2, 3, 0, 5, 6, 7, 4});
  expect_values(roll(x, {5}), {3, 4}, {7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6});
  expect_values(roll(x, {-7}, {}), {3, 4}, {7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6});
  // Shifts of a repeated dim add up; a whole turn is the identity.
  expect_values(roll(x, {2, 2}, {1, -1}), {3, 4}, roll(x, {0}, {1}).to_vector<double>());
  expect_values(roll(x, {3, 4}, {0, 1}), {3, 4}, x.to_vector<double>());
  EXPECT_EQ(roll(zeros({0, 3}), {2}, {0}).shape(), (Shape{0, 3}));
}

TEST(ShapeCopyOps, TrilAndTriuKeepATriangleOfTheLastTwoDims) {
  const Tensor x = iota_of({3, 4});
  expect_values(tril(x), {3, 4}, {0, 0, 0, 0, 4, 5, 0, 0, 8, 9, 10, 0});
  expect_values(tril(x, -1), {3, 4}, {0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0});
  expect_values(triu(x, 1), {3, 4}, {0, 1, 2, 3, 0, 0, 6, 7, 0, 0, 0, 11});
  expect_values(add(tril(x, 0), triu(x, 1)), {3, 4}, x.to_vector<double>());
  expect_values(tril(x, 5), {3, 4}, x.to_vector<double>());
  expect_values(triu(x, -5), {3, 4}, x.to_vector<double>());
  // Batch dims pass: each [2, 2] matrix masked alike.
  const Tensor batch = iota_of({2, 2, 2});
  expect_values(triu(batch), {2, 2, 2}, {0, 1, 0, 3, 4, 5, 0, 7});
  EXPECT_EQ(tril(gt(x, Scalar(0.0))).to(DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0}));
}

TEST(ShapeCopyOps, RepeatTilesWithLeadingNewDims) {
  const Tensor y = iota_of({2, 3});
  expect_values(repeat(y, {2, 1, 2}), {2, 2, 6},
                {0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  expect_values(repeat(y, {1, 1}), {2, 3}, y.to_vector<double>());
  expect_values(repeat(y, {2, 1}), {4, 3}, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  EXPECT_EQ(repeat(y, {0, 2}).shape(), (Shape{0, 6}));
  expect_values(repeat(full({}, 7.0), {3}), {3}, {7, 7, 7});
}

TEST(ShapeCopyOps, TilePadsRepsWithLeadingOnes) {
  const Tensor y = iota_of({2, 3});
  expect_values(tile(y, {2}), {2, 6}, {0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  expect_values(tile(y, {2, 1}), {4, 3}, repeat(y, {2, 1}).to_vector<double>());
  EXPECT_EQ(tile(y, {2, 1, 1}).shape(), (Shape{2, 2, 3}));
  expect_values(tile(y, {}), {2, 3}, y.to_vector<double>());
}

TEST(ShapeCopyOps, PadInEveryMode) {
  const Tensor v = iota_of({4});
  expect_values(pad(v, {2, 3}), {9}, {0, 0, 0, 1, 2, 3, 0, 0, 0});
  expect_values(pad(v, {2, 3}, PadMode::constant, -1.5), {9}, {-1.5, -1.5, 0, 1, 2, 3, -1.5, -1.5, -1.5});
  expect_values(pad(v, {2, 3}, PadMode::reflect), {9}, {2, 1, 0, 1, 2, 3, 2, 1, 0});
  expect_values(pad(v, {2, 3}, PadMode::replicate), {9}, {0, 0, 0, 1, 2, 3, 3, 3, 3});
  expect_values(pad(v, {2, 3}, PadMode::circular), {9}, {2, 3, 0, 1, 2, 3, 0, 1, 2});
  expect_values(pad(v, {4, 4}, PadMode::circular), {12}, {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  // Negative constant pads crop.
  expect_values(pad(v, {-1, -2}), {1}, {1});
  expect_values(pad(v, {-1, 2}, PadMode::constant, 9), {5}, {1, 2, 3, 9, 9});
  // Pairs run from the last dim backwards; leading dims without a pair stay.
  const Tensor x = iota_of({2, 3});
  expect_values(pad(x, {1, 0}), {2, 4}, {0, 0, 1, 2, 0, 3, 4, 5});
  expect_values(pad(x, {0, 0, 1, 0}), {3, 3}, {0, 0, 0, 0, 1, 2, 3, 4, 5});
  expect_values(pad(x, {1, 1, 1, 0}, PadMode::replicate), {3, 5},
                {0, 0, 1, 2, 2, 0, 0, 1, 2, 2, 3, 3, 4, 5, 5});
  expect_values(pad(x, {1, 1}, PadMode::reflect), {2, 5}, {1, 0, 1, 2, 1, 4, 3, 4, 5, 4});
  EXPECT_EQ(pad(iota_of({3}, DType::i64), {1, 1}, PadMode::constant, 7).to_vector<int64_t>(),
            (std::vector<int64_t>{7, 0, 1, 2, 7}));
}

TEST(ShapeCopyOps, ShapeFunctionsArePure) {
  EXPECT_EQ(flip_dims({-1, 0}, {2, 3, 4}), (DimVector{0, 2}));
  EXPECT_EQ(roll_shifts({1, -1}, {0, -1}, {5, 3}), (DimVector{1, 2}));
  EXPECT_EQ(roll_shifts({-13}, {}, {5, 3}), (DimVector{2}));
  EXPECT_EQ(repeat_shape({2, 3}, {2, 1, 2}), (Shape{2, 2, 6}));
  EXPECT_EQ(tile_repeats({2, 3, 4}, {5}), (std::vector<int64_t>{1, 1, 5}));
  const PadSpec spec = pad_spec({2, 3, 4}, {1, 2, -1, 0}, PadMode::constant);
  EXPECT_EQ(spec.before, (DimVector{0, -1, 1}));
  EXPECT_EQ(spec.after, (DimVector{0, 0, 2}));
  EXPECT_EQ(spec.shape, (Shape{2, 2, 7}));
  EXPECT_STREQ(to_string(PadMode::circular), "circular");
}

TEST(ShapeCopyOps, FlipErrors) {
  const Tensor x = iota_of({3, 4});
  EXPECT_TRUE(throws_with<ValueError>([&] { flip(x, {2}); }, {"[flip]", "dim 2 out of range", "[3, 4]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { flip(x, {0, -2}); }, {"[flip]", "dim 0 appears more than once", "[0, -2]", "[3, 4]"}));
  EXPECT_TRUE(throws_with<ValueError>([] { flip(Tensor(), {0}); }, {"[flip]", "undefined"}));
}

TEST(ShapeCopyOps, RollErrors) {
  const Tensor x = iota_of({3, 4});
  EXPECT_TRUE(throws_with<ValueError>([&] { roll(x, {1, 2}, {0}); }, {"[roll]", "shifts [1, 2] and dims [0] differ in length", "[3, 4]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { roll(x, {1, 2}); }, {"[roll]", "shifts [1, 2] must hold one shift", "[3, 4]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { roll(x, {1}, {-3}); }, {"[roll]", "dim -3 out of range", "[3, 4]"}));
}

TEST(ShapeCopyOps, TrilTriuErrors) {
  EXPECT_TRUE(throws_with<ValueError>([] { tril(iota_of({4})); }, {"[tril]", "at least 2 dims", "[4]"}));
  EXPECT_TRUE(throws_with<ValueError>([] { triu(full({}, 1.0), 1); }, {"[triu]", "at least 2 dims", "[]"}));
}

TEST(ShapeCopyOps, RepeatAndTileErrors) {
  const Tensor x = iota_of({2, 3});
  EXPECT_TRUE(throws_with<ValueError>([&] { repeat(x, {2}); }, {"[repeat]", "repeats [2] has fewer entries than the 2 dims", "[2, 3]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { repeat(x, {1, -1}); }, {"[repeat]", "negative repeat -1", "[2, 3]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { tile(x, {-2}); }, {"[tile]", "negative repeat -2", "[2, 3]"}));
}

TEST(ShapeCopyOps, PadErrors) {
  const Tensor x = iota_of({2, 3});
  EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {1, 2, 3}); }, {"[pad]", "pads [1, 2, 3] have an odd count 3", "[2, 3]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {1, 1, 1, 1, 1, 1}); }, {"[pad]", "pad 3 dims but shape [2, 3] has 2"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {-2, -2}); }, {"[pad]", "leave dim 1 of shape [2, 3] with the negative size -1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {-1, 0}, PadMode::reflect); }, {"[pad]", "negative pads [-1, 0]", "reflect mode", "only constant mode crops"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {0, 3}, PadMode::reflect); }, {"[pad]", "reflect pads (0, 3) of dim 1 of shape [2, 3] must be smaller than its size 3"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {4, 0}, PadMode::circular); }, {"[pad]", "circular pads (4, 0) of dim 1", "more than once", "at most its size 3"}));
  EXPECT_TRUE(throws_with<ValueError>([] { pad(zeros({2, 0}), {1, 0}, PadMode::replicate); }, {"[pad]", "replicate pads (1, 0) of the zero-size dim 1", "[2, 0]"}));
}
