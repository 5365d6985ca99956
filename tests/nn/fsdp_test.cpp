// FSDP units (fully_shard per block, then the root, as FSDP2): training equals single-device
// training; each unit is all-gathered in one collective per forward and reduce-scattered in one
// per backward; gathered values serve one use (a module called twice gathers twice, every forward
// gathers again), never outlive a parameter write, and record autograd only when it is on.
#include <gtest/gtest.h>

#include <string>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/optim.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"
#include "tiny_lm.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

void fsdp_per_block(nn::TransformerLM& m, const std::string& axis) {
  for (int64_t i = 0; i < m.config().layers; ++i) nn::fully_shard(m.submodule("blocks." + std::to_string(i)), axis);
  nn::fully_shard(m, axis);
}

int64_t gathers(const CommDebugMode& mode) {
  return mode.count(CollectiveKind::all_gather) + mode.count(CollectiveKind::all_gather_v);
}
int64_t scatters(const CommDebugMode& mode) {
  return mode.count(CollectiveKind::reduce_scatter) + mode.count(CollectiveKind::reduce_scatter_v);
}

// Three AdamW steps with clipping on `model` and on an unsharded copy: the same losses, gradients
// and parameters.
void check_training_equals_single_device(const DeviceMesh& mesh, const Placements& data,
                                         const std::function<void(nn::TransformerLM&)>& parallelize) {
  manual_seed(7);
  nn::TransformerLM reference(mesh, tiny());
  manual_seed(7);
  nn::TransformerLM model(mesh, tiny());
  parallelize(model);
  const Placements whole(static_cast<size_t>(mesh.ndim()), Replicate{});
  nn::AdamW ref_opt(reference.parameters(), 0.01, 0.9, 0.99, 1e-8, 0.01), opt(model.parameters(), 0.01, 0.9, 0.99, 1e-8, 0.01);
  const auto params = model.named_parameters(), ref_params = reference.named_parameters();
  for (int step = 0; step < 3; ++step) {
    const auto [ids, next] = batch(tiny().vocab, step);
    reference.zero_grad();
    model.zero_grad();
    const DTensor ref_loss = reference.loss(distribute_tensor(ids, mesh, whole), distribute_tensor(next, mesh, whole));
    const DTensor loss = model.loss(distribute_tensor(ids, mesh, data), distribute_tensor(next, mesh, data));
    EXPECT_NEAR(loss.full_tensor().item(), ref_loss.full_tensor().item(), 1e-10) << "step " << step;
    ref_loss.backward();
    loss.backward();
    for (size_t i = 0; i < params.size(); ++i) {
      const DTensor g = params[i].second->grad();
      ASSERT_TRUE(g.defined()) << params[i].first;
      EXPECT_TRUE(g.layout() == params[i].second->layout()) << params[i].first << ": " << g.layout().to_string();
      EXPECT_TRUE(allclose(g.full_tensor(), ref_params[i].second->grad().full_tensor(), 1e-8, 1e-10))
          << params[i].first << " at step " << step;
    }
    nn::clip_grad_norm_(reference.parameters(), 1.0);
    nn::clip_grad_norm_(model.parameters(), 1.0);
    ref_opt.step();
    opt.step();
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(allclose(params[i].second->full_tensor(), ref_params[i].second->full_tensor(), 1e-8, 1e-10))
        << params[i].first << " after training";
}

}  // namespace

TEST(Fsdp, UnitsPerBlockTrainLikeOneDevice) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    {
      SCOPED_TRACE("fsdp per block");
      const DeviceMesh mesh({n}, {"dp"});
      check_training_equals_single_device(mesh, {Shard{0}}, [](nn::TransformerLM& m) { fsdp_per_block(m, "dp"); });
    }
    if (n % 2 == 0 && n > 2) {
      SCOPED_TRACE("tp x fsdp per block");
      const DeviceMesh mesh({2, n / 2}, {"dp", "tp"});
      check_training_equals_single_device(mesh, {Shard{0}, Replicate{}}, [](nn::TransformerLM& m) {
        nn::parallelize_module(m, "tp", nn::transformer_tp_plan(true));
        fsdp_per_block(m, "dp");
      });
    }
  });
}

