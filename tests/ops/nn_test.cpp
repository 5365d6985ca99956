// Tests for tessera/ops/nn.hpp against hand-computed values and plain double-loop references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <tessera/core/tensor.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/nn.hpp>
#include <tessera/ops/reduce.hpp>

#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

// Tolerances for comparing against a double reference computed from the (already rounded)
// input values: the output rounding of the dtype plus its compute type's error.
constexpr TolTable kTol{
    .f64 = {1e-12, 1e-12}, .f32 = {1e-5, 1e-6}, .f16 = {2e-3, 1e-3}, .bf16 = {1e-2, 1e-2}, .other = {1e-2, 1e-2}};

// values as a tensor of dtype, converted by the library (from_vector, then to()).
Tensor tensor_of(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f64) {
  return from_vector(values, shape).to(dtype);
}

// Deterministic values in [-scale, scale).
std::vector<double> sample(int64_t n, double scale = 3.0, uint64_t seed = 1) {
  std::vector<double> out(static_cast<size_t>(n));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 12345;
  for (auto& v : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = (static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
  }
  return out;
}

std::string show(const std::vector<double>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// Checks dtype, shape and values of `actual` against a double reference.
void expect_close(const Tensor& actual, const std::vector<double>& expected, const Shape& shape, DType dtype,
                  const std::string& context = "") {
  SCOPED_TRACE(context + " dtype " + std::string(name(dtype)));
  ASSERT_EQ(actual.dtype(), dtype);
  ASSERT_EQ(actual.shape(), shape) << actual.shape().to_string() << " vs " << shape.to_string();
  const Tol t = kTol(dtype);
  EXPECT_TRUE(allclose(actual.to(DType::f64), tensor_of(expected, shape), t.rtol, t.atol))
      << "got " << show(actual.to_vector<double>()) << "\nexpected " << show(expected);
}

// Geometry [outer, n, inner] of a reduction over dim of shape.
struct Split {
  int64_t outer = 1, n = 1, inner = 1;
};
Split split(const Shape& shape, int64_t dim) {
  Split s;
  for (int64_t d = 0; d < shape.size(); ++d) (d < dim ? s.outer : d == dim ? s.n : s.inner) *= shape[d];
  return s;
}

std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& shape, int64_t dim, bool log) {
  if (dim < 0) dim += shape.size();
  const Split s = split(shape, dim);
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.inner; ++j) {
      auto at = [&](int64_t i) { return static_cast<size_t>((o * s.n + i) * s.inner + j); };
      double m = -kInf, total = 0;
      for (int64_t i = 0; i < s.n; ++i) m = std::max(m, x[at(i)]);
      for (int64_t i = 0; i < s.n; ++i) total += std::exp(x[at(i)] - m);
      for (int64_t i = 0; i < s.n; ++i) y[at(i)] = log ? x[at(i)] - m - std::log(total) : std::exp(x[at(i)] - m) / total;
    }
  return y;
}

// Rows of n over the trailing dims; w/b empty means absent.
std::vector<double> ref_layer_norm(const std::vector<double>& x, int64_t n, const std::vector<double>& w,
                                   const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[r * n + i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
    var /= n;
    for (int64_t i = 0; i < n; ++i) {
      double v = (x[r * n + i] - mean) / std::sqrt(var + eps);
      if (!w.empty()) v *= w[i];
      if (!b.empty()) v += b[i];
      y[r * n + i] = v;
    }
  }
  return y;
}

std::vector<double> ref_rms_norm(const std::vector<double>& x, int64_t n, const std::vector<double>& w, double eps) {
  std::vector<double> y(x.size());
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int64_t i = 0; i < n; ++i) squares += x[r * n + i] * x[r * n + i];
    const double scale = 1.0 / std::sqrt(squares / n + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * scale * (w.empty() ? 1.0 : w[i]);
  }
  return y;
}

// Per-target losses (0 where ignored) of logits in [C], [N, C] or [N, C, d...] form.
struct CrossEntropyRef {
  std::vector<double> losses;
  double sum = 0;
  int64_t kept = 0;
};
CrossEntropyRef ref_cross_entropy(const std::vector<double>& logits, const Shape& shape,
                                  const std::vector<int64_t>& target, int64_t ignore_index) {
  const Split s = split(shape, shape.size() == 1 ? 0 : 1);
  CrossEntropyRef ref;
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.inner; ++j) {
      const int64_t k = o * s.inner + j, t = target[static_cast<size_t>(k)];
      double loss = 0;
      if (t != ignore_index) {
        auto at = [&](int64_t c) { return logits[static_cast<size_t>((o * s.n + c) * s.inner + j)]; };
        double m = -kInf, total = 0;
        for (int64_t c = 0; c < s.n; ++c) m = std::max(m, at(c));
        for (int64_t c = 0; c < s.n; ++c) total += std::exp(at(c) - m);
        loss = m + std::log(total) - at(t);
        ref.sum += loss;
        ++ref.kept;
      }
      ref.losses.push_back(loss);
    }
  return ref;
}

}  // namespace

