// FSDP's bucketed collectives: foreach_all_gather moves each tensor as redistribute would, in one
// all_gather per (mesh dim, dtype) for the FSDP unshards among them (uneven and empty pieces,
// nested under a tensor-parallel split), and backward reduce-scatters the gradients of one call
// together, once per call; reduce_partials with targets reduce-scatters FSDP gradients in buckets.
#include <gtest/gtest.h>

#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
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

int64_t gathers(const CommDebugMode& mode) {
  return mode.count(CollectiveKind::all_gather) + mode.count(CollectiveKind::all_gather_v);
}
int64_t scatters(const CommDebugMode& mode) {
  return mode.count(CollectiveKind::reduce_scatter) + mode.count(CollectiveKind::reduce_scatter_v);
}

// fully_shard's storage layout for `compute` on mesh dim m: Shard(0) there, split last.
Layout storage_of(const Layout& compute, int64_t m) {
  Placements placements = compute.placements();
  placements[static_cast<size_t>(m)] = Shard{0};
  std::vector<int64_t> order = compute.shard_order(0);
  order.push_back(m);
  return Layout(compute.global_shape(), compute.dtype(), compute.mesh(), placements, ShardOrder{{0, order}});
}

// `whole` distributed in `compute`, then moved to its FSDP storage layout over mesh dim m.
DTensor stored(const Tensor& whole, const DeviceMesh& mesh, const Placements& compute, int64_t m) {
  const DTensor laid = distribute_tensor(whole, mesh, compute);
  return laid.redistribute(mesh, storage_of(laid.layout(), m));
}

}  // namespace

TEST(ForeachAllGather, EqualsRedistributeInOneAllGatherPerGroup) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    const bool two_d = n % 2 == 0 && n > 2;
    const DeviceMesh mesh = two_d ? DeviceMesh({2, n / 2}, {"tp", "dp"}) : DeviceMesh({n}, {"dp"});
    const int64_t dp = mesh.ndim() - 1;
    const Placements rep(static_cast<size_t>(mesh.ndim()), Replicate{});
    Placements tp_rows = rep;
    if (two_d) tp_rows[0] = Shard{0};  // on the 2-d mesh a tensor-parallel split of dim 0 comes first
    const Tensor a = wave({7, 3}, 0.1), b = wave({2}, 0.2), c = wave({5, 2, 3}, 0.3), d = wave({9, 4}, 0.4, DType::f32);
    const Tensor e = wave({4, 6}, 0.5);
    std::vector<DTensor> in = {stored(a, mesh, tp_rows, dp),  // uneven, nested under tp on 2-d
                               stored(b, mesh, rep, dp),      // fewer rows than ranks: empty pieces
                               stored(c, mesh, rep, dp),
                               stored(d, mesh, rep, dp),  // another dtype: its own all_gather
                               distribute_tensor(e, mesh, two_d ? Placements{Replicate{}, Shard{1}} : Placements{Shard{1}})};
    std::vector<Layout> targets;
    for (const DTensor& t : in) {
      Placements compute = t.placements();
      compute[static_cast<size_t>(dp)] = Replicate{};
      targets.push_back(t.layout().with_placements(compute));
    }
    targets[0] = distribute_tensor(a, mesh, tp_rows).layout();
    std::vector<DTensor> want;
    for (size_t i = 0; i < in.size(); ++i) want.push_back(in[i].redistribute(mesh, targets[i]));
    CommDebugMode mode;
    const std::vector<DTensor> out = foreach_all_gather(in, targets);
    // f64 {a, b, c}, f32 {d}, and the planner's gather of e's columns (not an FSDP unshard).
    EXPECT_EQ(gathers(mode), 3) << mode.to_string();
    EXPECT_EQ(mode.total_count(), 3) << mode.to_string();
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(out[i].layout() == targets[i]) << i << ": " << out[i].layout().to_string();
      EXPECT_TRUE(allclose(out[i].to_local(), want[i].to_local(), 0, 0)) << i;
    }
    EXPECT_TRUE(throws_with<ValueError>([&] { foreach_all_gather(in, {targets[0]}); },
                                        {"[foreach_all_gather]", "5 tensors", "1 target"}));
  });
}

