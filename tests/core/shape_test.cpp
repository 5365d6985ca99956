// DimVector / Shape: inline vs heap storage, value semantics, editing, and the shape helpers
// (contiguous_strides, normalize_dim, broadcast_shapes).
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include <tessera/core/shape.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// True when v's elements live inside the DimVector object itself (no heap allocation).
bool stored_inline(const DimVector& v) {
  const auto p = reinterpret_cast<std::uintptr_t>(v.data());
  const auto self = reinterpret_cast<std::uintptr_t>(&v);
  return p >= self && p < self + sizeof(DimVector);
}

std::vector<int64_t> seq(int64_t n, int64_t start = 1) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(start + i);
  return out;
}

}  // namespace

TEST(DimVector, DefaultIsEmpty) {
  DimVector v;
  EXPECT_EQ(v.size(), 0);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.begin(), v.end());
  EXPECT_EQ(v.numel(), 1);
  EXPECT_EQ(v.to_string(), "[]");
  EXPECT_TRUE(stored_inline(v));
  EXPECT_EQ(v, DimVector{});
}

TEST(DimVector, UpToSixDimsStayInline) {
  for (int64_t n = 0; n <= DimVector::kInline; ++n) {
    const DimVector v(seq(n));
    EXPECT_TRUE(stored_inline(v)) << n;
    EXPECT_EQ(v.size(), n);
    EXPECT_EQ(v.vec(), seq(n));
  }
}

TEST(DimVector, MoreThanSixDimsSpillToHeap) {
  const DimVector v{1, 2, 3, 4, 5, 6, 7};
  EXPECT_FALSE(stored_inline(v));
  EXPECT_EQ(v.size(), 7);
  EXPECT_EQ(v.vec(), seq(7));
  EXPECT_EQ(v.back(), 7);
  EXPECT_EQ(v.numel(), 5040);
  EXPECT_EQ(v.to_string(), "[1, 2, 3, 4, 5, 6, 7]");

  const DimVector big(seq(40));
  EXPECT_EQ(big.size(), 40);
  EXPECT_EQ(big.vec(), seq(40));
}

