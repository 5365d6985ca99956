// Tensor: factories, copies and conversions, values, comparisons, printing, and one test per
// documented error (STYLE.md §8d). Views are in tensor_views_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/core/tensor.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kTwo53 = int64_t{1} << 53;

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) { return to_string(info.param); }

// `values` as they read back from b8 (nonzero -> 1).
std::vector<double> as_bool(std::vector<double> values) {
  for (double& v : values) v = v != 0 ? 1 : 0;
  return values;
}

}  // namespace

// --- factories ------------------------------------------------------------------------------

class FactoryTest : public ::testing::TestWithParam<DType> {};

TEST_P(FactoryTest, Empty) {
  const DType dt = GetParam();
  const Tensor t = empty({2, 3, 4}, dt);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dtype(), dt);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.itemsize(), itemsize(dt));
  EXPECT_EQ(t.nbytes(), 24 * itemsize(dt));
  EXPECT_GE(t.storage()->nbytes(), t.nbytes());
  EXPECT_EQ(t.device(), Device::cpu);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.raw_data(), t.storage()->data());
}

TEST_P(FactoryTest, ZerosOnesFull) {
  const DType dt = GetParam();
  EXPECT_EQ(walk(zeros({2, 3}, dt)), std::vector<double>(6, 0));
  EXPECT_EQ(walk(ones({3}, dt)), std::vector<double>(3, 1));
  EXPECT_EQ(walk(full({2, 2}, 3, dt)), std::vector<double>(4, dt == DType::b8 ? 1 : 3));
  const double cut = dt == DType::b8 ? 1 : is_floating(dt) ? 2.5 : 2;  // floats truncate toward zero
  EXPECT_EQ(walk(full({2}, 2.5, dt)), std::vector<double>(2, cut));
  EXPECT_EQ(walk(full({}, true, dt)), std::vector<double>{1});
  EXPECT_EQ(full({}, 0, dt).ndim(), 0);
  // zeros is all-zero bytes for every dtype
  const Tensor z = zeros({5}, dt);
  const auto* bytes = static_cast<const unsigned char*>(z.raw_data());
  for (int64_t i = 0; i < z.nbytes(); ++i) EXPECT_EQ(bytes[i], 0);
}

TEST_P(FactoryTest, ArangeCount) {
  const DType dt = GetParam();
  const Tensor a = arange(5, dt);
  EXPECT_EQ(a.dtype(), dt);
  EXPECT_EQ(a.shape(), (Shape{5}));
  EXPECT_EQ(walk(a), (dt == DType::b8 ? std::vector<double>{0, 1, 1, 1, 1} : iota(5)));
  EXPECT_EQ(arange(0, dt).shape(), (Shape{0}));
}

TEST_P(FactoryTest, ArangeRangeConvertsPerDType) {
  const DType dt = GetParam();
  const Tensor a = arange(-1.0, 1.5, 0.5, dt);  // -1, -0.5, 0, 0.5, 1
  ASSERT_EQ(a.shape(), (Shape{5}));
  std::vector<double> expected;
  if (is_floating(dt)) expected = {-1, -0.5, 0, 0.5, 1};
  else if (dt == DType::u8) expected = {0, 0, 0, 0, 1};  // saturates below 0
  else if (dt == DType::b8) expected = {1, 1, 0, 1, 1};
  else expected = {-1, 0, 0, 0, 1};  // truncation toward zero
  EXPECT_EQ(walk(a), expected);
}