// ---- softmax / log_softmax ---------------------------------------------------------------------

TEST(Softmax, HandComputed) {
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of({1, 2, 3}, {3}, dtype);
    expect_close(softmax(x, 0), {0.09003057317038046, 0.24472847105479764, 0.6652409557748218}, {3}, dtype);
    expect_close(log_softmax(x, -1), {-2.4076059644443806, -1.4076059644443804, -0.4076059644443804}, {3}, dtype);
  }
}

TEST(Softmax, LargeMagnitudeIsStable) {
  // bf16 cannot hold 1001 (it rounds to 1000), so it gets 1000 and 1004.
  for (DType dtype : floating_dtypes()) {
    const double hi = dtype == DType::bf16 ? 1004 : 1001;
    const Tensor x = tensor_of({1000, hi, -1000, -hi}, {2, 2}, dtype);
    const auto xs = x.to_vector<double>();
    expect_close(softmax(x, 1), ref_softmax(xs, {2, 2}, 1, false), {2, 2}, dtype);
    expect_close(log_softmax(x, 1), ref_softmax(xs, {2, 2}, 1, true), {2, 2}, dtype);
    if (dtype != DType::bf16) {
      expect_close(softmax(x, 1), {0.2689414213699951, 0.7310585786300049, 0.7310585786300049, 0.2689414213699951},
                   {2, 2}, dtype, "hand");
      expect_close(log_softmax(x, 1),
                   {-1.3132616875182228, -0.31326168751822286, -0.31326168751822286, -1.3132616875182228}, {2, 2},
                   dtype, "hand");
    }
  }
  // Far beyond exp's range in f64: still finite.
  const Tensor x = tensor_of({1e300, 1e300}, {2});
  expect_close(softmax(x, 0), {0.5, 0.5}, {2}, DType::f64);
  expect_close(log_softmax(x, 0), {-std::log(2.0), -std::log(2.0)}, {2}, DType::f64);
}

TEST(Softmax, EveryDimEveryDtypeMatchesReference) {
  const Shape shape{2, 3, 4};
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of(sample(24), shape, dtype);
    const auto xs = x.to_vector<double>();
    for (int64_t dim = -3; dim < 3; ++dim) {
      const std::string context = "dim " + std::to_string(dim);
      expect_close(softmax(x, dim), ref_softmax(xs, shape, dim, false), shape, dtype, "softmax " + context);
      expect_close(log_softmax(x, dim), ref_softmax(xs, shape, dim, true), shape, dtype, "log_softmax " + context);
    }
  }
}

TEST(Softmax, RowsSumToOne) {
  const Tensor y = softmax(tensor_of(sample(5 * 7, 10.0), {5, 7}, DType::f32), 0);
  const auto v = y.to_vector<double>();
  for (int64_t j = 0; j < 7; ++j) {
    double total = 0;
    for (int64_t i = 0; i < 5; ++i) total += v[static_cast<size_t>(i * 7 + j)];
    EXPECT_NEAR(total, 1.0, 1e-6);
  }
}

TEST(Softmax, NonContiguousInputs) {
  for (DType dtype : floating_dtypes()) {
    const Tensor base = tensor_of(sample(3 * 4 * 5, 3.0, 7), {3, 4, 5}, dtype);
    for (const Tensor& x : {base.transpose(0, 2), base.permute({1, 2, 0}), base.narrow(2, 1, 3)}) {
      ASSERT_FALSE(x.is_contiguous());
      const auto xs = x.to_vector<double>();
      for (int64_t dim = -x.ndim(); dim < x.ndim(); ++dim) {
        expect_close(softmax(x, dim), ref_softmax(xs, x.shape(), dim, false), x.shape(), dtype, "softmax");
        expect_close(log_softmax(x, dim), ref_softmax(xs, x.shape(), dim, true), x.shape(), dtype, "log_softmax");
      }
    }
  }
}

TEST(Softmax, ZeroSizeAndZeroDim) {
  for (const Shape& shape : {Shape{0, 3}, Shape{2, 0}, Shape{0}}) {
    for (int64_t dim = 0; dim < shape.size(); ++dim) {
      EXPECT_EQ(softmax(zeros(shape), dim).shape(), shape);
      EXPECT_EQ(log_softmax(zeros(shape, DType::f16), dim).shape(), shape);
    }
  }
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of({5.5}, {}, dtype);
    expect_close(softmax(x, 0), {1.0}, {}, dtype);
    expect_close(softmax(x, -1), {1.0}, {}, dtype);
    expect_close(log_softmax(x, 0), {0.0}, {}, dtype);
  }
}