TEST(DimVector, Constructors) {
  const std::vector<int64_t> values = {4, 0, -1};
  EXPECT_EQ(DimVector(values).vec(), values);
  EXPECT_EQ(DimVector(values.data(), 2).vec(), (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(DimVector(values.data(), 0).size(), 0);
  EXPECT_EQ(DimVector::filled(3, 7).vec(), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(DimVector::filled(9, 2).vec(), std::vector<int64_t>(9, 2));
  EXPECT_EQ(DimVector::filled(0, 2).size(), 0);
}

TEST(DimVector, CopyIsDeepInlineAndHeap) {
  for (int64_t n : {3, 9}) {
    DimVector a(seq(n));
    DimVector b(a);
    EXPECT_EQ(a, b);
    EXPECT_NE(a.data(), b.data());
    b[0] = 100;
    EXPECT_EQ(a[0], 1) << "copy must not alias the original";
    EXPECT_EQ(b[0], 100);
  }
}

TEST(DimVector, CopyAssignAcrossStorageModes) {
  DimVector small{1, 2};
  DimVector large(seq(8));
  DimVector target{9};
  target = large;  // inline -> heap
  EXPECT_EQ(target.vec(), seq(8));
  EXPECT_FALSE(stored_inline(target));
  target = small;  // heap -> 2 elements
  EXPECT_EQ(target.vec(), (std::vector<int64_t>{1, 2}));
  target = large;
  target[7] = -5;
  EXPECT_EQ(large[7], 8);

  DimVector& alias = target;
  target = alias;  // self-assignment keeps the contents
  EXPECT_EQ(target.size(), 8);
  EXPECT_EQ(target[7], -5);
}

TEST(DimVector, MoveStealsHeapAndEmptiesSource) {
  DimVector a(seq(10));
  const int64_t* heap = a.data();
  DimVector b(std::move(a));
  EXPECT_EQ(b.data(), heap) << "moving a heap vector must not copy";
  EXPECT_EQ(b.vec(), seq(10));
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from state is specified here
  a.push_back(3);          // the moved-from vector is usable again
  EXPECT_EQ(a.vec(), (std::vector<int64_t>{3}));
  EXPECT_TRUE(stored_inline(a));

  DimVector c{1, 2, 3};
  DimVector d(std::move(c));
  EXPECT_EQ(d.vec(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(stored_inline(d));
  EXPECT_EQ(c.size(), 0);  // NOLINT(bugprone-use-after-move)
}

TEST(DimVector, MoveAssignReleasesOldContents) {
  DimVector target(seq(12));  // heap; must be freed (ASan would report a leak otherwise)
  DimVector source(seq(7, 100));
  const int64_t* heap = source.data();
  target = std::move(source);
  EXPECT_EQ(target.data(), heap);
  EXPECT_EQ(target.vec(), seq(7, 100));
  EXPECT_EQ(source.size(), 0);  // NOLINT(bugprone-use-after-move)

  DimVector inline_source{5, 6};
  target = std::move(inline_source);
  EXPECT_EQ(target.vec(), (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(stored_inline(target));

  DimVector& alias = target;
  target = std::move(alias);  // self-move keeps the contents
  EXPECT_EQ(target.vec(), (std::vector<int64_t>{5, 6}));
}

TEST(DimVector, PushBackGrowsPastInline) {
  DimVector v;
  for (int64_t i = 1; i <= 20; ++i) {
    v.push_back(i);
    EXPECT_EQ(v.size(), i);
    EXPECT_EQ(v.back(), i);
    EXPECT_EQ(stored_inline(v), i <= DimVector::kInline);
  }
  EXPECT_EQ(v.vec(), seq(20));
}

TEST(DimVector, InsertFrontMiddleEnd) {
  DimVector v{2, 4};
  v.insert(0, 1);
  v.insert(2, 3);
  v.insert(4, 5);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  v.insert(5, 6);  // fills the inline buffer
  EXPECT_TRUE(stored_inline(v));
  v.insert(3, 99);  // 7th element: spills while shifting
  EXPECT_FALSE(stored_inline(v));
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1, 2, 3, 99, 4, 5, 6}));
  v.insert(0, 0);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{0, 1, 2, 3, 99, 4, 5, 6}));
  DimVector e;
  e.insert(0, 42);
  EXPECT_EQ(e.vec(), (std::vector<int64_t>{42}));
}

TEST(DimVector, EraseFrontMiddleEnd) {
  DimVector v{1, 2, 3, 4};
  v.erase(1);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1, 3, 4}));
  v.erase(2);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1, 3}));
  v.erase(0);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{3}));
  v.erase(0);
  EXPECT_TRUE(v.empty());

  DimVector h(seq(8));
  h.erase(0);
  h.erase(6);
  h.erase(3);
  EXPECT_EQ(h.vec(), (std::vector<int64_t>{2, 3, 4, 6, 7}));
  // A vector shrunk back below kInline compares and copies by value.
  EXPECT_EQ(h, (DimVector{2, 3, 4, 6, 7}));
  const DimVector copy = h;
  EXPECT_EQ(copy.vec(), h.vec());
}

TEST(DimVector, Resize) {
  DimVector v{1, 2};
  v.resize(4, 9);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1, 2, 9, 9}));
  v.resize(1);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1}));
  v.resize(8);
  EXPECT_EQ(v.vec(), (std::vector<int64_t>{1, 0, 0, 0, 0, 0, 0, 0}));
  v.resize(0);
  EXPECT_TRUE(v.empty());
}

TEST(DimVector, Equality) {
  EXPECT_EQ((DimVector{2, 3}), (DimVector{2, 3}));
  EXPECT_NE((DimVector{2, 3}), (DimVector{3, 2}));
  EXPECT_NE((DimVector{2, 3}), (DimVector{2, 3, 1}));
  EXPECT_NE((DimVector{}), (DimVector{1}));
  EXPECT_EQ(DimVector(seq(9)), DimVector(seq(9)));
  EXPECT_NE(DimVector(seq(9)), DimVector(seq(9, 2)));
}

TEST(DimVector, Numel) {
  EXPECT_EQ((DimVector{2, 3, 4}).numel(), 24);
  EXPECT_EQ((DimVector{7}).numel(), 7);
  EXPECT_EQ((DimVector{3, 0, 5}).numel(), 0);
  EXPECT_EQ((DimVector{1, 1, 1, 1, 1, 1, 1, 1}).numel(), 1);
  EXPECT_EQ((DimVector{2, 2, 2, 2, 2, 2, 2, 2, 2, 2}).numel(), 1024);
}

