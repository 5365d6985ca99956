// Tests for tessera/ops/reduce.hpp against plain-loop references over std::vector<double> and
// hand-computed small cases. Inputs are written and results read straight from storage (walking
// shape/strides/offset here), so the references never go through the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/tensor.hpp>
#include <tessera/ops/reduce.hpp>

#include <test_util.hpp>

using namespace tessera;
// Named one by one (not `using namespace tessera::testing`): the local matches() compares with the
// expected values as dtype stores them and would be ambiguous with tessera::testing::matches.
using tessera::testing::all_dtypes;
using tessera::testing::floating_dtypes;
using tessera::testing::kInf;
using tessera::testing::kNaN;
using tessera::testing::make;
using tessera::testing::make_typed;
using tessera::testing::Tol;
using tessera::testing::TolTable;
using tessera::testing::value_error;
using tessera::testing::walk;

namespace {

// --- references ----------------------------------------------------------------------------------

// For each output element (row-major over the kept dims), the inputs it folds, in row-major order
// over the reduced dims; and the output shape.
struct Groups {
  Shape shape;
  std::vector<std::vector<double>> values;
};

Groups groups(const std::vector<double>& x, const Shape& shape, std::vector<int64_t> dims, bool keepdim) {
  const int64_t ndim = shape.size();
  std::vector<bool> reduced(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) reduced[static_cast<size_t>(d < 0 ? d + ndim : d)] = true;
  Groups g;
  int64_t outputs = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced[static_cast<size_t>(d)]) {
      g.shape.push_back(shape[d]);
      outputs *= shape[d];
    } else if (keepdim) {
      g.shape.push_back(1);
    }
  }
  g.values.resize(static_cast<size_t>(outputs));
  std::vector<int64_t> index(static_cast<size_t>(ndim), 0);
  for (size_t k = 0; k < x.size(); ++k) {
    int64_t out = 0;
    for (int64_t d = 0; d < ndim; ++d)
      if (!reduced[static_cast<size_t>(d)]) out = out * shape[d] + index[static_cast<size_t>(d)];
    g.values[static_cast<size_t>(out)].push_back(x[k]);
    for (int64_t d = ndim - 1; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < shape[d]) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
  return g;
}

double sum_ref(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e;
  return s;
}
double prod_ref(const std::vector<double>& v) {
  double p = 1;
  for (double e : v) p *= e;
  return p;
}
double mean_ref(const std::vector<double>& v) { return sum_ref(v) / static_cast<double>(v.size()); }
double max_ref(const std::vector<double>& v) {
  double m = -kInf;
  for (double e : v) {
    if (std::isnan(e)) return kNaN;
    m = e > m ? e : m;
  }
  return m;
}
double min_ref(const std::vector<double>& v) {
  double m = kInf;
  for (double e : v) {
    if (std::isnan(e)) return kNaN;
    m = e < m ? e : m;
  }
  return m;
}
double var_ref(const std::vector<double>& v, int64_t correction) {
  const double m = mean_ref(v);
  double s = 0;
  for (double e : v) s += (e - m) * (e - m);
  return s / static_cast<double>(std::max<int64_t>(static_cast<int64_t>(v.size()) - correction, 0));
}
// Index of the first maximum (minimum); the first NaN wins.
double arg_ref(const std::vector<double>& v, bool is_max) {
  size_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return static_cast<double>(i);
    if (is_max ? v[i] > v[best] : v[i] < v[best]) best = i;
  }
  return static_cast<double>(best);
}

std::vector<double> fold_ref(const Groups& g, const std::function<double(const std::vector<double>&)>& f) {
  std::vector<double> out;
  for (const std::vector<double>& v : g.values) out.push_back(f(v));
  return out;
}

// The value as stored in dtype (f32/f16/bf16 round; overflow gives inf).
double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::f32:
      return static_cast<float>(v);
    case DType::f16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case DType::bf16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    default:
      return v;
  }
}

// Output rounding of each dtype (reductions accumulate in f64 and round once); integers and bool
// are exact.
constexpr TolTable kTol{
    .f64 = {1e-12, 1e-12}, .f32 = {1e-6, 1e-7}, .f16 = {1e-3, 1e-4}, .bf16 = {8e-3, 1e-3}, .other = {0, 0}};