TEST(Softmax, InfinitiesFollowPyTorch) {
  const Tensor x = tensor_of({-kInf, 0, -kInf, -kInf}, {2, 2});
  const auto sm = softmax(x, 1).to_vector<double>();
  EXPECT_EQ(sm[0], 0.0);
  EXPECT_EQ(sm[1], 1.0);
  EXPECT_TRUE(std::isnan(sm[2]) && std::isnan(sm[3]));  // a row of -inf is NaN
  const auto lsm = log_softmax(x.to(DType::f32), 1).to_vector<double>();
  EXPECT_EQ(lsm[0], -kInf);
  EXPECT_EQ(lsm[1], 0.0);
  EXPECT_TRUE(std::isnan(lsm[2]) && std::isnan(lsm[3]));
  // NaN anywhere in a row makes the row NaN.
  const auto nan_row = softmax(tensor_of({1, std::nan(""), 2}, {3}), 0).to_vector<double>();
  for (double v : nan_row) EXPECT_TRUE(std::isnan(v));
}

TEST(Softmax, RejectsIntegerDtype) {
  EXPECT_TRUE(value_error([] { softmax(arange(4), 0); }, {"[softmax]", "i64"}));
  EXPECT_TRUE(value_error([] { log_softmax(zeros({2}, DType::b8), 0); }, {"[log_softmax]", "b8"}));
}

TEST(Softmax, RejectsDimOutOfRange) {
  EXPECT_TRUE(value_error([] { softmax(zeros({2, 3}), 2); }, {"[softmax]", "dim 2", "[2, 3]"}));
  EXPECT_TRUE(value_error([] { log_softmax(zeros({2, 3}), -3); }, {"[log_softmax]", "dim -3", "[2, 3]"}));
}

// ---- layer_norm ----------------------------------------------------------------------------------

TEST(LayerNorm, HandComputed) {
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of({1, 2, 3}, {1, 3}, dtype);
    expect_close(layer_norm(x, {3}, std::nullopt, std::nullopt, 0.0), {-1.224744871391589, 0.0, 1.224744871391589},
                 {1, 3}, dtype);
    const Tensor w = tensor_of({1, 2, -1}, {3}, dtype), b = tensor_of({0.5, 0, 1}, {3}, dtype);
    expect_close(layer_norm(x, {3}, w, b, 0.0), {-0.724744871391589, 0.0, -0.224744871391589}, {1, 3}, dtype);
  }
  // eps sits inside the sqrt: a constant row normalises to 0, and to bias with a bias.
  expect_close(layer_norm(tensor_of({4, 4}, {2}), {2}, std::nullopt, tensor_of({3, -1}, {2})), {3, -1}, {2},
               DType::f64);
}

TEST(LayerNorm, MatchesReferenceEveryDtype) {
  const Shape shape{2, 3, 4};
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of(sample(24, 5.0, 3), shape, dtype);
    const Tensor w = tensor_of(sample(12, 2.0, 4), {3, 4}, dtype), b = tensor_of(sample(12, 1.0, 5), {3, 4}, dtype);
    const auto xs = x.to_vector<double>(), ws = w.to_vector<double>(), bs = b.to_vector<double>();
    // Over the last two dims, with every combination of weight and bias.
    expect_close(layer_norm(x, {3, 4}), ref_layer_norm(xs, 12, {}, {}, 1e-5), shape, dtype, "plain");
    expect_close(layer_norm(x, {3, 4}, w), ref_layer_norm(xs, 12, ws, {}, 1e-5), shape, dtype, "weight");
    expect_close(layer_norm(x, {3, 4}, std::nullopt, b), ref_layer_norm(xs, 12, {}, bs, 1e-5), shape, dtype, "bias");
    expect_close(layer_norm(x, {3, 4}, w, b, 0.1), ref_layer_norm(xs, 12, ws, bs, 0.1), shape, dtype, "both");
    // Over the last dim and over all dims.
    const Tensor w4 = w.narrow(0, 0, 1).reshape({4});
    expect_close(layer_norm(x, {4}, w4), ref_layer_norm(xs, 4, w4.to_vector<double>(), {}, 1e-5), shape, dtype,
                 "last dim");
    expect_close(layer_norm(x, {2, 3, 4}), ref_layer_norm(xs, 24, {}, {}, 1e-5), shape, dtype, "all dims");
  }
}

TEST(LayerNorm, LargeOffsetIsStable) {
  // A two-pass variance keeps rows far from zero exact enough in f32.
  const Tensor x = tensor_of({10000.0, 10001.0, 10002.0, 10003.0}, {1, 4}, DType::f32);
  expect_close(layer_norm(x, {4}), ref_layer_norm(x.to_vector<double>(), 4, {}, {}, 1e-5), {1, 4}, DType::f32);
}