TEST_P(FactoryTest, Eye) {
  const DType dt = GetParam();
  EXPECT_EQ(walk(eye(3, -1, dt)), (std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(walk(eye(2, 3, dt)), (std::vector<double>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(walk(eye(3, 2, dt)), (std::vector<double>{1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(eye(2, 3, dt).dtype(), dt);
}

TEST_P(FactoryTest, ScalarTensor) {
  const DType dt = GetParam();
  const Tensor s = scalar_tensor(5, dt);
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.dtype(), dt);
  EXPECT_EQ(walk(s), std::vector<double>{dt == DType::b8 ? 1.0 : 5.0});
}

TEST_P(FactoryTest, LikeFactoriesCopyShapeAndDType) {
  const DType dt = GetParam();
  const Tensor like = zeros({2, 3}, dt).t();  // non-contiguous
  for (const Tensor& t : {empty_like(like), zeros_like(like), ones_like(like)}) {
    EXPECT_EQ(t.shape(), (Shape{3, 2}));
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_NE(t.storage(), like.storage());
  }
  EXPECT_EQ(walk(zeros_like(like)), std::vector<double>(6, 0));
  EXPECT_EQ(walk(ones_like(like)), std::vector<double>(6, 1));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, FactoryTest, ::testing::ValuesIn(all_dtypes()), dtype_param_name);

TEST(Factories, DefaultDTypes) {
  EXPECT_EQ(empty({2}).dtype(), DType::f32);
  EXPECT_EQ(zeros({2}).dtype(), DType::f32);
  EXPECT_EQ(ones({2}).dtype(), DType::f32);
  EXPECT_EQ(full({2}, 1).dtype(), DType::f32);
  EXPECT_EQ(arange(3).dtype(), DType::i64);
  EXPECT_EQ(arange(0.0, 3.0, 1.0).dtype(), DType::f32);
  EXPECT_EQ(eye(2).dtype(), DType::f32);
}

TEST(Factories, ZeroSizeAndZeroDim) {
  const Tensor z = zeros({3, 0});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.nbytes(), 0);
  EXPECT_EQ(z.strides(), (Strides{1, 1}));
  EXPECT_EQ(empty({}).numel(), 1);
  EXPECT_EQ(eye(0).shape(), (Shape{0, 0}));
  EXPECT_EQ(eye(2, 0).shape(), (Shape{2, 0}));
}

TEST(Factories, FullKeepsLargeIntegersExact) {
  const int64_t big = (int64_t{1} << 62) + 1;
  EXPECT_EQ(full({2}, big, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{big, big}));
  EXPECT_EQ(full({1}, 1e20, DType::i32).item<int32_t>(), kI32Max);  // floating -> integer saturates
  EXPECT_EQ(full({1}, 0.1, DType::f16).data<Half>()[0].bits, Half(0.1f).bits);
}

TEST(Factories, ArangeRanges) {
  EXPECT_EQ(walk(arange(0.0, 1.0, 0.25)), (std::vector<double>{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(walk(arange(5.0, 0.0, -1.5, DType::f64)), (std::vector<double>{5, 3.5, 2, 0.5}));
  EXPECT_EQ(walk(arange(-3.0, 3.0, 2.0, DType::i32)), (std::vector<double>{-3, -1, 1}));
  EXPECT_EQ(walk(arange(3.0, -3.0, -2.0, DType::i64)), (std::vector<double>{3, 1, -1}));
  EXPECT_EQ(arange(0.0, 1.0, 0.1, DType::f64).numel(), 10);  // end excluded despite rounding
  EXPECT_EQ(arange(1.0, 1.0, 1.0).numel(), 0);
  EXPECT_EQ(arange(0.0, 5.0, -1.0).numel(), 0);  // step away from end: empty
  EXPECT_EQ(arange(5.0, 0.0, 1.0).numel(), 0);
  EXPECT_EQ(arange(0.0, 2.5, 1.0).numel(), 3);
  const Tensor big = arange(0.0, 1e6, 1.0, DType::i64);
  const auto v = big.to_vector<int64_t>();
  ASSERT_EQ(v.size(), 1000000u);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int64_t>(i)) FAIL() << i;
}

TEST(Factories, FromVectorEveryDType) {
  const Tensor f32 = from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2});
  EXPECT_EQ(f32.dtype(), DType::f32);
  EXPECT_EQ(f32.shape(), (Shape{2, 2}));
  EXPECT_EQ(f32.data<float>()[2], 3.25f);
  EXPECT_EQ(walk(f32), (std::vector<double>{1.5, -2, 3.25, 0}));

  const Tensor f64 = from_vector<double>({0.1, 1e300});
  EXPECT_EQ(f64.dtype(), DType::f64);
  EXPECT_EQ(f64.data<double>()[0], 0.1);
  EXPECT_EQ(f64.data<double>()[1], 1e300);

  const Tensor f16 = from_vector<Half>({Half(1.0f), Half(-0.5f), Half::from_bits(0x7bff)});
  EXPECT_EQ(f16.dtype(), DType::f16);
  EXPECT_EQ(f16.data<Half>()[2].bits, 0x7bff);
  EXPECT_EQ(walk(f16), (std::vector<double>{1, -0.5, 65504}));

  const Tensor bf16 = from_vector<BFloat16>({BFloat16(3.140625f), BFloat16(-1e20f)});
  EXPECT_EQ(bf16.dtype(), DType::bf16);
  EXPECT_EQ(bf16.data<BFloat16>()[0].bits, BFloat16(3.140625f).bits);
  EXPECT_EQ(bf16.data<BFloat16>()[1].bits, BFloat16(-1e20f).bits);

  const Tensor i32 = from_vector<int32_t>({kI32Min, -1, kI32Max}, {3, 1});
  EXPECT_EQ(i32.dtype(), DType::i32);
  EXPECT_EQ(i32.shape(), (Shape{3, 1}));
  EXPECT_EQ(i32.data<int32_t>()[0], kI32Min);
  EXPECT_EQ(i32.data<int32_t>()[2], kI32Max);

  const Tensor i64 = from_vector<int64_t>({kTwo53 + 1, -7});
  EXPECT_EQ(i64.dtype(), DType::i64);
  EXPECT_EQ(i64.data<int64_t>()[0], kTwo53 + 1);

  const Tensor u8 = from_vector<uint8_t>({0, 128, 255});
  EXPECT_EQ(u8.dtype(), DType::u8);
  EXPECT_EQ(walk(u8), (std::vector<double>{0, 128, 255}));

  const std::vector<bool> bits = {true, false, true, true, false};  // bit-packed specialisation
  const Tensor b8 = from_vector(bits);
  EXPECT_EQ(b8.dtype(), DType::b8);
  EXPECT_EQ(b8.shape(), (Shape{5}));
  const bool* p = b8.data<bool>();
  for (size_t i = 0; i < bits.size(); ++i) EXPECT_EQ(p[i], bits[i]) << i;
  EXPECT_EQ(from_vector(bits, {1, 5}).to_vector<bool>(), bits);
}

TEST(Factories, FromVectorShapes) {
  const Tensor s = from_vector<int32_t>({42}, {});
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.item<int32_t>(), 42);
  const Tensor e = from_vector<float>({});
  EXPECT_EQ(e.shape(), (Shape{0}));
  EXPECT_EQ(from_vector<float>({}, {2, 0, 3}).shape(), (Shape{2, 0, 3}));
  EXPECT_TRUE(from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).is_contiguous());
}

TEST(StorageTest, AllocateAlignedAndSized) {
  const auto s = Storage::allocate(100);
  EXPECT_EQ(s->nbytes(), 100);
  EXPECT_EQ(s->device(), Device::cpu);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s->data()) % 64, 0u);
  const auto z = Storage::allocate(0);
  EXPECT_EQ(z->nbytes(), 0);
  EXPECT_NE(z->data(), nullptr);
  EXPECT_EQ(name(Device::cpu), "cpu");
  EXPECT_EQ(name(Device::cuda), "cuda");
}

TEST(StorageTest, LargeBlocksAreCachedAndReused) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "sanitized builds disable the allocator cache";
#endif
  if (std::getenv("TESSERA_ALLOCATOR_CACHE_MB") != nullptr) GTEST_SKIP() << "cache limit overridden";
  constexpr int64_t kMiB = int64_t{1} << 20;
  empty_cache();
  EXPECT_EQ(cached_bytes(), 0);
  const void* first = nullptr;
  {
    const auto s = Storage::allocate(kMiB);
    first = s->data();
  }
  EXPECT_EQ(cached_bytes(), kMiB);
  {
    const auto again = Storage::allocate(kMiB - 100);  // same size class: reuses the block
    EXPECT_EQ(again->data(), first);
    EXPECT_EQ(again->nbytes(), kMiB - 100);  // nbytes is what was asked for, not the class
    EXPECT_EQ(cached_bytes(), 0);
  }
  { const auto small = Storage::allocate(1000); }  // below 64 KiB: not cached
  EXPECT_EQ(cached_bytes(), kMiB);
  empty_cache();
  EXPECT_EQ(cached_bytes(), 0);
}

