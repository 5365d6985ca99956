// The fused backward kernels (gelu_backward, norm_backward, cross_entropy_backward) against a
// double-precision reference and against the op-by-op formulas they replace, on Tensors and on
// DTensors over meshes, uneven shapes and placements (a sharded normalised dim takes the op-by-op
// path; a Partial gradient is reduced first); bad operands are ValueErrors naming the call.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/fused_backward.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor wave(const Shape& shape, double phase, DType dtype = DType::f64) {
  return mul(sin(add(mul(arange(shape.numel()).to(DType::f64), Scalar(0.61)), Scalar(phase))), Scalar(2.5))
      .reshape(shape)
      .to(dtype);
}

// grad * (Phi(x) + x phi(x)), in double.
Tensor gelu_grad_reference(const Tensor& g, const Tensor& x) {
  const Tensor xd = x.to(DType::f64), gd = g.to(DType::f64);
  const Tensor cdf = mul(add(erf(mul(xd, Scalar(1 / std::sqrt(2.0)))), Scalar(1.0)), Scalar(0.5));
  const Tensor pdf = mul(exp(mul(mul(xd, xd), Scalar(-0.5))), Scalar(1 / std::sqrt(2 * std::numbers::pi)));
  return mul(gd, add(cdf, mul(xd, pdf)));
}

}  // namespace

TEST(FusedBackward, GeluBackwardEqualsTheDerivative) {
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Shape shape{5, 77};  // 385 elements: a vector tail on every width
    const Tensor x = wave(shape, 0.3, dtype), g = wave(shape, 1.1, dtype);
    const Tensor got = gelu_backward(g, x);
    EXPECT_EQ(got.dtype(), dtype);
    const double tol = dtype == DType::f64 ? 1e-13 : dtype == DType::f32 ? 2e-6 : 2e-2;
    EXPECT_TRUE(allclose(got.to(DType::f64), gelu_grad_reference(g, x), tol, tol)) << name(dtype);
  }
  // An element's result does not depend on where it sits (vector body or tail).
  const Tensor x = wave({1, 37}, 0.2, DType::f32), g = wave({1, 37}, 0.9, DType::f32);
  const Tensor whole = gelu_backward(g, x);
  for (int64_t start : {0, 3, 17, 36})
    EXPECT_TRUE(allclose(gelu_backward(g.narrow(1, start, 37 - start), x.narrow(1, start, 37 - start)),
                         whole.narrow(1, start, 37 - start), 0, 0))
        << start;
  EXPECT_TRUE(throws_with<ValueError>([] { gelu_backward(zeros({3}), zeros({4})); }, {"[gelu_backward]", "[3]", "[4]"}));
  EXPECT_TRUE(throws_with<ValueError>([] { gelu_backward(zeros({3}, DType::i64), zeros({3}, DType::i64)); },
                                      {"[gelu_backward]", "floating"}));
}

// gelu_backward(g, x, y) reads Phi off y = gelu(x) for f32: the same derivative, across zero, tiny,
// large and negative x, and the two-argument form for other dtypes.
TEST(FusedBackward, GeluBackwardFromTheOutputEqualsTheDerivative) {
  const std::vector<double> edges = {0.0, 1e-35, -1e-35, 1e-20, -3e-8, 0.5, -0.5, 3.0, -6.0, -12.0, 9.0, -20.0};
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor x = cat({from_vector(edges).to(dtype), wave({200}, 0.3, dtype)}, 0);
    const Tensor g = wave(x.shape(), 1.3, dtype);
    const Tensor got = gelu_backward(g, x, gelu(x));
    EXPECT_EQ(got.dtype(), dtype);
    if (dtype != DType::f32) {
      EXPECT_TRUE(allclose(got, gelu_backward(g, x), 0, 0)) << name(dtype);
      continue;
    }
    EXPECT_TRUE(allclose(got.to(DType::f64), gelu_grad_reference(g, x), 2e-6, 2e-6));
  }
  EXPECT_TRUE(throws_with<ValueError>([] { gelu_backward(zeros({3}), zeros({3}), zeros({4})); },
                                      {"[gelu_backward]", "y [4]", "[3]"}));
}