// Two units, as FSDP2 groups a model's blocks: each call's gradients are reduce-scattered in one
// collective as soon as backward has passed it (two reduce_scatters, not one bucket at the end),
// land Shard(0) like their leaves, and equal the single-device gradients.
TEST(ForeachAllGather, BackwardReduceScattersEachCallOnce) {
  const Tensor x = wave({8, 5}, 0.5), w1 = wave({5, 4}, 0.6), b1 = wave({4}, 0.65), w2 = wave({4, 3}, 0.7);
  Tensor want1, want_b1, want2;
  {
    Tensor p1 = w1.clone(), q1 = b1.clone(), p2 = w2.clone();
    p1.requires_grad_(), q1.requires_grad_(), p2.requires_grad_();
    sum(tanh(matmul(tanh(add(matmul(x, p1), q1)), p2))).backward();
    want1 = p1.grad(), want_b1 = q1.grad(), want2 = p2.grad();
  }
  for_each_world({2, 3, 4}, [&] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Placements rep{Replicate{}};
    DTensor p1 = stored(w1, mesh, rep, 0), q1 = stored(b1, mesh, rep, 0), p2 = stored(w2, mesh, rep, 0);
    for (DTensor* p : {&p1, &q1, &p2}) p->requires_grad_();
    const DTensor xs = distribute_tensor(x, mesh, {Shard{0}});  // uneven over 3
    const Layout c1 = distribute_tensor(w1, mesh, rep).layout(), cb = distribute_tensor(b1, mesh, rep).layout(),
                 c2 = distribute_tensor(w2, mesh, rep).layout();
    const auto first = foreach_all_gather({p1, q1}, {c1, cb});
    const DTensor h = tanh(add(matmul(xs, first[0]), first[1]));
    const auto second = foreach_all_gather({p2}, {c2});
    const DTensor loss = sum(tanh(matmul(h, second[0])));
    {
      CommDebugMode mode;
      loss.backward();
      EXPECT_EQ(scatters(mode), 2) << mode.to_string();
      EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 0) << mode.to_string();
    }
    for (DTensor* p : {&p1, &q1, &p2}) EXPECT_TRUE(p->grad().layout() == p->layout()) << p->grad().to_string();
    EXPECT_TRUE(allclose(p1.grad().full_tensor(), want1, 1e-12, 1e-12));
    EXPECT_TRUE(allclose(q1.grad().full_tensor(), want_b1, 1e-12, 1e-12));
    EXPECT_TRUE(allclose(p2.grad().full_tensor(), want2, 1e-12, 1e-12));

    // Under NoSync two microbatches accumulate locally; one bucket when the scope closes.
    for (DTensor* p : {&p1, &q1, &p2}) p->set_grad(DTensor());
    {
      CommDebugMode mode;
      {
        NoSync no_sync;
        for (int micro = 0; micro < 2; ++micro) {
          const auto g1 = foreach_all_gather({p1, q1}, {c1, cb});
          const auto g2 = foreach_all_gather({p2}, {c2});
          sum(tanh(matmul(tanh(add(matmul(xs, g1[0]), g1[1])), g2[0]))).backward();
        }
        EXPECT_EQ(scatters(mode), 0) << mode.to_string();
      }
      EXPECT_EQ(scatters(mode), 1) << mode.to_string();
    }
    EXPECT_TRUE(allclose(p1.grad().full_tensor(), mul(want1, Scalar(2.0)), 1e-12, 1e-12));
    EXPECT_TRUE(allclose(p2.grad().full_tensor(), mul(want2, Scalar(2.0)), 1e-12, 1e-12));

    // A gathered non-leaf passes its gradient back through redistribute, in the input's layout.
    DTensor leaf = stored(w1, mesh, rep, 0);
    leaf.requires_grad_();
    const DTensor scaled = mul(leaf, Scalar(2.0));
    const auto g = foreach_all_gather({scaled}, {c1});
    sum(tanh(add(matmul(xs, g[0]), first[1].detach()))).backward();
    Tensor want_scaled;
    {
      Tensor p = w1.clone();
      p.requires_grad_();
      sum(tanh(add(matmul(x, mul(p, Scalar(2.0))), b1))).backward();
      want_scaled = p.grad();
    }
    EXPECT_TRUE(leaf.grad().layout() == leaf.layout());
    EXPECT_TRUE(allclose(leaf.grad().full_tensor(), want_scaled, 1e-12, 1e-12));
  });
}

