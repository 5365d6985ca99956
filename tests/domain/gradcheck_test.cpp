// Finite-difference gradchecks of the domain-parallel ops, each a function of full f64 tensors:
// distribute them over a sharded spatial (or sequence) dim, run the DTensor op, gather the
// result. The check differentiates through every halo, ring step and their backward exchanges.
#include <gtest/gtest.h>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/domain/context_parallel.hpp>
#include <tessera/domain/spatial.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor smooth(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.53 + seed).reshape(shape);
}

// A full tensor as a DTensor with `placements` (the gradient flows back to the full tensor).
DTensor spread(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  return DTensor::from_local(full, mesh, Placements(placements.size(), Replicate{})).redistribute(placements);
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      const std::string& what) {
  const auto result = autograd::gradcheck(fn, inputs);
  EXPECT_TRUE(result.ok) << what << ": " << result.message;
}

}  // namespace

TEST(DomainGradcheck, ConvolutionOverShardedSpatialDims) {
  for_each_world({2, 3, 6}, [] {
    const DeviceMesh mesh = line_mesh();
    // 7 rows: empty pieces on 6 ranks (they run the op on padding and keep nothing).
    const Tensor x = smooth({1, 2, 7, 5}, 0.1), w = smooth({3, 2, 3, 3}, 0.7), b = smooth({3}, 1.3);
    for (const auto& [stride, padding, dilation] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {2, 1, 1}, {1, 2, 2}}) {
      const auto fn = [&](const std::vector<Tensor>& in) {
        const DTensor xd = spread(in[0], mesh, {Shard{2}});
        const DTensor wd = spread(in[1], mesh, {Replicate{}}), bd = spread(in[2], mesh, {Replicate{}});
        return conv2d(xd, wd, bd, {stride}, {padding}, {dilation}).full_tensor();
      };
      expect_gradcheck(fn, {x, w, b},
                       "conv2d stride " + std::to_string(stride) + " padding " + std::to_string(padding) +
                           " dilation " + std::to_string(dilation));
    }
  });
}

TEST(DomainGradcheck, PoolingAndInterpolationOverShardedSpatialDims) {
  for_each_world({2, 3, 6}, [] {
    const DeviceMesh mesh = line_mesh();
    // Distinct values, so max pooling's choice is stable under the finite-difference step; 7 x 5:
    // empty pieces on 6 ranks along either dim.
    const Tensor x = smooth({1, 2, 7, 5}, 0.2) + arange(70).to(DType::f64).reshape({1, 2, 7, 5}) * 0.01;
    expect_gradcheck([&](const std::vector<Tensor>& in) {
      return max_pool2d(spread(in[0], mesh, {Shard{2}}), {3, 2}, {2, 2}, {1, 0}).full_tensor();
    }, {x}, "max_pool2d");
    expect_gradcheck([&](const std::vector<Tensor>& in) {
      return avg_pool2d(spread(in[0], mesh, {Shard{3}}), {3, 3}, {1, 2}, {1, 1}).full_tensor();
    }, {x}, "avg_pool2d");
    for (const char* mode : {"nearest", "bilinear"})
      expect_gradcheck([&](const std::vector<Tensor>& in) {
        return interpolate(spread(in[0], mesh, {Shard{2}}), {14, 9}, mode).full_tensor();
      }, {x}, std::string("interpolate ") + mode);
  });
}

TEST(DomainGradcheck, RingAttentionAndContextParallel) {
  for_each_world({2, 3, 6}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor q = smooth({1, 2, 7, 3}, 0.1), k = smooth({1, 2, 7, 3}, 0.5), v = smooth({1, 2, 7, 3}, 0.9);
    for (bool causal : {false, true})
      expect_gradcheck([&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(spread(in[0], mesh, {Shard{2}}), spread(in[1], mesh, {Shard{2}}),
                                            spread(in[2], mesh, {Shard{2}}), std::nullopt, 0.0, causal)
            .full_tensor();
      }, {q, k, v}, causal ? "ring attention, causal" : "ring attention");
    expect_gradcheck([&](const std::vector<Tensor>& in) {
      DTensor qd = spread(in[0], mesh, {Replicate{}}), kd = spread(in[1], mesh, {Replicate{}}),
              vd = spread(in[2], mesh, {Replicate{}});
      DTensor y;
      context_parallel(mesh, {&qd, &kd, &vd}, {2, 2, 2},
                       [&] { y = scaled_dot_product_attention(qd, kd, vd, std::nullopt, 0.0, true); });
      return context_parallel_unshard(mesh, {y}, {2})[0].full_tensor();
    }, {q, k, v}, "load-balanced context_parallel, causal");
  });
}

// pad and roll of a sharded dim (a row exchange, no gather), 7 rows: empty pieces on 6 ranks.
TEST(DomainGradcheck, PadAndRollOverAShardedDim) {
  for_each_world({3, 6}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor x = smooth({7, 3}, 0.4);
    for (PadMode mode : {PadMode::constant, PadMode::reflect, PadMode::replicate, PadMode::circular})
      expect_gradcheck([&](const std::vector<Tensor>& in) {
        return pad(spread(in[0], mesh, {Shard{0}}), {1, 0, 2, 3}, mode, 0.5).full_tensor();
      }, {x}, std::string("pad ") + to_string(mode));
    expect_gradcheck([&](const std::vector<Tensor>& in) {
      return pad(spread(in[0], mesh, {Shard{0}}), {0, 0, -2, 1}).full_tensor();
    }, {x}, "crop");
    expect_gradcheck([&](const std::vector<Tensor>& in) {
      return roll(spread(in[0], mesh, {Shard{0}}), {3, -1}, {0, 1}).full_tensor();
    }, {x}, "roll");
    // A Partial (a sum over a dim split across mesh dim p) passes through, the exchange being
    // linear, and gets the whole gradient.
    if (world_size() % 2 == 0) {
      const DeviceMesh grid({2, world_size() / 2}, {"p", "s"});
      const Tensor halves = smooth({2, 7, 3}, 0.8);
      const auto partial = [&](const Tensor& t) { return sum(spread(t, grid, {Shard{0}, Shard{1}}), {0}); };
      expect_gradcheck([&](const std::vector<Tensor>& in) {
        return pad(partial(in[0]), {0, 0, 2, 1}, PadMode::reflect).full_tensor();
      }, {halves}, "pad of a Partial");
      expect_gradcheck([&](const std::vector<Tensor>& in) {
        return roll(partial(in[0]), {2}, {0}).full_tensor();
      }, {halves}, "roll of a Partial");
    }
  });
}
