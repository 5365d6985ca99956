#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <tessera/ops/random.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// Bit-for-bit equality of two tensors of the same dtype and shape.
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  const Tensor ac = a.contiguous();
  const Tensor bc = b.contiguous();
  return std::memcmp(ac.raw_data(), bc.raw_data(), static_cast<size_t>(ac.nbytes())) == 0;
}

double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double variance_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double sum = 0;
  for (double x : v) sum += (x - m) * (x - m);
  return sum / static_cast<double>(v.size());
}

// Candidate (begin, length) pairs along a dim of size n: whole, empty, odd starts, single.
std::vector<std::pair<int64_t, int64_t>> ranges_of(int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> r = {{0, n}, {n, 0}, {0, 1}};
  if (n > 1) r.push_back({1, n - 1});
  if (n > 4) r.push_back({3, n - 4});
  if (n > 6) r.push_back({5, 2});
  if (n > 2) r.push_back({n - 1, 1});
  return r;
}

// Every box of global_shape built from ranges_of() in each dim.
std::vector<std::pair<Shape, Shape>> boxes_of(const Shape& global_shape) {
  std::vector<std::pair<Shape, Shape>> boxes = {{Shape{}, Shape{}}};
  for (int64_t d = 0; d < global_shape.size(); ++d) {
    std::vector<std::pair<Shape, Shape>> next;
    for (const auto& [begin, block] : boxes) {
      for (const auto& [start, length] : ranges_of(global_shape[d])) {
        Shape b = begin, s = block;
        b.push_back(start);
        s.push_back(length);
        next.push_back({b, s});
      }
    }
    boxes = std::move(next);
  }
  return boxes;
}

Tensor narrow_box(const Tensor& full, const Shape& begin, const Shape& block) {
  Tensor t = full;
  for (int64_t d = 0; d < begin.size(); ++d) t = t.narrow(d, begin[d], block[d]);
  return t;
}

}  // namespace

// --- Philox 4x32-10 known answers -----------------------------------------------------------------

// Known-answer vectors from the Random123 distribution (D. E. Shaw Research), file
// examples/kat_vectors, lines "philox4x32 10 <counter x4> <key x2> <expected x4>"; the last two
// cases are from the extended kat_vectors of the Random123 manual (girving/random123-manual,
// examples/kat_vectors).
TEST(Philox, KnownAnswerVectors) {
  struct Case {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> expected;
  };
  const Case cases[] = {
      {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
       {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
      {{0x00000001, 0x00000000, 0x00000000, 0x00000000}, {0x00000001, 0x00000000},
       {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093}},
      {{0x00000000, 0x00000000, 0x00000000, 0x00000001}, {0x00000000, 0x00000001},
       {0x96b27e8c, 0x28826d0f, 0x66d958ef, 0x081509dc}},
  };
  for (const Case& c : cases) EXPECT_EQ(philox4x32_10(c.counter, c.key), c.expected);
}

// --- the documented counter layout ----------------------------------------------------------------

TEST(Random, UniformF32FollowsTheCounterLayout) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t offset = 0x00000005fedcba98ull;
  const RandomDraw draw{Distribution::uniform, 0, 1, DType::f32, seed, offset};
  const Tensor t = random_block(draw, {3, 7}, {0, 0}, {3, 7});
  const float* p = t.data<float>();
  const std::array<uint32_t, 2> key = {0x89abcdef, 0x01234567};
  for (uint32_t i = 0; i < 21; ++i) {
    const auto lanes = philox4x32_10({i / 4, 0, 0xfedcba98, 0x5}, key);
    EXPECT_EQ(p[i], static_cast<float>(lanes[i % 4] >> 8) * 0x1p-24f) << "element " << i;
  }
}

TEST(Random, UniformF64UsesTwoLanesPerElement) {
  const RandomDraw draw{Distribution::uniform, 0, 1, DType::f64, 42, 3};
  const Tensor t = random_block(draw, {9}, {0}, {9});
  const double* p = t.data<double>();
  for (uint32_t i = 0; i < 9; ++i) {
    const auto lanes = philox4x32_10({i / 2, 0, 3, 0}, {42, 0});
    const uint64_t x = static_cast<uint64_t>(lanes[2 * (i % 2) + 1]) << 32 | lanes[2 * (i % 2)];
    EXPECT_EQ(p[i], static_cast<double>(x >> 11) * 0x1p-53) << "element " << i;
  }
}

TEST(Random, BernoulliFollowsTheCounterLayout) {
  const RandomDraw draw{Distribution::bernoulli, 0.3, 0, DType::b8, 9, 1};
  const Tensor t = random_block(draw, {50}, {0}, {50});
  const bool* p = t.data<bool>();
  for (uint32_t i = 0; i < 50; ++i) {
    const auto lanes = philox4x32_10({i / 4, 0, 1, 0}, {9, 0});
    EXPECT_EQ(p[i], static_cast<double>(lanes[i % 4]) < 0.3 * 4294967296.0) << "element " << i;
  }
}

TEST(Random, ValuesDependOnlyOnTheFlatIndex) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    for (Distribution dist : {Distribution::uniform, Distribution::normal, Distribution::bernoulli}) {
      const RandomDraw draw{dist, dist == Distribution::bernoulli ? 0.5 : 0.0, 1, dtype, 5, 2};
      const Tensor flat = random_block(draw, {60}, {0}, {60});
      const Tensor grid = random_block(draw, {3, 4, 5}, {0, 0, 0}, {3, 4, 5});
      EXPECT_TRUE(bitwise_equal(flat, grid.reshape({60})));
    }
  }
}