TEST(StorageTest, TensorOverExistingStorage) {
  const auto storage = Storage::allocate(10 * sizeof(int32_t));
  auto* p = static_cast<int32_t*>(storage->data());
  for (int32_t i = 0; i < 10; ++i) p[i] = i * i;
  const Tensor t(storage, {2, 3}, {1, 2}, 3, DType::i32);  // elements 3 + i + 2j
  EXPECT_EQ(t.storage(), storage);
  EXPECT_EQ(walk(t), (std::vector<double>{9, 25, 49, 16, 36, 64}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.raw_data(), static_cast<void*>(p + 3));
}

// --- copies ---------------------------------------------------------------------------------

TEST(TensorContiguous, ReturnsSelfOrCopy) {
  const Tensor x = arange(6).view({2, 3});
  EXPECT_TRUE(x.contiguous().is_same(x));
  const Tensor t = x.t();
  const Tensor c = t.contiguous();
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.strides(), (Strides{2, 1}));
  EXPECT_EQ(walk(c), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // A contiguous view with an offset is returned as is.
  const Tensor rows = x.narrow(0, 1, 1);
  EXPECT_TRUE(rows.contiguous().is_same(rows));
}

TEST(TensorClone, IndependentContiguousCopy) {
  Tensor x = arange(12).view({3, 4});
  const Tensor view = x.narrow(1, 1, 2).t();  // [2, 3] strides [1, 4] offset 1
  Tensor c = view.clone();
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(c.dtype(), DType::i64);
  EXPECT_EQ(walk(c), (std::vector<double>{1, 5, 9, 2, 6, 10}));
  c.fill_(0);
  EXPECT_EQ(walk(x), iota(12));
  x.fill_(-1);
  EXPECT_EQ(walk(c), std::vector<double>(6, 0));
  // clone of a contiguous tensor is still a fresh storage
  EXPECT_NE(x.clone().storage(), x.storage());
  EXPECT_EQ(scalar_tensor(2.5, DType::bf16).clone().item(), 2.5);
}

TEST(TensorCopy, SameShapeContiguous) {
  Tensor dst = zeros({2, 3}, DType::f32);
  const auto storage = dst.storage();
  const Tensor src = arange(0.0, 6.0, 1.0, DType::f32).view({2, 3});
  Tensor& ret = dst.copy_(src);
  EXPECT_EQ(&ret, &dst);
  EXPECT_EQ(dst.storage(), storage);  // in place
  EXPECT_EQ(walk(dst), iota(6));
  EXPECT_NE(dst.storage(), src.storage());
}

TEST(TensorCopy, BroadcastsSource) {
  Tensor dst = zeros({2, 3}, DType::i64);
  dst.copy_(from_vector<int64_t>({7, 8, 9}));
  EXPECT_EQ(walk(dst), (std::vector<double>{7, 8, 9, 7, 8, 9}));
  dst.copy_(from_vector<int64_t>({1, 2}, {2, 1}));
  EXPECT_EQ(walk(dst), (std::vector<double>{1, 1, 1, 2, 2, 2}));
  dst.copy_(scalar_tensor(4, DType::i64));
  EXPECT_EQ(walk(dst), std::vector<double>(6, 4));
  dst.copy_(from_vector<int64_t>({5}, {1, 1}));
  EXPECT_EQ(walk(dst), std::vector<double>(6, 5));
  // Broadcasting with conversion.
  Tensor i = zeros({2, 3}, DType::i32);
  i.copy_(from_vector<double>({1.9, -1.9, 1e10}));
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{1, -1, kI32Max, 1, -1, kI32Max}));
}

TEST(TensorCopy, NonContiguousDestination) {
  Tensor base = zeros({3, 4}, DType::i64);
  Tensor dst = base.t();  // [4, 3]
  dst.copy_(arange(12).view({4, 3}));  // dst[i][j] = 3i + j  ->  base[r][c] = 3c + r
  std::vector<double> expected;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c) expected.push_back(static_cast<double>(3 * c + r));
  EXPECT_EQ(walk(base), expected);
}

TEST(TensorCopy, NonContiguousSource) {
  Tensor dst = zeros({4, 3}, DType::i64);
  dst.copy_(arange(12).view({3, 4}).t());  // dst[i][j] = 4j + i
  std::vector<double> expected;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) expected.push_back(static_cast<double>(4 * j + i));
  EXPECT_EQ(walk(dst), expected);
}

TEST(TensorCopy, BothStridedWithOffsetsAndConversion) {
  Tensor dst_base = zeros({5, 5}, DType::f64);
  Tensor dst = dst_base.narrow(0, 1, 3).narrow(1, 2, 2);  // [3, 2] at offset 7
  EXPECT_EQ(dst.offset(), 7);
  const Tensor src_base = arange(0.0, 24.0, 1.0, DType::f32).view({4, 6});
  const Tensor src = src_base.t().narrow(0, 2, 3).narrow(1, 1, 2);  // src[i][j] = 6(1+j) + 2 + i
  EXPECT_EQ(src.strides(), (Strides{1, 6}));
  dst.copy_(src);
  std::vector<double> expected(25, 0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j) expected[static_cast<size_t>((1 + i) * 5 + 2 + j)] = static_cast<double>(6 * (1 + j) + 2 + i);
  EXPECT_EQ(walk(dst_base), expected);
  EXPECT_EQ(walk(src_base), iota(24));  // source untouched
}

TEST(TensorCopy, ThreeDimsPermutedIntoPermuted) {
  // A general strided walk: nothing merges into one run.
  Tensor dst_base = zeros({2, 3, 4}, DType::i32);
  Tensor dst = dst_base.permute({2, 0, 1});                     // [4, 2, 3]
  const Tensor src = arange(24).view({3, 4, 2}).permute({1, 2, 0});  // [4, 2, 3]; src[a][b][c] = 8c + 2a + b
  dst.copy_(src);
  // dst[a][b][c] = dst_base[b][c][a]
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(at<int32_t>(dst_base, {b, c, a}), 8 * c + 2 * a + b);
}

TEST(TensorCopy, ZeroSizeAndSelf) {
  Tensor z = zeros({0, 3});
  z.copy_(ones({3}));
  z.copy_(ones({1}));
  EXPECT_EQ(z.numel(), 0);
  Tensor x = arange(6);
  x.copy_(x);
  EXPECT_EQ(walk(x), iota(6));
  Tensor s = scalar_tensor(0, DType::f32);
  s.copy_(scalar_tensor(2.5, DType::f64));
  EXPECT_EQ(s.item(), 2.5);
}

// Source and destination share storage: the result must be as if src were read completely first.
TEST(TensorCopy, OverlappingSourceAndDestination) {
  Tensor m = arange(9).view({3, 3});
  m.copy_(m.t());  // in-place transpose
  EXPECT_EQ(walk(m), (std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8}));

  Tensor flat = arange(6);
  flat.narrow(0, 1, 5).copy_(flat.narrow(0, 0, 5));  // contiguous shift right
  EXPECT_EQ(walk(flat), (std::vector<double>{0, 0, 1, 2, 3, 4}));
  flat = arange(6);
  flat.narrow(0, 0, 5).copy_(flat.narrow(0, 1, 5));  // contiguous shift left
  EXPECT_EQ(walk(flat), (std::vector<double>{1, 2, 3, 4, 5, 5}));

  Tensor base = arange(12).view({6, 2});
  Tensor col = base.select(1, 0);  // 0 2 4 6 8 10, stride 2
  col.narrow(0, 1, 5).copy_(col.narrow(0, 0, 5));  // strided shift right
  EXPECT_EQ(walk(col), (std::vector<double>{0, 0, 2, 4, 6, 8}));
  EXPECT_EQ(walk(base.select(1, 1)), (std::vector<double>{1, 3, 5, 7, 9, 11}));

  Tensor row = arange(4);
  row.copy_(row.as_strided({4}, {-1}, 3));  // reverse in place
  EXPECT_EQ(walk(row), (std::vector<double>{3, 2, 1, 0}));
  row.copy_(row.select(0, 1));  // broadcast one of its own elements
  EXPECT_EQ(walk(row), (std::vector<double>{2, 2, 2, 2}));
}

TEST(TensorCopy, ErrorsThrow) {
  Tensor dst = zeros({3});
  Tensor expanded = zeros({1, 3}).expand({2, 3});
  EXPECT_TRUE(value_error([&] { expanded.copy_(ones({2, 3})); },
                          {"[copy_]", "destination of shape [2, 3] with strides [0, 1] has elements that share memory"}));
  EXPECT_TRUE(value_error([&] { dst.copy_(ones({2})); }, {"[copy_]", "shapes [3] and [2] cannot be broadcast together"}));
  EXPECT_TRUE(value_error([&] { dst.copy_(ones({2, 3})); },
                          {"[copy_]", "source shape [2, 3] does not broadcast to destination shape [3]"}));
  Tensor one = zeros({1});
  EXPECT_TRUE(value_error([&] { one.copy_(ones({3})); }, {"[copy_]", "source shape [3]", "destination shape [1]"}));
  EXPECT_TRUE(value_error([&] { dst.copy_(Tensor()); }, {"[copy_]", "source tensor is undefined"}));
  EXPECT_EQ(walk(dst), std::vector<double>(3, 0));  // failed copies leave the destination alone
}

