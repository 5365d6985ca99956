// matmul, bmm, linear and the BLAS thread setting, checked against a naive triple loop over
// std::vector<double> (torch.matmul semantics written out independently of Tessera's views).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/tensor.hpp>
#include <tessera/ops/ops.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// Deterministic values in [-2, 2] in quarter steps: exact in every floating dtype.
Tensor quarters(const Shape& shape, int seed, DType dtype = DType::f64) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((static_cast<int64_t>(i) * 7 + seed * 3) % 17 - 8) / 4.0;
  return from_vector(v, shape).to(dtype);
}

// Deterministic irrational-looking values in [-1, 1] (sums are not exact in f32).
Tensor wavy(const Shape& shape, int seed, DType dtype = DType::f64) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + 1.3 * seed);
  return from_vector(v, shape).to(dtype);
}

// Small non-negative integers in [0, 8]: exact in every numeric dtype, u8 included.
Tensor counts(const Shape& shape, int seed, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((static_cast<int64_t>(i) * 7 + seed * 3) % 9);
  return from_vector(v, shape).to(dtype);
}

// Small signed integers in [-4, 4].
Tensor small_ints(const Shape& shape, int seed, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((static_cast<int64_t>(i) * 5 + seed) % 9 - 4);
  return from_vector(v, shape).to(dtype);
}

struct Ref {
  std::vector<int64_t> shape;
  std::vector<double> values;
};

// torch.matmul on row-major values: 1-d operands promoted and the added dim dropped, batch
// dims broadcast by index arithmetic, and a naive i-j-p loop per batch.
Ref ref_matmul(const std::vector<double>& av, std::vector<int64_t> as, const std::vector<double>& bv,
               std::vector<int64_t> bs) {
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  EXPECT_EQ(k, bs[bs.size() - 2]) << "reference: inner dims differ";
  std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const size_t nb = std::max(ab.size(), bb.size());
  ab.insert(ab.begin(), nb - ab.size(), 1);
  bb.insert(bb.begin(), nb - bb.size(), 1);
  std::vector<int64_t> batch(nb);
  int64_t batches = 1;
  for (size_t d = 0; d < nb; ++d) {
    batch[d] = ab[d] == 1 ? bb[d] : ab[d];
    batches *= batch[d];
  }
  Ref ref;
  ref.values.assign(static_cast<size_t>(batches * m * n), 0.0);
  for (int64_t flat = 0; flat < batches; ++flat) {
    int64_t rem = flat, a_off = 0, b_off = 0, a_stride = 1, b_stride = 1;
    for (size_t d = nb; d-- > 0;) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      a_off += (ab[d] == 1 ? 0 : idx) * a_stride;
      b_off += (bb[d] == 1 ? 0 : idx) * b_stride;
      a_stride *= ab[d];
      b_stride *= bb[d];
    }
    const double* pa = av.data() + a_off * m * k;
    const double* pb = bv.data() + b_off * k * n;
    double* po = ref.values.data() + flat * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += pa[i * k + p] * pb[p * n + j];
        po[i * n + j] = sum;
      }
  }
  ref.shape = batch;
  if (!a_vec) ref.shape.push_back(m);
  if (!b_vec) ref.shape.push_back(n);
  return ref;
}

Ref ref_matmul(const Tensor& a, const Tensor& b) {
  return ref_matmul(a.to_vector<double>(), a.shape().vec(), b.to_vector<double>(), b.shape().vec());
}

// x @ weight^T + bias on row-major values, x [..., in], weight [out, in], bias [out].
Ref ref_linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const std::vector<double> xv = x.to_vector<double>(), wv = weight.to_vector<double>();
  const std::vector<double> bv = bias ? bias->to_vector<double>() : std::vector<double>(static_cast<size_t>(out), 0.0);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.ndim(); ++d) rows *= x.shape()[d];
  Ref ref;
  ref.shape = x.shape().vec();
  ref.shape.back() = out;
  ref.values.assign(static_cast<size_t>(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = bv[static_cast<size_t>(o)];
      for (int64_t p = 0; p < in; ++p) sum += xv[static_cast<size_t>(r * in + p)] * wv[static_cast<size_t>(o * in + p)];
      ref.values[static_cast<size_t>(r * out + o)] = sum;
    }
  return ref;
}

// Shape equal and every value within atol + rtol * |ref|.
void expect_matches(const Tensor& out, const Ref& ref, double rtol = 0, double atol = 0) {
  ASSERT_EQ(out.shape(), Shape(ref.shape)) << "got " << out.shape().to_string();
  const std::vector<double> got = out.to_vector<double>();
  ASSERT_EQ(got.size(), ref.values.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - ref.values[i]), atol + rtol * std::abs(ref.values[i]))
        << "element " << i << ": got " << got[i] << ", expected " << ref.values[i];
}