// Each expected value as dtype stores it: reductions accumulate in f64 and round once, so results
// are compared with the rounded reference.
std::vector<double> stored(DType dtype, const std::vector<double>& expected) {
  std::vector<double> out;
  for (double e : expected) out.push_back(round_to(dtype, e));
  return out;
}

// Shape, dtype and every element (NaN matches NaN) of t against the stored expected values.
::testing::AssertionResult matches(const Tensor& t, const Shape& shape, DType dtype, const std::vector<double>& expected,
                                   Tol tolerance) {
  return tessera::testing::matches(t, shape, dtype, stored(dtype, expected), tolerance);
}

::testing::AssertionResult matches(const Tensor& t, const Shape& shape, DType dtype, const std::vector<double>& expected) {
  return tessera::testing::matches(t, shape, dtype, stored(dtype, expected), kTol(dtype));
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out = "{";
  for (size_t i = 0; i < dims.size(); ++i) out.append(i ? ", " : "").append(std::to_string(dims[i]));
  return out.append("}");
}

DType sum_dtype(DType dtype) { return is_floating(dtype) ? dtype : DType::i64; }
DType mean_dtype(DType dtype) { return is_floating(dtype) ? dtype : DType::f32; }

// [2, 3, 4] test values for dtype: exact in the dtype, no zeros (so products stay informative),
// with repeated values (so argmax/argmin ties occur).
std::vector<double> values_for(DType dtype, int64_t n) {
  std::vector<double> v;
  for (int64_t k = 0; k < n; ++k) {
    if (is_floating(dtype)) v.push_back((k % 3 == 0 ? -1 : 1) * (1 + static_cast<double>((k * 7) % 5) * 0.125));
    else if (dtype == DType::u8) v.push_back(static_cast<double>(1 + (k * 3) % 4));
    else if (dtype == DType::b8) v.push_back(k % 3 != 0 ? 1 : 0);
    else v.push_back(static_cast<double>(std::vector<int>{1, -2, 3, -1, 2}[static_cast<size_t>(k % 5)]));
  }
  return v;
}

// The [2, 3, 4] tensors the sweeps run over: contiguous, permuted, narrowed, expanded.
std::vector<std::pair<std::string, Tensor>> layouts(DType dtype) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("contiguous", make(values_for(dtype, 24), {2, 3, 4}, dtype));
  out.emplace_back("permuted", make(values_for(dtype, 24), {4, 3, 2}, dtype).permute({2, 1, 0}));
  out.emplace_back("narrowed", make(values_for(dtype, 40), {2, 5, 4}, dtype).narrow(1, 1, 3));
  out.emplace_back("expanded", make(values_for(dtype, 12), {1, 3, 4}, dtype).expand({2, 3, 4}));
  return out;
}

const std::vector<std::vector<int64_t>>& dim_sets() {
  static const std::vector<std::vector<int64_t>> sets = {{},     {0},    {1},    {2},      {-1},     {-2},     {-3},
                                                         {0, 2}, {2, 0}, {0, 1}, {1, 2},   {-1, -3}, {0, 1, 2}};
  return sets;
}

}  // namespace

// ================================================================================================
// Sweeps: every reduction x every dim set x keepdim x every dtype x layouts
// ================================================================================================

TEST(ReduceSweep, SumMeanProdAmaxAminVarMatchReference) {
  for (DType dtype : all_dtypes()) {
    for (const auto& [layout, x] : layouts(dtype)) {
      ASSERT_EQ(x.shape(), Shape({2, 3, 4}));
      const std::vector<double> v = walk(x);
      for (const std::vector<int64_t>& dims : dim_sets()) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(name(dtype)) + " " + layout + " dims " + dims_text(dims) +
                       (keepdim ? " keepdim" : ""));
          const Groups g = groups(v, {2, 3, 4}, dims, keepdim);
          EXPECT_TRUE(matches(sum(x, dims, keepdim), g.shape, sum_dtype(dtype), fold_ref(g, sum_ref)));
          EXPECT_TRUE(matches(mean(x, dims, keepdim), g.shape, mean_dtype(dtype), fold_ref(g, mean_ref)));
          EXPECT_TRUE(matches(prod(x, dims, keepdim), g.shape, sum_dtype(dtype), fold_ref(g, prod_ref)));
          EXPECT_TRUE(matches(amax(x, dims, keepdim), g.shape, dtype, fold_ref(g, max_ref), {0, 0}));
          EXPECT_TRUE(matches(amin(x, dims, keepdim), g.shape, dtype, fold_ref(g, min_ref), {0, 0}));
          for (int64_t correction : {0, 1}) {
            EXPECT_TRUE(matches(var(x, dims, correction, keepdim), g.shape, mean_dtype(dtype),
                                fold_ref(g, [&](const std::vector<double>& e) { return var_ref(e, correction); })))
                << "correction " << correction;
          }
        }
      }
    }
  }
}