// --- sub-blocks ------------------------------------------------------------------------------------

TEST(Random, BlocksEqualNarrowOfTheWholeTensorBitForBit) {
  const Shape shapes[] = {{1}, {3}, {7}, {17}, {7, 3}, {3, 17}, {1, 7, 3}, {3, 1, 17}, {3, 1, 7, 3}, {2, 3, 1, 7}};
  const std::pair<Distribution, DType> kinds[] = {
      {Distribution::uniform, DType::f32},   {Distribution::uniform, DType::f64},
      {Distribution::uniform, DType::f16},   {Distribution::uniform, DType::bf16},
      {Distribution::normal, DType::f32},    {Distribution::normal, DType::f64},
      {Distribution::normal, DType::f16},    {Distribution::normal, DType::bf16},
      {Distribution::bernoulli, DType::f32}, {Distribution::bernoulli, DType::f64},
      {Distribution::bernoulli, DType::b8},  {Distribution::bernoulli, DType::i32},
  };
  int64_t checked = 0;
  for (const auto& [dist, dtype] : kinds) {
    const double a = dist == Distribution::uniform ? -2.0 : dist == Distribution::normal ? 1.5 : 0.4;
    const double b = dist == Distribution::uniform ? 3.0 : 2.0;
    const RandomDraw draw{dist, a, b, dtype, 0xdeadbeefcafeull, 11};
    for (const Shape& shape : shapes) {
      const Tensor full = random_block(draw, shape, DimVector::filled(shape.size(), 0), shape);
      for (const auto& [begin, block] : boxes_of(shape)) {
        const Tensor piece = random_block(draw, shape, begin, block);
        ASSERT_TRUE(piece.is_contiguous());
        ASSERT_TRUE(bitwise_equal(piece, narrow_box(full, begin, block)))
            << name(dtype) << " distribution " << static_cast<int>(dist) << " shape " << shape.to_string()
            << " begin " << begin.to_string() << " block " << block.to_string();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(Random, RandEqualsRandomBlockOfItsDraw) {
  for (DType dtype : floating_dtypes()) {
    manual_seed(123);
    const Tensor u = rand({5, 6}, dtype);
    const Tensor z = randn({5, 6}, dtype);
    const Tensor m = bernoulli({5, 6}, 0.25, dtype);
    EXPECT_TRUE(bitwise_equal(u, random_block({Distribution::uniform, 0, 1, dtype, 123, 0}, {5, 6}, {0, 0}, {5, 6})));
    EXPECT_TRUE(bitwise_equal(z, random_block({Distribution::normal, 0, 1, dtype, 123, 1}, {5, 6}, {0, 0}, {5, 6})));
    EXPECT_TRUE(
        bitwise_equal(m, random_block({Distribution::bernoulli, 0.25, 0, dtype, 123, 2}, {5, 6}, {0, 0}, {5, 6})));
    // A shard: rows 1..3, columns 3..5.
    EXPECT_TRUE(bitwise_equal(u.narrow(0, 1, 3).narrow(1, 3, 3),
                              random_block({Distribution::uniform, 0, 1, dtype, 123, 0}, {5, 6}, {1, 3}, {3, 3})));
  }
}

TEST(Random, ZeroDimAndEmptyTensors) {
  manual_seed(1);
  const Tensor s = rand({});
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_TRUE(bitwise_equal(s, random_block({Distribution::uniform, 0, 1, DType::f32, 1, 0}, {}, {}, {})));
  const Tensor e = randn({0, 5}, DType::f64);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.shape(), (Shape{0, 5}));
  EXPECT_EQ(default_generator().offset(), 2u);  // an empty draw still takes its offset
}

// --- determinism ------------------------------------------------------------------------------------

TEST(Random, SameSeedSameValues) {
  for (DType dtype : floating_dtypes()) {
    manual_seed(2024);
    const Tensor a = rand({33}, dtype), b = randn({33}, dtype);
    manual_seed(2024);
    EXPECT_TRUE(bitwise_equal(a, rand({33}, dtype)));
    EXPECT_TRUE(bitwise_equal(b, randn({33}, dtype)));
  }
}

TEST(Random, DifferentSeedsAndConsecutiveDrawsDiffer) {
  manual_seed(1);
  const Tensor a = rand({64});
  const Tensor b = rand({64});
  manual_seed(2);
  const Tensor c = rand({64});
  manual_seed(uint64_t{1} << 32);  // the seed's high word is part of the key too
  const Tensor d = rand({64});
  EXPECT_FALSE(bitwise_equal(a, b));
  EXPECT_FALSE(bitwise_equal(a, c));
  EXPECT_FALSE(bitwise_equal(a, d));
  EXPECT_FALSE(bitwise_equal(b, c));
  const RandomDraw far{Distribution::uniform, 0, 1, DType::f32, 1, uint64_t{1} << 32};  // offset high word
  EXPECT_FALSE(bitwise_equal(a, random_block(far, {64}, {0}, {64})));
}

TEST(Random, ManualSeedResetsTheOffset) {
  manual_seed(77);
  EXPECT_EQ(default_generator().seed(), 77u);
  EXPECT_EQ(default_generator().offset(), 0u);
  const Tensor first = rand({10});
  (void)randn({10});
  (void)bernoulli({10}, 0.5);
  EXPECT_EQ(default_generator().offset(), 3u);
  manual_seed(77);
  EXPECT_EQ(default_generator().offset(), 0u);
  EXPECT_TRUE(bitwise_equal(first, rand({10})));
}

TEST(Random, GeneratorNextTakesConsecutiveOffsets) {
  Generator g(5);
  const RandomDraw d0 = g.next(Distribution::normal, 1, 2, DType::f64);
  const RandomDraw d1 = g.next(Distribution::uniform, 0, 1, DType::f32);
  EXPECT_EQ(d0.seed, 5u);
  EXPECT_EQ(d0.offset, 0u);
  EXPECT_EQ(d1.offset, 1u);
  EXPECT_EQ(d0.distribution, Distribution::normal);
  EXPECT_EQ(d0.a, 1);
  EXPECT_EQ(d0.b, 2);
  EXPECT_EQ(g.offset(), 2u);
}

// --- statistics (fixed seeds; tolerances are many standard errors wide) -----------------------------

TEST(Random, UniformMeanAndVariance) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    manual_seed(31);
    const std::vector<double> v = values(rand({100000}, dtype));
    // Standard error of the mean 0.0009, of the variance 0.0003.
    EXPECT_NEAR(mean_of(v), 0.5, 0.01);
    EXPECT_NEAR(variance_of(v), 1.0 / 12, 0.005);
    // Neighbours (same Philox block) are uncorrelated.
    double cov = 0;
    for (size_t i = 0; i + 1 < v.size(); ++i) cov += (v[i] - 0.5) * (v[i + 1] - 0.5);
    EXPECT_NEAR(cov / static_cast<double>(v.size() - 1) * 12, 0.0, 0.02);
  }
}

TEST(Random, NormalMeanVarianceAndTails) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    manual_seed(32);
    const std::vector<double> v = values(randn({100000}, dtype));
    // Standard error of the mean 0.003, of the variance 0.0045.
    EXPECT_NEAR(mean_of(v), 0.0, 0.02);
    EXPECT_NEAR(variance_of(v), 1.0, 0.04);
    int64_t within_one = 0;
    for (double x : v) {
      ASSERT_TRUE(std::isfinite(x));
      within_one += std::abs(x) < 1;
    }
    EXPECT_NEAR(static_cast<double>(within_one) / 100000, 0.6827, 0.01);
  }
}