void expect_matmul(const Tensor& a, const Tensor& b, double rtol = 0, double atol = 0) {
  SCOPED_TRACE(a.shape().to_string() + " @ " + b.shape().to_string());
  const Tensor out = matmul(a, b);
  EXPECT_EQ(out.dtype(), promote_types(a.dtype(), b.dtype()));
  expect_matches(out, ref_matmul(a, b), rtol, atol);
}

// Relative tolerance for results rounded to dtype (inputs are exact in every dtype).
double rtol_of(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    case DType::bf16:
      return 1e-2;
    default:
      return 0;
  }
}

}  // namespace

// --- matmul: ranks ---------------------------------------------------------------------------

TEST(Matmul, DotProductOf1dAnd1dIs0d) {
  const Tensor a = from_vector<double>({1, 2, 3});
  const Tensor b = from_vector<double>({4, -5, 6});
  const Tensor out = matmul(a, b);
  EXPECT_EQ(out.ndim(), 0);
  EXPECT_EQ(out.dtype(), DType::f64);
  EXPECT_EQ(out.item(), 1 * 4 - 2 * 5 + 3 * 6);
  expect_matmul(quarters({9}, 1), quarters({9}, 2));
}

TEST(Matmul, VectorAtMatrix) {
  // [1, 2] @ [[1, 2, 3], [4, 5, 6]] = [9, 12, 15]
  const Tensor out = matmul(from_vector<double>({1, 2}), from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_EQ(out.shape(), Shape({3}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{9, 12, 15}));
  expect_matmul(quarters({5}, 1), quarters({5, 4}, 2));
}

TEST(Matmul, MatrixAtVector) {
  // [[1, 2, 3], [4, 5, 6]] @ [1, 0, -1] = [-2, -2]
  const Tensor out = matmul(from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}), from_vector<double>({1, 0, -1}));
  EXPECT_EQ(out.shape(), Shape({2}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{-2, -2}));
  expect_matmul(quarters({6, 5}, 1), quarters({5}, 2));
}

TEST(Matmul, MatrixAtMatrixHandComputed) {
  // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
  const Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  const Tensor b = from_vector<float>({5, 6, 7, 8}, {2, 2});
  EXPECT_TRUE(equal(matmul(a, b), from_vector<float>({19, 22, 43, 50}, {2, 2})));
}

TEST(Matmul, MatrixAtMatrixShapes) {
  const std::vector<std::vector<int64_t>> mkn = {{1, 1, 1}, {7, 5, 3}, {3, 5, 7}, {1, 8, 1}, {8, 1, 8}, {64, 64, 64}};
  for (const auto& s : mkn) {
    for (DType dt : {DType::f32, DType::f64}) {
      SCOPED_TRACE(name(dt));
      expect_matmul(quarters({s[0], s[1]}, 1, dt), quarters({s[1], s[2]}, 2, dt));  // exact in both
      expect_matmul(wavy({s[0], s[1]}, 3, dt), wavy({s[1], s[2]}, 4, dt), rtol_of(dt), 1e-5);
    }
  }
}

TEST(Matmul, Batched3dAt3d) {
  expect_matmul(quarters({4, 3, 5}, 1), quarters({4, 5, 2}, 2));
  expect_matmul(wavy({3, 7, 5}, 1, DType::f32), wavy({3, 5, 6}, 2, DType::f32), 1e-5, 1e-5);
  // Batch of 1 on one side broadcasts.
  expect_matmul(quarters({1, 3, 5}, 1), quarters({4, 5, 2}, 2));
  expect_matmul(quarters({4, 3, 5}, 1), quarters({1, 5, 2}, 2));
}

TEST(Matmul, BatchDimsBroadcast) {
  const Tensor a = quarters({2, 1, 3, 4}, 1), b = quarters({5, 4, 2}, 2);
  EXPECT_EQ(matmul(a, b).shape(), Shape({2, 5, 3, 2}));
  expect_matmul(a, b);
  expect_matmul(quarters({3, 1, 2, 4}, 1), quarters({1, 6, 4, 3}, 2));
  expect_matmul(quarters({3}, 1), quarters({2, 4, 3, 5}, 2));  // 1-d @ 4-d
  expect_matmul(quarters({2, 4, 3, 5}, 1), quarters({5}, 2));  // 4-d @ 1-d
}

TEST(Matmul, BatchedAtMatrixFoldsIntoOneGemm) {
  expect_matmul(quarters({2, 3, 4}, 1), quarters({4, 5}, 2));
  expect_matmul(quarters({2, 2, 3, 4}, 1), quarters({1, 1, 4, 5}, 2));  // b's size-1 batch dims fold too
  expect_matmul(wavy({6, 7, 5}, 1, DType::f32), wavy({5, 3}, 2, DType::f32), 1e-5, 1e-5);
}

TEST(Matmul, MatrixAtBatched) {
  expect_matmul(quarters({3, 4}, 1), quarters({2, 4, 5}, 2));
  expect_matmul(quarters({3, 4}, 1), quarters({2, 3, 4, 5}, 2));
}

// --- matmul: strided operands ------------------------------------------------------------------