TEST(ArgmaxSweep, EveryDimEveryDtypeMatchesReference) {
  for (DType dtype : all_dtypes()) {
    for (const auto& [layout, x] : layouts(dtype)) {
      const std::vector<double> v = walk(x);
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(std::string(name(dtype)) + " " + layout + (keepdim ? " keepdim" : ""));
        // Flattened.
        const Shape flat_shape = keepdim ? Shape{1, 1, 1} : Shape{};
        EXPECT_TRUE(matches(argmax(x, std::nullopt, keepdim), flat_shape, DType::i64, {arg_ref(v, true)}));
        EXPECT_TRUE(matches(argmin(x, std::nullopt, keepdim), flat_shape, DType::i64, {arg_ref(v, false)}));
        for (int64_t dim : {0, 1, 2, -1, -2, -3}) {
          SCOPED_TRACE("dim " + std::to_string(dim));
          const Groups g = groups(v, {2, 3, 4}, {dim}, keepdim);
          EXPECT_TRUE(matches(argmax(x, dim, keepdim), g.shape, DType::i64,
                              fold_ref(g, [](const std::vector<double>& e) { return arg_ref(e, true); })));
          EXPECT_TRUE(matches(argmin(x, dim, keepdim), g.shape, DType::i64,
                              fold_ref(g, [](const std::vector<double>& e) { return arg_ref(e, false); })));
        }
      }
    }
  }
}

// ================================================================================================
// Hand-computed cases
// ================================================================================================

TEST(SumReduce, HandComputed) {
  const Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  EXPECT_TRUE(matches(sum(x), {}, DType::f32, {21}));
  EXPECT_TRUE(matches(sum(x, {0}), {3}, DType::f32, {5, 7, 9}));
  EXPECT_TRUE(matches(sum(x, {1}), {2}, DType::f32, {6, 15}));
  EXPECT_TRUE(matches(sum(x, {-1}, true), {2, 1}, DType::f32, {6, 15}));
  EXPECT_TRUE(matches(sum(x, {0, 1}, true), {1, 1}, DType::f32, {21}));
  EXPECT_TRUE(matches(sum(x.t(), {1}), {3}, DType::f32, {5, 7, 9}));
  EXPECT_TRUE(matches(prod(x, {0}), {3}, DType::f32, {4, 10, 18}));
  EXPECT_TRUE(matches(amax(x, {1}), {2}, DType::f32, {3, 6}));
  EXPECT_TRUE(matches(amin(x.t(), {0}), {2}, DType::f32, {1, 4}));
}

TEST(SumReduce, ZeroDimInput) {
  for (DType dtype : all_dtypes()) {
    SCOPED_TRACE(name(dtype));
    const double value = dtype == DType::b8 ? 1 : 3;
    const Tensor s = make({value}, {}, dtype);
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{}, {0}, {-1}}) {
      for (bool keepdim : {false, true}) {
        EXPECT_TRUE(matches(sum(s, dims, keepdim), {}, sum_dtype(dtype), {value}));
        EXPECT_TRUE(matches(mean(s, dims, keepdim), {}, mean_dtype(dtype), {value}));
        EXPECT_TRUE(matches(prod(s, dims, keepdim), {}, sum_dtype(dtype), {value}));
        EXPECT_TRUE(matches(amax(s, dims, keepdim), {}, dtype, {value}));
        EXPECT_TRUE(matches(amin(s, dims, keepdim), {}, dtype, {value}));
        EXPECT_TRUE(matches(var(s, dims, 0, keepdim), {}, mean_dtype(dtype), {0}));
        EXPECT_TRUE(matches(var(s, dims, 1, keepdim), {}, mean_dtype(dtype), {kNaN}));  // 0 / 0
      }
    }
    EXPECT_TRUE(matches(argmax(s), {}, DType::i64, {0}));
    EXPECT_TRUE(matches(argmax(s, 0), {}, DType::i64, {0}));
    EXPECT_TRUE(matches(argmin(s, -1, true), {}, DType::i64, {0}));
  }
}

