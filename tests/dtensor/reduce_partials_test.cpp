// Partial DTensors reduced in buckets (DDP's gradient buckets): the values equal redistribute's,
// tensors reduced over the same mesh dims share one all_reduce per bucket (small buckets split
// them; uneven blocks and other dtypes and dims go apart), and a backward reduces its Partial
// leaf gradients that way when it returns.
#include <gtest/gtest.h>

#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor wave(const Shape& shape, double phase, DType dtype = DType::f64) {
  return sin(add(mul(arange(shape.numel()).to(DType::f64), Scalar(0.37)), Scalar(phase))).reshape(shape).to(dtype);
}

// A Partial(op) DTensor over mesh dim `dim` whose reduced value is `whole` laid out as `placements`
// elsewhere: each rank along `dim` holds whole / n (sum) or whole itself (max).
DTensor partial_of(const Tensor& whole, const DeviceMesh& mesh, Placements placements, int64_t dim, ReduceOp op) {
  const DTensor laid = distribute_tensor(whole, mesh, placements);
  placements[static_cast<size_t>(dim)] = Partial{op};
  const double n = static_cast<double>(mesh.size(dim));
  const Tensor local = op == ReduceOp::sum ? mul(laid.to_local(), Scalar(1.0 / n)) : laid.to_local();
  FromLocalOptions global;
  global.shape = whole.shape();
  return DTensor::from_local(local, mesh, placements, global);
}

}  // namespace

TEST(ReducePartials, EqualsRedistributeInOneCollectivePerGroup) {
  if (under_mpi() && world_size() % 2 != 0) GTEST_SKIP() << "a 2 x n/2 mesh needs an even world";
  for_each_world({4, 6}, [] {
    const DeviceMesh mesh({2, world_size() / 2}, {"dp", "tp"});
    const Tensor a = wave({7, 3}, 0.1), b = wave({5}, 0.2), c = wave({4, 2}, 0.3), d = wave({3}, 0.4, DType::f32);
    const std::vector<DTensor> in = {
        partial_of(a, mesh, {Replicate{}, Shard{0}}, 0, ReduceOp::sum),  // uneven over tp
        partial_of(b, mesh, {Replicate{}, Replicate{}}, 0, ReduceOp::sum),
        partial_of(c, mesh, {Replicate{}, Replicate{}}, 1, ReduceOp::sum),  // another group: over tp
        partial_of(d, mesh, {Replicate{}, Replicate{}}, 0, ReduceOp::sum),  // another dtype
        partial_of(b, mesh, {Replicate{}, Replicate{}}, 0, ReduceOp::max),  // another op
        distribute_tensor(c, mesh, {Shard{0}, Replicate{}}),               // nothing to reduce
    };
    CommDebugMode mode;
    const std::vector<DTensor> out = reduce_partials(in);
    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 4) << mode.to_string();  // {a, b}, {c}, {d}, {max b}
    EXPECT_EQ(mode.total_count(), 4);
    const std::vector<Tensor> want = {a, b, c, d, b, c};
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_FALSE(out[i].layout().has_partial()) << i;
      EXPECT_TRUE(allclose(out[i].full_tensor().to(DType::f64), want[i], 1e-6, 1e-12)) << i;
    }
    EXPECT_EQ(out[0].placements(), (Placements{Replicate{}, Shard{0}}));
    // Buckets of one tensor each: the same values, a collective per tensor of the group.
    CommDebugMode small;
    const std::vector<DTensor> split = reduce_partials({in[0], in[1]}, 1);
    EXPECT_EQ(small.count(CollectiveKind::all_reduce), 2);
    EXPECT_TRUE(allclose(split[1].full_tensor(), b, 1e-12, 1e-12));
    EXPECT_TRUE(throws_with<ValueError>([&] { reduce_partials(in, 0); }, {"[reduce_partials]", "bucket_bytes 0"}));
  });
}