TEST(LayerNorm, NonContiguousInputAndWeight) {
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of(sample(20, 2.0, 9), {4, 5}, dtype).t();  // [5, 4]
    const Tensor w = tensor_of(sample(8, 1.0, 10), {4, 2}, dtype).select(1, 1);  // stride 2
    ASSERT_FALSE(x.is_contiguous());
    ASSERT_FALSE(w.is_contiguous());
    expect_close(layer_norm(x, {4}, w, w), ref_layer_norm(x.to_vector<double>(), 4, w.to_vector<double>(),
                                                          w.to_vector<double>(), 1e-5),
                 {5, 4}, dtype);
  }
}

TEST(LayerNorm, ZeroSizeInput) {
  EXPECT_EQ(layer_norm(zeros({0, 4}), {4}).shape(), (Shape{0, 4}));
  EXPECT_EQ(layer_norm(zeros({3, 0}, DType::bf16), {0}, zeros({0}, DType::bf16)).shape(), (Shape{3, 0}));
}

TEST(LayerNorm, RejectsMismatchedNormalizedShape) {
  EXPECT_TRUE(value_error([] { layer_norm(zeros({2, 3}), {4}); },
                          {"[layer_norm] normalized_shape [4] does not match the trailing dims of input shape [2, 3]"}));
  EXPECT_TRUE(value_error([] { layer_norm(zeros({3}), {2, 3}); }, {"[layer_norm]", "[2, 3]", "input shape [3]"}));
  EXPECT_TRUE(value_error([] { layer_norm(zeros({2, 3}), {}); }, {"[layer_norm]", "normalized_shape []", "[2, 3]"}));
}

TEST(LayerNorm, RejectsMismatchedWeightOrBias) {
  EXPECT_TRUE(value_error([] { layer_norm(zeros({2, 3}), {3}, zeros({2})); },
                          {"[layer_norm]", "weight shape [2]", "normalized_shape [3]", "[2, 3]"}));
  EXPECT_TRUE(value_error([] { layer_norm(zeros({2, 3}), {3}, std::nullopt, zeros({1, 3})); },
                          {"[layer_norm]", "bias shape [1, 3]", "normalized_shape [3]"}));
  EXPECT_TRUE(value_error([] { layer_norm(zeros({2, 3}), {3}, zeros({3}, DType::f64)); },
                          {"[layer_norm]", "weight dtype f64", "input dtype f32"}));
}

TEST(LayerNorm, RejectsIntegerInput) {
  EXPECT_TRUE(value_error([] { layer_norm(zeros({2, 3}, DType::i32), {3}); }, {"[layer_norm]", "i32"}));
}

// ---- rms_norm ------------------------------------------------------------------------------------

TEST(RmsNorm, HandComputed) {
  for (DType dtype : floating_dtypes()) {
    expect_close(rms_norm(tensor_of({3, 4}, {2}, dtype), {2}, std::nullopt, 0.0),
                 {0.848528137423857, 1.131370849898476}, {2}, dtype);
    expect_close(rms_norm(tensor_of({3, 4}, {2}, dtype), {2}, tensor_of({2, -1}, {2}, dtype), 0.0),
                 {1.697056274847714, -1.131370849898476}, {2}, dtype);
  }
  // A zero row stays zero (eps avoids 0/0).
  expect_close(rms_norm(zeros({1, 3}), {3}), {0, 0, 0}, {1, 3}, DType::f32);
}

TEST(RmsNorm, MatchesReferenceEveryDtype) {
  const Shape shape{3, 2, 5};
  for (DType dtype : floating_dtypes()) {
    const Tensor x = tensor_of(sample(30, 4.0, 11), shape, dtype);
    const Tensor w = tensor_of(sample(10, 2.0, 12), {2, 5}, dtype);
    const auto xs = x.to_vector<double>();
    expect_close(rms_norm(x, {5}), ref_rms_norm(xs, 5, {}, 1e-6), shape, dtype, "last dim");
    expect_close(rms_norm(x, {2, 5}, w, 1e-2), ref_rms_norm(xs, 10, w.to_vector<double>(), 1e-2), shape, dtype,
                 "two dims");
    const Tensor xt = x.transpose(0, 2);  // [5, 2, 3], non-contiguous
    expect_close(rms_norm(xt, {3}), ref_rms_norm(xt.to_vector<double>(), 3, {}, 1e-6), xt.shape(), dtype, "transposed");
  }
}

TEST(RmsNorm, ZeroSizeInput) { EXPECT_EQ(rms_norm(zeros({0, 2, 4}, DType::f16), {4}).shape(), (Shape{0, 2, 4})); }