TEST(SumReduce, ZeroSizeInputs) {
  for (DType dtype : all_dtypes()) {
    SCOPED_TRACE(name(dtype));
    const Tensor e = empty({0, 3}, dtype);
    EXPECT_TRUE(matches(sum(e), {}, sum_dtype(dtype), {0}));
    EXPECT_TRUE(matches(sum(e, {0}), {3}, sum_dtype(dtype), {0, 0, 0}));
    EXPECT_TRUE(matches(sum(e, {0}, true), {1, 3}, sum_dtype(dtype), {0, 0, 0}));
    EXPECT_TRUE(matches(sum(e, {1}), {0}, sum_dtype(dtype), {}));
    EXPECT_TRUE(matches(sum(e, {1}, true), {0, 1}, sum_dtype(dtype), {}));
    EXPECT_TRUE(matches(prod(e), {}, sum_dtype(dtype), {1}));
    EXPECT_TRUE(matches(prod(e, {0}), {3}, sum_dtype(dtype), {1, 1, 1}));
    EXPECT_TRUE(matches(mean(e), {}, mean_dtype(dtype), {kNaN}));
    EXPECT_TRUE(matches(mean(e, {0}), {3}, mean_dtype(dtype), {kNaN, kNaN, kNaN}));
    EXPECT_TRUE(matches(mean(e, {1}), {0}, mean_dtype(dtype), {}));
    EXPECT_TRUE(matches(var(e), {}, mean_dtype(dtype), {kNaN}));
    EXPECT_TRUE(matches(var(e, {0}, 0), {3}, mean_dtype(dtype), {kNaN, kNaN, kNaN}));
    // Reductions over non-empty dims of an empty tensor are empty, not errors.
    EXPECT_TRUE(matches(amax(e, {1}), {0}, dtype, {}));
    EXPECT_TRUE(matches(amin(e, {1}, true), {0, 1}, dtype, {}));
    EXPECT_TRUE(matches(argmax(e, 1), {0}, DType::i64, {}));
    EXPECT_TRUE(matches(argmin(empty({2, 0}, dtype), 0), {0}, DType::i64, {}));
    // [2, 0] reduced over the empty dim gives identities per row.
    EXPECT_TRUE(matches(sum(empty({2, 0}, dtype), {1}), {2}, sum_dtype(dtype), {0, 0}));
    EXPECT_TRUE(matches(prod(empty({2, 0}, dtype), {-1}), {2}, sum_dtype(dtype), {1, 1}));
  }
}

TEST(SumReduce, ResultDtypes) {
  EXPECT_EQ(sum(ones({2}, DType::i32)).dtype(), DType::i64);
  EXPECT_EQ(sum(ones({2}, DType::u8)).dtype(), DType::i64);
  EXPECT_EQ(sum(ones({2}, DType::b8)).dtype(), DType::i64);
  EXPECT_EQ(sum(ones({2}, DType::i64)).dtype(), DType::i64);
  EXPECT_EQ(sum(ones({2}, DType::f16)).dtype(), DType::f16);
  EXPECT_EQ(sum(ones({2}, DType::bf16)).dtype(), DType::bf16);
  EXPECT_EQ(mean(ones({2}, DType::i32)).dtype(), DType::f32);
  EXPECT_EQ(mean(ones({2}, DType::b8)).dtype(), DType::f32);
  EXPECT_EQ(mean(ones({2}, DType::f64)).dtype(), DType::f64);
  EXPECT_EQ(prod(ones({2}, DType::u8)).dtype(), DType::i64);
  EXPECT_EQ(amax(ones({2}, DType::u8)).dtype(), DType::u8);
  EXPECT_EQ(amin(ones({2}, DType::bf16)).dtype(), DType::bf16);
  EXPECT_EQ(var(ones({2}, DType::i64)).dtype(), DType::f32);
  EXPECT_EQ(var(ones({2}, DType::f16)).dtype(), DType::f16);
  EXPECT_EQ(argmax(ones({2}, DType::f16)).dtype(), DType::i64);
  // Values: b8 sums count the true elements; u8 sums do not wrap at 256.
  EXPECT_TRUE(matches(sum(make({1, 0, 1, 1}, {4}, DType::b8)), {}, DType::i64, {3}));
  EXPECT_TRUE(matches(sum(make({200, 200, 200}, {3}, DType::u8)), {}, DType::i64, {600}));
  EXPECT_TRUE(matches(mean(make({1, 2}, {2}, DType::i32)), {}, DType::f32, {1.5}));
  EXPECT_TRUE(matches(mean(make({1, 0, 1, 1}, {4}, DType::b8)), {}, DType::f32, {0.75}));
  EXPECT_TRUE(matches(prod(make({200, 200, 200}, {3}, DType::u8)), {}, DType::i64, {8e6}));
}