// One all_gather per unit in forward, one reduce_scatter per unit in backward; a second forward
// gathers again, and its gradients add to the first's; once the order is known, each unit's
// gather starts the next one's.
TEST(Fsdp, OneCollectivePerUnitEachWay) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    manual_seed(7);
    nn::TransformerLM model(mesh, tiny());
    fsdp_per_block(model, "dp");
    const int64_t units = tiny().layers + 1;
    const auto [ids, next] = batch(tiny().vocab, 0);
    const DTensor tokens = distribute_tensor(ids, mesh, {Shard{0}}), targets = distribute_tensor(next, mesh, {Shard{0}});
    DTensor loss;
    {
      CommDebugMode mode;
      loss = model.loss(tokens, targets);
      EXPECT_EQ(gathers(mode), units) << mode.to_string();
    }
    {
      CommDebugMode mode;
      loss.backward();
      EXPECT_EQ(scatters(mode), units) << mode.to_string();
      // Nothing else: the loss's backward divides by the token count forward reduced.
      EXPECT_EQ(mode.total_count(), units) << mode.to_string();
    }
    const Tensor first = model.named_parameters().front().second->grad().full_tensor();
    {
      CommDebugMode mode;
      model.loss(tokens, targets).backward();
      EXPECT_EQ(gathers(mode), units) << mode.to_string();  // the first forward's values are not kept
    }
    EXPECT_TRUE(allclose(model.named_parameters().front().second->grad().full_tensor(), mul(first, Scalar(2.0)),
                         1e-12, 1e-12));

    // The forward order is learnt: the root's gather now starts block 0's too (prefetch), and
    // block 0 uses it (the forward still gathers each unit once).
    CommDebugMode mode;
    const DTensor h = model.forward_units(0, 1, tokens);
    EXPECT_EQ(gathers(mode), 2) << mode.to_string();
    const DTensor logits = model.forward_units(1, model.units(), h);
    EXPECT_EQ(gathers(mode), units) << mode.to_string();
    manual_seed(7);
    nn::TransformerLM reference(mesh, tiny());
    EXPECT_TRUE(allclose(logits.full_tensor(), reference.forward(tokens).full_tensor(), 1e-12, 1e-12));
  });
}

// A module called twice in one forward gathers its unit twice and gets both uses' gradients; a
// forward without autograd gathers untracked, and a later one with autograd gathers again; values
// gathered before an optimizer step are not reused after it; reshard drops the gathered values.
TEST(Fsdp, GatheredValuesServeOneUse) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Tensor x = sin(mul(arange(35).to(DType::f64), Scalar(0.3))).reshape({7, 5});
    manual_seed(5);
    nn::Linear reference(mesh, 5, 5, true, DType::f64);
    manual_seed(5);
    nn::Linear lin(mesh, 5, 5, true, DType::f64);
    nn::fully_shard(lin, "dp");
    EXPECT_EQ(lin.parameter("weight").placements()[0], Placement(Shard{0}));

    const DTensor xr = distribute_tensor(x, mesh, {Replicate{}}), xs = distribute_tensor(x, mesh, {Shard{0}});
    sum(tanh(reference.forward(tanh(reference.forward(xr))))).backward();
    {
      CommDebugMode mode;
      sum(tanh(lin.forward(tanh(lin.forward(xs))))).backward();
      EXPECT_EQ(gathers(mode), 2) << mode.to_string();
    }
    for (const char* name : {"weight", "bias"})
      EXPECT_TRUE(allclose(lin.parameter(name).grad().full_tensor(), reference.parameter(name).grad().full_tensor(),
                           1e-12, 1e-12))
          << name;

    // Untracked, then tracked: the second forward must not reuse the untracked gather.
    lin.zero_grad();
    {
      autograd::NoGradGuard no_grad;
      (void)lin.forward(xs);
    }
    sum(lin.forward(xs)).backward();
    EXPECT_TRUE(lin.parameter("weight").grad().defined());

    // reshard: the next use gathers again.
    (void)lin.forward(xs);
    nn::reshard(lin);
    CommDebugMode mode;
    (void)lin.forward(xs);
    EXPECT_EQ(gathers(mode), 1) << mode.to_string();
  });
}

// Values gathered before a parameter write are not served after it: fc2's weights, gathered with
// fc1's by a forward of fc1 alone, are gathered again after the optimizer step.
TEST(Fsdp, ParameterWritesInvalidateGatheredValues) {
  for_each_world({2, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const Tensor x = sin(mul(arange(28).to(DType::f64), Scalar(0.3))).reshape({7, 4});
    manual_seed(5);
    nn::MLP mlp(mesh, 4, 6, DType::f64);
    nn::fully_shard(mlp, "dp");
    auto& fc1 = dynamic_cast<nn::Linear&>(mlp.submodule("fc1"));
    auto& fc2 = dynamic_cast<nn::Linear&>(mlp.submodule("fc2"));
    const DTensor xs = distribute_tensor(x, mesh, {Shard{0}});
    sum(mlp.forward(xs)).backward();  // every parameter gets a gradient
    const DTensor h = fc1.forward(xs);  // gathers the unit; fc2's values wait unused
    nn::SGD sgd(mlp.parameters(), 0.5);
    sgd.step();
    const Tensor got = fc2.forward(h).full_tensor();
    const Tensor want = add(matmul(h.full_tensor(), fc2.parameter("weight").full_tensor().transpose(0, 1)),
                            fc2.parameter("bias").full_tensor());
    EXPECT_TRUE(allclose(got, want, 1e-12, 1e-12));
  });
}

TEST(Fsdp, Errors) {
  for_each_world({2}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    manual_seed(1);
    nn::TransformerLM model(mesh, tiny());
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::fully_shard(model, "pp"); }, {"[parallelize_module]", "'pp'"}));
    nn::parallelize_module(model, "dp", {{"head", nn::ColwiseParallel{}}});
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::fully_shard(model, "dp"); },
                                        {"[fully_shard]", "head.weight", "expected Replicate on axis 'dp'"}));
  });
}