TEST(RmsNorm, RejectsBadArguments) {
  EXPECT_TRUE(value_error([] { rms_norm(zeros({2, 3}), {2}); },
                          {"[rms_norm] normalized_shape [2] does not match the trailing dims of input shape [2, 3]"}));
  EXPECT_TRUE(value_error([] { rms_norm(zeros({2, 3}), {}); }, {"[rms_norm]", "normalized_shape []"}));
  EXPECT_TRUE(value_error([] { rms_norm(zeros({2, 3}), {3}, zeros({4})); },
                          {"[rms_norm]", "weight shape [4]", "normalized_shape [3]"}));
  EXPECT_TRUE(value_error([] { rms_norm(zeros({2, 3}, DType::f16), {3}, zeros({3}, DType::bf16)); },
                          {"[rms_norm]", "weight dtype bf16", "input dtype f16"}));
  EXPECT_TRUE(value_error([] { rms_norm(zeros({2, 3}, DType::u8), {3}); }, {"[rms_norm]", "u8"}));
}

// ---- embedding -----------------------------------------------------------------------------------

TEST(Embedding, GathersRows) {
  const Tensor weight = tensor_of({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}, DType::f32);
  const Tensor out = embedding(weight, from_vector<int64_t>({3, 0, 3, 1, 2, 2}, {2, 3}));
  EXPECT_EQ(out.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{30, 31, 0, 1, 30, 31, 10, 11, 20, 21, 20, 21}));
  // A 0-d index gives one row of shape [D].
  const Tensor row = embedding(weight, scalar_tensor(2, DType::i32));
  EXPECT_EQ(row.shape(), (Shape{2}));
  EXPECT_EQ(row.to_vector<double>(), (std::vector<double>{20, 21}));
}

TEST(Embedding, EveryWeightAndIndexDtype) {
  const std::vector<double> values = {1, 0, 2, 1, 3, 0};
  for (DType wdtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::b8}) {
    const Tensor weight = tensor_of(values, {3, 2}, wdtype);
    for (DType idtype : {DType::i32, DType::i64, DType::u8}) {
      const Tensor out = embedding(weight, tensor_of({2, 0}, {2}, idtype));
      EXPECT_EQ(out.dtype(), wdtype);
      EXPECT_TRUE(equal(out, tensor_of({3, 0, 1, 0}, {2, 2}, wdtype))) << name(wdtype) << " " << name(idtype);
    }
  }
}

TEST(Embedding, NonContiguousWeightAndIndices) {
  const Tensor base = tensor_of(sample(12, 5.0, 13), {3, 4}, DType::f64);
  const Tensor weight = base.t();  // [4, 3], column stride 4
  const Tensor indices = from_vector<int64_t>({0, 3, 1, 2, 2, 0}, {2, 3}).t();  // [3, 2]
  const Tensor out = embedding(weight, indices);
  ASSERT_EQ(out.shape(), (Shape{3, 2, 3}));
  const auto bs = base.to_vector<double>(), ws = weight.to_vector<double>();
  const auto is = indices.to_vector<double>(), os = out.to_vector<double>();
  for (size_t k = 0; k < is.size(); ++k)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(os[k * 3 + j], ws[static_cast<size_t>(is[k]) * 3 + j]);
  // A narrowed weight whose rows are contiguous but not adjacent.
  const Tensor narrowed = base.narrow(1, 1, 2);  // [3, 2]
  EXPECT_TRUE(equal(embedding(narrowed, from_vector<int32_t>({2, 0})),
                    tensor_of({bs[2 * 4 + 1], bs[2 * 4 + 2], bs[1], bs[2]}, {2, 2})));
}

TEST(Embedding, ZeroSize) {
  EXPECT_EQ(embedding(zeros({4, 3}), zeros({0}, DType::i64)).shape(), (Shape{0, 3}));
  EXPECT_EQ(embedding(zeros({4, 0}), zeros({2, 5}, DType::i64)).shape(), (Shape{2, 5, 0}));
  EXPECT_EQ(embedding(zeros({0, 3}), zeros({0, 2}, DType::i32)).shape(), (Shape{0, 2, 3}));
}

TEST(Embedding, RejectsIndexOutOfRange) {
  EXPECT_TRUE(value_error([] { embedding(zeros({4, 3}), from_vector<int64_t>({1, 4})); },
                          {"[embedding]", "index 4", "[4, 3]", "[0, 4)"}));
  EXPECT_TRUE(value_error([] { embedding(zeros({4, 3}), from_vector<int32_t>({-1})); },
                          {"[embedding]", "index -1", "[4, 3]"}));
}