TEST(Matmul, TransposedOperands) {
  for (DType dt : {DType::f32, DType::f64, DType::i64}) {
    SCOPED_TRACE(name(dt));
    const Tensor at = quarters({5, 7}, 1).to(dt).t();  // [7, 5], strides [1, 7]
    const Tensor bt = quarters({3, 5}, 2).to(dt).t();  // [5, 3], strides [1, 5]
    ASSERT_FALSE(at.is_contiguous());
    ASSERT_FALSE(bt.is_contiguous());
    const Tensor a = quarters({7, 5}, 3).to(dt), b = quarters({5, 3}, 4).to(dt);
    expect_matmul(at, b);
    expect_matmul(a, bt);
    expect_matmul(at, bt);
    expect_matmul(at, at.t());  // x @ x^T: both views of one storage
  }
}

TEST(Matmul, TransposedBatched) {
  const Tensor a = quarters({2, 5, 3}, 1).transpose(1, 2);  // [2, 3, 5]
  const Tensor b = quarters({2, 4, 5}, 2).transpose(-1, -2);  // [2, 5, 4]
  ASSERT_FALSE(a.is_contiguous());
  expect_matmul(a, b);
  expect_matmul(a, quarters({5, 4}, 3));                        // folded path with a non-viewable a
  expect_matmul(quarters({4, 2, 3}, 4).permute({1, 0, 2}), quarters({3, 6}, 5));  // permuted batch
  expect_matmul(quarters({3, 2, 5}, 6).transpose(0, 1), quarters({2, 5, 4}, 7));  // batch dim not outermost
}

TEST(Matmul, NarrowedSubMatrices) {
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(name(dt));
    // Row stride 9 > 4 columns.
    const Tensor a = quarters({6, 9}, 1, dt).narrow(1, 2, 4).narrow(0, 1, 4);  // [4, 4]
    const Tensor b = quarters({8, 10}, 2, dt).narrow(0, 1, 4).narrow(1, 3, 5);  // [4, 5]
    ASSERT_EQ(a.strides()[0], 9);
    ASSERT_EQ(b.strides()[0], 10);
    expect_matmul(a, b);
    // Narrowed transposes: column stride larger than the rows.
    const Tensor at = quarters({9, 6}, 3, dt).t().narrow(1, 2, 4).narrow(0, 1, 3);  // [3, 4], strides [1, 6]
    expect_matmul(at, b.narrow(1, 0, 2));
    expect_matmul(a, quarters({10, 8}, 4, dt).t().narrow(0, 2, 4).narrow(1, 1, 6));
    // Every other column: neither layout BLAS can describe.
    const Tensor gappy = quarters({4, 10}, 5, dt).as_strided({4, 5}, {10, 2}, 0);
    expect_matmul(gappy, quarters({5, 3}, 6, dt));
    expect_matmul(quarters({2, 4}, 7, dt), gappy);
  }
}

TEST(Matmul, RowAndColumnViews) {
  const Tensor base = quarters({6, 4}, 1);
  const Tensor row = base.t().narrow(0, 1, 1);     // [1, 6], strides [1, 4]
  const Tensor col = base.narrow(1, 2, 1);         // [6, 1], strides [4, 1]
  const Tensor col_t = base.t().t().narrow(1, 0, 1);
  expect_matmul(row, col);
  expect_matmul(col, row);
  expect_matmul(row, col_t);
  expect_matmul(base.select(1, 3), quarters({6, 2}, 2));  // 1-d with stride 4
  expect_matmul(quarters({2, 6}, 3), base.select(1, 0));
  expect_matmul(base.select(1, 1), base.select(1, 2));   // strided dot product
}

TEST(Matmul, ExpandedInputs) {
  expect_matmul(quarters({1, 5}, 1).expand({4, 5}), quarters({5, 3}, 2));         // row stride 0
  expect_matmul(quarters({4, 5}, 1), quarters({5, 1}, 2).expand({5, 3}));         // column stride 0
  expect_matmul(quarters({3, 1}, 1).expand({3, 4}), quarters({4, 2}, 2));
  expect_matmul(quarters({1, 1}, 1).expand({3, 4}), quarters({1, 1}, 2).expand({4, 2}));
  expect_matmul(quarters({3, 4}, 1).expand({2, 3, 4}), quarters({2, 4, 5}, 2));  // batch stride 0
  expect_matmul(quarters({2, 3, 4}, 1), quarters({4, 5}, 2).expand({2, 4, 5}));
  expect_matmul(quarters({4}, 1).expand({3, 4}), quarters({4}, 2));
}

TEST(Matmul, ResultIsFreshContiguousStorage) {
  const Tensor a = quarters({3, 4}, 1), b = quarters({4, 2}, 2);
  Tensor out = matmul(a, b);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_NE(out.storage(), a.storage());
  EXPECT_NE(out.storage(), b.storage());
  const std::vector<double> before = a.to_vector<double>();
  out.fill_(0);
  EXPECT_EQ(a.to_vector<double>(), before);
}

// --- matmul: dtypes ----------------------------------------------------------------------------