TEST(DimVector, ToString) {
  EXPECT_EQ((Shape{2, 3}).to_string(), "[2, 3]");
  EXPECT_EQ((Shape{}).to_string(), "[]");
  EXPECT_EQ((Shape{7}).to_string(), "[7]");
  EXPECT_EQ((Shape{0, 1}).to_string(), "[0, 1]");
  EXPECT_EQ((Strides{-1, 12}).to_string(), "[-1, 12]");
}

TEST(ContiguousStrides, RowMajor) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({5}), (Strides{1}));
  EXPECT_EQ(contiguous_strides({}), (Strides{}));
  EXPECT_EQ(contiguous_strides({3, 1, 2}), (Strides{2, 2, 1}));
  // Zero sizes count as 1 so strides stay distinct and positive (as in PyTorch).
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Strides{3, 3, 1}));
  EXPECT_EQ(contiguous_strides({2, 2, 2, 2, 2, 2, 2, 2}), (Strides{128, 64, 32, 16, 8, 4, 2, 1}));
}

TEST(NormalizeDim, InRange) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(normalize_dim(0, 3, "op", s), 0);
  EXPECT_EQ(normalize_dim(2, 3, "op", s), 2);
  EXPECT_EQ(normalize_dim(-1, 3, "op", s), 2);
  EXPECT_EQ(normalize_dim(-3, 3, "op", s), 0);
  // A 0-d shape accepts 0 and -1 (both meaning "the scalar"), as in PyTorch.
  EXPECT_EQ(normalize_dim(0, 0, "op", {}), 0);
  EXPECT_EQ(normalize_dim(-1, 0, "op", {}), 0);
}

TEST(NormalizeDim, OutOfRangeThrows) {
  const Shape s{2, 3, 4};
  EXPECT_TRUE(value_error([&] { normalize_dim(3, 3, "myop", s); },
                          {"[myop]", "dim 3 out of range for shape [2, 3, 4]", "expected a dim in [-3, 2]"}));
  EXPECT_TRUE(value_error([&] { normalize_dim(-4, 3, "myop", s); }, {"[myop]", "dim -4", "[2, 3, 4]"}));
  EXPECT_TRUE(value_error([&] { normalize_dim(1, 0, "myop", {}); }, {"[myop]", "dim 1", "[]", "[-1, 0]"}));
  EXPECT_TRUE(value_error([&] { normalize_dim(-2, 0, "myop", {}); }, {"[myop]", "dim -2"}));
}

TEST(BroadcastShapes, Compatible) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}, "op"), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({3, 1}, {2, 1, 4}, "op"), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {2, 3}, "op"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({5, 1}, {1, 6}, "op"), (Shape{5, 6}));
  // Scalars broadcast with anything.
  EXPECT_EQ(broadcast_shapes({}, {2, 3}, "op"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({2, 3}, {}, "op"), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({}, {}, "op"), (Shape{}));
  // Size 0 broadcasts with 1 (giving 0), never with anything else.
  EXPECT_EQ(broadcast_shapes({0}, {1}, "op"), (Shape{0}));
  EXPECT_EQ(broadcast_shapes({1}, {0}, "op"), (Shape{0}));
  EXPECT_EQ(broadcast_shapes({0}, {0}, "op"), (Shape{0}));
  EXPECT_EQ(broadcast_shapes({0, 3}, {5, 1, 1}, "op"), (Shape{5, 0, 3}));
  EXPECT_EQ(broadcast_shapes({}, {0}, "op"), (Shape{0}));
  // More than the inline capacity.
  EXPECT_EQ(broadcast_shapes({2, 1, 1, 1, 1, 1, 1, 3}, {4, 1, 1, 1, 1, 1, 1}, "op"),
            (Shape{2, 4, 1, 1, 1, 1, 1, 3}));
}

TEST(BroadcastShapes, IncompatibleThrows) {
  EXPECT_TRUE(value_error([] { broadcast_shapes({2, 3}, {3, 2}, "add"); },
                          {"[add]", "shapes [2, 3] and [3, 2] cannot be broadcast together"}));
  EXPECT_TRUE(value_error([] { broadcast_shapes({0}, {3}, "mul"); }, {"[mul]", "[0]", "[3]"}));
  EXPECT_TRUE(value_error([] { broadcast_shapes({4}, {2, 3}, "op"); }, {"[op]", "[4]", "[2, 3]", "4 vs 3"}));
}
