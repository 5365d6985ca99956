// ExplicitRedistributionContext: inside it an op that must move an input throws, naming the op,
// the input and both placements, on every rank and before any communication; explicit moves
// (redistribute, full_tensor) still work; a move of no data is allowed unless strict; scopes nest.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/explicit_redistribution.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST(ExplicitRedistribution, AnImplicitMoveThrowsOnEveryRankBeforeCommunicating) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor gx = data({6, 8}, 1), gw = data({8, 5}, 2);
    const DTensor x = distribute_tensor(gx, mesh, {Shard{1}});
    const DTensor w = distribute_tensor(gw, mesh, {Shard{1}});
    ExplicitRedistributionContext explicit_only;
    EXPECT_TRUE(ExplicitRedistributionContext::active());
    CommDebugMode comm;
    // matmul contracts x's dim 1 against w's dim 0: w (S(1)) must move whatever strategy wins.
    EXPECT_TRUE(sharding_error([&] { (void)matmul(x, w); },
                               {"[matmul]", "must be redistributed from (S(1)) to", "ExplicitRedistributionContext",
                                "x.redistribute("}));
    EXPECT_EQ(comm.total_count(), 0) << "refused before any rank communicated";
    // The same op with the move made explicit runs, and equals the unsharded matmul.
    const DTensor y = matmul(x, w.redistribute({Shard{0}}));
    EXPECT_TRUE(allclose(y.full_tensor(), matmul(gx, gw), 1e-5, 1e-5));
    // sort needs the whole dim; cumprod and topk cannot run on a pending sum. cumsum along the
    // sharded dim and topk of a shard are not redistributions: they exchange only the pieces'
    // totals or candidates, as part of the op, and run.
    const DTensor parts = make_input(gx, mesh, {Partial{}});
    EXPECT_TRUE(sharding_error([&] { (void)sort(x, 1); }, {"[sort]", "input 0", "from (S(1)) to (R)"}));
    EXPECT_TRUE(sharding_error([&] { (void)cumprod(parts, 0); }, {"[cumprod]", "from (P(sum)) to"}));
    EXPECT_TRUE(sharding_error([&] { (void)topk(parts, 2, 1); }, {"[topk]", "from (P(sum)) to"}));
    EXPECT_TRUE(sharding_error([&] { (void)softmax(x, 1); }, {"[softmax]", "input 0"}));
    EXPECT_TRUE(allclose(cumsum(x, 1).full_tensor(), cumsum(gx, 1), 1e-4, 1e-4));
    EXPECT_TRUE(allclose(topk(x, 2, 1).values.full_tensor(), topk(gx, 2, 1).values, 1e-6, 1e-6));
  });
}

TEST(ExplicitRedistribution, AMoveOfNoDataIsAllowedUnlessStrict) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor ga = data({8, 3}, 3), gb = data({8, 3}, 4);
    const DTensor a = distribute_tensor(ga, mesh, {Shard{0}});
    const DTensor b = distribute_tensor(gb, mesh, {Replicate{}});
    {
      // b (R) is chunked to a's S(0) where it lies: a local step, no data moves.
      ExplicitRedistributionContext explicit_only;
      CommDebugMode comm;
      const DTensor sum = add(a, b);
      EXPECT_EQ(comm.total_count(), 0);
      EXPECT_TRUE(allclose(sum.full_tensor(), add(ga, gb), 1e-6, 1e-6));
    }
    ExplicitRedistributionContext strict(true, /*strict=*/true);
    EXPECT_TRUE(sharding_error([&] { (void)add(a, b); }, {"[add]", "input 1", "from (R) to (S(0))", "strict"}));
    // Inputs already where the op wants them: nothing to refuse.
    EXPECT_TRUE(allclose(add(a, a).full_tensor(), add(ga, ga), 1e-6, 1e-6));
  });
}

TEST(ExplicitRedistribution, ScopesNestAndTheInnermostDecides) {
  for_each_world({2}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor g = data({4, 6}, 5);
    const DTensor x = distribute_tensor(g, mesh, {Shard{1}});
    EXPECT_FALSE(ExplicitRedistributionContext::active());
    ExplicitRedistributionContext outer;
    {
      ExplicitRedistributionContext exempt(/*enable=*/false);
      EXPECT_FALSE(ExplicitRedistributionContext::active());
      EXPECT_TRUE(allclose(softmax(x, 1).full_tensor(), softmax(g, 1), 1e-6, 1e-6));
    }
    EXPECT_TRUE(ExplicitRedistributionContext::active());
    EXPECT_TRUE(sharding_error([&] { (void)softmax(x, 1); }, {"[softmax]"}));
    // full_tensor and redistribute are the caller's own moves.
    EXPECT_TRUE(equal(x.full_tensor(), g));
    EXPECT_TRUE(equal(x.redistribute({Replicate{}}).to_local(), g));
  });
}