TEST(Matmul, FloatDTypes) {
  for (DType dt : floating_dtypes()) {
    SCOPED_TRACE(name(dt));
    const double rtol = rtol_of(dt);
    expect_matmul(quarters({7, 5}, 1, dt), quarters({5, 3}, 2, dt), rtol);
    expect_matmul(quarters({2, 3, 6}, 1, dt), quarters({2, 6, 4}, 2, dt), rtol);
    expect_matmul(quarters({2, 3, 6}, 1, dt), quarters({6, 4}, 2, dt), rtol);
    expect_matmul(quarters({6, 3}, 1, dt).t(), quarters({6}, 2, dt), rtol);
    expect_matmul(wavy({16, 24}, 3, dt), wavy({24, 8}, 4, dt), rtol, rtol);
  }
}

TEST(Matmul, HalfDTypesAccumulateInF32) {
  // 4096 ones summed in f16 would stop at 2048 (bf16 at 256); via f32 the sum is exact and
  // 4096 is representable in both.
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(name(dt));
    const Tensor out = matmul(ones({1, 4096}, dt), ones({4096, 1}, dt));
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.item(), 4096.0);
    const Tensor dot = matmul(ones({4096}, dt), ones({4096}, dt));
    EXPECT_EQ(dot.dtype(), dt);
    EXPECT_EQ(dot.item(), 4096.0);
  }
}

TEST(Matmul, IntegerDTypesExact) {
  for (DType dt : {DType::i32, DType::i64}) {
    SCOPED_TRACE(name(dt));
    expect_matmul(small_ints({7, 5}, 1, dt), small_ints({5, 3}, 2, dt));
    expect_matmul(small_ints({2, 1, 3, 4}, 1, dt), small_ints({5, 4, 2}, 2, dt));
    expect_matmul(small_ints({2, 3, 4}, 1, dt), small_ints({4, 5}, 2, dt));
    expect_matmul(small_ints({5, 7}, 1, dt).t(), small_ints({5, 3}, 2, dt).narrow(1, 1, 2));
    expect_matmul(small_ints({6}, 1, dt), small_ints({6}, 2, dt));
  }
  // i64 beyond 2^53 is exact (no detour through double).
  const Tensor big = from_vector<int64_t>({int64_t{1} << 40, 3}, {1, 2});
  const Tensor col = from_vector<int64_t>({(int64_t{1} << 20) + 1, 1}, {2, 1});
  EXPECT_EQ(matmul(big, col).item<int64_t>(), (int64_t{1} << 60) + (int64_t{1} << 40) + 3);
}

TEST(Matmul, U8WrapsModulo256) {
  std::vector<double> av(12), bv(8);
  for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<double>((i * 37 + 11) % 256);
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<double>((i * 53 + 200) % 256);
  const Tensor a = from_vector(av, {3, 4}).to(DType::u8), b = from_vector(bv, {4, 2}).to(DType::u8);
  const Tensor out = matmul(a, b);
  EXPECT_EQ(out.dtype(), DType::u8);
  Ref ref = ref_matmul(av, {3, 4}, bv, {4, 2});
  for (double& v : ref.values) v = std::fmod(v, 256.0);
  expect_matches(out, ref);
  // Small values: no wrap, the plain product.
  const Tensor s = from_vector<uint8_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_TRUE(equal(matmul(s, s.t()), from_vector<uint8_t>({14, 32, 32, 77}, {2, 2})));
}

TEST(Matmul, MixedDTypesPromote) {
  struct Case {
    DType a, b, out;
  };
  const Case cases[] = {{DType::f32, DType::f64, DType::f64}, {DType::f64, DType::f32, DType::f64},
                        {DType::i32, DType::f32, DType::f32}, {DType::u8, DType::i64, DType::i64},
                        {DType::u8, DType::i32, DType::i32},  {DType::f16, DType::bf16, DType::f32},
                        {DType::i64, DType::f16, DType::f16}, {DType::f16, DType::f32, DType::f32},
                        {DType::b8, DType::f32, DType::f32}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(name(c.a)) + " @ " + std::string(name(c.b)));
    const Tensor a = c.a == DType::b8 ? from_vector<bool>({true, false, true, true, false, true}, {2, 3})
                                      : counts({2, 3}, 1, c.a);
    const Tensor b = counts({3, 4}, 2, c.b);
    const Tensor out = matmul(a, b);
    EXPECT_EQ(out.dtype(), c.out);
    expect_matches(out, ref_matmul(a, b), rtol_of(c.out));
  }
}

// --- matmul: zero sizes --------------------------------------------------------------------------

