// DTensor::redistribute_async (PyTorch's async_op=True): the plan's last collective is left in
// flight and completes at wait(); the result equals redistribute's exactly, over meshes,
// placements (Partial sources, uneven pieces) and dtypes, with the same calls, and autograd
// flows through it.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST(RedistributeAsync, EqualsRedistributeWithTheSameCalls) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    const DeviceMesh line = line_mesh();
    const Placement P = Partial{}, R = Replicate{}, S0 = Shard{0}, S1 = Shard{1};
    const Placement pmax = Partial{ReduceOp::max};
    struct Move {
      Placements from, to;
    };
    const std::vector<Move> moves = {{{S0}, {R}}, {{S0}, {S1}}, {{P}, {R}}, {{P}, {S0}}, {{P}, {S1}},
                                     {{pmax}, {S0}}, {{R}, {S1}}, {{S1}, {S0}}, {{S0}, {S0}}};
    for (const Shape& shape : {Shape{12, 10}, Shape{7, 5}, Shape{1, 3}, Shape{0, 4}})
      for (const Move& move : moves) {
        const Tensor global = data(shape, 4);
        const DTensor x = make_input(global, line, move.from);
        CommDebugMode sync_mode;
        const DTensor expected = x.redistribute(move.to);
        const auto sync_calls = sync_mode.total_count();
        CommDebugMode async_mode;
        const PendingDTensor pending = x.redistribute_async(move.to);
        const Tensor overlapped = matmul(global.reshape({-1, 1}), global.reshape({1, -1}));  // work meanwhile
        const DTensor got = pending.wait();
        SCOPED_TRACE(to_string(move.from) + " -> " + to_string(move.to) + " of " + shape.to_string() + "\n" +
                     async_mode.to_string());
        EXPECT_TRUE(pending.is_completed());
        EXPECT_EQ(got.layout(), expected.layout());
        EXPECT_TRUE(same(got.to_local(), expected.to_local()));
        // Uneven reduce_scatter runs as an all_to_all_v and a local reduction: one call either way.
        EXPECT_EQ(async_mode.total_count(), sync_calls);
        EXPECT_TRUE(same(pending.wait().to_local(), got.to_local()));  // a second wait: the same
        (void)overlapped;
      }
    if (n % 2 == 0 && n >= 4) {
      const DeviceMesh square({2, n / 2}, {"a", "b"});
      const Tensor global = data({8, 6}, 2);
      for (const Move& move : std::vector<Move>{{{P, P}, {R, R}}, {{S0, S1}, {R, R}}, {{P, S0}, {R, R}},
                                                {{P, P}, {S0, S1}}, {{S0, R}, {S1, S0}}}) {
        const DTensor x = make_input(global, square, move.from);
        const DTensor got = x.redistribute_async(move.to).wait();
        EXPECT_EQ(got.placements(), move.to);
        EXPECT_TRUE(same(got.to_local(), x.redistribute(move.to).to_local())) << to_string(move.from);
      }
    }
  });
}

TEST(RedistributeAsync, HalfPrecisionAndForwardDtype) {
  for_each_world({3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor global = data({7, 5}, 6).to(DType::bf16);
    for (const Placements& from : {Placements{Partial{}}, Placements{Shard{1}}}) {
      const DTensor x = make_input(global, mesh, from);
      EXPECT_TRUE(same(x.redistribute_async({Shard{0}}).wait().to_local(), x.redistribute({Shard{0}}).to_local()))
          << to_string(from);
    }
    const DTensor f = make_input(data({8, 4}, 1), mesh, {Shard{0}});
    const DTensor cast = f.redistribute_async({Replicate{}}, {.forward_dtype = DType::bf16}).wait();
    EXPECT_EQ(cast.dtype(), DType::bf16);
    EXPECT_TRUE(same(cast.to_local(), f.redistribute({Replicate{}}, {.forward_dtype = DType::bf16}).to_local()));
  });
}

TEST(RedistributeAsync, GradientFlowsThroughTheResult) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor global = data({6, 4}, 3);
    DTensor x = distribute_tensor(global, mesh, {Shard{0}});
    x.requires_grad_();
    const DTensor y = x.redistribute_async({Replicate{}}).wait();
    sum(mul(y, y)).backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_TRUE(same(x.grad().full_tensor(), mul(global, Scalar(2.0))));
  });
}

TEST(RedistributeAsync, BadArgumentsThrowAtTheCallOnEveryRank) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const DTensor x = distribute_tensor(data({4, 4}, 1), mesh, {Shard{0}});
    EXPECT_TRUE(throws_with<ShardingError>([&] { x.redistribute_async({Shard{0}, Replicate{}}); },
                                           {"[DTensor::redistribute_async]", "2 placements"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { x.redistribute_async({Shard{2}}); },
                                           {"[DTensor::redistribute_async]", "shard dim 2 is out of range"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { x.redistribute_async({Partial{}}); }, {"Partial"}));
    EXPECT_TRUE(throws_with<ValueError>([] { PendingDTensor().wait(); }, {"[PendingDTensor::wait]"}));
    // Nothing was left in flight: the next collective works.
    EXPECT_TRUE(same(x.redistribute({Replicate{}}).to_local(), data({4, 4}, 1)));
  });
}
