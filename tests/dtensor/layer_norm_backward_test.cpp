// layer_norm and rms_norm with a normalised dim sharded: each rank normalises its block of the
// rows, so the backward issues one collective (the per-row sums and replicated affine gradients
// in one all_reduce) where moving x so that rows are whole issued two (x's gradient moved back
// and the affine gradients reduced). Values equal the unsharded op's, uneven pieces included.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/explicit_redistribution.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor wave(const Shape& shape, double scale, double offset) {
  return add(sin(mul(arange(shape.numel()).reshape(shape).to(DType::f64), Scalar(scale))), Scalar(offset));
}

struct NormCase {
  Shape normalized;
  int64_t shard = 0;     // x's sharded dim
  bool weight_sharded;   // weight and bias sharded like x's normalised dims (else replicated)
  bool centred = true;   // layer_norm, else rms_norm
  std::string text() const {
    return std::string(centred ? "layer_norm" : "rms_norm") + " over " + normalized.to_string() + ", x S(" +
           std::to_string(shard) + "), affine " + (weight_sharded ? "sharded" : "replicated");
  }
};

// Runs the case on a 1-d mesh: the backward's collectives, and every gradient against the Tensor op.
void check_case(const NormCase& c, const DeviceMesh& mesh, const Shape& shape) {
  const Tensor gx = wave(shape, 0.37, 2.0);  // an offset mean: the merge of the pieces must be exact
  const Tensor gw = wave(c.normalized, 0.11, 1.0), gb = wave(c.normalized, 0.23, 0.0);
  Tensor tx = gx.clone(), tw = gw.clone(), tb = gb.clone();
  for (Tensor* t : {&tx, &tw, &tb}) t->requires_grad_();
  const Tensor expected = c.centred ? layer_norm(tx, c.normalized, tw, tb) : rms_norm(tx, c.normalized, tw);
  sum(mul(expected, expected)).backward();

  const Placement affine = c.weight_sharded ? Placement{Shard{c.shard - (shape.size() - c.normalized.size())}}
                                            : Placement{Replicate{}};
  DTensor x = distribute_tensor(gx, mesh, {Shard{c.shard}}), w = distribute_tensor(gw, mesh, {affine}),
          b = distribute_tensor(gb, mesh, {affine});
  for (DTensor* t : {&x, &w, &b}) t->requires_grad_();
  CommDebugMode forward;
  const DTensor out = c.centred ? layer_norm(x, c.normalized, w, b) : rms_norm(x, c.normalized, w);
  EXPECT_EQ(forward.total_count(), 1) << c.text() << "\n" << forward.to_string();
  EXPECT_EQ(out.placements(), x.placements()) << c.text();
  const DTensor loss = sum(mul(out, out));
  CommDebugMode backward;
  loss.backward();
  EXPECT_EQ(backward.total_count(), 1) << c.text() << "\n" << backward.to_string();
  EXPECT_EQ(backward.count(CollectiveKind::all_reduce), 1) << c.text();

  EXPECT_TRUE(allclose(out.full_tensor(), expected, 1e-12, 1e-12)) << c.text();
  EXPECT_TRUE(allclose(x.grad().full_tensor(), tx.grad(), 1e-10, 1e-10)) << c.text();
  EXPECT_TRUE(allclose(w.grad().full_tensor(), tw.grad(), 1e-10, 1e-10)) << c.text();
  if (c.centred) {
    EXPECT_TRUE(allclose(b.grad().full_tensor(), tb.grad(), 1e-10, 1e-10)) << c.text();
  }
  EXPECT_EQ(x.grad().placements(), x.placements()) << c.text();
  EXPECT_EQ(w.grad().placements(), w.placements()) << c.text();
}

}  // namespace

// Issue 40: shard 1 or 2 of a 3-d input, affine: one collective in the backward.
TEST(NormShardedDim, BackwardIssuesOneCollective) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    for (bool centred : {true, false})
      for (bool weight_sharded : {false, true}) {
        // [3, 6, 10] on 4 ranks: dim 1 in pieces 2, 2, 2, 0 and dim 2 in 3, 3, 3, 1.
        check_case({{10}, 2, weight_sharded, centred}, mesh, {3, 6, 10});
        check_case({{6, 10}, 1, weight_sharded, centred}, mesh, {3, 6, 10});
        check_case({{6, 10}, 2, weight_sharded, centred}, mesh, {3, 6, 10});
      }
  });
}