TEST(SumReduce, IntegerSumsDoNotOverflowNarrowTypes) {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(walk<int64_t>(sum(make_typed<int32_t>({kMax32, kMax32, 2}, {3}))),
            (std::vector<int64_t>{2 * static_cast<int64_t>(kMax32) + 2}));
}

TEST(SumReduce, I64OverflowWrapsLikeElementwise) {
  // Tensors wrap on integer overflow (as add does); the reduction must not hit signed-overflow UB.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(walk<int64_t>(sum(make_typed<int64_t>({kMax, 1}, {2}))), (std::vector<int64_t>{kMin}));
  EXPECT_EQ(walk<int64_t>(sum(make_typed<int64_t>({kMin, -1, 5}, {3}))), (std::vector<int64_t>{kMin + 4}));
  EXPECT_EQ(walk<int64_t>(sum(make_typed<int64_t>({kMax, kMax, 1, 1}, {2, 2}), {1})), (std::vector<int64_t>{-2, 2}));
  EXPECT_EQ(walk<int64_t>(sum(make_typed<int64_t>({kMax, kMax, 1, 1}, {2, 2}), {0})), (std::vector<int64_t>{kMin, kMin}));
  EXPECT_EQ(walk<int64_t>(prod(make_typed<int64_t>({int64_t{1} << 62, 4}, {2}))), (std::vector<int64_t>{0}));
  EXPECT_EQ(walk<int64_t>(prod(make_typed<int64_t>({kMax, kMax}, {2}))), (std::vector<int64_t>{1}));
}

TEST(SumReduce, HalfPrecisionAccumulatesWide) {
  // 4096 ones: an f16 accumulator would stop at 2048 (bf16: at 256).
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = ones({4096}, dtype);
    EXPECT_TRUE(matches(sum(x), {}, dtype, {4096}, {0, 0}));
    EXPECT_TRUE(matches(mean(x), {}, dtype, {1}, {0, 0}));
    const Tensor m = ones({4096, 2}, dtype);
    EXPECT_TRUE(matches(sum(m, {0}), {2}, dtype, {4096, 4096}, {0, 0}));       // rows of accumulators
    EXPECT_TRUE(matches(sum(m.t(), {1}), {2}, dtype, {4096, 4096}, {0, 0}));   // strided runs
    EXPECT_TRUE(matches(sum(ones({64, 64}, dtype).t()), {}, dtype, {4096}, {0, 0}));
    // 0.1 summed 1000 times; compare to the wide sum of the rounded input, rounded once.
    const Tensor tenth = full({1000}, 0.1, dtype);
    const double rounded = round_to(dtype, 0.1);
    EXPECT_TRUE(matches(sum(tenth), {}, dtype, {round_to(dtype, 1000 * rounded)}, {0, 0}));
  }
}

// Sums over the leading dims of a contiguous tensor (a bias's gradient) add eight rows at a time:
// row counts off that block, several leading dims, keepdim, and every floating dtype.
TEST(SumReduce, LeadingDimsMatchReference) {
  std::vector<double> v;
  for (int64_t k = 0; k < 19 * 3 * 5; ++k) v.push_back(std::round(8 * std::sin(0.37 * static_cast<double>(k))) / 8);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = make(v, {19, 3, 5}, dtype);
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{0}, std::vector<int64_t>{0, 1}}) {
      const Groups g = groups(v, {19, 3, 5}, dims, false);
      EXPECT_TRUE(matches(sum(x, dims), g.shape, dtype, fold_ref(g, sum_ref), {0, 0})) << dims.size();
      const Groups kept = groups(v, {19, 3, 5}, dims, true);
      EXPECT_TRUE(matches(sum(x, dims, true), kept.shape, dtype, fold_ref(kept, sum_ref), {0, 0}));
    }
  }
}