// reduce_partials into targets: FSDP gradients (Partial, the target Shard(0) on that dim) go in
// reduce_scatter buckets and come back as views of them; the others reduce as before and move.
TEST(ForeachAllGather, ReducePartialsIntoTargetsScattersFsdpGradients) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const double n = static_cast<double>(world_size());
    const Tensor a = wave({7, 3}, 0.1), b = wave({2}, 0.2), c = wave({6}, 0.3);
    const auto partial = [&](const Tensor& whole) {
      FromLocalOptions global;
      global.shape = whole.shape();
      return DTensor::from_local(mul(whole, Scalar(1.0 / n)), mesh, {Partial{}}, global);
    };
    const std::vector<DTensor> in = {partial(a), partial(b), partial(c)};
    const Layout rep_c = distribute_tensor(c, mesh, {Replicate{}}).layout();
    const std::vector<Layout> targets = {storage_of(distribute_tensor(a, mesh, {Replicate{}}).layout(), 0),
                                         storage_of(distribute_tensor(b, mesh, {Replicate{}}).layout(), 0), rep_c};
    CommDebugMode mode;
    const std::vector<DTensor> out = reduce_partials(in, targets);
    EXPECT_EQ(scatters(mode), 1) << mode.to_string();
    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 1) << mode.to_string();
    EXPECT_EQ(mode.total_count(), 2) << mode.to_string();
    const std::vector<Tensor> want = {a, b, c};
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(out[i].layout() == targets[i]) << i << ": " << out[i].layout().to_string();
      EXPECT_TRUE(allclose(out[i].full_tensor(), want[i], 1e-12, 1e-12)) << i;
    }
    EXPECT_TRUE(throws_with<ValueError>([&] { reduce_partials(in, {rep_c}); },
                                        {"[reduce_partials]", "3 tensors", "1 target"}));
    // In flight: the same results once waited for; the inputs were packed at the call.
    const PendingReduction pending = reduce_partials_async(in, targets);
    for (const DTensor& t : in) {
      Tensor local = t.to_local();
      local.fill_(0.0);
    }
    const std::vector<DTensor> later = pending.wait();
    for (size_t i = 0; i < later.size(); ++i) EXPECT_TRUE(allclose(later[i].full_tensor(), want[i], 1e-12, 1e-12)) << i;
    EXPECT_TRUE(throws_with<ValueError>([] { PendingReduction().wait(); }, {"[PendingReduction::wait]"}));
  });
}

// The async form: the same result, packed at the call (a later write to the input does not show),
// the same vector on every wait, and an empty handle names the call.
TEST(ForeachAllGather, AsyncPacksAtTheCall) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Tensor a = wave({7, 3}, 0.1);
    const DTensor in = stored(a, mesh, {Replicate{}}, 0);
    const Layout target = distribute_tensor(a, mesh, {Replicate{}}).layout();
    const PendingGather pending = foreach_all_gather_async({in}, {target});
    Tensor local = in.to_local();
    local.fill_(0.0);
    const std::vector<DTensor> out = pending.wait();
    EXPECT_TRUE(allclose(out[0].to_local(), a, 0, 0));
    EXPECT_TRUE(pending.wait()[0].to_local().raw_data() == out[0].to_local().raw_data());
    EXPECT_TRUE(throws_with<ValueError>([] { PendingGather().wait(); }, {"[PendingGather::wait]"}));
  });
}
