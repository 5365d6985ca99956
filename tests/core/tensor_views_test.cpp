// Tensor views: each one shares storage (never copies), has the hand-computed shape, strides and
// offset, and writes through it reach the base tensor.
#include <gtest/gtest.h>

#include <vector>

#include <tessera/core/tensor.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// x viewed as a 2x3x4 i64 tensor holding 0..23.
Tensor cube() { return arange(24).view({2, 3, 4}); }

// Asserts v is a view of base: same storage object, no new allocation.
::testing::AssertionResult is_view_of(const Tensor& v, const Tensor& base) {
  if (v.storage() != base.storage()) return ::testing::AssertionFailure() << "different storage";
  return ::testing::AssertionSuccess();
}

void expect_layout(const Tensor& t, const Shape& shape, const Strides& strides, int64_t offset) {
  EXPECT_EQ(t.shape(), shape) << t.shape().to_string();
  EXPECT_EQ(t.strides(), strides) << t.strides().to_string();
  EXPECT_EQ(t.offset(), offset);
}

}  // namespace

// --- view -------------------------------------------------------------------------------------

TEST(TensorView, ContiguousViewSharesStorage) {
  const Tensor base = arange(6);
  const Tensor v = base.view({2, 3});
  EXPECT_TRUE(is_view_of(v, base));
  EXPECT_EQ(v.raw_data(), base.raw_data());
  expect_layout(v, {2, 3}, {3, 1}, 0);
  EXPECT_EQ(v.dtype(), DType::i64);
  EXPECT_EQ(walk(v), iota(6));
  EXPECT_EQ(at<int64_t>(v, {1, 2}), 5);
}

TEST(TensorView, InferredDim) {
  const Tensor base = arange(24);
  expect_layout(base.view({-1, 4}), {6, 4}, {4, 1}, 0);
  expect_layout(base.view({2, -1, 3}), {2, 4, 3}, {12, 3, 1}, 0);
  expect_layout(base.view({-1}), {24}, {1}, 0);
  expect_layout(base.view({1, -1, 1}), {1, 24, 1}, {24, 1, 1}, 0);
  expect_layout(arange(1).view({}), {}, {}, 0);
  expect_layout(zeros({0, 3}).view({-1, 3}), {0, 3}, {3, 1}, 0);
  expect_layout(zeros({0, 3}).view({3, 0, 2}), {3, 0, 2}, {2, 2, 1}, 0);
}

TEST(TensorView, WritesReachBase) {
  Tensor base = arange(6);
  Tensor v = base.view({3, 2});
  v.data<int64_t>()[3] = 100;  // element (1, 1)
  EXPECT_EQ(base.data<int64_t>()[3], 100);
  v.select(0, 2).fill_(-1);
  EXPECT_EQ(walk(base), (std::vector<double>{0, 1, 2, 100, -1, -1}));
}

TEST(TensorView, ViewOfViewWithOffset) {
  const Tensor base = arange(12).view({3, 4});
  const Tensor rows = base.narrow(0, 1, 2);  // rows 1..2: contiguous block at offset 4
  EXPECT_TRUE(rows.is_contiguous());
  const Tensor flat = rows.view({8});
  EXPECT_TRUE(is_view_of(flat, base));
  expect_layout(flat, {8}, {1}, 4);
  EXPECT_EQ(walk(flat), iota(8, 4));
}

TEST(TensorView, TransposedViewableCases) {
  // [3, 2] with strides [1, 3]: adding or removing size-1 dims is expressible.
  const Tensor t = arange(6).view({2, 3}).t();
  expect_layout(t.view({3, 2, 1}), {3, 2, 1}, {1, 3, 3}, 0);
  expect_layout(t.view({1, 3, 2}), {1, 3, 2}, {3, 1, 3}, 0);
  EXPECT_EQ(walk(t.view({3, 2, 1})), (std::vector<double>{0, 3, 1, 4, 2, 5}));

  // [3, 2, 4] with strides [4, 12, 1]: splitting the contiguous last dim works.
  const Tensor p = cube().transpose(0, 1);
  expect_layout(p, {3, 2, 4}, {4, 12, 1}, 0);
  const Tensor split = p.view({3, 2, 2, 2});
  EXPECT_TRUE(is_view_of(split, p));
  expect_layout(split, {3, 2, 2, 2}, {4, 12, 2, 1}, 0);
  EXPECT_EQ(walk(split), walk(p));

  // Column slice [3, 2] with strides [4, 1]: the row dim may be split.
  const Tensor cols = arange(24).view({6, 4}).narrow(1, 1, 2);
  expect_layout(cols.view({2, 3, 2}), {2, 3, 2}, {12, 4, 1}, 1);
}