TEST(SumReduce, LargeF32SumIsAccurate) {
  constexpr int64_t n = 1 << 20;
  const float tenth = 0.1f;
  const Tensor x = full({n}, tenth, DType::f32);
  const double want = static_cast<double>(n) * static_cast<double>(tenth);
  const double got = walk(sum(x))[0];
  EXPECT_NEAR(got, want, 1e-6 * want);
  EXPECT_NEAR(walk(mean(x))[0], static_cast<double>(tenth), 1e-6 * 0.1);
  // Varied values, a tail that is not a whole block, and a sum along each dim of a big matrix.
  constexpr int64_t rows = 1000, cols = 1037;
  std::vector<double> v;
  for (int64_t k = 0; k < rows * cols; ++k) v.push_back(static_cast<float>(std::sin(0.001 * static_cast<double>(k)) + 0.3));
  const Tensor m = make(v, {rows, cols}, DType::f32);
  double abs_total = 0;
  for (double e : v) abs_total += std::abs(e);
  EXPECT_NEAR(walk(sum(m))[0], sum_ref(v), 1e-6 * abs_total);
  EXPECT_NEAR(walk(sum(m.t()))[0], sum_ref(v), 1e-6 * abs_total);
  for (int64_t dim : {0, 1}) {
    SCOPED_TRACE(dim);
    const Groups g = groups(v, {rows, cols}, {dim}, false);
    EXPECT_TRUE(matches(sum(m, {dim}), g.shape, DType::f32, fold_ref(g, sum_ref), {1e-6, 1e-5}));
    const Groups gt = groups(walk(m.t()), {cols, rows}, {1 - dim}, false);
    EXPECT_TRUE(matches(sum(m.t(), {1 - dim}), gt.shape, DType::f32, fold_ref(gt, sum_ref), {1e-6, 1e-5}));
  }
}

TEST(ReduceNaN, AmaxAminPropagateNaN) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = make({1, kNaN, 3, 4, 5, 6}, {2, 3}, dtype);
    EXPECT_TRUE(matches(amax(x), {}, dtype, {kNaN}));
    EXPECT_TRUE(matches(amin(x), {}, dtype, {kNaN}));
    EXPECT_TRUE(matches(amax(x, {1}), {2}, dtype, {kNaN, 6}));
    EXPECT_TRUE(matches(amin(x, {1}), {2}, dtype, {kNaN, 4}));
    EXPECT_TRUE(matches(amax(x, {0}), {3}, dtype, {4, kNaN, 6}));
    EXPECT_TRUE(matches(amin(x.t(), {1}), {3}, dtype, {1, kNaN, 3}));
    // NaN first (where the fold starts) and last.
    const Tensor first = make({kNaN, 1, 2}, {3}, dtype), last = make({2, 1, kNaN}, {3}, dtype);
    EXPECT_TRUE(matches(amax(first), {}, dtype, {kNaN}));
    EXPECT_TRUE(matches(amin(first), {}, dtype, {kNaN}));
    EXPECT_TRUE(matches(amax(last), {}, dtype, {kNaN}));
    EXPECT_TRUE(matches(amin(last), {}, dtype, {kNaN}));
    EXPECT_TRUE(matches(amax(make({-kInf, -kInf}, {2}, dtype)), {}, dtype, {-kInf}));
    EXPECT_TRUE(matches(sum(x, {1}), {2}, dtype, {kNaN, 15}));
    EXPECT_TRUE(matches(mean(x, {0}), {3}, dtype, {2.5, kNaN, 4.5}));
  }
}

TEST(ArgmaxArgmin, TiesPickTheFirst) {
  EXPECT_TRUE(matches(argmax(make({3, 1, 3}, {3}, DType::f32)), {}, DType::i64, {0}));
  EXPECT_TRUE(matches(argmin(make({1, 0, 0}, {3}, DType::i32)), {}, DType::i64, {1}));
  EXPECT_TRUE(matches(argmax(make({0, 1, 1}, {3}, DType::b8)), {}, DType::i64, {1}));
  EXPECT_TRUE(matches(argmax(make({5, 5, 5, 5}, {2, 2}, DType::u8), 1), {2}, DType::i64, {0, 0}));
  EXPECT_TRUE(matches(argmax(make({1, 7, 7, 7, 2, 7}, {2, 3}, DType::f16), 1, true), {2, 1}, DType::i64, {1, 0}));
  EXPECT_TRUE(matches(argmax(make({1, 7, 7, 7, 2, 7}, {2, 3}, DType::f16), 0), {3}, DType::i64, {1, 0, 0}));
}