TEST(Matmul, ZeroSizes) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    SCOPED_TRACE(name(dt));
    // m = 0 and n = 0: empty results.
    EXPECT_EQ(matmul(ones({0, 3}, dt), ones({3, 4}, dt)).shape(), Shape({0, 4}));
    EXPECT_EQ(matmul(ones({2, 3}, dt), ones({3, 0}, dt)).shape(), Shape({2, 0}));
    EXPECT_EQ(matmul(ones({0, 3}, dt), ones({3, 0}, dt)).shape(), Shape({0, 0}));
    // k = 0: zeros, whatever memory empty() returned.
    for (int rep = 0; rep < 3; ++rep) {
      const Tensor out = matmul(ones({2, 0}, dt), ones({0, 4}, dt));
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_TRUE(equal(out, zeros({2, 4}, dt)));
    }
    EXPECT_TRUE(equal(matmul(ones({0}, dt), ones({0}, dt)), zeros({}, dt)));
    EXPECT_TRUE(equal(matmul(ones({0}, dt), ones({0, 3}, dt)), zeros({3}, dt)));
    EXPECT_TRUE(equal(matmul(ones({2, 1, 3, 0}, dt), ones({5, 0, 2}, dt)), zeros({2, 5, 3, 2}, dt)));
    EXPECT_TRUE(equal(matmul(ones({2, 3, 0}, dt), ones({0, 2}, dt)), zeros({2, 3, 2}, dt)));
    // Zero batch.
    EXPECT_EQ(matmul(ones({0, 2, 3}, dt), ones({3, 4}, dt)).shape(), Shape({0, 2, 4}));
    EXPECT_EQ(matmul(ones({0, 2, 3}, dt), ones({1, 3, 4}, dt)).shape(), Shape({0, 2, 4}));
    EXPECT_EQ(matmul(ones({2, 0, 3}, dt), ones({2, 3, 4}, dt)).shape(), Shape({2, 0, 4}));
  }
}

// --- matmul: errors ------------------------------------------------------------------------------

TEST(Matmul, ErrorInnerDimsDiffer) {
  const std::string msg = value_error_message([] { matmul(zeros({2, 3}), zeros({4, 5})); });
  EXPECT_TRUE(starts_with(msg, "[matmul] inner dims differ: [2, 3] @ [4, 5]")) << msg;
  const std::string vec = value_error_message([] { matmul(zeros({3}), zeros({4})); });
  EXPECT_TRUE(starts_with(vec, "[matmul] inner dims differ: [3] @ [4]")) << vec;
  const std::string batched = value_error_message([] { matmul(zeros({2, 2, 3}), zeros({2, 2, 3})); });
  EXPECT_TRUE(starts_with(batched, "[matmul] inner dims differ: [2, 2, 3] @ [2, 2, 3]")) << batched;
}

TEST(Matmul, ErrorBatchDimsDoNotBroadcast) {
  const std::string msg = value_error_message([] { matmul(zeros({2, 3, 4}), zeros({3, 4, 5})); });
  EXPECT_TRUE(starts_with(msg, "[matmul] ")) << msg;
  EXPECT_TRUE(contains(msg, "[2, 3, 4]") && contains(msg, "[3, 4, 5]")) << msg;
  EXPECT_TRUE(contains(msg, "broadcast")) << msg;
  const std::string deep = value_error_message([] { matmul(zeros({2, 1, 3, 4}), zeros({3, 5, 4, 5})); });
  EXPECT_TRUE(contains(deep, "[2, 1, 3, 4]") && contains(deep, "[3, 5, 4, 5]")) << deep;
}

TEST(Matmul, ErrorZeroDimOperand) {
  const std::string msg = value_error_message([] { matmul(scalar_tensor(2.0, DType::f32), zeros({3})); });
  EXPECT_TRUE(starts_with(msg, "[matmul] ")) << msg;
  EXPECT_TRUE(contains(msg, "at least 1 dim") && contains(msg, "[]") && contains(msg, "[3]")) << msg;
  const std::string right = value_error_message([] { matmul(zeros({2, 3}), scalar_tensor(2.0, DType::f32)); });
  EXPECT_TRUE(starts_with(right, "[matmul] ") && contains(right, "[2, 3]")) << right;
}

TEST(Matmul, ErrorBoolDType) {
  const Tensor b = from_vector<bool>({true, false, false, true}, {2, 2});
  const std::string msg = value_error_message([&] { matmul(b, b); });
  EXPECT_TRUE(starts_with(msg, "[matmul] ")) << msg;
  EXPECT_TRUE(contains(msg, "b8") && contains(msg, "[2, 2] @ [2, 2]")) << msg;
}

TEST(Matmul, ErrorUndefinedTensor) {
  const std::string msg = value_error_message([] { matmul(Tensor(), zeros({2, 2})); });
  EXPECT_TRUE(starts_with(msg, "[matmul] ") && contains(msg, "undefined")) << msg;
}

// --- bmm -------------------------------------------------------------------------------------------

TEST(Bmm, MatchesReference) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::i32}) {
    SCOPED_TRACE(name(dt));
    const Tensor a = small_ints({3, 2, 4}, 1, dt), b = small_ints({3, 4, 5}, 2, dt);
    const Tensor out = bmm(a, b);
    EXPECT_EQ(out.dtype(), dt);
    expect_matches(out, ref_matmul(a, b), rtol_of(dt));
  }
}