// The rows may be sharded too (a 2-d mesh, 2x2 on 4 ranks), x may hold pieces of several mesh dims on one normalised
// dim, the affine operands may be sharded otherwise (moved in the forward), and x may be Partial
// (reduced first): the values are the unsharded op's in every case.
TEST(NormShardedDim, EqualsTheUnshardedOpOnEveryLayout) {
  for_each_world({4}, [] {
    if (world_size() % 2 != 0) GTEST_SKIP() << "a 2 x n/2 mesh needs an even world";
    const DeviceMesh mesh({2, world_size() / 2}, {"a", "b"});
    const Shape shape{3, 5, 7};
    const Tensor gx = wave(shape, 0.29, -3.0), gw = wave({5, 7}, 0.13, 1.0), gb = wave({5, 7}, 0.31, 0.5);
    const std::vector<Placements> x_layouts{{Shard{0}, Shard{2}}, {Shard{2}, Shard{1}}, {Shard{2}, Shard{2}},
                                            {Partial{}, Shard{1}}, {Shard{1}, Replicate{}}};
    const std::vector<Placements> affine_layouts{{Replicate{}, Replicate{}}, {Shard{1}, Shard{0}}, {Shard{0}, Replicate{}}};
    for (bool centred : {true, false}) {
      Tensor tx = gx.clone(), tw = gw.clone(), tb = gb.clone();
      for (Tensor* t : {&tx, &tw, &tb}) t->requires_grad_();
      const Tensor expected = centred ? layer_norm(tx, {5, 7}, tw, tb) : rms_norm(tx, {5, 7}, tw);
      sum(mul(expected, wave(shape, 0.5, 1.0))).backward();
      for (const Placements& xp : x_layouts)
        for (const Placements& ap : affine_layouts) {
          const std::string text = std::string(centred ? "layer_norm" : "rms_norm") + " x " + to_string(xp) +
                                   " affine " + to_string(ap);
          DTensor x = make_input(gx, mesh, xp), w = distribute_tensor(gw, mesh, ap), b = distribute_tensor(gb, mesh, ap);
          for (DTensor* t : {&x, &w, &b}) t->requires_grad_();
          const DTensor out = centred ? layer_norm(x, {5, 7}, w, b) : rms_norm(x, {5, 7}, w);
          EXPECT_TRUE(allclose(out.full_tensor(), expected, 1e-12, 1e-12)) << text;
          const DTensor weights = distribute_tensor(wave(shape, 0.5, 1.0), mesh, {Replicate{}, Replicate{}});
          sum(mul(out, weights)).backward();
          EXPECT_TRUE(allclose(x.grad().full_tensor(), tx.grad(), 1e-10, 1e-10)) << text;
          EXPECT_TRUE(allclose(w.grad().full_tensor(), tw.grad(), 1e-10, 1e-10)) << text;
          if (centred) {
            EXPECT_TRUE(allclose(b.grad().full_tensor(), tb.grad(), 1e-10, 1e-10)) << text;
          }
        }
    }
  });
}

// f32 input: statistics merged in f64, the result within f32 rounding of the Tensor op.
TEST(NormShardedDim, SinglePrecisionMatchesTheTensorOp) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor gx = wave({4, 9}, 0.41, 100.0).to(DType::f32), gw = wave({9}, 0.2, 1.0).to(DType::f32);
    const DTensor out = layer_norm(distribute_tensor(gx, mesh, {Shard{1}}), {9}, distribute_tensor(gw, mesh, {Replicate{}}));
    EXPECT_EQ(out.dtype(), DType::f32);
    EXPECT_TRUE(allclose(out.full_tensor(), layer_norm(gx, {9}, gw), 1e-4, 1e-4));
  });
}

// Errors name the user's call and the shapes; moving an affine operand inside an
// ExplicitRedistributionContext is refused like any implicit move.
TEST(NormShardedDim, Errors) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    const DTensor x = distribute_tensor(wave({2, 8}, 0.3, 0.0), mesh, {Shard{1}});
    EXPECT_TRUE(value_error([&] { (void)layer_norm(x, {8}, distribute_tensor(wave({7}, 0.1, 0.0), mesh, {Replicate{}})); },
                            {"[layer_norm]", "weight shape [7] does not match normalized_shape [8]", "[2, 8]"}));
    EXPECT_TRUE(value_error(
        [&] { (void)rms_norm(x, {8}, distribute_tensor(wave({8}, 0.1, 0.0).to(DType::f32), mesh, {Replicate{}})); },
        {"[rms_norm]", "weight dtype f32 does not match input dtype f64"}));
    // A weight sharded unlike x's normalised dim must move: refused inside the context.
    std::vector<int64_t> pieces(static_cast<size_t>(world_size()), 1);
    pieces[0] = 8 - (world_size() - 1);
    const DTensor odd = distribute_to_layout(wave({8}, 0.1, 0.0), mesh,
                                             Layout({8}, DType::f64, mesh.spec(), {Shard{0}}, {}, {{0, pieces}}));
    ExplicitRedistributionContext explicit_only;
    EXPECT_TRUE(throws_with<ShardingError>([&] { (void)layer_norm(x, {8}, odd); }, {"[layer_norm]", "input 1"}));
  });
}