TEST(Embedding, RejectsNonIntegerIndices) {
  EXPECT_TRUE(value_error([] { embedding(zeros({4, 3}), zeros({2})); }, {"[embedding]", "f32", "[2]"}));
  EXPECT_TRUE(value_error([] { embedding(zeros({4, 3}), zeros({2}, DType::b8)); }, {"[embedding]", "b8"}));
}

TEST(Embedding, RejectsWeightNot2d) {
  EXPECT_TRUE(value_error([] { embedding(zeros({4}), zeros({2}, DType::i64)); }, {"[embedding]", "weight shape [4]"}));
  EXPECT_TRUE(value_error([] { embedding(zeros({2, 3, 4}), zeros({2}, DType::i64)); }, {"[embedding]", "[2, 3, 4]"}));
}

TEST(Embedding, PaddingIdxLeavesTheForwardUnchanged) {
  const Tensor weight = tensor_of({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}, DType::f32);
  const Tensor ids = from_vector<int64_t>({3, 0, 3, 1, 2, 2}, {2, 3});
  for (int64_t pad : {0, 2, 3, -1, -4}) EXPECT_TRUE(equal(embedding(weight, ids, pad), embedding(weight, ids))) << pad;
}

TEST(Embedding, PaddingIdxRowGetsNoGradient) {
  const Tensor ids = from_vector<int64_t>({3, 0, 3, 1, 2, 2}, {2, 3});
  const Tensor up = tensor_of(sample(12, 2.0, 7), {2, 3, 2}, DType::f64);
  // (padding_idx, the row it names): negative counts from the end.
  for (const auto& [pad, row] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {0, 0}, {-1, 3}, {-4, 0}}) {
    Tensor plain = tensor_of(sample(8, 3.0, 5), {4, 2}, DType::f64).requires_grad_();
    Tensor padded = tensor_of(sample(8, 3.0, 5), {4, 2}, DType::f64).requires_grad_();
    sum(mul(embedding(plain, ids), up)).backward();
    sum(mul(embedding(padded, ids, pad), up)).backward();
    const auto g = plain.grad().to_vector<double>(), gp = padded.grad().to_vector<double>();
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t j = 0; j < 2; ++j) {
        const auto k = static_cast<size_t>(r * 2 + j);
        EXPECT_EQ(gp[k], r == row ? 0.0 : g[k]) << "padding_idx " << pad << " row " << r;
      }
    EXPECT_NE(g[static_cast<size_t>(row * 2)], 0.0);  // the padding row is looked up
  }
  // A padding row no index names changes nothing; the gradient keeps the weight's dtype.
  Tensor w = zeros({5, 2}, DType::f32).requires_grad_();
  sum(embedding(w, ids, 4)).backward();
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 0, 0}));
}

TEST(Embedding, RejectsPaddingIdxOutOfRange) {
  EXPECT_TRUE(value_error([] { embedding(zeros({4, 3}), from_vector<int64_t>({1}), 4); },
                          {"[embedding]", "padding_idx 4", "[4, 3]", "[-4, 4)"}));
  EXPECT_TRUE(value_error([] { embedding(zeros({4, 3}), from_vector<int64_t>({1}), -5); },
                          {"[embedding]", "padding_idx -5", "[4, 3]"}));
  EXPECT_TRUE(value_error([] { embedding(zeros({0, 3}), zeros({0}, DType::i64), 0); },
                          {"[embedding]", "padding_idx 0", "[0, 3]"}));
  // The pure check behind both Tensor and DTensor embedding.
  EXPECT_EQ(embedding_padding_index(std::nullopt, Shape{4, 3}), std::nullopt);
  EXPECT_EQ(embedding_padding_index(-1, Shape{4, 3}), std::optional<int64_t>(3));
  EXPECT_EQ(embedding_padding_index(2, Shape{4, 3}), std::optional<int64_t>(2));
}

// ---- cross_entropy -------------------------------------------------------------------------------

TEST(CrossEntropy, HandComputed) {
  for (DType dtype : floating_dtypes()) {
    const Tensor logits = tensor_of({1, 2, 3, 1, 2, 3}, {2, 3}, dtype);
    const Tensor target = from_vector<int64_t>({2, 0});
    expect_close(cross_entropy(logits, target), {1.4076059644443804}, {}, dtype, "mean");
    expect_close(cross_entropy(logits, target, -100, Reduction::sum), {2.815211928888761}, {}, dtype, "sum");
    expect_close(cross_entropy(logits, target, -100, Reduction::none), {0.4076059644443804, 2.4076059644443806}, {2},
                 dtype, "none");
  }
}

