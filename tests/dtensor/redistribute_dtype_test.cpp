// Redistributing in another dtype (PyTorch's forward_dtype / backward_dtype): the values move
// in forward_dtype and the result keeps it; the gradient moves in backward_dtype and reaches the
// input in the input's dtype. Half the bytes in bf16, checked with CommDebugMode.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST(RedistributeDtype, ForwardDtypeMovesAndReturnsTheCastValues) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor g = data({8, 6}, 1);
    for (const Placements& from : {Placements{Shard{0}}, Placements{Shard{1}}, Placements{Partial{}}}) {
      const DTensor x = make_input(g, mesh, from);
      int64_t f32_bytes = 0, bf16_bytes = 0;
      DTensor plain, cast;
      {
        CommDebugMode comm;
        plain = x.redistribute({Replicate{}});
        f32_bytes = comm.total_bytes_received();
      }
      {
        CommDebugMode comm;
        cast = x.redistribute({Replicate{}}, {.forward_dtype = DType::bf16});
        bf16_bytes = comm.total_bytes_received();
      }
      EXPECT_EQ(plain.dtype(), DType::f32);
      EXPECT_EQ(cast.dtype(), DType::bf16) << to_string(from);
      EXPECT_EQ(cast.placements(), (Placements{Replicate{}}));
      EXPECT_EQ(bf16_bytes * 2, f32_bytes) << to_string(from);
      // A Partial's parts are rounded to bf16 before they are summed: bf16's precision.
      EXPECT_TRUE(allclose(cast.full_tensor().to(DType::f32), g, 2e-2, 2e-2)) << to_string(from);
      if (!is_partial(from[0])) {
        EXPECT_TRUE(equal(cast.full_tensor(), g.to(DType::bf16)));
      }
    }
  });
}

TEST(RedistributeDtype, BackwardDtypeMovesTheGradientAndHandsItBackInTheInputsDtype) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    // Two rows per rank, so every rank receives gradient rows back (whatever the world size).
    const int64_t rows = 2 * world_size();
    const Tensor g = data({rows, 6}, 2), weights = data({rows, 6}, 3);
    const DTensor w = distribute_tensor(weights, mesh, {Shard{1}});
    int64_t backward_bytes[2] = {0, 0};
    Tensor grads[2];
    for (int half : {0, 1}) {
      DTensor x = distribute_tensor(g, mesh, {Shard{0}});
      x.requires_grad_();
      RedistributeOptions options;
      if (half) options.backward_dtype = DType::bf16;
      const DTensor y = x.redistribute({Shard{1}}, options);  // one all_to_all_v each way
      EXPECT_EQ(y.dtype(), DType::f32);
      const DTensor loss = sum(mul(y, w));
      CommDebugMode comm;
      loss.backward();
      backward_bytes[half] = comm.bytes_received(CollectiveKind::all_to_all_v);  // the gradient's move
      EXPECT_EQ(x.grad().dtype(), DType::f32);
      EXPECT_EQ(x.grad().placements(), (Placements{Shard{0}}));
      grads[half] = x.grad().full_tensor();
    }
    EXPECT_GT(backward_bytes[0], 0);
    EXPECT_EQ(backward_bytes[1] * 2, backward_bytes[0]);
    EXPECT_TRUE(equal(grads[0], weights));                          // d(sum(x * w))/dx = w
    EXPECT_TRUE(equal(grads[1], weights.to(DType::bf16).to(DType::f32)));  // w, rounded on the way
    // forward_dtype alone: the gradient moves in the result's dtype and arrives as f32.
    DTensor x = distribute_tensor(g, mesh, {Shard{0}});
    x.requires_grad_();
    const DTensor y = x.redistribute({Shard{1}}, {.forward_dtype = DType::bf16});
    sum(mul(y.to(DType::f32), w)).backward();
    EXPECT_EQ(x.grad().dtype(), DType::f32);
    EXPECT_TRUE(equal(x.grad().full_tensor(), weights.to(DType::bf16).to(DType::f32)));
  });
}