// Every (source, destination) dtype pair, through to() (contiguous) and copy_ between strided
// views; expected values are written out per category below.
class ConvertTest : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

namespace {
// Source values per dtype, each exactly representable in it.
std::vector<double> source_values(DType src) {
  if (is_floating(src)) return {0, 1, -2.5, 3.75, 300, 0.5};
  if (src == DType::u8) return {0, 1, 254, 3, 255, 7};
  if (src == DType::b8) return {0, 1, 1, 0, 1, 0};
  return {0, 1, -2, 3, 300, 7};  // i32, i64
}

std::vector<double> expected_values(DType src, DType dst) {
  if (dst == DType::b8) return as_bool(source_values(src));
  if (src == DType::b8) return source_values(src);
  if (is_floating(src)) {
    if (is_floating(dst)) return {0, 1, -2.5, 3.75, 300, 0.5};
    if (dst == DType::u8) return {0, 1, 0, 3, 255, 0};  // truncate, saturate at [0, 255]
    return {0, 1, -2, 3, 300, 0};                       // truncate toward zero
  }
  if (src == DType::u8) return {0, 1, 254, 3, 255, 7};
  if (dst == DType::u8) return {0, 1, 254, 3, 44, 7};  // integer -> integer wraps modulo 256
  return {0, 1, -2, 3, 300, 7};
}

std::string convert_param_name(const ::testing::TestParamInfo<std::tuple<DType, DType>>& info) {
  return to_string(std::get<0>(info.param)) + "_to_" + to_string(std::get<1>(info.param));
}
}  // namespace

TEST_P(ConvertTest, ToAndStridedCopy) {
  const auto [src_dtype, dst_dtype] = GetParam();
  const std::vector<double> values = source_values(src_dtype);
  const std::vector<double> expected = expected_values(src_dtype, dst_dtype);
  const auto n = static_cast<int64_t>(values.size());

  const Tensor src = make(values, {n}, src_dtype);
  const Tensor converted = src.to(dst_dtype);
  EXPECT_EQ(converted.dtype(), dst_dtype);
  EXPECT_EQ(converted.shape(), (Shape{n}));
  EXPECT_EQ(walk(converted), expected);
  if (src_dtype == dst_dtype) {
    EXPECT_TRUE(converted.is_same(src));
  }
  else EXPECT_NE(converted.storage(), src.storage());

  // Strided source (every other element of a longer vector) into a strided destination
  // (column 0 of an n x 2 tensor whose column 1 must stay untouched).
  std::vector<double> interleaved;
  for (double v : values) {
    interleaved.push_back(v);
    interleaved.push_back(1);
  }
  const Tensor strided_src = make(interleaved, {2 * n}, src_dtype).as_strided({n}, {2}, 0);
  Tensor dst_base = zeros({n, 2}, dst_dtype);
  Tensor dst = dst_base.select(1, 0);
  ASSERT_FALSE(dst.is_contiguous());
  dst.copy_(strided_src);
  EXPECT_EQ(walk(dst), expected);
  EXPECT_EQ(walk(dst_base.select(1, 1)), std::vector<double>(static_cast<size_t>(n), 0));

  // to_vector converts the same way.
  visit(dst_dtype, [&]<class T>(TypeTag<T>) {
    const std::vector<T> v = src.to_vector<T>();
    ASSERT_EQ(v.size(), values.size());
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(to_double(static_cast<T>(v[i])), expected[i]) << i;
  });
}

INSTANTIATE_TEST_SUITE_P(AllPairs, ConvertTest,
                         ::testing::Combine(::testing::ValuesIn(all_dtypes()), ::testing::ValuesIn(all_dtypes())),
                         convert_param_name);

TEST(TensorTo, FloatToIntegerSaturatesAndMapsNaNToZero) {
  const Tensor f = from_vector<float>({1e20f, -1e20f, NAN, INFINITY, -INFINITY, 2.9f, -2.9f});
  EXPECT_EQ(f.to(DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{kI32Max, kI32Min, 0, kI32Max, kI32Min, 2, -2}));
  EXPECT_EQ(f.to(DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), 0,
                                  std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(), 2, -2}));
  EXPECT_EQ(f.to(DType::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{255, 0, 0, 255, 0, 2, 0}));
  const Tensor d = from_vector<double>({255.9, -0.5, 256.0, 1e300});
  EXPECT_EQ(d.to(DType::u8).to_vector<uint8_t>(), (std::vector<uint8_t>{255, 0, 255, 255}));
  EXPECT_EQ(from_vector<Half>({Half(-70000.0f), Half(65504.0f)}).to(DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{kI32Min, 65504}));  // -70000 is -inf in f16
}

