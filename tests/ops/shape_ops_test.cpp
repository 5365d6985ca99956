// Free-function views, cat, stack, chunk and split, checked against hand-computed values.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <tessera/core/tensor.hpp>
#include <tessera/ops/ops.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// [0, 1, ..., numel-1] in shape, as f64.
Tensor iota_tensor(const Shape& shape, DType dtype = DType::f64) {
  return arange(shape.numel()).reshape(shape).to(dtype);
}

std::vector<int64_t> sizes_along(const std::vector<Tensor>& pieces, int64_t dim) {
  std::vector<int64_t> sizes;
  for (const Tensor& p : pieces) sizes.push_back(p.shape()[dim]);
  return sizes;
}

// Every piece is a view of base's storage.
void expect_views_of(const std::vector<Tensor>& pieces, const Tensor& base) {
  for (const Tensor& p : pieces) EXPECT_EQ(p.storage(), base.storage());
}

}  // namespace

// --- free-function views ---------------------------------------------------------------------------

TEST(ShapeOps, FreeFunctionsMatchMethods) {
  const Tensor x = iota_tensor({2, 3, 4});
  const auto same = [&](const Tensor& free_form, const Tensor& method_form) {
    EXPECT_TRUE(free_form.is_same(method_form)) << free_form.shape().to_string();
  };
  same(reshape(x, {6, 4}), x.reshape({6, 4}));
  same(view(x, {4, -1}), x.view({4, -1}));
  same(transpose(x, 0, 2), x.transpose(0, 2));
  same(permute(x, {2, 0, 1}), x.permute({2, 0, 1}));
  same(narrow(x, 1, 1, 2), x.narrow(1, 1, 2));
  same(select(x, -1, 3), x.select(-1, 3));
  same(unsqueeze(x, 1), x.unsqueeze(1));
  same(squeeze(unsqueeze(x, 0)), x.unsqueeze(0).squeeze());
  same(squeeze(unsqueeze(x, 2), 2), x.unsqueeze(2).squeeze(2));
  same(flatten(x), x.flatten());
  same(flatten(x, 1), x.flatten(1, -1));
  same(flatten(x, 0, 1), x.flatten(0, 1));
  same(expand(x.narrow(0, 0, 1), {5, 3, 4}), x.narrow(0, 0, 1).expand({5, 3, 4}));
  same(broadcast_to(x.narrow(0, 0, 1), {5, 3, 4}), x.narrow(0, 0, 1).expand({5, 3, 4}));
  same(contiguous(x), x);
  EXPECT_TRUE(equal(contiguous(transpose(x, 0, 1)), x.transpose(0, 1).contiguous()));
}

TEST(ShapeOps, FreeViewsShareStorage) {
  Tensor x = iota_tensor({2, 3});
  Tensor t = transpose(x, 0, 1);
  EXPECT_EQ(t.storage(), x.storage());
  t.select(0, 2).fill_(-1);  // column 2 of x
  EXPECT_EQ(values(x), (std::vector<double>{0, 1, -1, 3, 4, -1}));
  Tensor n = narrow(view(x, {6}), 0, 1, 2);
  n.fill_(9);
  EXPECT_EQ(values(x), (std::vector<double>{0, 9, 9, 3, 4, -1}));
  EXPECT_EQ(values(select(x, 1, 0)), (std::vector<double>{0, 3}));
}

// --- cat -------------------------------------------------------------------------------------------

TEST(Cat, Dim0) {
  const Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2});
  const Tensor b = from_vector<double>({5, 6}, {1, 2});
  const Tensor out = cat({a, b});
  EXPECT_EQ(out.shape(), Shape({3, 2}));
  EXPECT_EQ(values(out), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(equal(cat({a, b}, -2), out));
}

TEST(Cat, Dim1AndNegative) {
  const Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2});
  const Tensor b = from_vector<double>({5, 6, 7, 8, 9, 10}, {2, 3});
  const Tensor out = cat({a, b}, 1);
  EXPECT_EQ(out.shape(), Shape({2, 5}));
  EXPECT_EQ(values(out), (std::vector<double>{1, 2, 5, 6, 7, 3, 4, 8, 9, 10}));
  EXPECT_TRUE(equal(cat({a, b}, -1), out));
}