TEST(Bmm, StridedOperands) {
  const Tensor a = quarters({3, 4, 2}, 1).transpose(1, 2);       // [3, 2, 4]
  const Tensor b = quarters({5, 3, 4}, 2).permute({1, 2, 0});    // [3, 4, 5]
  expect_matches(bmm(a, b), ref_matmul(a, b));
  const Tensor c = quarters({1, 2, 4}, 3).expand({3, 2, 4});
  expect_matches(bmm(c, b), ref_matmul(c, b));
  expect_matches(bmm(a, quarters({3, 4, 0}, 4)), ref_matmul(a, quarters({3, 4, 0}, 4)));
}

TEST(Bmm, ErrorNot3d) {
  const std::string msg = value_error_message([] { bmm(zeros({2, 3}), zeros({2, 3, 4})); });
  EXPECT_TRUE(starts_with(msg, "[bmm] ")) << msg;
  EXPECT_TRUE(contains(msg, "3-d") && contains(msg, "[2, 3]") && contains(msg, "[2, 3, 4]")) << msg;
  const std::string four = value_error_message([] { bmm(zeros({1, 2, 3, 4}), zeros({1, 2, 4, 3})); });
  EXPECT_TRUE(starts_with(four, "[bmm] ") && contains(four, "[1, 2, 3, 4]")) << four;
  const std::string zero_d = value_error_message([] { bmm(scalar_tensor(1.0, DType::f32), zeros({2, 3, 4})); });
  EXPECT_TRUE(starts_with(zero_d, "[bmm] ")) << zero_d;
}

TEST(Bmm, ErrorBatchSizesDiffer) {
  // No broadcasting in bmm, not even from a batch of 1.
  for (int64_t other : {3, 1}) {
    const std::string msg = value_error_message([&] { bmm(zeros({2, 3, 4}), zeros({other, 4, 5})); });
    const std::string other_shape = Shape({other, 4, 5}).to_string();
    EXPECT_TRUE(starts_with(msg, "[bmm] ")) << msg;
    EXPECT_TRUE(contains(msg, "[2, 3, 4]") && contains(msg, other_shape)) << msg;
  }
}

TEST(Bmm, ErrorInnerDimsDiffer) {
  const std::string msg = value_error_message([] { bmm(zeros({2, 3, 4}), zeros({2, 5, 6})); });
  EXPECT_TRUE(starts_with(msg, "[bmm] inner dims differ: [2, 3, 4] @ [2, 5, 6]")) << msg;
}

// --- linear ----------------------------------------------------------------------------------------

TEST(Linear, HandComputed) {
  // x [[1, 2]], weight [[1, 0], [1, 1], [0, -1]], bias [10, 20, 30] -> [[11, 23, 28]]
  const Tensor x = from_vector<float>({1, 2}, {1, 2});
  const Tensor w = from_vector<float>({1, 0, 1, 1, 0, -1}, {3, 2});
  const Tensor bias = from_vector<float>({10, 20, 30});
  EXPECT_TRUE(equal(linear(x, w), from_vector<float>({1, 3, -2}, {1, 3})));
  EXPECT_TRUE(equal(linear(x, w, bias), from_vector<float>({11, 23, 28}, {1, 3})));
}

TEST(Linear, WithoutBias) {
  for (DType dt : floating_dtypes()) {
    SCOPED_TRACE(name(dt));
    const Tensor x = quarters({5, 4}, 1, dt), w = quarters({3, 4}, 2, dt);
    const Tensor out = linear(x, w);
    EXPECT_EQ(out.dtype(), dt);
    expect_matches(out, ref_linear(x, w, std::nullopt), rtol_of(dt));
  }
}

TEST(Linear, WithBias) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    SCOPED_TRACE(name(dt));
    const Tensor x = small_ints({5, 4}, 1, dt), w = small_ints({3, 4}, 2, dt);
    const Tensor bias = small_ints({3}, 3, dt);
    const Tensor out = linear(x, w, bias);
    EXPECT_EQ(out.dtype(), dt);
    expect_matches(out, ref_linear(x, w, bias), rtol_of(dt));
    // Called twice: the bias is not accumulated into from a previous call.
    expect_matches(linear(x, w, bias), ref_linear(x, w, bias), rtol_of(dt));
  }
}

TEST(Linear, BiasOfOtherDTypePromotes) {
  const Tensor x = quarters({2, 3}, 1, DType::f32), w = quarters({4, 3}, 2, DType::f32);
  const Tensor b64 = wavy({4}, 3, DType::f64);
  const Tensor out = linear(x, w, b64);
  EXPECT_EQ(out.dtype(), DType::f64);
  expect_matches(out, ref_linear(x, w, b64), 1e-12, 1e-12);  // f32 inputs are exact quarters
  const Tensor half_out = linear(quarters({2, 3}, 1, DType::f16), quarters({4, 3}, 2, DType::f16), quarters({4}, 3, DType::f32));
  EXPECT_EQ(half_out.dtype(), DType::f32);
  const Tensor int_out = linear(small_ints({2, 3}, 1, DType::i32), small_ints({4, 3}, 2, DType::i32), quarters({4}, 3, DType::f32));
  EXPECT_EQ(int_out.dtype(), DType::f32);
  expect_matches(int_out, ref_linear(small_ints({2, 3}, 1, DType::i32), small_ints({4, 3}, 2, DType::i32), quarters({4}, 3)));
  const Tensor i64_bias = linear(small_ints({2, 3}, 1, DType::i32), small_ints({4, 3}, 2, DType::i32), small_ints({4}, 3, DType::i64));
  EXPECT_EQ(i64_bias.dtype(), DType::i64);
  // Mixed x / weight dtypes promote too.
  EXPECT_EQ(linear(quarters({2, 3}, 1, DType::f32), quarters({4, 3}, 2, DType::f64)).dtype(), DType::f64);
}

