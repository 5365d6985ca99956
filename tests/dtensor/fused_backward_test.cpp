// The fused backward kernels (gelu_backward, norm_backward) against a double-precision reference
// and against the op-by-op formulas they replace, on Tensors and on DTensors over meshes, uneven
// shapes and placements (a sharded normalised dim takes the op-by-op path; a Partial gradient
// is reduced first); bad operands are ValueErrors naming the call.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/detail/derivatives.hpp>
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
    }
    // A Partial gradient: summed first.
    const DTensor half = DTensor::from_local(mul(g, Scalar(1.0 / world_size())), mesh, {Partial{}});
    EXPECT_TRUE(allclose(gelu_backward(half, distribute_tensor(x, mesh, {Shard{1}})).full_tensor(), gelu_want, 1e-12, 1e-12));
  });
}