TEST(Random, NormalMeanAndStdParameters) {
  const RandomDraw draw{Distribution::normal, 3.0, 0.5, DType::f64, 8, 0};
  const std::vector<double> v = values(random_block(draw, {100000}, {0}, {100000}));
  EXPECT_NEAR(mean_of(v), 3.0, 0.01);
  EXPECT_NEAR(variance_of(v), 0.25, 0.01);
}

TEST(Random, BernoulliFrequency) {
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    manual_seed(33);
    const std::vector<double> v = values(bernoulli({100000}, p, DType::i32));
    for (double x : v) ASSERT_TRUE(x == 0 || x == 1);
    // Standard error at most 0.0016.
    EXPECT_NEAR(mean_of(v), p, 0.01) << "p = " << p;
    if (p == 0 || p == 1) {
      EXPECT_EQ(mean_of(v), p);
    }
  }
}

TEST(Random, UniformValuesAreInTheHalfOpenUnitInterval) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    manual_seed(34);
    const std::vector<double> v = values(rand({100000}, dtype));
    double lo = 1, hi = 0;
    for (double x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    EXPECT_GE(lo, 0.0);
    EXPECT_LT(hi, 1.0);
    EXPECT_LT(lo, 0.001);
    EXPECT_GT(hi, 0.99);
  }
}