TEST(ArgmaxArgmin, NaNIsPicked) {
  for (DType dtype : floating_dtypes()) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = make({1, kNaN, 5, kNaN}, {4}, dtype);
    EXPECT_TRUE(matches(argmax(x), {}, DType::i64, {1}));
    EXPECT_TRUE(matches(argmin(x), {}, DType::i64, {1}));
    const Tensor m = make({1, 2, kNaN, 0, 9, 8}, {2, 3}, dtype);
    EXPECT_TRUE(matches(argmax(m, 1), {2}, DType::i64, {2, 1}));
    EXPECT_TRUE(matches(argmin(m, 1), {2}, DType::i64, {2, 0}));
    EXPECT_TRUE(matches(argmax(m, 0), {3}, DType::i64, {0, 1, 0}));
    EXPECT_TRUE(matches(argmax(m.t(), 0), {2}, DType::i64, {2, 1}));
  }
}

TEST(ArgmaxArgmin, LeadingDimOfRank3KeepsOutputOrder) {
  // x[i, j, k] = 100 * (i == j % 2) + 10 * j + k: the argmax along dim 0 depends on j only, and
  // argmin on k too; a result laid out [k, j] instead of [j, k] would show.
  std::vector<double> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) v.push_back((i == j % 2 ? 100 : 0) + 10 * j + k + (i == 1 && k == 3 ? 1000 : 0));
  const Tensor x = make(v, {2, 3, 4}, DType::f32);
  EXPECT_TRUE(matches(argmax(x, 0), {3, 4}, DType::i64, {0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1}));
  EXPECT_TRUE(matches(argmax(x, -3, true), {1, 3, 4}, DType::i64, {0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1}));
  EXPECT_TRUE(matches(argmin(x, 0), {3, 4}, DType::i64, {1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 0}));
  EXPECT_TRUE(matches(argmax(x, 1), {2, 4}, DType::i64, {2, 2, 2, 2, 1, 1, 1, 1}));
}

TEST(VarReduce, CorrectionsLikeTorch) {
  const Tensor x = make({1, 2, 3, 4}, {4}, DType::f64);
  EXPECT_TRUE(matches(var(x, {}, 0), {}, DType::f64, {1.25}));
  EXPECT_TRUE(matches(var(x, {}, 1), {}, DType::f64, {5.0 / 3}));
  EXPECT_TRUE(matches(var(x), {}, DType::f64, {5.0 / 3}));  // default correction is 1
  EXPECT_TRUE(matches(var(x, {}, 2), {}, DType::f64, {2.5}));
  EXPECT_TRUE(matches(var(x, {}, 4), {}, DType::f64, {kInf}));  // N - correction <= 0: divide by 0
  EXPECT_TRUE(matches(var(x, {}, 5), {}, DType::f64, {kInf}));
  EXPECT_TRUE(matches(var(make({2, 2}, {2}, DType::f32), {}, 2), {}, DType::f32, {kNaN}));  // 0 / 0
  EXPECT_TRUE(matches(var(make({7}, {1}, DType::f32)), {}, DType::f32, {kNaN}));
  EXPECT_TRUE(matches(var(make({7}, {1}, DType::f32), {}, 0), {}, DType::f32, {0}));
  // Per dim, with keepdim, on ints (f32 result) and transposed input.
  const Tensor m = make({1, 2, 3, 4, 6, 8}, {2, 3}, DType::i32);
  EXPECT_TRUE(matches(var(m, {1}, 1, true), {2, 1}, DType::f32, {1, 4}));
  EXPECT_TRUE(matches(var(m, {0}, 0), {3}, DType::f32, {2.25, 4, 6.25}));
  EXPECT_TRUE(matches(var(m.t(), {0}, 1), {2}, DType::f32, {1, 4}));
  // Two-pass: a large common offset does not cancel the variance away.
  EXPECT_TRUE(matches(var(make({1e8 + 1, 1e8 + 2, 1e8 + 3}, {3}, DType::f64)), {}, DType::f64, {1}));
  EXPECT_TRUE(matches(var(make({1e4 + 1, 1e4 + 2, 1e4 + 3}, {3}, DType::f32)), {}, DType::f32, {1}));
}

// ================================================================================================
// Errors (STYLE.md §5: "[op] ...", naming the shapes)
// ================================================================================================