TEST(CrossEntropy, EveryReductionEveryDtypeMatchesReference) {
  const Shape shape{6, 5};
  const std::vector<int64_t> targets = {4, 0, 2, 2, 1, 3};
  for (DType dtype : floating_dtypes()) {
    const Tensor logits = tensor_of(sample(30, 4.0, 17), shape, dtype);
    const auto ref = ref_cross_entropy(logits.to_vector<double>(), shape, targets, -100);
    for (DType tdtype : {DType::i64, DType::i32, DType::u8}) {
      const Tensor target = tensor_of(std::vector<double>(targets.begin(), targets.end()), {6}, tdtype);
      expect_close(cross_entropy(logits, target, -100, Reduction::none), ref.losses, {6}, dtype, "none");
      expect_close(cross_entropy(logits, target, -100, Reduction::sum), {ref.sum}, {}, dtype, "sum");
      expect_close(cross_entropy(logits, target, -100, Reduction::mean), {ref.sum / ref.kept}, {}, dtype, "mean");
    }
  }
}

TEST(CrossEntropy, ClassDimOneForm) {
  // [N, C, d1, d2] logits with [N, d1, d2] targets, as in PyTorch.
  const Shape shape{2, 4, 3, 2};
  const std::vector<int64_t> targets = {0, 3, 1, 2, -100, 1, 3, 3, 0, -100, 2, 1};
  for (DType dtype : floating_dtypes()) {
    const Tensor logits = tensor_of(sample(48, 3.0, 19), shape, dtype);
    const Tensor target = from_vector(targets, {2, 3, 2});
    const auto ref = ref_cross_entropy(logits.to_vector<double>(), shape, targets, -100);
    EXPECT_EQ(ref.kept, 10);
    expect_close(cross_entropy(logits, target, -100, Reduction::none), ref.losses, {2, 3, 2}, dtype, "none");
    expect_close(cross_entropy(logits, target, -100, Reduction::sum), {ref.sum}, {}, dtype, "sum");
    expect_close(cross_entropy(logits, target), {ref.sum / ref.kept}, {}, dtype, "mean");
  }
  // [N, C, d] with d = 1 equals the [N, C] form.
  const Tensor logits = tensor_of(sample(6, 2.0, 23), {2, 3});
  const Tensor target = from_vector<int64_t>({1, 2});
  EXPECT_TRUE(allclose(cross_entropy(logits.unsqueeze(2), target.unsqueeze(1), -100, Reduction::none),
                       cross_entropy(logits, target, -100, Reduction::none).unsqueeze(1)));
}

TEST(CrossEntropy, OneDimLogitsZeroDimTarget) {
  for (DType dtype : floating_dtypes()) {
    const Tensor logits = tensor_of({1, 2, 3}, {3}, dtype);
    const Tensor target = scalar_tensor(0, DType::i64);
    expect_close(cross_entropy(logits, target), {2.4076059644443806}, {}, dtype, "mean");
    expect_close(cross_entropy(logits, target, -100, Reduction::sum), {2.4076059644443806}, {}, dtype, "sum");
    expect_close(cross_entropy(logits, target, -100, Reduction::none), {2.4076059644443806}, {}, dtype, "none");
    // Ignored: none gives 0, sum 0, mean NaN.
    expect_close(cross_entropy(logits, target, 0, Reduction::none), {0.0}, {}, dtype, "ignored none");
    EXPECT_TRUE(std::isnan(cross_entropy(logits, target, 0).item()));
  }
}

TEST(CrossEntropy, IgnoreIndex) {
  const Shape shape{4, 3};
  const Tensor logits = tensor_of(sample(12, 2.0, 29), shape, DType::f32);
  const auto xs = logits.to_vector<double>();
  // Default ignore_index -100.
  {
    const std::vector<int64_t> targets = {2, -100, 0, -100};
    const auto ref = ref_cross_entropy(xs, shape, targets, -100);
    const Tensor target = from_vector(targets);
    expect_close(cross_entropy(logits, target, -100, Reduction::none), ref.losses, {4}, DType::f32, "none");
    EXPECT_EQ(cross_entropy(logits, target, -100, Reduction::none).to_vector<double>()[1], 0.0);
    expect_close(cross_entropy(logits, target, -100, Reduction::sum), {ref.sum}, {}, DType::f32, "sum");
    expect_close(cross_entropy(logits, target), {ref.sum / 2}, {}, DType::f32, "mean over the 2 kept");
  }
  // An ignore_index that is also a valid class, and a negative one other than -100.
  for (int64_t ignore : {int64_t{1}, int64_t{-1}}) {
    const std::vector<int64_t> targets = {1, ignore, 0, 2};
    const auto ref = ref_cross_entropy(xs, shape, targets, ignore);
    const Tensor target = from_vector(targets);
    expect_close(cross_entropy(logits, target, ignore, Reduction::none), ref.losses, {4}, DType::f32, "none");
    expect_close(cross_entropy(logits, target, ignore), {ref.sum / ref.kept}, {}, DType::f32, "mean");
  }
  // Every target ignored: mean NaN, sum 0, none all zeros.
  const Tensor all_ignored = from_vector<int64_t>({-100, -100, -100, -100});
  EXPECT_TRUE(std::isnan(cross_entropy(logits, all_ignored).item()));
  EXPECT_EQ(cross_entropy(logits, all_ignored, -100, Reduction::sum).item(), 0.0);
  EXPECT_EQ(cross_entropy(logits, all_ignored, -100, Reduction::none).to_vector<double>(), std::vector<double>(4, 0.0));
}