TEST(Random, UniformRangesNeverReachTheHighBound) {
  // bf16 on [1, 2) has spacing 2^-7, so a + (b - a) * u rounds to 2 for the top u = 1 - 2^-8
  // unless clamped; f16 on [-3, 5) and f32 on [1e6, 1e6 + 1) round up as well.
  const struct {
    DType dtype;
    double a, b;
  } cases[] = {{DType::bf16, 1, 2}, {DType::f16, -3, 5}, {DType::f32, 1e6, 1e6 + 1}, {DType::f64, -1, 1}};
  for (const auto& c : cases) {
    SCOPED_TRACE(name(c.dtype));
    const RandomDraw draw{Distribution::uniform, c.a, c.b, c.dtype, 35, 0};
    const std::vector<double> v = values(random_block(draw, {20000}, {0}, {20000}));
    for (double x : v) {
      ASSERT_GE(x, c.a);
      ASSERT_LT(x, c.b);
    }
    EXPECT_NEAR(mean_of(v), (c.a + c.b) / 2, (c.b - c.a) * 0.02);
  }
  // An empty range gives a.
  const RandomDraw point{Distribution::uniform, 2.5, 2.5, DType::f32, 1, 0};
  for (double x : values(random_block(point, {8}, {0}, {8}))) EXPECT_EQ(x, 2.5);
}

// --- dropout -------------------------------------------------------------------------------------------

TEST(Random, DropoutMaskKeepsWithProbabilityOneMinusP) {
  manual_seed(36);
  const Tensor mask = dropout_mask({100000}, 0.2);
  EXPECT_EQ(mask.dtype(), DType::b8);
  EXPECT_NEAR(mean_of(values(mask)), 0.8, 0.01);
  EXPECT_EQ(default_generator().offset(), 1u);
  manual_seed(36);
  EXPECT_TRUE(bitwise_equal(mask, bernoulli({100000}, 0.8, DType::b8)));
}

TEST(Random, DropoutScalesKeptValuesAndZeroesTheRest) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    const double p = 0.25;
    const Tensor x = arange(1, 4001, 1, dtype).reshape({40, 100});
    manual_seed(37);
    const Tensor y = dropout(x, p);
    EXPECT_EQ(default_generator().offset(), 1u);  // one draw
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ(y.shape(), x.shape());
    manual_seed(37);
    const std::vector<double> mask = values(dropout_mask(x.shape(), p));
    const std::vector<double> xs = values(x), ys = values(y);
    int64_t kept = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (mask[i] != 0) {
        ++kept;
        // Computed in f32 (f64 for f64) and rounded once to the dtype.
        const double expected = dtype == DType::f64 ? xs[i] * (1.0 / 0.75)
                                                    : values(scalar_tensor(static_cast<float>(xs[i]) * static_cast<float>(1.0 / 0.75), dtype))[0];
        ASSERT_EQ(ys[i], expected) << "element " << i;
        EXPECT_NEAR(ys[i], xs[i] / 0.75, std::abs(xs[i]) * 0.01);
      } else {
        ASSERT_EQ(ys[i], 0.0) << "element " << i;
      }
    }
    EXPECT_NEAR(static_cast<double>(kept) / 4000, 0.75, 0.04);
  }
}