TEST(TensorView, TransposedNotViewableThrows) {
  const Tensor t = arange(6).view({2, 3}).t();
  EXPECT_TRUE(value_error([&] { (void)t.view({6}); },
                          {"[view]", "cannot view shape [3, 2] with strides [1, 3] as [6] without a copy", "reshape"}));
  const Tensor p = cube().transpose(0, 1);
  EXPECT_TRUE(value_error([&] { (void)p.view({3, 8}); }, {"[view]", "[3, 2, 4]", "[4, 12, 1]", "[3, 8]"}));
  const Tensor cols = arange(12).view({3, 4}).narrow(1, 0, 2);
  EXPECT_TRUE(value_error([&] { (void)cols.view({6}); }, {"[view]", "[3, 2]", "[4, 1]"}));
  // Expanded tensors cannot merge a broadcast dim with a real one.
  const Tensor e = arange(3).view({1, 3}).expand({2, 3});
  EXPECT_TRUE(value_error([&] { (void)e.view({6}); }, {"[view]", "[2, 3]", "[0, 1]"}));
}

TEST(TensorView, BadShapesThrow) {
  const Tensor x = arange(6).view({2, 3});
  EXPECT_TRUE(value_error([&] { (void)x.view({4}); },
                          {"[view]", "shape [4] is invalid for input of shape [2, 3] (6 elements)"}));
  EXPECT_TRUE(value_error([&] { (void)x.view({-1, -1}); }, {"[view]", "only one dim can be -1 in [-1, -1]"}));
  EXPECT_TRUE(value_error([&] { (void)x.view({-1, 4}); }, {"[view]", "[-1, 4]", "[2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)x.view({-2, -3}); }, {"[view]", "invalid size -2 in [-2, -3]"}));
  EXPECT_TRUE(value_error([&] { (void)zeros({0, 3}).view({-1, 0}); }, {"[view]", "[-1, 0]", "[0, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)x.view({}); }, {"[view]", "shape [] is invalid", "[2, 3]"}));
}

// --- reshape ----------------------------------------------------------------------------------

TEST(TensorReshape, ViewWhenPossible) {
  const Tensor base = arange(12);
  const Tensor r = base.reshape({3, -1});
  EXPECT_TRUE(is_view_of(r, base));
  expect_layout(r, {3, 4}, {4, 1}, 0);
  EXPECT_EQ(r.raw_data(), base.raw_data());
}

TEST(TensorReshape, CopyWhenNotViewable) {
  Tensor base = arange(6).view({2, 3});
  const Tensor t = base.t();
  Tensor r = t.reshape({6});
  EXPECT_NE(r.storage(), base.storage());
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(walk(r), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  r.fill_(7);  // the copy is independent
  EXPECT_EQ(walk(base), iota(6));
}

TEST(TensorReshape, SameStorageForViewAndViewableReshapeOfTransposed) {
  const Tensor p = cube().transpose(0, 1);
  const Tensor r = p.reshape({3, 2, 2, 2});
  EXPECT_EQ(r.storage(), p.storage());
  expect_layout(r, {3, 2, 2, 2}, {4, 12, 2, 1}, 0);
}

TEST(TensorReshape, ErrorsNameReshape) {
  EXPECT_TRUE(value_error([] { (void)arange(6).reshape({4, 2}); },
                          {"[reshape]", "shape [4, 2] is invalid for input of shape [6] (6 elements)"}));
  EXPECT_TRUE(value_error([] { (void)arange(6).reshape({-1, -1}); }, {"[reshape]", "only one dim can be -1"}));
}

// --- transpose / t / permute -----------------------------------------------------------------

TEST(TensorTranspose, SwapsShapeAndStrides) {
  const Tensor x = cube();
  const Tensor t = x.transpose(0, 2);
  EXPECT_TRUE(is_view_of(t, x));
  expect_layout(t, {4, 3, 2}, {1, 4, 12}, 0);
  EXPECT_FALSE(t.is_contiguous());
  // element (i, j, k) of t is element (k, j, i) of x = 12k + 4j + i
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(at<int64_t>(t, {i, j, k}), 12 * k + 4 * j + i);
  expect_layout(x.transpose(-1, -3), {4, 3, 2}, {1, 4, 12}, 0);
  expect_layout(x.transpose(1, 1), {2, 3, 4}, {12, 4, 1}, 0);
  expect_layout(scalar_tensor(1, DType::f32).transpose(0, -1), {}, {}, 0);
}

TEST(TensorTranspose, WritesReachBase) {
  Tensor x = zeros({2, 3}, DType::i32);
  Tensor t = x.transpose(0, 1);
  t.select(0, 2).fill_(5);  // column 2 of x
  EXPECT_EQ(walk(x), (std::vector<double>{0, 0, 5, 0, 0, 5}));
}

TEST(TensorTranspose, OutOfRangeThrows) {
  EXPECT_TRUE(value_error([] { (void)cube().transpose(0, 3); }, {"[transpose]", "dim 3", "[2, 3, 4]"}));
  EXPECT_TRUE(value_error([] { (void)cube().transpose(-4, 0); }, {"[transpose]", "dim -4", "[2, 3, 4]"}));
}

TEST(TensorT, TwoDimsOneDimZeroDims) {
  const Tensor m = arange(6).view({2, 3});
  expect_layout(m.t(), {3, 2}, {1, 3}, 0);
  EXPECT_TRUE(is_view_of(m.t(), m));
  const Tensor v = arange(4);
  EXPECT_TRUE(v.t().is_same(v));
  const Tensor s = scalar_tensor(2, DType::i64);
  EXPECT_TRUE(s.t().is_same(s));
  EXPECT_TRUE(value_error([] { (void)cube().t(); }, {"[t]", "expects a tensor with <= 2 dims, got shape [2, 3, 4]"}));
}

TEST(TensorPermute, ReordersDims) {
  const Tensor x = cube();
  const Tensor p = x.permute({2, 0, 1});
  EXPECT_TRUE(is_view_of(p, x));
  expect_layout(p, {4, 2, 3}, {1, 12, 4}, 0);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(at<int64_t>(p, {i, j, k}), 12 * j + 4 * k + i);
  expect_layout(x.permute({-1, 0, -2}), {4, 2, 3}, {1, 12, 4}, 0);
  expect_layout(x.permute({0, 1, 2}), {2, 3, 4}, {12, 4, 1}, 0);
  expect_layout(scalar_tensor(1, DType::f32).permute({}), {}, {}, 0);
  // permute then its inverse is the original layout
  expect_layout(p.permute({1, 2, 0}), {2, 3, 4}, {12, 4, 1}, 0);
}

TEST(TensorPermute, ErrorsThrow) {
  EXPECT_TRUE(value_error([] { (void)cube().permute({0, 1}); },
                          {"[permute]", "got 2 dims for shape [2, 3, 4]; expected 3"}));
  EXPECT_TRUE(value_error([] { (void)cube().permute({0, 1, 0}); },
                          {"[permute]", "dim 0 repeated in permutation of shape [2, 3, 4]"}));
  EXPECT_TRUE(value_error([] { (void)cube().permute({0, -3, 1}); }, {"[permute]", "dim 0 repeated"}));
  EXPECT_TRUE(value_error([] { (void)cube().permute({0, 1, 3}); }, {"[permute]", "dim 3 out of range", "[2, 3, 4]"}));
}

// --- narrow / select --------------------------------------------------------------------------

TEST(TensorNarrow, SlicesAlongDim) {
  const Tensor x = arange(12).view({3, 4});
  const Tensor n = x.narrow(1, 1, 2);
  EXPECT_TRUE(is_view_of(n, x));
  expect_layout(n, {3, 2}, {4, 1}, 1);
  EXPECT_EQ(walk(n), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  EXPECT_FALSE(n.is_contiguous());
  const Tensor rows = x.narrow(0, 2, 1);
  expect_layout(rows, {1, 4}, {4, 1}, 8);
  EXPECT_EQ(walk(rows), (std::vector<double>{8, 9, 10, 11}));
  expect_layout(x.narrow(-1, 0, 4), {3, 4}, {4, 1}, 0);
}

TEST(TensorNarrow, NegativeStartCountsFromEnd) {
  const Tensor x = arange(12).view({3, 4});
  const Tensor n = x.narrow(1, -2, 2);  // columns 2, 3
  expect_layout(n, {3, 2}, {4, 1}, 2);
  EXPECT_EQ(walk(n), (std::vector<double>{2, 3, 6, 7, 10, 11}));
  EXPECT_EQ(walk(x.narrow(0, -3, 1)), (std::vector<double>{0, 1, 2, 3}));
}

TEST(TensorNarrow, ZeroLength) {
  const Tensor x = arange(12).view({3, 4});
  const Tensor e = x.narrow(1, 4, 0);  // at the end: allowed
  EXPECT_EQ(e.shape(), (Shape{3, 0}));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(x.narrow(0, 1, 0).shape(), (Shape{0, 4}));
}

TEST(TensorNarrow, NarrowOfNarrowAndWrites) {
  Tensor x = zeros({10}, DType::f32);
  Tensor inner = x.narrow(0, 2, 6).narrow(0, 1, 3);  // elements 3..5
  EXPECT_EQ(inner.offset(), 3);
  inner.fill_(1.5);
  EXPECT_EQ(walk(x), (std::vector<double>{0, 0, 0, 1.5, 1.5, 1.5, 0, 0, 0, 0}));
}

TEST(TensorNarrow, OutOfBoundsThrows) {
  const Tensor x = arange(12).view({3, 4});
  EXPECT_TRUE(value_error([&] { (void)x.narrow(1, 3, 2); },
                          {"[narrow]", "range [3, 5) out of bounds for dim 1 of shape [3, 4]"}));
  EXPECT_TRUE(value_error([&] { (void)x.narrow(1, -5, 1); }, {"[narrow]", "out of bounds", "[3, 4]"}));
  EXPECT_TRUE(value_error([&] { (void)x.narrow(0, 0, -1); }, {"[narrow]", "out of bounds for dim 0", "[3, 4]"}));
  EXPECT_TRUE(value_error([&] { (void)x.narrow(2, 0, 1); }, {"[narrow]", "dim 2 out of range", "[3, 4]"}));
  EXPECT_TRUE(value_error([] { (void)scalar_tensor(1, DType::f32).narrow(0, 0, 1); },
                          {"[narrow]", "cannot narrow a 0-d tensor"}));
}

TEST(TensorSelect, RemovesDim) {
  const Tensor x = arange(12).view({3, 4});
  const Tensor row = x.select(0, 1);
  EXPECT_TRUE(is_view_of(row, x));
  expect_layout(row, {4}, {1}, 4);
  EXPECT_EQ(walk(row), (std::vector<double>{4, 5, 6, 7}));
  const Tensor col = x.select(1, -1);
  expect_layout(col, {3}, {4}, 3);
  EXPECT_EQ(walk(col), (std::vector<double>{3, 7, 11}));
  const Tensor s = x.select(0, -3).select(0, 2);
  expect_layout(s, {}, {}, 2);
  EXPECT_EQ(s.item<int64_t>(), 2);
  const Tensor c = cube().select(2, 3);  // (i, j, 3) = 12i + 4j + 3
  expect_layout(c, {2, 3}, {12, 4}, 3);
  EXPECT_EQ(walk(c), (std::vector<double>{3, 7, 11, 15, 19, 23}));
}

TEST(TensorSelect, WritesReachBase) {
  Tensor x = zeros({2, 3}, DType::i64);
  x.select(1, 1).fill_(9);
  EXPECT_EQ(walk(x), (std::vector<double>{0, 9, 0, 0, 9, 0}));
}

TEST(TensorSelect, OutOfRangeThrows) {
  const Tensor x = arange(12).view({3, 4});
  EXPECT_TRUE(value_error([&] { (void)x.select(0, 3); }, {"[select]", "index 3 out of range for dim 0 of shape [3, 4]"}));
  EXPECT_TRUE(value_error([&] { (void)x.select(1, -5); }, {"[select]", "index -5 out of range for dim 1 of shape [3, 4]"}));
  EXPECT_TRUE(value_error([&] { (void)x.select(2, 0); }, {"[select]", "dim 2 out of range", "[3, 4]"}));
  EXPECT_TRUE(value_error([] { (void)zeros({0}).select(0, 0); }, {"[select]", "index 0", "[0]"}));
  EXPECT_TRUE(value_error([] { (void)scalar_tensor(1, DType::f32).select(0, 0); },
                          {"[select]", "cannot select from a 0-d tensor"}));
}

// --- unsqueeze / squeeze / flatten ------------------------------------------------------------

TEST(TensorUnsqueeze, InsertsSizeOneDim) {
  const Tensor x = arange(6).view({2, 3});
  const Tensor a = x.unsqueeze(0);
  EXPECT_TRUE(is_view_of(a, x));
  expect_layout(a, {1, 2, 3}, {6, 3, 1}, 0);
  expect_layout(x.unsqueeze(1), {2, 1, 3}, {3, 3, 1}, 0);
  expect_layout(x.unsqueeze(2), {2, 3, 1}, {3, 1, 1}, 0);
  expect_layout(x.unsqueeze(-1), {2, 3, 1}, {3, 1, 1}, 0);
  expect_layout(x.unsqueeze(-3), {1, 2, 3}, {6, 3, 1}, 0);
  expect_layout(scalar_tensor(1, DType::f32).unsqueeze(0), {1}, {1}, 0);
  expect_layout(scalar_tensor(1, DType::f32).unsqueeze(-1), {1}, {1}, 0);
  EXPECT_TRUE(x.unsqueeze(1).is_contiguous());
  EXPECT_EQ(walk(x.unsqueeze(1)), iota(6));
}

TEST(TensorUnsqueeze, OutOfRangeThrows) {
  const Tensor x = arange(6).view({2, 3});
  EXPECT_TRUE(value_error([&] { (void)x.unsqueeze(3); }, {"[unsqueeze]", "dim 3 out of range", "[2, 3]", "[-3, 2]"}));
  EXPECT_TRUE(value_error([&] { (void)x.unsqueeze(-4); }, {"[unsqueeze]", "dim -4", "[2, 3]"}));
}

TEST(TensorSqueeze, AllSizeOneDims) {
  const Tensor x = arange(6).view({1, 3, 1, 2});
  const Tensor s = x.squeeze();
  EXPECT_TRUE(is_view_of(s, x));
  expect_layout(s, {3, 2}, {2, 1}, 0);
  expect_layout(arange(1).view({1, 1}).squeeze(), {}, {}, 0);
  expect_layout(arange(6).view({2, 3}).squeeze(), {2, 3}, {3, 1}, 0);
  expect_layout(scalar_tensor(3, DType::i32).squeeze(), {}, {}, 0);
}

TEST(TensorSqueeze, OneDim) {
  const Tensor x = arange(6).view({1, 3, 1, 2});
  expect_layout(x.squeeze(0), {3, 1, 2}, {2, 2, 1}, 0);
  expect_layout(x.squeeze(-2), {1, 3, 2}, {6, 2, 1}, 0);
  EXPECT_TRUE(x.squeeze(1).is_same(x));  // size 3: unchanged
  EXPECT_TRUE(is_view_of(x.squeeze(0), x));
  const Tensor s = scalar_tensor(3, DType::i32);
  EXPECT_TRUE(s.squeeze(0).is_same(s));
  EXPECT_TRUE(value_error([&] { (void)x.squeeze(4); }, {"[squeeze]", "dim 4 out of range", "[1, 3, 1, 2]"}));
}

TEST(TensorFlatten, ViewWhenContiguous) {
  const Tensor x = cube();
  const Tensor f = x.flatten();
  EXPECT_TRUE(is_view_of(f, x));
  expect_layout(f, {24}, {1}, 0);
  expect_layout(x.flatten(1), {2, 12}, {12, 1}, 0);
  expect_layout(x.flatten(0, 1), {6, 4}, {4, 1}, 0);
  expect_layout(x.flatten(-2, -1), {2, 12}, {12, 1}, 0);
  expect_layout(x.flatten(1, 1), {2, 3, 4}, {12, 4, 1}, 0);
  const Tensor s = scalar_tensor(5, DType::i64).flatten();
  EXPECT_EQ(s.shape(), (Shape{1}));
  EXPECT_EQ(s.item<int64_t>(), 5);
}

TEST(TensorFlatten, CopyWhenNotViewable) {
  const Tensor x = cube();
  const Tensor t = x.transpose(0, 2);  // [4, 3, 2]
  const Tensor f = t.flatten();
  EXPECT_NE(f.storage(), x.storage());
  std::vector<double> expected;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) expected.push_back(static_cast<double>(12 * k + 4 * j + i));
  EXPECT_EQ(walk(f), expected);
  // Merging only the dims that are contiguous with each other stays a view.
  const Tensor p = x.permute({1, 2, 0});  // [3, 4, 2] strides [4, 1, 12]
  const Tensor g = p.flatten(0, 1);
  EXPECT_TRUE(is_view_of(g, x));
  expect_layout(g, {12, 2}, {1, 12}, 0);
}

TEST(TensorFlatten, StartAfterEndThrows) {
  EXPECT_TRUE(value_error([] { (void)cube().flatten(2, 1); },
                          {"[flatten]", "start_dim 2 comes after end_dim 1 for shape [2, 3, 4]"}));
  EXPECT_TRUE(value_error([] { (void)cube().flatten(3); }, {"[flatten]", "dim 3 out of range"}));
}

// --- expand / broadcast_to / as_strided ------------------------------------------------------

TEST(TensorExpand, SizeOneDimsGetStrideZero) {
  const Tensor col = arange(3).view({3, 1});
  const Tensor e = col.expand({3, 4});
  EXPECT_TRUE(is_view_of(e, col));
  expect_layout(e, {3, 4}, {1, 0}, 0);
  EXPECT_EQ(walk(e), (std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_FALSE(e.is_contiguous());

  const Tensor row = arange(3);
  const Tensor r = row.expand({2, 3});
  expect_layout(r, {2, 3}, {0, 1}, 0);
  EXPECT_EQ(walk(r), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  expect_layout(row.expand({2, -1}), {2, 3}, {0, 1}, 0);
  expect_layout(col.expand({-1, 5}), {3, 5}, {1, 0}, 0);
  expect_layout(col.expand({3, 1}), {3, 1}, {1, 1}, 0);
  expect_layout(arange(1).expand({0}), {0}, {0}, 0);
  expect_layout(col.expand({2, 0, 3, 2}), {2, 0, 3, 2}, {0, 0, 1, 0}, 0);
  expect_layout(scalar_tensor(7, DType::i32).expand({2, 2}), {2, 2}, {0, 0}, 0);
  EXPECT_EQ(walk(scalar_tensor(7, DType::i32).expand({2, 2})), (std::vector<double>{7, 7, 7, 7}));
  const Tensor b = col.broadcast_to({2, 3, 4});
  expect_layout(b, {2, 3, 4}, {0, 1, 0}, 0);
}

TEST(TensorExpand, SeesWritesToBase) {
  Tensor base = zeros({3}, DType::f64);
  const Tensor e = base.expand({2, 3});
  base.data<double>()[1] = 4.0;
  EXPECT_EQ(walk(e), (std::vector<double>{0, 4, 0, 0, 4, 0}));
}

TEST(TensorExpand, ErrorsThrow) {
  const Tensor x = arange(6).view({2, 3});
  EXPECT_TRUE(value_error([&] { (void)x.expand({3}); }, {"[expand]", "cannot expand shape [2, 3] to [3] (fewer dims)"}));
  EXPECT_TRUE(value_error([&] { (void)x.expand({4, 3}); },
                          {"[expand]", "cannot expand shape [2, 3] to [4, 3] (dim 0: 2 vs 4)"}));
  EXPECT_TRUE(value_error([&] { (void)x.expand({-1, 2, 3}); },
                          {"[expand]", "size -1 not allowed for new leading dim 0 in [-1, 2, 3]"}));
  EXPECT_TRUE(value_error([] { (void)arange(1).expand({-2}); }, {"[expand]", "[1]", "[-2]"}));
  EXPECT_TRUE(value_error([&] { (void)x.broadcast_to({2, 4}); }, {"[expand]", "[2, 3]", "[2, 4]"}));
}

TEST(TensorAsStrided, SlidingWindows) {
  const Tensor base = arange(10);
  const Tensor w = base.as_strided({3, 3}, {2, 1}, 1);
  EXPECT_TRUE(is_view_of(w, base));
  expect_layout(w, {3, 3}, {2, 1}, 1);
  EXPECT_EQ(walk(w), (std::vector<double>{1, 2, 3, 3, 4, 5, 5, 6, 7}));
  // The offset is absolute in storage, not relative to a view's offset (as in PyTorch).
  const Tensor tail = base.narrow(0, 5, 5);
  EXPECT_EQ(walk(tail.as_strided({2}, {1}, 0)), (std::vector<double>{0, 1}));
  // Negative strides are allowed as long as every element is in bounds.
  EXPECT_EQ(walk(base.as_strided({4}, {-2}, 9)), (std::vector<double>{9, 7, 5, 3}));
  // Zero-size views may start anywhere.
  EXPECT_EQ(base.as_strided({0, 5}, {5, 1}, 10).numel(), 0);
}

TEST(TensorAsStrided, OutOfBoundsThrows) {
  const Tensor base = arange(10);
  EXPECT_TRUE(value_error([&] { (void)base.as_strided({3, 3}, {3, 1}, 2); },
                          {"[as_strided]", "shape [3, 3] strides [3, 1] offset 2", "outside its storage of 80 bytes"}));
  EXPECT_TRUE(value_error([&] { (void)base.as_strided({2}, {-1}, 0); }, {"[as_strided]", "strides [-1]"}));
  EXPECT_TRUE(value_error([&] { (void)base.as_strided({2}, {1}, -1); }, {"[as_strided]", "offset -1"}));
  EXPECT_TRUE(value_error([&] { (void)base.as_strided({2, 2}, {1}, 0); }, {"[as_strided]", "[2, 2]", "[1]"}));
  EXPECT_TRUE(value_error([&] { (void)base.as_strided({-1}, {1}, 0); }, {"[as_strided]", "negative size", "[-1]"}));
}

// --- zero-size and 0-d tensors ----------------------------------------------------------------

TEST(TensorZeroSize, ViewsWork) {
  const Tensor z = zeros({0, 3});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.nbytes(), 0);
  EXPECT_TRUE(z.is_contiguous());
  expect_layout(z.t(), {3, 0}, {1, 3}, 0);
  EXPECT_TRUE(z.t().is_contiguous());  // no elements: trivially contiguous
  EXPECT_EQ(z.reshape({3, 0, 5}).shape(), (Shape{3, 0, 5}));
  EXPECT_EQ(z.reshape({-1}).shape(), (Shape{0}));
  EXPECT_EQ(z.t().reshape({0}).shape(), (Shape{0}));
  EXPECT_EQ(z.narrow(1, 1, 2).shape(), (Shape{0, 2}));
  EXPECT_EQ(z.unsqueeze(0).shape(), (Shape{1, 0, 3}));
  EXPECT_EQ(z.flatten().shape(), (Shape{0}));
  EXPECT_EQ(z.select(1, 2).shape(), (Shape{0}));
  EXPECT_EQ(z.expand({2, 0, 3}).shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(z.permute({1, 0}).shape(), (Shape{3, 0}));
  EXPECT_EQ(z.clone().shape(), (Shape{0, 3}));
  EXPECT_TRUE(walk(z.contiguous()).empty());
}

TEST(TensorZeroDim, ViewsWork) {
  const Tensor s = scalar_tensor(4.5, DType::f64);
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.view({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(s.reshape({-1}).shape(), (Shape{1}));
  EXPECT_EQ(s.view({1}).view({}).item(), 4.5);
  EXPECT_EQ(s.expand({3}).to_vector<double>(), (std::vector<double>{4.5, 4.5, 4.5}));
  EXPECT_TRUE(is_view_of(s.unsqueeze(0), s));
  EXPECT_TRUE(value_error([&] { (void)s.size(0); }, {"[size]", "a 0-d tensor has no dims"}));
  EXPECT_TRUE(value_error([&] { (void)s.stride(0); }, {"[stride]", "a 0-d tensor has no dims"}));
}

TEST(TensorMetadata, SizeAndStride) {
  const Tensor x = cube();
  EXPECT_EQ(x.size(0), 2);
  EXPECT_EQ(x.size(-1), 4);
  EXPECT_EQ(x.stride(0), 12);
  EXPECT_EQ(x.stride(-2), 4);
  EXPECT_TRUE(value_error([&] { (void)x.size(3); }, {"[size]", "dim 3 out of range for shape [2, 3, 4]"}));
  EXPECT_TRUE(value_error([&] { (void)x.stride(-4); }, {"[stride]", "dim -4 out of range for shape [2, 3, 4]"}));
}