// (softmax(logits) - one_hot(target)) * grad along the class dim, zero where ignored, by ops in f64.
Tensor cross_entropy_grad_reference(const Tensor& g, const Tensor& logits, const Tensor& target, int64_t ignore) {
  const int64_t class_dim = logits.ndim() == 1 ? 0 : 1;
  Shape along = Shape::filled(logits.ndim(), 1);
  along[class_dim] = logits.size(class_dim);
  const Tensor t = unsqueeze(target, class_dim);
  const Tensor one_hot = eq(arange(logits.size(class_dim)).reshape(along), t).to(DType::f64);
  const Tensor kept = ne(t, Scalar(ignore)).to(DType::f64);
  const Tensor p = softmax(logits.to(DType::f64), class_dim);
  return mul(mul(sub(p, one_hot), kept), unsqueeze(g.to(DType::f64), class_dim));
}

TEST(FusedBackward, CrossEntropyBackwardEqualsTheOpByOpGradient) {
  struct Form {
    Shape logits;
    std::vector<int64_t> target;
  };
  const std::vector<Form> forms = {
      {{6, 11}, {3, -100, 0, 10, 10, 5}},       // rows [N, C]
      {{11}, {7}},                                // [C] with a 0-d target
      {{2, 5, 3}, {4, 0, -100, 1, 2, 4}},       // [N, C, d]: lanes strided by d
      {{0, 4}, {}},                               // no rows
  };
  for (const DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (const Form& f : forms) {
      Shape target_shape = f.logits;
      target_shape.erase(f.logits.size() == 1 ? 0 : 1);
      const Tensor logits = mul(wave(f.logits, 0.2, dtype), Scalar(3.0));
      const Tensor target = from_vector(f.target).reshape(target_shape);
      const Tensor g = wave(target_shape, 0.8, dtype);
      const Tensor got = cross_entropy_backward(g, logits, target, -100);
      EXPECT_EQ(got.dtype(), dtype);
      EXPECT_EQ(got.shape(), f.logits);
      const double tol = dtype == DType::f64 ? 1e-14 : dtype == DType::f32 ? 2e-6 : 2e-2;
      EXPECT_TRUE(allclose(got.to(DType::f64), cross_entropy_grad_reference(g, logits, target, -100), tol, tol))
          << name(dtype) << " " << f.logits.to_string();
    }
  }
  // Huge logits stay finite (the max is subtracted); autograd's gradient of the mean is the kernel's.
  const Tensor big = mul(wave({3, 4}, 0.1, DType::f32), Scalar(1e4)), t = from_vector<int64_t>({0, 3, 1});
  EXPECT_TRUE(allclose(cross_entropy_backward(full({3}, 1.0 / 3, DType::f32), big, t, -100).to(DType::f64),
                       cross_entropy_grad_reference(full({3}, 1.0 / 3), big, t, -100), 1e-6, 1e-6));
  const Tensor leaf = wave({3, 4}, 0.6, DType::f32).requires_grad_();
  cross_entropy(leaf, t).backward();
  EXPECT_TRUE(allclose(leaf.grad(), cross_entropy_backward(full({3}, 1.0 / 3, DType::f32), leaf.detach(), t, -100), 1e-7, 1e-7));

  EXPECT_TRUE(throws_with<ValueError>([] { cross_entropy_backward(zeros({3}), zeros({3, 4}), zeros({2}, DType::i64), -100); },
                                      {"[cross_entropy backward]", "[3, 4]", "[2]"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [] { cross_entropy_backward(zeros({2}), zeros({2, 4}), from_vector<int64_t>({1, 4}), -100); },
      {"[cross_entropy backward]", "target 4", "[0, 4)"}));
}

TEST(FusedBackward, NormBackwardEqualsTheOpByOpFormula) {
  for (const DType dtype : {DType::f64, DType::f32}) {
    for (const bool centred : {false, true}) {
      for (const int64_t count : {1, 2}) {
        for (const bool with_weight : {false, true}) {
          const Shape shape{3, 4, 6};
          const Tensor x = wave(shape, 0.4, dtype), g = wave(shape, 2.0, dtype);
          const Shape trailing = count == 1 ? Shape{6} : Shape{4, 6};
          const std::optional<Tensor> w = with_weight ? std::optional<Tensor>(wave(trailing, 0.7, dtype)) : std::nullopt;
          const auto [dx, g_xhat] = norm_backward(g, x, w, count, 1e-5, centred);
          const auto [dx_ops, g_xhat_ops] = derivatives::norm_backward_by_ops(g, x, w, count, 1e-5, centred);
          const double tol = dtype == DType::f64 ? 1e-12 : 2e-5;
          EXPECT_TRUE(allclose(dx, dx_ops, tol, tol)) << name(dtype) << " centred " << centred << " count " << count;
          EXPECT_TRUE(allclose(g_xhat, g_xhat_ops, tol, tol));
        }
      }
    }
  }
  EXPECT_TRUE(throws_with<ValueError>([] { norm_backward(zeros({2, 3}), zeros({2, 3}), zeros({4}), 1, 1e-5, false); },
                                      {"[rms_norm backward]", "weight [4]", "[3]"}));
}

// On DTensors: the same values as the Tensor kernels, whatever the placements (a sharded
// normalised dim goes op by op), blockwise in x's layout.
TEST(FusedBackward, DTensorFormsEqualTheTensorKernels) {
  for_each_world({1, 2, 3, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Shape shape{5, 3, 7};  // uneven over 2, 3 and 4 ranks
    const Tensor x = wave(shape, 0.1), g = wave(shape, 1.7), w = wave({7}, 0.5);
    const auto [dx_want, gx_want] = norm_backward(g, x, w, 1, 1e-6, true);
    const Tensor gelu_want = gelu_backward(g, x);
    for (const Placements& p : {Placements{Shard{0}}, Placements{Shard{2}}, Placements{Replicate{}}}) {
      const DTensor dx_in = distribute_tensor(x, mesh, p), dg = distribute_tensor(g, mesh, p);
      const DTensor dw = distribute_tensor(w, mesh, {Replicate{}});
      const auto [dx, gx] = norm_backward(dg, dx_in, std::optional<DTensor>(dw), 1, 1e-6, true);
      EXPECT_TRUE(allclose(dx.full_tensor(), dx_want, 1e-12, 1e-12)) << to_string(p);
      EXPECT_TRUE(allclose(gx.full_tensor(), gx_want, 1e-12, 1e-12));
      if (p != Placements{Shard{2}}) {
        EXPECT_EQ(dx.placements(), p);  // blockwise: in x's layout
      }
      const DTensor gelu = gelu_backward(dg, dx_in);
      EXPECT_TRUE(allclose(gelu.full_tensor(), gelu_want, 0, 0));
      EXPECT_EQ(gelu.placements(), p);
      const DTensor x32 = distribute_tensor(x.to(DType::f32), mesh, p), g32 = distribute_tensor(g.to(DType::f32), mesh, p);
      const DTensor from_y = gelu_backward(g32, x32, tessera::gelu(x32));
      const Tensor from_y_want = gelu_backward(g.to(DType::f32), x.to(DType::f32), tessera::gelu(x.to(DType::f32)));
      EXPECT_TRUE(allclose(from_y.full_tensor(), from_y_want, 0, 0));
      EXPECT_EQ(from_y.placements(), p);
    }
    // A Partial gradient: summed first.
    const DTensor half = DTensor::from_local(mul(g, Scalar(1.0 / world_size())), mesh, {Partial{}});
    EXPECT_TRUE(allclose(gelu_backward(half, distribute_tensor(x, mesh, {Shard{1}})).full_tensor(), gelu_want, 1e-12, 1e-12));
  });
}

// cross_entropy on DTensors: with the class dim whole on every rank, the fused kernel on each
// rank's rows (the gradient in the logits' layout, uneven rows and ignored targets included);
// with it sharded (vocabulary parallel), op by op. Both equal the Tensor loss and gradient.
TEST(FusedBackward, DTensorCrossEntropyEqualsTheTensorOne) {
  for_each_world({1, 2, 3, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const Tensor logits = mul(wave({9, 7}, 0.4, DType::f32), Scalar(2.0));
    const Tensor target = from_vector<int64_t>({6, 0, -100, 3, 3, 1, 5, -100, 2});
    const Tensor leaf = logits.clone().requires_grad_();
    const Tensor want = cross_entropy(leaf, target);
    want.backward();
    for (const Placements& p : {Placements{Shard{0}}, Placements{Replicate{}}, Placements{Shard{1}}}) {
      const DTensor x = distribute_tensor(logits, mesh, p).requires_grad_();
      const DTensor t = distribute_tensor(target, mesh, {p == Placements{Shard{0}} ? Placement(Shard{0}) : Replicate{}});
      const DTensor loss = cross_entropy(x, t);
      EXPECT_TRUE(allclose(loss.full_tensor(), want, 1e-6, 1e-6)) << to_string(p);
      loss.backward();
      EXPECT_TRUE(allclose(x.grad().full_tensor(), leaf.grad(), 1e-6, 1e-6)) << to_string(p);
      if (p != Placements{Shard{1}}) {
        EXPECT_EQ(x.grad().placements(), p);
      }
    }
  });
}