TEST(Random, DropoutOfAViewUsesLogicalPositions) {
  const Tensor base = arange(0, 60, 1, DType::f32).reshape({6, 10});
  const Tensor view = base.t().narrow(0, 2, 5);  // non-contiguous [5, 6]
  manual_seed(38);
  const Tensor from_view = dropout(view, 0.5);
  manual_seed(38);
  const Tensor from_copy = dropout(view.contiguous(), 0.5);
  EXPECT_TRUE(bitwise_equal(from_view, from_copy));
}

TEST(Random, DropoutIdentityCasesTakeNoDraw) {
  const Tensor x = ones({4, 4});
  manual_seed(39);
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0).is_same(x));
  EXPECT_EQ(default_generator().offset(), 0u);
}

// --- errors (one per documented error) ----------------------------------------------------------------

TEST(Random, RandRejectsNonFloatingDtype) {
  manual_seed(0);
  const std::string m = value_error_message([] { rand({3}, DType::i32); });
  EXPECT_TRUE(contains(m, "[rand]")) << m;
  EXPECT_TRUE(contains(m, "unsupported dtype i32")) << m;
  EXPECT_TRUE(contains(m, "expected a floating dtype")) << m;
  EXPECT_EQ(default_generator().offset(), 0u);  // a failed call takes no draw
}

TEST(Random, RandnRejectsNonFloatingDtype) {
  const std::string m = value_error_message([] { randn({3}, DType::b8); });
  EXPECT_TRUE(contains(m, "[randn]")) << m;
  EXPECT_TRUE(contains(m, "b8")) << m;
}

TEST(Random, RandRejectsNegativeSize) {
  const std::string m = value_error_message([] { rand({2, -1}); });
  EXPECT_TRUE(contains(m, "[rand] negative size in shape [2, -1]")) << m;
}

TEST(Random, BernoulliRejectsProbabilityOutsideUnitInterval) {
  std::string m = value_error_message([] { bernoulli({3}, 1.5); });
  EXPECT_TRUE(contains(m, "[bernoulli]")) << m;
  EXPECT_TRUE(contains(m, "1.5")) << m;
  EXPECT_TRUE(contains(m, "expected 0 <= p <= 1")) << m;
  m = value_error_message([] { bernoulli({3}, -0.1); });
  EXPECT_TRUE(contains(m, "[bernoulli]")) << m;
  m = value_error_message([] { bernoulli({3}, std::nan("")); });
  EXPECT_TRUE(contains(m, "[bernoulli]")) << m;
}

TEST(Random, DropoutMaskRejectsProbabilityOutsideUnitInterval) {
  const std::string m = value_error_message([] { dropout_mask({3}, 2.0); });
  EXPECT_TRUE(contains(m, "[dropout_mask]")) << m;
  EXPECT_TRUE(contains(m, "p = 2")) << m;
}

TEST(Random, DropoutRejectsPOutsideHalfOpenInterval) {
  std::string m = value_error_message([] { dropout(ones({3}), 1.0); });
  EXPECT_TRUE(contains(m, "[dropout]")) << m;
  EXPECT_TRUE(contains(m, "outside [0, 1)")) << m;
  m = value_error_message([] { dropout(ones({3}), -0.5, /*training=*/false); });
  EXPECT_TRUE(contains(m, "[dropout]")) << m;
}

TEST(Random, DropoutRejectsNonFloatingInput) {
  const std::string m = value_error_message([] { dropout(arange(4), 0.5); });
  EXPECT_TRUE(contains(m, "[dropout]")) << m;
  EXPECT_TRUE(contains(m, "unsupported dtype i64")) << m;
}

TEST(Random, DropoutRejectsUndefinedInput) {
  const std::string m = value_error_message([] { dropout(Tensor(), 0.5); });
  EXPECT_TRUE(contains(m, "[dropout] input tensor is undefined")) << m;
}