TEST(CrossEntropy, LargeLogitsAreStable) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16}) {
    const Tensor logits = tensor_of({1000, 1001, -1000, -1001}, {2, 2}, dtype);
    expect_close(cross_entropy(logits, from_vector<int64_t>({0, 1}), -100, Reduction::none),
                 {1.3132616875182228, 1.3132616875182228}, {2}, dtype);
  }
}

TEST(CrossEntropy, NonContiguousInputs) {
  const Tensor base = tensor_of(sample(15, 3.0, 31), {5, 3}, DType::f64);
  const Tensor logits = base.t();  // [3, 5]: 3 samples, 5 classes
  const Tensor target = from_vector<int64_t>({4, 3, 0, 2, 1, 2}, {3, 2}).select(1, 0);  // [4, 0, 1], stride 2
  ASSERT_FALSE(logits.is_contiguous());
  ASSERT_FALSE(target.is_contiguous());
  const auto ref = ref_cross_entropy(logits.to_vector<double>(), {3, 5}, {4, 0, 1}, -100);
  expect_close(cross_entropy(logits, target, -100, Reduction::none), ref.losses, {3}, DType::f64, "none");
  expect_close(cross_entropy(logits, target), {ref.sum / 3}, {}, DType::f64, "mean");
  // The [N, C, d] form with a transposed logits view.
  const Tensor logits3 = tensor_of(sample(24, 3.0, 37), {2, 3, 4}).transpose(1, 2);  // [2, 4, 3]: 4 classes, d = 3
  const std::vector<int64_t> targets3 = {0, 3, 1, 2, 2, 0};
  const auto ref3 = ref_cross_entropy(logits3.to_vector<double>(), {2, 4, 3}, targets3, -100);
  expect_close(cross_entropy(logits3, from_vector(targets3, {2, 3}), -100, Reduction::none), ref3.losses, {2, 3},
               DType::f64, "[N, C, d]");
}

TEST(CrossEntropy, ZeroSize) {
  const Tensor logits = zeros({0, 3});
  const Tensor target = zeros({0}, DType::i64);
  EXPECT_EQ(cross_entropy(logits, target, -100, Reduction::none).shape(), (Shape{0}));
  EXPECT_EQ(cross_entropy(logits, target, -100, Reduction::sum).item(), 0.0);
  EXPECT_TRUE(std::isnan(cross_entropy(logits, target).item()));
  EXPECT_EQ(cross_entropy(zeros({2, 3, 0}), zeros({2, 0}, DType::i64), -100, Reduction::none).shape(), (Shape{2, 0}));
}

TEST(CrossEntropy, RejectsTargetOutOfRange) {
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({2, 3}), from_vector<int64_t>({0, 3})); },
                          {"[cross_entropy]", "target 3", "[2, 3]", "[0, 3)", "ignore_index -100"}));
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({2, 3}), from_vector<int64_t>({-1, 0})); },
                          {"[cross_entropy]", "target -1", "[2, 3]"}));
}

TEST(CrossEntropy, RejectsNonIntegerTarget) {
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({2, 3}), zeros({2})); }, {"[cross_entropy]", "f32", "[2]"}));
}

TEST(CrossEntropy, RejectsMismatchedShapes) {
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({2, 3}), zeros({3}, DType::i64)); },
                          {"[cross_entropy]", "target shape [3]", "logits shape [2, 3]", "expected target shape [2]"}));
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({2, 4, 5}), zeros({2, 4}, DType::i64)); },
                          {"[cross_entropy]", "[2, 4]", "[2, 4, 5]", "expected target shape [2, 5]"}));
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({3}), zeros({1}, DType::i64)); },
                          {"[cross_entropy]", "target shape [1]", "logits shape [3]", "expected target shape []"}));
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({}), zeros({}, DType::i64)); },
                          {"[cross_entropy]", "logits shape []"}));
}

TEST(CrossEntropy, RejectsIntegerLogits) {
  EXPECT_TRUE(value_error([] { cross_entropy(zeros({2, 3}, DType::i64), zeros({2}, DType::i64)); },
                          {"[cross_entropy]", "i64"}));
}