// Data parallel: the Partial gradients of every parameter are reduced together when backward
// returns (one all_reduce), and equal the single-device gradients.
TEST(ReducePartials, BackwardReducesDataParallelGradientsInOneBucket) {
  const Tensor x = wave({8, 5}, 0.5), w1 = wave({5, 4}, 0.6), w2 = wave({4, 3}, 0.7);
  Tensor want1, want2;
  {
    Tensor p1 = w1.clone(), p2 = w2.clone();
    p1.requires_grad_(), p2.requires_grad_();
    sum(tanh(matmul(tanh(matmul(x, p1)), p2))).backward();
    want1 = p1.grad(), want2 = p2.grad();
  }
  for_each_world({2, 3, 4}, [&] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    DTensor p1 = distribute_tensor(w1, mesh, {Replicate{}}), p2 = distribute_tensor(w2, mesh, {Replicate{}});
    p1.requires_grad_(), p2.requires_grad_();
    const DTensor xs = distribute_tensor(x, mesh, {Shard{0}});  // uneven over 3
    const DTensor loss = sum(tanh(matmul(tanh(matmul(xs, p1)), p2)));
    CommDebugMode mode;
    loss.backward();
    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 1) << mode.to_string();
    EXPECT_EQ(p1.grad().placements(), (Placements{Replicate{}}));
    EXPECT_TRUE(allclose(p1.grad().full_tensor(), want1, 1e-12, 1e-12));
    EXPECT_TRUE(allclose(p2.grad().full_tensor(), want2, 1e-12, 1e-12));
  });
}

// DDP's overlap: once the gradients waiting reach the first bucket's size (1 MiB), their
// all_reduce is issued while backward goes on (a node that runs later sees it issued); the rest
// follow when backward returns. A gradient arriving for a leaf whose bucket is in flight is added
// after it lands. The results equal the single-device gradients.
TEST(ReducePartials, BackwardIssuesAFullBucketWhileItRuns) {
  const Tensor x = wave({8, 16}, 0.5), small = wave({16, 512}, 0.6), big = mul(wave({512, 256}, 0.7), Scalar(0.05));
  Tensor want_small, want_big;
  {
    Tensor s = small.clone(), b = big.clone();
    s.requires_grad_(), b.requires_grad_();
    const Tensor a = tanh(matmul(x, s));
    add(sum(tanh(matmul(a, b))), sum(matmul(mul(a, Scalar(0.5)), b))).backward();
    want_small = s.grad(), want_big = b.grad();
  }
  for_each_world({2, 3}, [&] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    DTensor s = distribute_tensor(small, mesh, {Replicate{}}), b = distribute_tensor(big, mesh, {Replicate{}});
    s.requires_grad_(), b.requires_grad_();
    const DTensor xs = distribute_tensor(x, mesh, {Shard{0}});
    CommDebugMode mode;
    int64_t issued_before_probe = -1;
    const DTensor a = tanh(matmul(xs, s));
    DTensor probed = a.detach();
    autograd::record<DTensor>("probe", probed, {&a}, [&](const DTensor& g) {
      issued_before_probe = mode.count(CollectiveKind::all_reduce);
      return std::vector<DTensor>{g};
    });
    // b's second use is created first, so its gradient reaches b after the first is in flight.
    const DTensor second = sum(matmul(mul(probed, Scalar(0.5)), b));
    const DTensor loss = add(sum(tanh(matmul(probed, b))), second);
    mode.reset();
    loss.backward();
    // b's bucket (1 MiB) went in flight with its first gradient; the second landed it and was
    // reduced on its own; both before backward reached a. s's bucket follows at the end.
    EXPECT_EQ(issued_before_probe, 2);
    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 3) << mode.to_string();
    EXPECT_EQ(b.grad().placements(), (Placements{Replicate{}}));
    EXPECT_TRUE(allclose(s.grad().full_tensor(), want_small, 1e-10, 1e-12));
    EXPECT_TRUE(allclose(b.grad().full_tensor(), want_big, 1e-10, 1e-12));
  });
}