TEST(Random, RandomBlockRejectsRankMismatch) {
  const RandomDraw draw;
  const std::string m = value_error_message([&] { random_block(draw, {4, 6}, {0}, {4, 6}); });
  EXPECT_TRUE(contains(m, "[random_block] rank mismatch")) << m;
  EXPECT_TRUE(contains(m, "[4, 6]")) << m;
  EXPECT_TRUE(contains(m, "begin [0]")) << m;
}

TEST(Random, RandomBlockRejectsBoxOutsideGlobalShape) {
  const RandomDraw draw;
  std::string m = value_error_message([&] { random_block(draw, {4, 6}, {0, 5}, {2, 3}); });
  EXPECT_TRUE(contains(m, "[random_block] block leaves the global shape at dim 1")) << m;
  EXPECT_TRUE(contains(m, "begin [0, 5]")) << m;
  EXPECT_TRUE(contains(m, "block shape [2, 3]")) << m;
  EXPECT_TRUE(contains(m, "global shape [4, 6]")) << m;
  m = value_error_message([&] { random_block(draw, {4, 6}, {-1, 0}, {2, 3}); });
  EXPECT_TRUE(contains(m, "at dim 0")) << m;
  m = value_error_message([&] { random_block(draw, {4, 6}, {0, 0}, {2, -3}); });
  EXPECT_TRUE(contains(m, "at dim 1")) << m;
}

TEST(Random, RandomBlockRejectsNonFloatingUniformAndNormal) {
  RandomDraw draw;
  draw.dtype = DType::i32;
  std::string m = value_error_message([&] { random_block(draw, {4}, {0}, {4}); });
  EXPECT_TRUE(contains(m, "[random_block] unsupported dtype i32 for a uniform draw")) << m;
  draw.distribution = Distribution::normal;
  m = value_error_message([&] { random_block(draw, {4}, {0}, {4}); });
  EXPECT_TRUE(contains(m, "for a normal draw")) << m;
}

TEST(Random, RandomBlockRejectsInvalidParameters) {
  std::string m = value_error_message(
      [] { random_block({Distribution::uniform, 2, 1, DType::f32, 0, 0}, {4}, {0}, {4}); });
  EXPECT_TRUE(contains(m, "[random_block] invalid uniform range [2, 1)")) << m;
  m = value_error_message(
      [] { random_block({Distribution::uniform, 0, INFINITY, DType::f32, 0, 0}, {4}, {0}, {4}); });
  EXPECT_TRUE(contains(m, "invalid uniform range")) << m;
  m = value_error_message([] { random_block({Distribution::normal, 0, -1, DType::f32, 0, 0}, {4}, {0}, {4}); });
  EXPECT_TRUE(contains(m, "[random_block] invalid normal parameters mean 0, std -1")) << m;
  m = value_error_message(
      [] { random_block({Distribution::bernoulli, 1.25, 0, DType::f32, 0, 0}, {4}, {0}, {4}); });
  EXPECT_TRUE(contains(m, "[random_block] invalid bernoulli probability 1.25")) << m;
}

// --- threads ---------------------------------------------------------------------------------------------

TEST(Random, EachThreadHasItsOwnGenerator) {
  manual_seed(1000);
  (void)rand({3});
  const uint64_t main_offset = default_generator().offset();
  Tensor a, b, fresh;
  uint64_t fresh_seed = 1, fresh_offset = 1;
  std::thread ta([&] {
    manual_seed(99);
    a = rand({1000});
    a = randn({1000});
  });
  std::thread tb([&] {
    manual_seed(99);
    b = rand({1000});
    b = randn({1000});
  });
  std::thread tc([&] {
    fresh_seed = default_generator().seed();
    fresh_offset = default_generator().offset();
    fresh = rand({8});
  });
  ta.join();
  tb.join();
  tc.join();
  EXPECT_TRUE(bitwise_equal(a, b));
  EXPECT_EQ(fresh_seed, kDefaultSeed);
  EXPECT_EQ(fresh_offset, 0u);
  EXPECT_TRUE(bitwise_equal(fresh, random_block({Distribution::uniform, 0, 1, DType::f32, kDefaultSeed, 0}, {8}, {0}, {8})));
  // The other threads did not touch this thread's generator.
  EXPECT_EQ(default_generator().seed(), 1000u);
  EXPECT_EQ(default_generator().offset(), main_offset);
}
