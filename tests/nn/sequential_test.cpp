// PyTorch's module ergonomics on DTensor: modules are callable, nn::Sequential chains them (its
// children named by index, reachable by a parallel plan), activation modules equal their ops,
// Dropout follows train()/eval(); a Sequential sharded with parallelize_module after it is built
// equals the unsharded one, values and gradients, on threads and under mpirun.
#include <gtest/gtest.h>

#include <memory>

#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/containers.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/ops/random.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Placements replicated(const DeviceMesh& mesh) { return Placements(static_cast<size_t>(mesh.ndim()), Replicate{}); }

bool same(const DTensor& a, const DTensor& b, double tol = 1e-6) {
  return allclose(a.full_tensor(), b.full_tensor(), tol, tol);
}

// A two-layer MLP as a Sequential of Linear, GELU, Linear.
std::shared_ptr<nn::Sequential> mlp(const DeviceMesh& mesh) {
  manual_seed(5);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(mesh, 6, 8), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(mesh, 8, 6)});
}

}  // namespace

TEST(Sequential, ChainsCallableModulesNamedByIndex) {
  for_each_world({1, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"dp"});
    const auto seq = mlp(mesh);
    EXPECT_EQ(seq->size(), 3);
    EXPECT_EQ(seq->type_name(), "Sequential");
    EXPECT_EQ((*seq)[1].type_name(), "GELU");
    EXPECT_EQ((*seq)[-1].type_name(), "Linear");
    std::vector<std::string> names;
    for (const auto& [name, p] : seq->named_parameters()) names.push_back(name);
    EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
    const DTensor x = distribute_tensor(randn({5, 6}), mesh, replicated(mesh));
    const auto& fc1 = dynamic_cast<const nn::Linear&>((*seq)[0]);
    const auto& fc2 = dynamic_cast<const nn::Linear&>((*seq)[2]);
    // Callable: model(x) is model.forward(x); the chain is fc2(gelu(fc1(x))).
    EXPECT_TRUE(same((*seq)(x), fc2.forward(gelu(fc1(x)))));
    EXPECT_TRUE(same(seq->forward(x), (*seq)(x)));
    EXPECT_TRUE(same(nn::Sequential({})(x), x));  // empty: the identity
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)(*seq)[3]; }, {"[Sequential]", "index 3 is out of range for 3"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { nn::Sequential({nullptr}); }, {"[Sequential]", "module 0 is null"}));
  });
}

TEST(Sequential, ActivationModulesEqualTheirOps) {
  for_each_world({1, 3}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = distribute_tensor(randn({7, 4}), mesh, {Shard{0}});
    EXPECT_TRUE(same(nn::ReLU()(x), relu(x), 0));
    EXPECT_TRUE(same(nn::GELU()(x), gelu(x), 0));
    EXPECT_TRUE(same(nn::SiLU()(x), silu(x), 0));
    EXPECT_TRUE(same(nn::Tanh()(x), tanh(x), 0));
    EXPECT_TRUE(same(nn::Sigmoid()(x), sigmoid(x), 0));
    // Dropout drops in training mode as dropout does (the same draw after the same seed), and
    // is the identity after eval(), also when its parent is put in eval.
    auto drop = std::make_shared<nn::Dropout>(0.5);
    manual_seed(9);
    const DTensor dropped = (*drop)(x);
    manual_seed(9);
    EXPECT_TRUE(same(dropped, dropout(x, 0.5), 0));
    EXPECT_FALSE(same(dropped, x, 0));
    nn::Sequential seq({drop});
    seq.eval();
    EXPECT_FALSE(drop->training());
    EXPECT_TRUE(same(seq(x), x, 0));
    seq.train();
    EXPECT_TRUE(drop->training());
    EXPECT_TRUE(throws_with<ValueError>([] { nn::Dropout(1.0); }, {"[Dropout]", "p = 1"}));
  });
}

// Built on the mesh as on one device, then sharded: Colwise on "0", Rowwise on "2" (the GELU
// between needs nothing), equal to the replicated model in values and gradients.
TEST(Sequential, ParallelizedAfterItIsBuiltEqualsTheUnshardedModel) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    const auto reference = mlp(mesh);
    const auto sharded = mlp(mesh);  // the same seed: the same parameters
    nn::parallelize_module(*sharded, "tp", {{"0", nn::ColwiseParallel{}}, {"2", nn::RowwiseParallel{}}});
    EXPECT_EQ(sharded->parameter_names().size(), 0u);
    EXPECT_TRUE(is_shard((*sharded)[0].parameter("weight").placements()[0], 0));
    manual_seed(3);
    const DTensor x = distribute_tensor(randn({5, 6}), mesh, replicated(mesh));
    const DTensor y_ref = (*reference)(x), y = (*sharded)(x);
    EXPECT_TRUE(same(y, y_ref, 1e-5));
    sum(y_ref * y_ref).backward();
    sum(y * y).backward();
    const auto ref_params = reference->named_parameters(), params = sharded->named_parameters();
    ASSERT_EQ(ref_params.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(same(params[i].second->grad(), ref_params[i].second->grad(), 1e-5)) << params[i].first;
  });
}