TEST(Linear, InputOfAnyRank) {
  const Tensor w = quarters({5, 4}, 1), bias = quarters({5}, 2);
  for (const Shape& shape : {Shape{4}, Shape{3, 4}, Shape{2, 3, 4}, Shape{2, 1, 3, 4}}) {
    SCOPED_TRACE(shape.to_string());
    const Tensor x = quarters(shape, 3);
    expect_matches(linear(x, w), ref_linear(x, w, std::nullopt));
    expect_matches(linear(x, w, bias), ref_linear(x, w, bias));
  }
}

TEST(Linear, StridedViews) {
  const Tensor w = quarters({4, 5}, 1).t();  // [5, 4] weight, transposed view (already row-major [in, out])
  ASSERT_FALSE(w.is_contiguous());
  const Tensor bias = quarters({10}, 2).narrow(0, 3, 5);
  const Tensor x = quarters({4, 6}, 3).t();  // [6, 4]
  expect_matches(linear(x, w), ref_linear(x, w, std::nullopt));
  expect_matches(linear(x, w, bias), ref_linear(x, w, bias));
  const Tensor x3 = quarters({2, 4, 3}, 4).transpose(1, 2);  // [2, 3, 4], not viewable as [6, 4]
  expect_matches(linear(x3, w, bias), ref_linear(x3, w, bias));
  const Tensor xe = quarters({1, 4}, 5).expand({3, 4});
  expect_matches(linear(xe, w, bias), ref_linear(xe, w, bias));
  const Tensor be = quarters({1}, 6).expand({5});  // stride-0 bias
  expect_matches(linear(x, w, be), ref_linear(x, w, be));
}

TEST(Linear, ZeroSizes) {
  for (DType dt : {DType::f32, DType::i64}) {
    SCOPED_TRACE(name(dt));
    // No rows.
    const Tensor none = linear(ones({0, 4}, dt), ones({3, 4}, dt), ones({3}, dt));
    EXPECT_EQ(none.shape(), Shape({0, 3}));
    // in_features = 0: the result is the bias (zeros without one).
    EXPECT_TRUE(equal(linear(ones({2, 0}, dt), ones({3, 0}, dt), full({3}, 7, dt)), full({2, 3}, 7, dt)));
    EXPECT_TRUE(equal(linear(ones({2, 0}, dt), ones({3, 0}, dt)), zeros({2, 3}, dt)));
    EXPECT_TRUE(equal(linear(ones({2, 5, 0}, dt), ones({3, 0}, dt), full({3}, 7, dt)), full({2, 5, 3}, 7, dt)));
    // out_features = 0.
    EXPECT_EQ(linear(ones({2, 4}, dt), ones({0, 4}, dt), ones({0}, dt)).shape(), Shape({2, 0}));
    EXPECT_EQ(linear(ones({2, 4}, dt), ones({0, 4}, dt)).shape(), Shape({2, 0}));
    // Everything empty.
    EXPECT_EQ(linear(ones({0, 0}, dt), ones({0, 0}, dt), ones({0}, dt)).shape(), Shape({0, 0}));
  }
}

TEST(Linear, ErrorWeightNot2d) {
  const std::string msg = value_error_message([] { linear(zeros({2, 3}), zeros({3})); });
  EXPECT_TRUE(starts_with(msg, "[linear] weight must be 2-d")) << msg;
  EXPECT_TRUE(contains(msg, "[3]")) << msg;
  const std::string three = value_error_message([] { linear(zeros({2, 3}), zeros({1, 4, 3})); });
  EXPECT_TRUE(starts_with(three, "[linear] ") && contains(three, "[1, 4, 3]")) << three;
}

TEST(Linear, ErrorInFeaturesMismatch) {
  const std::string msg = value_error_message([] { linear(zeros({2, 3}), zeros({5, 4})); });
  EXPECT_TRUE(starts_with(msg, "[linear] ")) << msg;
  EXPECT_TRUE(contains(msg, "[2, 3]") && contains(msg, "in_features 4") && contains(msg, "[5, 4]")) << msg;
  // The same with a bias: checked before the bias.
  const std::string with_bias = value_error_message([] { linear(zeros({2, 3}), zeros({5, 4}), zeros({5})); });
  EXPECT_TRUE(starts_with(with_bias, "[linear] ") && contains(with_bias, "in_features 4")) << with_bias;
}