TEST(ReduceErrors, DimOutOfRange) {
  const Tensor x = ones({2, 3});
  EXPECT_TRUE(value_error([&] { (void)sum(x, {3}); }, {"[sum] dim 3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)sum(x, {2}); }, {"[sum] dim 2 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)sum(x, {-3}); }, {"[sum] dim -3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)mean(x, {0, 5}); }, {"[mean] dim 5 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)prod(x, {3}); }, {"[prod] dim 3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)amax(x, {3}); }, {"[amax] dim 3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)amin(x, {3}); }, {"[amin] dim 3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)var(x, {3}); }, {"[var] dim 3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)argmax(x, 2); }, {"[argmax] dim 2 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)argmin(x, -3); }, {"[argmin] dim -3 out of range for shape [2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)sum(ones({}), {1}); }, {"[sum] dim 1 out of range for shape []"}));
  EXPECT_TRUE(value_error([&] { (void)argmax(ones({}), 1); }, {"[argmax] dim 1 out of range for shape []"}));
}

TEST(ReduceErrors, RepeatedDim) {
  const Tensor x = ones({2, 3});
  EXPECT_TRUE(value_error([&] { (void)sum(x, {1, -1}); }, {"[sum] dim 1 appears more than once", "[2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)mean(x, {0, 0}); }, {"[mean] dim 0 appears more than once", "[2, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)prod(x, {0, 1, 0}); }, {"[prod] dim 0 appears more than once"}));
  EXPECT_TRUE(value_error([&] { (void)prod(ones({2}, DType::i32), {0, 0}); }, {"[prod] dim 0 appears more than once"}));
  EXPECT_TRUE(value_error([&] { (void)amax(x, {-2, 0}); }, {"[amax] dim 0 appears more than once"}));
  EXPECT_TRUE(value_error([&] { (void)var(x, {1, 1}); }, {"[var] dim 1 appears more than once"}));
}

TEST(ReduceErrors, ExtremumOverZeroElements) {
  EXPECT_TRUE(value_error([&] { (void)amax(empty({0, 3})); }, {"[amax] cannot reduce over zero elements", "[0, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)amin(empty({0, 3})); }, {"[amin] cannot reduce over zero elements", "[0, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)amax(empty({0, 3}), {0}); }, {"[amax] cannot reduce over zero elements"}));
  EXPECT_TRUE(value_error([&] { (void)amin(empty({0}, DType::i32)); }, {"[amin] cannot reduce over zero elements"}));
}

TEST(ReduceErrors, ArgmaxOverEmptyDim) {
  EXPECT_TRUE(value_error([&] { (void)argmax(empty({0})); }, {"[argmax] cannot reduce over zero elements", "[0]"}));
  EXPECT_TRUE(value_error([&] { (void)argmin(empty({2, 0})); }, {"[argmin] cannot reduce over zero elements"}));
  EXPECT_TRUE(value_error([&] { (void)argmax(empty({0}), 0); }, {"[argmax] cannot reduce over zero elements", "[0]"}));
  EXPECT_TRUE(value_error([&] { (void)argmax(empty({0, 3}), 0); },
                          {"[argmax] cannot reduce over zero elements", "[0, 3]"}));
  EXPECT_TRUE(value_error([&] { (void)argmin(empty({2, 0}), -1); },
                          {"[argmin] cannot reduce over zero elements", "[2, 0]"}));
}

TEST(ReduceErrors, VarNegativeCorrection) {
  EXPECT_TRUE(value_error([&] { (void)var(ones({2, 3}), {}, -1); }, {"[var] negative correction -1", "[2, 3]"}));
}

TEST(ReduceErrors, UndefinedTensor) {
  const Tensor u;
  const std::string what = "tensor is undefined";
  EXPECT_TRUE(value_error([&] { (void)sum(u); }, {"[sum]", what}));
  EXPECT_TRUE(value_error([&] { (void)mean(u); }, {"[mean]", what}));
  EXPECT_TRUE(value_error([&] { (void)prod(u); }, {"[prod]", what}));
  EXPECT_TRUE(value_error([&] { (void)amax(u); }, {"[amax]", what}));
  EXPECT_TRUE(value_error([&] { (void)amin(u); }, {"[amin]", what}));
  EXPECT_TRUE(value_error([&] { (void)var(u); }, {"[var]", what}));
  EXPECT_TRUE(value_error([&] { (void)argmax(u); }, {"[argmax]", what}));
  EXPECT_TRUE(value_error([&] { (void)argmin(u, 0); }, {"[argmin]", what}));
}