TEST(TensorTo, ToBool) {
  const Tensor f = from_vector<float>({0.0f, 0.5f, -1.0f, NAN, -0.0f, 1e-30f});
  EXPECT_EQ(f.to(DType::b8).to_vector<bool>(), (std::vector<bool>{false, true, true, true, false, true}));
  EXPECT_EQ(from_vector<int32_t>({0, 2, -1}).to(DType::b8).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(from_vector<uint8_t>({0, 128}).to(DType::b8).to_vector<bool>(), (std::vector<bool>{false, true}));
  const Tensor b = from_vector(std::vector<bool>{false, true});
  EXPECT_EQ(b.to(DType::f32).to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(b.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
}

TEST(TensorTo, FloatingRounding) {
  const Tensor big = from_vector<int64_t>({kTwo53 + 1, 16777217});
  EXPECT_EQ(big.to(DType::f64).to_vector<double>(), (std::vector<double>{9007199254740992.0, 16777217.0}));
  EXPECT_EQ(big.to(DType::f32).data<float>()[1], 16777216.0f);
  const Tensor f = from_vector<float>({65520.0f, 1e-8f, 0.1f, -1e6f});
  const Tensor h = f.to(DType::f16);
  EXPECT_EQ(h.data<Half>()[0].bits, 0x7c00);  // rounds to +inf
  EXPECT_EQ(h.data<Half>()[1].bits, 0x0000);  // underflows to +0
  EXPECT_EQ(h.data<Half>()[2].bits, Half(0.1f).bits);
  EXPECT_EQ(h.data<Half>()[3].bits, 0xfc00);  // -inf
  const Tensor b = f.to(DType::bf16);
  EXPECT_EQ(b.data<BFloat16>()[2].bits, BFloat16(0.1f).bits);
  EXPECT_TRUE(std::isnan(from_vector<double>({kNaN}).to(DType::bf16).item()));
  EXPECT_EQ(from_vector<double>({1e300}).to(DType::f32).item(), kInf);
}

TEST(TensorTo, NonContiguousSourceGivesRowMajorCopy) {
  const Tensor x = arange(6).view({2, 3}).t();
  const Tensor y = x.to(DType::f64);
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(x.to(DType::i64).is_same(x));
}

TEST(TensorFill, ContiguousAndStrided) {
  Tensor x = zeros({2, 3}, DType::f32);
  Tensor& ret = x.fill_(2.5);
  EXPECT_EQ(&ret, &x);
  EXPECT_EQ(walk(x), std::vector<double>(6, 2.5));

  Tensor base = zeros({3, 4}, DType::i32);
  base.narrow(1, 1, 2).fill_(7);
  EXPECT_EQ(walk(base), (std::vector<double>{0, 7, 7, 0, 0, 7, 7, 0, 0, 7, 7, 0}));
  base.t().select(0, 3).fill_(-1);  // column 3
  EXPECT_EQ(walk(base), (std::vector<double>{0, 7, 7, -1, 0, 7, 7, -1, 0, 7, 7, -1}));

  Tensor s = scalar_tensor(0, DType::i64);
  s.fill_(9);
  EXPECT_EQ(s.item<int64_t>(), 9);
  Tensor z = zeros({0});
  z.fill_(1);  // no-op
  EXPECT_EQ(z.numel(), 0);
}

TEST(TensorFill, ConvertsValue) {
  auto filled = [](DType dt, Scalar v) { return scalar_tensor(0, dt).fill_(v).item(); };
  EXPECT_EQ(filled(DType::i32, 2.7), 2);
  EXPECT_EQ(filled(DType::i32, -2.7), -2);
  EXPECT_EQ(filled(DType::i32, 1e20), kI32Max);
  EXPECT_EQ(filled(DType::i64, kNaN), 0);
  EXPECT_EQ(filled(DType::u8, -1), 255);     // integer scalar: wraps like a C++ cast
  EXPECT_EQ(filled(DType::u8, 300.0), 255);  // floating scalar: saturates
  EXPECT_EQ(filled(DType::b8, 2), 1);
  EXPECT_EQ(filled(DType::b8, 0.0), 0);
  EXPECT_EQ(filled(DType::b8, 0.25), 1);
  EXPECT_EQ(filled(DType::f32, true), 1);
  EXPECT_EQ(filled(DType::f16, 0.1), static_cast<double>(static_cast<float>(Half(0.1f))));
  const int64_t big = (int64_t{1} << 62) + 3;
  EXPECT_EQ(scalar_tensor(0, DType::i64).fill_(big).item<int64_t>(), big);
}

// --- values ---------------------------------------------------------------------------------

TEST(TensorItem, ConvertsToRequestedType) {
  const Tensor f = scalar_tensor(2.75, DType::f32);
  EXPECT_EQ(f.item(), 2.75);
  EXPECT_EQ(f.item<double>(), 2.75);
  EXPECT_EQ(f.item<float>(), 2.75f);
  EXPECT_EQ(f.item<int64_t>(), 2);
  EXPECT_EQ(f.item<uint8_t>(), 2);
  EXPECT_EQ(f.item<bool>(), true);
  EXPECT_EQ(f.item<Half>().bits, Half(2.75f).bits);
  EXPECT_EQ(scalar_tensor(-1e20, DType::f64).item<int32_t>(), kI32Min);
  const int64_t big = kTwo53 + 1;
  EXPECT_EQ(from_vector<int64_t>({big}).item<int64_t>(), big);  // no trip through double
  EXPECT_EQ(from_vector(std::vector<bool>{true}).item<int32_t>(), 1);
  EXPECT_EQ(from_vector(std::vector<bool>{false}).item(), 0.0);
  EXPECT_EQ(zeros({1, 1, 1}, DType::u8).fill_(200).item<int32_t>(), 200);
  // On a view: reads the viewed element, not the storage's first.
  const Tensor x = arange(12).view({3, 4});
  EXPECT_EQ(x.select(0, 2).select(0, 1).item<int64_t>(), 9);
  EXPECT_EQ(x.narrow(1, 3, 1).narrow(0, 1, 1).item<int64_t>(), 7);
}

TEST(TensorItem, NotOneElementThrows) {
  EXPECT_TRUE(value_error([] { (void)arange(2).item(); }, {"[item]", "expects a tensor with one element, got shape [2]"}));
  EXPECT_TRUE(value_error([] { (void)zeros({0}).item<float>(); }, {"[item]", "got shape [0]"}));
  EXPECT_TRUE(value_error([] { (void)zeros({1, 2}).item<int32_t>(); }, {"[item]", "[1, 2]"}));
}

TEST(TensorToVector, ConvertsAndOrdersRowMajor) {
  const Tensor f = from_vector<float>({2.5f, -1.5f, 3.0f, 0.0f});
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{2.5f, -1.5f, 3.0f, 0.0f}));
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{2.5, -1.5, 3.0, 0.0}));
  EXPECT_EQ(f.to_vector<int32_t>(), (std::vector<int32_t>{2, -1, 3, 0}));
  EXPECT_EQ(f.to_vector<uint8_t>(), (std::vector<uint8_t>{2, 0, 3, 0}));
  EXPECT_EQ(f.to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  const std::vector<Half> h = f.to_vector<Half>();
  EXPECT_EQ(h[1].bits, Half(-1.5f).bits);
  const Tensor x = arange(6).view({2, 3}).t();
  EXPECT_EQ(x.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(arange(3).expand({2, 3}).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(zeros({0, 4}).to_vector<float>().empty());
  EXPECT_EQ(scalar_tensor(3, DType::i32).to_vector<int64_t>(), (std::vector<int64_t>{3}));
}

TEST(TensorData, TypedPointerAndOffset) {
  Tensor x = arange(10);
  const Tensor tail = x.narrow(0, 2, 3);
  EXPECT_EQ(tail.raw_data(), static_cast<const char*>(x.raw_data()) + 2 * sizeof(int64_t));
  EXPECT_EQ(tail.data<int64_t>()[0], 2);
  x.data<int64_t>()[2] = 50;
  EXPECT_EQ(tail.data<int64_t>()[0], 50);
  EXPECT_TRUE(value_error([&] { (void)x.data<float>(); }, {"[data]", "tensor of shape [10] has dtype i64; expected f32"}));
  EXPECT_TRUE(value_error([] { (void)zeros({2}, DType::f16).data<BFloat16>(); }, {"[data]", "dtype f16; expected bf16"}));
}

TEST(TensorMetadata, IsContiguous) {
  const Tensor x = arange(24).view({2, 3, 4});
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_FALSE(x.transpose(1, 2).is_contiguous());
  EXPECT_FALSE(x.narrow(2, 0, 2).is_contiguous());
  EXPECT_TRUE(x.narrow(0, 1, 1).is_contiguous());
  EXPECT_TRUE(x.select(0, 1).is_contiguous());
  EXPECT_FALSE(x.select(2, 1).is_contiguous());
  EXPECT_FALSE(arange(3).expand({2, 3}).is_contiguous());
  // Size-1 dims may have any stride.
  EXPECT_TRUE(x.as_strided({1, 3}, {100, 1}, 0).is_contiguous());
  EXPECT_TRUE(x.as_strided({3, 1}, {1, 0}, 0).is_contiguous());
  EXPECT_TRUE(arange(1).expand({1, 1}).is_contiguous());
  // Zero-size tensors are contiguous whatever their strides; 0-d ones are too.
  EXPECT_TRUE(x.as_strided({0, 3}, {1, 7}, 0).is_contiguous());
  EXPECT_TRUE(scalar_tensor(1, DType::f32).is_contiguous());
  // Gaps are not.
  EXPECT_FALSE(x.as_strided({3}, {2}, 0).is_contiguous());
}

TEST(TensorMetadata, IsSame) {
  const Tensor x = arange(8);
  const Tensor copy = x;  // NOLINT(performance-unnecessary-copy-initialization): handle copy is the point
  EXPECT_TRUE(copy.is_same(x));
  EXPECT_TRUE(x.view({8}).is_same(x));
  EXPECT_FALSE(x.view({2, 4}).is_same(x));
  EXPECT_FALSE(x.clone().is_same(x));
  EXPECT_FALSE(x.narrow(0, 1, 7).is_same(x.narrow(0, 0, 7)));
  EXPECT_TRUE(x.narrow(0, 1, 7).is_same(x.narrow(0, 1, 7)));
  EXPECT_FALSE(x.as_strided({4}, {2}, 0).is_same(x.as_strided({4}, {1}, 0)));
  const Tensor u(x.storage(), {8}, {1}, 0, DType::u8), b(x.storage(), {8}, {1}, 0, DType::b8);
  EXPECT_FALSE(u.is_same(b));
  EXPECT_TRUE(Tensor().is_same(Tensor()));
  EXPECT_FALSE(Tensor().is_same(x));
}

// --- comparisons ----------------------------------------------------------------------------

TEST(Allclose, Tolerances) {
  const Tensor a = from_vector<double>({1.0, 2.0, 3.0});
  EXPECT_TRUE(allclose(a, a));
  EXPECT_TRUE(allclose(a, from_vector<double>({1.0 + 1e-6, 2.0, 3.0})));   // within default rtol
  EXPECT_FALSE(allclose(a, from_vector<double>({1.0 + 1e-4, 2.0, 3.0})));  // outside
  // |a - b| <= atol + rtol * |b|: relative to the second argument only.
  const Tensor x = from_vector<double>({1.5}), y = from_vector<double>({2.0});
  EXPECT_TRUE(allclose(x, y, 0.25, 0.0));   // 0.5 <= 0.25 * 2
  EXPECT_FALSE(allclose(y, x, 0.25, 0.0));  // 0.5 >  0.25 * 1.5
  EXPECT_TRUE(allclose(y, x, 0.25, 0.125));  // 0.5 <= 0.125 + 0.375
  EXPECT_FALSE(allclose(y, x, 0.25, 0.124));
  EXPECT_TRUE(allclose(from_vector<double>({0.0}), from_vector<double>({1e-9})));  // atol near zero
  EXPECT_FALSE(allclose(from_vector<double>({0.0}), from_vector<double>({1e-7})));
  EXPECT_TRUE(allclose(from_vector<double>({0.0}), from_vector<double>({1e-7}), 0.0, 1e-6));
}

TEST(Allclose, NaNAndInfinity) {
  const Tensor nan = from_vector<float>({NAN}), one = from_vector<float>({1.0f});
  const Tensor inf = from_vector<float>({INFINITY}), ninf = from_vector<float>({-INFINITY});
  EXPECT_FALSE(allclose(nan, nan));
  EXPECT_TRUE(allclose(nan, nan, 1e-5, 1e-8, /*equal_nan=*/true));
  EXPECT_FALSE(allclose(nan, one, 1e-5, 1e-8, true));
  EXPECT_FALSE(allclose(one, nan, 1e-5, 1e-8, true));
  EXPECT_TRUE(allclose(inf, inf));
  EXPECT_TRUE(allclose(ninf, ninf));
  EXPECT_FALSE(allclose(inf, ninf));
  EXPECT_FALSE(allclose(ninf, inf));
  EXPECT_FALSE(allclose(inf, one));
  EXPECT_FALSE(allclose(one, inf));   // rtol * |inf| must not make everything close to inf
  EXPECT_FALSE(allclose(one, ninf));
}

TEST(Allclose, BroadcastsAndMixesDTypes) {
  const Tensor m = from_vector<float>({1, 2, 3, 1, 2, 3}, {2, 3});
  EXPECT_TRUE(allclose(m, from_vector<int32_t>({1, 2, 3})));
  EXPECT_TRUE(allclose(from_vector<int64_t>({1, 2, 3}), m));
  EXPECT_FALSE(allclose(m, from_vector<double>({1, 2, 4})));
  EXPECT_TRUE(allclose(full({2, 2}, 5), scalar_tensor(5, DType::u8)));
  EXPECT_TRUE(allclose(m.t(), m.t().contiguous()));
  EXPECT_TRUE(allclose(zeros({0, 3}), ones({3})));  // nothing to compare
  EXPECT_TRUE(allclose(from_vector<Half>({Half(0.1f)}), from_vector<float>({0.1f}), 1e-3));
  EXPECT_TRUE(value_error([&] { (void)allclose(m, ones({4})); },
                          {"[allclose]", "shapes [2, 3] and [4] cannot be broadcast together"}));
}

TEST(Equal, ExactValuesAndShapes) {
  const Tensor a = from_vector<int64_t>({1, 2, 3});
  EXPECT_TRUE(equal(a, a));
  EXPECT_TRUE(equal(a, from_vector<int32_t>({1, 2, 3})));
  EXPECT_TRUE(equal(a, from_vector<float>({1, 2, 3})));
  EXPECT_TRUE(equal(from_vector<double>({1, 2, 3}), from_vector<float>({1, 2, 3})));
  EXPECT_FALSE(equal(a, from_vector<int64_t>({1, 2, 4})));
  EXPECT_FALSE(equal(a, a.view({1, 3})));  // no broadcasting
  EXPECT_FALSE(equal(scalar_tensor(1, DType::i64), from_vector<int64_t>({1})));
  EXPECT_TRUE(equal(arange(6).view({2, 3}).t(), from_vector<int64_t>({0, 3, 1, 4, 2, 5}, {3, 2})));
  EXPECT_TRUE(equal(zeros({0, 2}), zeros({0, 2}, DType::i32)));
  EXPECT_FALSE(equal(zeros({0, 2}), zeros({2, 0})));
  EXPECT_FALSE(equal(from_vector<float>({NAN}), from_vector<float>({NAN})));
  EXPECT_FALSE(equal(from_vector<Half>({Half(0.1f)}), from_vector<float>({0.1f})));  // f16 rounding
  EXPECT_TRUE(equal(from_vector(std::vector<bool>{true, false}), from_vector<uint8_t>({1, 0})));
  EXPECT_FALSE(equal(from_vector<int64_t>({-1}), from_vector<uint8_t>({255})));
  EXPECT_TRUE(equal(from_vector<int64_t>({255}), from_vector<uint8_t>({255})));
}

TEST(Equal, LargeInt64ComparedExactly) {
  const Tensor a = from_vector<int64_t>({kTwo53, -kTwo53});
  const Tensor b = from_vector<int64_t>({kTwo53 + 1, -kTwo53});
  EXPECT_EQ(static_cast<double>(kTwo53), static_cast<double>(kTwo53 + 1));  // they collide as doubles
  EXPECT_FALSE(equal(a, b));
  EXPECT_TRUE(equal(b, from_vector<int64_t>({kTwo53 + 1, -kTwo53})));
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(equal(from_vector<int64_t>({max}), from_vector<int64_t>({max - 1})));
  EXPECT_TRUE(equal(from_vector<int64_t>({max}).expand({2}), from_vector<int64_t>({max, max})));
}

// --- printing -------------------------------------------------------------------------------

TEST(TensorPrint, Matrix) {
  EXPECT_EQ(arange(6).reshape({2, 3}).to_string(), "tensor([[0, 1, 2],\n        [3, 4, 5]], dtype=i64)");
}

TEST(TensorPrint, ThreeDimsSeparatesBlocksWithBlankLine) {
  EXPECT_EQ(arange(8).reshape({2, 2, 2}).to_string(),
            "tensor([[[0, 1],\n"
            "         [2, 3]],\n"
            "\n"
            "        [[4, 5],\n"
            "         [6, 7]]], dtype=i64)");
}

TEST(TensorPrint, VectorsRightAlign) {
  EXPECT_EQ(arange(3).to_string(), "tensor([0, 1, 2], dtype=i64)");
  EXPECT_EQ(from_vector<int32_t>({-1, 10, 5}).to_string(), "tensor([-1, 10,  5], dtype=i32)");
  EXPECT_EQ(from_vector<uint8_t>({255, 0}).to_string(), "tensor([255,   0], dtype=u8)");
}

// Floats print as PyTorch does: "1." when all values are integral, 4 decimals for moderate
// magnitudes, scientific when some magnitude is >= 1e8 or below 1e-4.
TEST(TensorPrint, FloatFormats) {
  EXPECT_EQ(from_vector<float>({0.5f, 1.0f, -2.25f}).to_string(), "tensor([ 0.5000,  1.0000, -2.2500], dtype=f32)");
  EXPECT_EQ(from_vector<float>({1.0f, 2.0f, -3.0f}).to_string(), "tensor([ 1.,  2., -3.], dtype=f32)");
  EXPECT_EQ(zeros({2}).to_string(), "tensor([0., 0.], dtype=f32)");
  EXPECT_EQ(arange(6).to(DType::f32).reshape({2, 3}).to_string(),
            "tensor([[0., 1., 2.],\n        [3., 4., 5.]], dtype=f32)");
  EXPECT_EQ(from_vector<double>({1e20, 0.001}).to_string(), "tensor([1.0000e+20, 1.0000e-03], dtype=f64)");
  EXPECT_EQ(from_vector<double>({1e-5, 1.0}).to_string(), "tensor([1.0000e-05, 1.0000e+00], dtype=f64)");
  EXPECT_EQ(from_vector<double>({1e8}).to_string(), "tensor([1.0000e+08], dtype=f64)");
  EXPECT_EQ(from_vector<Half>({Half(1.0f), Half(0.5f)}).to_string(), "tensor([1.0000, 0.5000], dtype=f16)");
  EXPECT_EQ(from_vector<Half>({Half(0.1f)}).to_string(), "tensor([0.1000], dtype=f16)");
  EXPECT_EQ(from_vector<float>({NAN, INFINITY, -INFINITY}).to_string(), "tensor([ nan,  inf, -inf], dtype=f32)");
  EXPECT_EQ(from_vector<float>({1.5f, NAN}).to_string(), "tensor([1.5000,    nan], dtype=f32)");
  EXPECT_EQ(from_vector<float>({2.0f, INFINITY}).to_string(), "tensor([ 2., inf], dtype=f32)");  // aligned to the widest entry
  EXPECT_EQ(scalar_tensor(3.5, DType::bf16).to_string(), "tensor(3.5000, dtype=bf16)");
}

TEST(TensorPrint, BoolPrintsWords) {
  EXPECT_EQ(from_vector(std::vector<bool>{true, false}).to_string(), "tensor([ true, false], dtype=b8)");
  EXPECT_EQ(scalar_tensor(true, DType::b8).to_string(), "tensor(true, dtype=b8)");
}

TEST(TensorPrint, ZeroDimEmptyUndefined) {
  EXPECT_EQ(scalar_tensor(3.5, DType::f64).to_string(), "tensor(3.5000, dtype=f64)");
  EXPECT_EQ(scalar_tensor(-2, DType::f32).to_string(), "tensor(-2., dtype=f32)");
  EXPECT_EQ(scalar_tensor(7, DType::i64).to_string(), "tensor(7, dtype=i64)");
  EXPECT_EQ(zeros({0, 3}).to_string(), "tensor([], shape=[0, 3], dtype=f32)");
  EXPECT_EQ(zeros({0}, DType::i32).to_string(), "tensor([], shape=[0], dtype=i32)");
  EXPECT_EQ(Tensor().to_string(), "tensor(undefined)");
}

TEST(TensorPrint, ViewsPrintTheirElements) {
  EXPECT_EQ(arange(6).view({2, 3}).t().to_string(), "tensor([[0, 3],\n        [1, 4],\n        [2, 5]], dtype=i64)");
  EXPECT_EQ(arange(2).expand({2, 2}).to_string(), "tensor([[0, 1],\n        [0, 1]], dtype=i64)");
  EXPECT_EQ(arange(12).view({3, 4}).narrow(1, 1, 2).select(0, 2).to_string(), "tensor([ 9, 10], dtype=i64)");
}

TEST(TensorPrint, LargeTensorsAreSummarised) {
  EXPECT_EQ(arange(2000).to_string(), "tensor([   0,    1,    2, ..., 1997, 1998, 1999], dtype=i64)");
  EXPECT_EQ(arange(2000).view({40, 50}).to_string(),
            "tensor([[   0,    1,    2, ...,   47,   48,   49],\n"
            "        [  50,   51,   52, ...,   97,   98,   99],\n"
            "        [ 100,  101,  102, ...,  147,  148,  149],\n"
            "        ...,\n"
            "        [1850, 1851, 1852, ..., 1897, 1898, 1899],\n"
            "        [1900, 1901, 1902, ..., 1947, 1948, 1949],\n"
            "        [1950, 1951, 1952, ..., 1997, 1998, 1999]], dtype=i64)");
  const std::string cube = zeros({20, 20, 20}).to_string();
  EXPECT_NE(cube.find("..."), std::string::npos);
  EXPECT_LT(cube.size(), 2000u);
  // Exactly 1000 elements are printed in full.
  const std::string thousand = arange(1000).to_string();
  EXPECT_EQ(thousand.find("..."), std::string::npos);
  EXPECT_NE(thousand.find(", 500, "), std::string::npos);
}

TEST(TensorPrint, StreamOperatorMatchesToString) {
  const Tensor x = arange(4).view({2, 2});
  std::ostringstream out;
  out << x;
  EXPECT_EQ(out.str(), x.to_string());
  std::ostringstream undefined;
  undefined << Tensor();
  EXPECT_EQ(undefined.str(), "tensor(undefined)");
}

// --- documented errors ----------------------------------------------------------------------

TEST(TensorErrors, ConstructorValidatesView) {
  const auto storage = Storage::allocate(6 * sizeof(float));
  EXPECT_TRUE(value_error([] { (void)Tensor(nullptr, {2}, {1}, 0, DType::f32); }, {"[Tensor]", "null storage"}));
  EXPECT_TRUE(value_error([&] { (void)Tensor(storage, {2, 3}, {3}, 0, DType::f32); },
                          {"[Tensor]", "shape [2, 3] and strides [3] differ in length"}));
  EXPECT_TRUE(value_error([&] { (void)Tensor(storage, {2, -3}, {3, 1}, 0, DType::f32); },
                          {"[Tensor]", "negative size in shape [2, -3]"}));
  EXPECT_TRUE(value_error([&] { (void)Tensor(storage, {2, 3}, {3, 1}, 1, DType::f32); },
                          {"[Tensor]", "view shape [2, 3] strides [3, 1] offset 1 reaches outside its storage of 24 bytes"}));
  EXPECT_TRUE(value_error([&] { (void)Tensor(storage, {4}, {1}, 0, DType::f64); }, {"[Tensor]", "storage of 24 bytes"}));
  EXPECT_TRUE(value_error([&] { (void)Tensor(storage, {2}, {-1}, 0, DType::f32); }, {"[Tensor]", "strides [-1]"}));
  EXPECT_NO_THROW(Tensor(storage, {2, 3}, {3, 1}, 0, DType::f32));
  EXPECT_NO_THROW(Tensor(storage, {0, 3}, {3, 1}, 100, DType::f32));  // no elements: nothing to reach
}

TEST(TensorErrors, StorageAllocate) {
  EXPECT_TRUE(value_error([] { (void)Storage::allocate(-1); }, {"[allocate]", "negative size -1 bytes"}));
  EXPECT_TRUE(value_error([] { (void)Storage::allocate(8, Device::cuda); },
                          {"[allocate]", "device cuda has no backend in this build; expected cpu"}));
}

TEST(TensorErrors, Factories) {
  EXPECT_TRUE(value_error([] { (void)empty({2, -1}); }, {"[empty]", "negative size in shape [2, -1]"}));
  EXPECT_TRUE(value_error([] { (void)zeros({-1}); }, {"negative size in shape [-1]"}));
  EXPECT_TRUE(value_error([] { (void)ones({3, -2}, DType::i32); }, {"negative size in shape [3, -2]"}));
  EXPECT_TRUE(value_error([] { (void)full({-4}, 1.0); }, {"negative size in shape [-4]"}));
  EXPECT_TRUE(value_error([] { (void)arange(-1); }, {"[arange]", "negative length -1"}));
  EXPECT_TRUE(value_error([] { (void)arange(0.0, 1.0, 0.0); }, {"[arange]", "step must be non-zero"}));
  EXPECT_TRUE(value_error([] { (void)arange(0.0, kInf, 1.0); }, {"[arange]", "non-finite bounds", "end inf"}));
  EXPECT_TRUE(value_error([] { (void)arange(kNaN, 1.0, 1.0); }, {"[arange]", "non-finite bounds"}));
  // A count that no int64 holds must not wrap around to an empty tensor.
  EXPECT_TRUE(value_error([] { (void)arange(0.0, 1e19, 1.0); }, {"[arange]", "too many elements"}));
  EXPECT_TRUE(value_error([] { (void)arange(-1e308, 1e308, 1.0); }, {"[arange]", "too many elements"}));
  EXPECT_TRUE(value_error([] { (void)eye(-2); }, {"[eye]", "negative size -2"}));
  EXPECT_TRUE(value_error([] { (void)eye(-1, 3); }, {"[eye]", "negative size -1"}));
}

TEST(TensorErrors, FromVector) {
  EXPECT_TRUE(value_error([] { (void)from_vector<float>({1, 2, 3, 4, 5}, {2, 3}); },
                          {"[from_vector]", "got 5 values for shape [2, 3]; expected 6"}));
  EXPECT_TRUE(value_error([] { (void)from_vector<int64_t>({}, {}); }, {"[from_vector]", "got 0 values for shape []; expected 1"}));
  EXPECT_TRUE(value_error([] { (void)from_vector<double>({1, 2, 3, 4, 5, 6}, {-2, -3}); },
                          {"[from_vector]", "negative size in shape [-2, -3]"}));
  EXPECT_TRUE(value_error([] { (void)from_vector(std::vector<bool>{true}, {2}); }, {"[from_vector]", "got 1 values"}));
}

TEST(TensorErrors, UndefinedTensorThrowsValueError) {
  const Tensor u;
  Tensor m;
  EXPECT_FALSE(u.defined());
  const Tensor copy = u;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_FALSE(copy.defined());
  const std::string undefined = "tensor is undefined";
  EXPECT_TRUE(value_error([&] { (void)u.view({1}); }, {"[view]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.reshape({1}); }, {"[reshape]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.transpose(0, 0); }, {"[transpose]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.t(); }, {"[t]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.permute({}); }, {"[permute]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.narrow(0, 0, 0); }, {"[narrow]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.select(0, 0); }, {"[select]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.unsqueeze(0); }, {"[unsqueeze]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.squeeze(); }, {"[squeeze]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.squeeze(0); }, {"[squeeze]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.flatten(); }, {"[flatten]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.expand({2}); }, {"[expand]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.broadcast_to({2}); }, {"[expand]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.as_strided({1}, {1}, 0); }, {"[as_strided]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.contiguous(); }, {"[contiguous]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.clone(); }, {"[clone]", undefined}));
  EXPECT_TRUE(value_error([&] { m.copy_(ones({1})); }, {"[copy_]", undefined}));
  EXPECT_TRUE(value_error([&] { m.fill_(1); }, {"[fill_]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.to(DType::f64); }, {"[to]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.to(DType::f32); }, {"[to]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.item(); }, {"[item]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.item<int32_t>(); }, {"[item]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.to_vector<float>(); }, {"[to_vector]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.raw_data(); }, {"[raw_data]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)m.raw_data(); }, {"[raw_data]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.data<float>(); }, {"[data]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.device(); }, {"[device]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.size(0); }, {"[size]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)u.stride(0); }, {"[stride]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)empty_like(u); }, {"[empty_like]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)zeros_like(u); }, {"[zeros_like]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)ones_like(u); }, {"[ones_like]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)allclose(u, ones({1})); }, {"[allclose]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)allclose(ones({1}), u); }, {"[allclose]", undefined}));
  EXPECT_TRUE(value_error([&] { (void)equal(u, u); }, {"[equal]", undefined}));
  Tensor dst = zeros({1});
  EXPECT_TRUE(value_error([&] { dst.copy_(u); }, {"[copy_]", "source tensor is undefined"}));
  EXPECT_EQ(u.to_string(), "tensor(undefined)");  // printing an undefined tensor is allowed
}