TEST(Linear, ErrorBiasShape) {
  const std::string msg = value_error_message([] { linear(zeros({2, 4}), zeros({5, 4}), zeros({4})); });
  EXPECT_TRUE(starts_with(msg, "[linear] bias shape [4] must be [5]")) << msg;
  EXPECT_TRUE(contains(msg, "[5, 4]")) << msg;
  const std::string two_d = value_error_message([] { linear(zeros({2, 4}), zeros({5, 4}), zeros({1, 5})); });
  EXPECT_TRUE(starts_with(two_d, "[linear] bias shape [1, 5] must be [5]")) << two_d;
  const std::string zero_d = value_error_message([] { linear(zeros({2, 4}), zeros({5, 4}), zeros({})); });
  EXPECT_TRUE(starts_with(zero_d, "[linear] bias shape [] must be [5]")) << zero_d;
  const std::string undef = value_error_message([] { linear(zeros({2, 4}), zeros({5, 4}), Tensor()); });
  EXPECT_TRUE(starts_with(undef, "[linear] bias shape undefined")) << undef;
}

TEST(Linear, ErrorZeroDimInput) {
  const std::string msg = value_error_message([] { linear(scalar_tensor(1.0, DType::f32), zeros({5, 4})); });
  EXPECT_TRUE(starts_with(msg, "[linear] ") && contains(msg, "at least 1 dim")) << msg;
}

TEST(Linear, ErrorBoolDType) {
  const Tensor x = zeros({2, 3}, DType::b8), w = zeros({4, 3}, DType::b8);
  for (const std::optional<Tensor>& bias : {std::optional<Tensor>(), std::optional<Tensor>(zeros({4}, DType::b8))}) {
    const std::string msg = value_error_message([&] { linear(x, w, bias); });
    EXPECT_TRUE(starts_with(msg, "[linear] ")) << msg;
    EXPECT_TRUE(contains(msg, "b8") && contains(msg, "[2, 3]") && contains(msg, "[4, 3]")) << msg;
  }
}

// --- BLAS threads ----------------------------------------------------------------------------------

TEST(BlasThreads, SetAndRestore) {
  const int initial = blas_threads();
  EXPECT_GE(initial, 1);
  set_blas_threads(2);
  EXPECT_EQ(blas_threads(), 2);
  // Big enough that OpenBLAS may actually use both threads.
  const Tensor a = wavy({96, 80}, 1), b = wavy({80, 72}, 2);
  expect_matches(matmul(a, b), ref_matmul(a, b), 1e-12, 1e-12);
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  expect_matches(matmul(a, b), ref_matmul(a, b), 1e-12, 1e-12);
  set_blas_threads(initial);
  EXPECT_EQ(blas_threads(), initial);
}

// f32 products of m n k >= 2^21 go to oneDNN's sgemm when the build has it (ops/sgemm.cpp), the
// smaller ones to OpenBLAS: both routes equal the reference, with every transposition of the
// operands (as views), accumulation into the output (linear's bias, beta = 1), odd sizes and
// two BLAS threads.
TEST(BlasThreads, LargeAndSmallF32ProductsEqualTheReference) {
  const int initial = blas_threads();
  for (const int threads : {1, 2}) {
    set_blas_threads(threads);
    for (const auto& [m, k, n] : {std::array<int64_t, 3>{161, 131, 107}, std::array<int64_t, 3>{33, 17, 29}}) {
      const Tensor a = wavy({m, k}, 1, DType::f32), b = wavy({k, n}, 2, DType::f32);
      const Tensor at = wavy({k, m}, 1, DType::f32).t(), bt = wavy({n, k}, 2, DType::f32).t();
      ASSERT_FALSE(at.is_contiguous());
      const double tol = 1e-5;
      expect_matches(matmul(a, b), ref_matmul(a, b), tol, tol);
      expect_matches(matmul(at, b), ref_matmul(at.contiguous(), b), tol, tol);
      expect_matches(matmul(a, bt), ref_matmul(a, bt.contiguous()), tol, tol);
      expect_matches(matmul(at, bt), ref_matmul(at.contiguous(), bt.contiguous()), tol, tol);
      const Tensor weight = wavy({n, k}, 3, DType::f32), bias = wavy({n}, 4, DType::f32);
      expect_matches(linear(a, weight, bias), ref_linear(a, weight, bias), tol, tol);
    }
  }
  set_blas_threads(initial);
}

TEST(BlasThreads, ErrorNotPositive) {
  const int initial = blas_threads();
  for (int n : {0, -3}) {
    const std::string msg = value_error_message([&] { set_blas_threads(n); });
    EXPECT_TRUE(starts_with(msg, "[set_blas_threads] ")) << msg;
    EXPECT_TRUE(contains(msg, std::to_string(n)) && contains(msg, "at least 1")) << msg;
    EXPECT_EQ(blas_threads(), initial);  // unchanged by the failed call
  }
}