TEST(Cat, MiddleDimOf3d) {
  const Tensor a = iota_tensor({2, 1, 2}), b = iota_tensor({2, 2, 2}).to(DType::f64);
  const Tensor out = cat({a, b, a}, 1);
  EXPECT_EQ(out.shape(), Shape({2, 4, 2}));
  // a = [[[0, 1]], [[2, 3]]], b = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
  EXPECT_EQ(values(out), (std::vector<double>{0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 2, 3}));
  EXPECT_TRUE(equal(cat({a, b, a}, -2), out));
}

TEST(Cat, SingleTensorIsACopy) {
  Tensor a = iota_tensor({2, 3});
  Tensor out = cat({a});
  EXPECT_TRUE(equal(out, a));
  EXPECT_NE(out.storage(), a.storage());
  out.fill_(0);
  EXPECT_EQ(values(a), (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

TEST(Cat, DTypesPromote) {
  const Tensor i = from_vector<int32_t>({1, 2});
  const Tensor f = from_vector<float>({0.5f});
  const Tensor out = cat({i, f});
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_EQ(values(out), (std::vector<double>{1, 2, 0.5}));
  EXPECT_EQ(cat({from_vector<uint8_t>({200}), from_vector<int64_t>({-1})}).dtype(), DType::i64);
  EXPECT_EQ(values(cat({from_vector<uint8_t>({200}), from_vector<int64_t>({-1})})), (std::vector<double>{200, -1}));
  EXPECT_EQ(cat({from_vector<bool>({true}), from_vector<int32_t>({7})}).dtype(), DType::i32);
  EXPECT_EQ(cat({ones({1}, DType::f16), ones({1}, DType::bf16)}).dtype(), DType::f32);
  EXPECT_EQ(cat({ones({1}, DType::f32), ones({1}, DType::f64), ones({1}, DType::i64)}).dtype(), DType::f64);
  // Promotion considers every tensor, not just neighbours.
  EXPECT_EQ(cat({ones({1}, DType::u8), ones({1}, DType::u8), ones({1}, DType::f16)}).dtype(), DType::f16);
}

TEST(Cat, ZeroSizePieces) {
  const Tensor a = iota_tensor({2, 0}), b = iota_tensor({2, 3}), c = iota_tensor({2, 0});
  const Tensor out = cat({a, b, c}, 1);
  EXPECT_TRUE(equal(out, b));
  EXPECT_EQ(cat({a, c}, 1).shape(), Shape({2, 0}));
  EXPECT_EQ(cat({iota_tensor({0, 3}), iota_tensor({0, 3})}).shape(), Shape({0, 3}));
  EXPECT_TRUE(equal(cat({iota_tensor({0, 3}), b}), b));
  // Zero-size along another dim: shapes must still agree there.
  EXPECT_EQ(cat({iota_tensor({0, 2}), iota_tensor({0, 3})}, 1).shape(), Shape({0, 5}));
}

TEST(Cat, NonContiguousInputs) {
  const Tensor base = iota_tensor({3, 4});
  const Tensor t = base.t();                        // [4, 3]
  const Tensor n = base.narrow(1, 1, 2).t();        // [2, 3]: rows 1..2 of t
  const Tensor e = from_vector<double>({-1, -2, -3}).unsqueeze(0).expand({2, 3});
  const Tensor out = cat({t, n, e});
  EXPECT_EQ(out.shape(), Shape({8, 3}));
  EXPECT_EQ(values(out), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11,  // t
                                              1, 5, 9, 2, 6, 10,                     // n
                                              -1, -2, -3, -1, -2, -3}));             // e
  EXPECT_TRUE(out.is_contiguous());
  const Tensor along1 = cat({base.t(), base.t().narrow(1, 0, 1)}, 1);
  EXPECT_EQ(values(along1), (std::vector<double>{0, 4, 8, 0, 1, 5, 9, 1, 2, 6, 10, 2, 3, 7, 11, 3}));
}

TEST(Cat, ErrorEmptyList) {
  const std::string msg = value_error_message([] { cat(std::vector<Tensor>{}); });
  EXPECT_TRUE(starts_with(msg, "[cat] expects at least one tensor")) << msg;
}

TEST(Cat, ErrorShapesDiffer) {
  const std::string msg = value_error_message([] { cat({zeros({2, 3}), zeros({3, 4})}, 0); });
  EXPECT_TRUE(starts_with(msg, "[cat] shapes [2, 3], [3, 4] differ outside dim 0")) << msg;
  const std::string ndim = value_error_message([] { cat({zeros({2, 3}), zeros({2, 3, 1})}, 1); });
  EXPECT_TRUE(starts_with(ndim, "[cat] shapes [2, 3], [2, 3, 1] differ outside dim 1")) << ndim;
}

TEST(Cat, ErrorZeroDim) {
  const std::string msg = value_error_message([] { cat({scalar_tensor(1.0, DType::f32), scalar_tensor(2.0, DType::f32)}); });
  EXPECT_TRUE(starts_with(msg, "[cat] cannot join 0-d")) << msg;
  const std::string mixed = value_error_message([] { cat({zeros({2}), scalar_tensor(2.0, DType::f32)}); });
  EXPECT_TRUE(starts_with(mixed, "[cat] cannot join 0-d") && contains(mixed, "[2], []")) << mixed;
  const std::string undefined = value_error_message([] { cat({zeros({2}), Tensor()}); });
  EXPECT_TRUE(starts_with(undefined, "[cat] ") && contains(undefined, "undefined")) << undefined;
}

TEST(Cat, ErrorDimOutOfRange) {
  for (int64_t dim : {2, -3}) {
    const std::string msg = value_error_message([&] { cat({zeros({2, 3}), zeros({2, 3})}, dim); });
    EXPECT_TRUE(starts_with(msg, "[cat] dim " + std::to_string(dim) + " out of range for shape [2, 3]")) << msg;
  }
}

// --- stack -----------------------------------------------------------------------------------------

TEST(Stack, NewDimAt0) {
  const Tensor a = from_vector<double>({1, 2, 3}), b = from_vector<double>({4, 5, 6});
  const Tensor out = stack({a, b});
  EXPECT_EQ(out.shape(), Shape({2, 3}));
  EXPECT_EQ(values(out), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(equal(stack({a, b}, -2), out));
}

TEST(Stack, NewDimAtEnd) {
  const Tensor a = from_vector<double>({1, 2, 3}), b = from_vector<double>({4, 5, 6});
  const Tensor out = stack({a, b}, 1);
  EXPECT_EQ(out.shape(), Shape({3, 2}));
  EXPECT_EQ(values(out), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(equal(stack({a, b}, -1), out));
}

TEST(Stack, NewDimInTheMiddle) {
  const Tensor a = iota_tensor({2, 2}), b = iota_tensor({2, 2}).narrow(0, 0, 2).t();  // b = [[0, 2], [1, 3]]
  const Tensor out = stack({a, b, a}, 1);
  EXPECT_EQ(out.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(values(out), (std::vector<double>{0, 1, 0, 2, 0, 1, 2, 3, 1, 3, 2, 3}));
  EXPECT_TRUE(equal(stack({a, b, a}, -2), out));
  EXPECT_EQ(stack({a, b, a}, 2).shape(), Shape({2, 2, 3}));
  EXPECT_EQ(stack({a, b, a}, -1).shape(), Shape({2, 2, 3}));
  EXPECT_EQ(stack({a, b, a}, -3).shape(), Shape({3, 2, 2}));
}

TEST(Stack, ZeroDimTensorsAndPromotion) {
  const Tensor out = stack({scalar_tensor(1, DType::i32), scalar_tensor(2.5, DType::f64), scalar_tensor(3, DType::u8)});
  EXPECT_EQ(out.shape(), Shape({3}));
  EXPECT_EQ(out.dtype(), DType::f64);
  EXPECT_EQ(values(out), (std::vector<double>{1, 2.5, 3}));
  EXPECT_EQ(stack({zeros({0, 2}), zeros({0, 2})}, 1).shape(), Shape({0, 2, 2}));
  EXPECT_EQ(stack({zeros({3})}).shape(), Shape({1, 3}));
}

TEST(Stack, ErrorUnequalShapes) {
  const std::string msg = value_error_message([] { stack({zeros({2, 3}), zeros({3, 2})}); });
  EXPECT_TRUE(starts_with(msg, "[stack] expects tensors of equal shape, got [2, 3], [3, 2]")) << msg;
  const std::string ndim = value_error_message([] { stack({zeros({3}), zeros({1, 3})}); });
  EXPECT_TRUE(starts_with(ndim, "[stack] ") && contains(ndim, "[3], [1, 3]")) << ndim;
}

TEST(Stack, ErrorEmptyListAndDim) {
  const std::string empty = value_error_message([] { stack(std::vector<Tensor>{}); });
  EXPECT_TRUE(starts_with(empty, "[stack] expects at least one tensor")) << empty;
  for (int64_t dim : {3, -4}) {
    const std::string msg = value_error_message([&] { stack({zeros({2, 3}), zeros({2, 3})}, dim); });
    EXPECT_TRUE(starts_with(msg, "[stack] dim " + std::to_string(dim) + " out of range")) << msg;
  }
}

// --- chunk -----------------------------------------------------------------------------------------

TEST(Chunk, SizesFollowTorchChunk) {
  struct Case {
    int64_t size, chunks;
    std::vector<int64_t> sizes;
  };
  const Case cases[] = {{5, 4, {2, 2, 1}}, {6, 4, {2, 2, 2}}, {8, 4, {2, 2, 2, 2}}, {3, 5, {1, 1, 1}},
                        {7, 1, {7}},       {7, 7, {1, 1, 1, 1, 1, 1, 1}},          {10, 3, {4, 4, 2}},
                        {1, 3, {1}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.size) + " by " + std::to_string(c.chunks));
    const Tensor x = iota_tensor({c.size});
    const std::vector<Tensor> pieces = chunk(x, c.chunks);
    EXPECT_EQ(sizes_along(pieces, 0), c.sizes);
    expect_views_of(pieces, x);
    EXPECT_TRUE(equal(cat(pieces), x));
  }
}

TEST(Chunk, AlongOtherDims) {
  const Tensor x = iota_tensor({2, 5, 3});
  const std::vector<Tensor> pieces = chunk(x, 2, 1);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].shape(), Shape({2, 3, 3}));
  EXPECT_EQ(pieces[1].shape(), Shape({2, 2, 3}));
  EXPECT_TRUE(equal(pieces[1], x.narrow(1, 3, 2)));
  const std::vector<Tensor> last = chunk(x, 3, -1);
  EXPECT_EQ(sizes_along(last, 2), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(values(last[2]), values(x.select(2, 2)));
}

TEST(Chunk, EmptyDimGivesChunksEmptyPieces) {
  // torch.chunk(torch.empty(0, 2), 3) gives three [0, 2] pieces.
  const Tensor x = zeros({0, 2});
  const std::vector<Tensor> pieces = chunk(x, 3);
  ASSERT_EQ(pieces.size(), 3u);
  for (const Tensor& p : pieces) EXPECT_EQ(p.shape(), Shape({0, 2}));
  expect_views_of(pieces, x);
  EXPECT_EQ(chunk(zeros({2, 0}), 2, 1).size(), 2u);
}

TEST(Chunk, WritesThroughAChunkChangeTheBase) {
  Tensor x = iota_tensor({5, 2});
  std::vector<Tensor> pieces = chunk(x, 4);  // rows [0, 1], [2, 3], [4]
  ASSERT_EQ(pieces.size(), 3u);
  pieces[1].fill_(-1);
  pieces[2].select(1, 0).fill_(100);
  EXPECT_EQ(values(x), (std::vector<double>{0, 1, 2, 3, -1, -1, -1, -1, 100, 9}));
  std::vector<Tensor> cols = chunk(x, 2, 1);
  cols[1].fill_(7);
  EXPECT_EQ(values(x.select(1, 1)), (std::vector<double>{7, 7, 7, 7, 7}));
}

TEST(Chunk, ErrorChunksNotPositive) {
  for (int64_t chunks : {0, -2}) {
    const std::string msg = value_error_message([&] { chunk(zeros({4}), chunks); });
    EXPECT_TRUE(starts_with(msg, "[chunk] chunks " + std::to_string(chunks) + " must be at least 1")) << msg;
  }
}

TEST(Chunk, ErrorDimOutOfRangeAnd0d) {
  const std::string msg = value_error_message([] { chunk(zeros({2, 3}), 2, 2); });
  EXPECT_TRUE(starts_with(msg, "[chunk] dim 2 out of range for shape [2, 3]")) << msg;
  const std::string zero_d = value_error_message([] { chunk(scalar_tensor(1.0, DType::f32), 2); });
  EXPECT_TRUE(starts_with(zero_d, "[chunk] ") && contains(zero_d, "at least 1 dim")) << zero_d;
}

// --- split -----------------------------------------------------------------------------------------

TEST(Split, BySize) {
  const Tensor x = iota_tensor({5, 2});
  const std::vector<Tensor> pieces = split(x, 2);
  EXPECT_EQ(sizes_along(pieces, 0), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(values(pieces[2]), (std::vector<double>{8, 9}));
  expect_views_of(pieces, x);
  EXPECT_EQ(sizes_along(split(x, 5), 0), (std::vector<int64_t>{5}));
  EXPECT_EQ(sizes_along(split(x, 9), 0), (std::vector<int64_t>{5}));
  EXPECT_EQ(sizes_along(split(x, 1, 1), 1), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(sizes_along(split(x, 1, -1), 1), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(values(split(x, 1, -1)[1]), (std::vector<double>{1, 3, 5, 7, 9}));
  // An empty dim gives one empty piece, as torch.split.
  EXPECT_EQ(split(zeros({0, 3}), 2).size(), 1u);
}

TEST(Split, ByList) {
  const Tensor x = iota_tensor({2, 6});
  const std::vector<Tensor> pieces = split(x, std::vector<int64_t>{1, 3, 0, 2}, 1);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(sizes_along(pieces, 1), (std::vector<int64_t>{1, 3, 0, 2}));
  EXPECT_EQ(values(pieces[0]), (std::vector<double>{0, 6}));
  EXPECT_EQ(values(pieces[1]), (std::vector<double>{1, 2, 3, 7, 8, 9}));
  EXPECT_EQ(pieces[2].shape(), Shape({2, 0}));
  EXPECT_EQ(values(pieces[3]), (std::vector<double>{4, 5, 10, 11}));
  expect_views_of(pieces, x);
  EXPECT_EQ(sizes_along(split(x, std::vector<int64_t>{2}, -2), 0), (std::vector<int64_t>{2}));
}

TEST(Split, WritesThroughAPieceChangeTheBase) {
  Tensor x = iota_tensor({6});
  std::vector<Tensor> pieces = split(x, std::vector<int64_t>{2, 4});
  pieces[1].narrow(0, 1, 2).fill_(-5);
  EXPECT_EQ(values(x), (std::vector<double>{0, 1, 2, -5, -5, 5}));
  split(x, 4)[1].fill_(8);
  EXPECT_EQ(values(x), (std::vector<double>{0, 1, 2, -5, 8, 8}));
}

TEST(Split, NonContiguousInput) {
  const Tensor x = iota_tensor({3, 4}).t();  // [4, 3]
  const std::vector<Tensor> pieces = split(x, 3);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(values(pieces[0]), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10}));
  EXPECT_EQ(values(pieces[1]), (std::vector<double>{3, 7, 11}));
}

TEST(Split, ErrorSizesDoNotAddUp) {
  const std::string msg = value_error_message([] { split(zeros({5, 2}), std::vector<int64_t>{1, 2}); });
  EXPECT_TRUE(starts_with(msg, "[split] sizes [1, 2] add up to 3 but dim 0 of shape [5, 2] has 5")) << msg;
  const std::string over = value_error_message([] { split(zeros({5, 2}), std::vector<int64_t>{2, 1}, 1); });
  EXPECT_TRUE(starts_with(over, "[split] sizes [2, 1] add up to 3 but dim 1 of shape [5, 2] has 2")) << over;
  const std::string negative = value_error_message([] { split(zeros({5}), std::vector<int64_t>{6, -1}); });
  EXPECT_TRUE(starts_with(negative, "[split] negative size -1")) << negative;
}

TEST(Split, ErrorSplitSizeNotPositive) {
  const std::string msg = value_error_message([] { split(zeros({5}), 0); });
  EXPECT_TRUE(starts_with(msg, "[split] split_size 0 must be positive for shape [5]")) << msg;
  const std::string negative = value_error_message([] { split(zeros({5}), -1); });
  EXPECT_TRUE(starts_with(negative, "[split] split_size -1")) << negative;
}

TEST(Split, ErrorDimOutOfRangeAnd0d) {
  const std::string msg = value_error_message([] { split(zeros({2, 3}), 1, -3); });
  EXPECT_TRUE(starts_with(msg, "[split] dim -3 out of range for shape [2, 3]")) << msg;
  const std::string list = value_error_message([] { split(zeros({2, 3}), std::vector<int64_t>{2}, 2); });
  EXPECT_TRUE(starts_with(list, "[split] dim 2 out of range for shape [2, 3]")) << list;
  const std::string zero_d = value_error_message([] { split(scalar_tensor(1.0, DType::f32), 1); });
  EXPECT_TRUE(starts_with(zero_d, "[split] ") && contains(zero_d, "at least 1 dim")) << zero_d;
}
