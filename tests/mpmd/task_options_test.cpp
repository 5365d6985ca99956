// multimesh.jax's Task dataclass and register_task on a MultiMesh: a Task value's options (mesh
// or mesh_slice, logical and extra axes, a loop-dependent slice) decide where and under which
// rules a task runs; registered matchers build the Task per matched name through a callback.
// Values and gradients equal the computation on one device, on threads and under mpirun.
#include <gtest/gtest.h>

#include <string>

#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/multimesh.hpp>
#include <tessera/mpmd/task.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using namespace tessera::mpmd;

namespace {

// pp x dp over the world: two stages of n / 2 ranks.
MultiMesh stages() { return MultiMesh({2, world_size() / 2}, {"pp", "dp"}); }

// A task body: x -> 2 x + 1, elementwise.
std::vector<DTensor> affine(const std::vector<DTensor>& in) { return {in[0] * Scalar(2.0) + Scalar(1.0)}; }

// x on `mm`'s global mesh, whatever mesh it is on now (every rank reads it).
Tensor everywhere(const MultiMesh& mm, const DTensor& x) { return to_mesh(x, mm.global()).full_tensor(); }

}  // namespace

TEST(TaskValue, OptionsChainAndDecideTheMeshAndRules) {
  for_each_world({2, 4}, [] {
    const MultiMesh mm = stages();
    const Task options =
        Task().name("stage1").mesh_slice({{"pp", 1}}).extra_axes({{"hidden", {"dp"}}}).logical_axes({{"batch", {}}});
    EXPECT_EQ(options.name(), "stage1");
    EXPECT_EQ(options.mesh_slice(), (MeshSlice{{"pp", 1}}));
    EXPECT_EQ(options.extra_axes().size(), 1u);
    EXPECT_FALSE(options.runnable());

    // In the task: x [B, K] @ w [K, H] with its hidden dim constrained by logical name: the
    // extra axis maps it to dp. The same program, one device, gives the reference.
    const Tensor X = data({6, 4}, 1), W = data({4, 8}, 2);
    size_t rules_seen = 0;
    const Task stage = mm.task(
        [&](const std::vector<DTensor>& in) {
          rules_seen = current_logical_rules().size();
          const std::vector<std::string> names{"batch", "hidden"};
          return std::vector<DTensor>{mpmd::with_sharding_constraint(matmul(in[0], in[1]), names)};
        },
        "ignored: the options name it", options);
    EXPECT_EQ(stage.name(), "stage1");
    EXPECT_EQ(stage.mesh().spec(), mm.slice({{"pp", 1}}).spec());
    EXPECT_EQ(stage.rules(), (LogicalRules{{"batch", {}}, {"hidden", {"dp"}}}));

    const DTensor x = distribute_tensor(X, mm.global(), {Replicate{}, Replicate{}});
    const DTensor w = distribute_tensor(W, stage.mesh(), {Replicate{}}).requires_grad_();
    const DTensor y = stage({x, w})[0];
    EXPECT_EQ(y.layout().mesh(), stage.mesh().spec());
    EXPECT_EQ(rules_seen, stage.mesh().is_member() ? 2u : 0u);
    if (stage.mesh().is_member()) {
      if (stage.mesh().size() > 1) {
        EXPECT_EQ(y.placements()[0], Placement(Shard{1}));  // hidden over dp
      }
      EXPECT_TRUE(allclose(y.full_tensor(), matmul(X, W), 1e-12, 1e-12));
      // Gradients through the task's ops equal the one-device ones.
      sum(y).backward();
      const Tensor Wr = W.detach().requires_grad_();
      sum(matmul(X, Wr)).backward();
      EXPECT_TRUE(allclose(w.grad().full_tensor(), Wr.grad(), 1e-12, 1e-12));
    }
    EXPECT_TRUE(allclose(everywhere(mm, y), matmul(X, W), 1e-12, 1e-12));
  });
}

TEST(TaskValue, UnsetLogicalAxesNameTheMeshAxes) {
  for_each_world({2, 4}, [] {
    const MultiMesh mm = stages();
    const Task stage = mm.task(affine, "first", Task().mesh_slice({{"pp", 0}}));
    EXPECT_EQ(stage.rules(), (LogicalRules{{"dp", {"dp"}}}));
    const Task explicit_mesh = mm.task(affine, "all", Task().mesh(mm.global()).extra_axes({{"rows", {"pp"}}}));
    EXPECT_EQ(explicit_mesh.mesh().spec(), mm.global().spec());
    EXPECT_EQ(explicit_mesh.rules(), (LogicalRules{{"pp", {"pp"}}, {"dp", {"dp"}}, {"rows", {"pp"}}}));
  });
}

TEST(RegisterTask, TheCallbackBuildsTheTaskPerMatchedName) {
  for_each_world({2, 4}, [] {
    MultiMesh mm = stages();
    std::vector<std::string> matched;
    mm.register_task("layer(\\d+)", [&](const std::string& group, bool backprop) {
      EXPECT_FALSE(backprop);
      matched.push_back(group);
      const int64_t layer = std::stoll(group);
      return Task().name("layer_" + group).mesh_slice({{"pp", layer % 2}});
    });
    mm.register_task("head", Task().mesh(mm.global()));
    mm.register_task("layer1", Task().name("never").mesh_slice({{"pp", 0}}));  // a later match loses

    const Task first = mm.task(affine, "decoder.layer0.mlp");
    const Task second = mm.task(affine, "decoder.layer1.mlp");
    const Task head = mm.task(affine, "lm.head");
    EXPECT_EQ(matched, (std::vector<std::string>{"0", "1"}));
    EXPECT_EQ(first.name(), "layer_0");
    EXPECT_EQ(second.name(), "layer_1");
    EXPECT_EQ(head.name(), "head");  // unnamed: the matcher's name
    EXPECT_EQ(first.mesh().spec(), mm.slice({{"pp", 0}}).spec());
    EXPECT_EQ(second.mesh().spec(), mm.slice({{"pp", 1}}).spec());
    EXPECT_EQ(head.mesh().spec(), mm.global().spec());

    // A chain over both stages and the whole mesh equals the one-device computation.
    const Tensor X = data({5, 3}, 3);
    const DTensor x = distribute_tensor(X, first.mesh(), {Shard{0}});
    const DTensor y = head(second(first({x})))[0];
    EXPECT_TRUE(allclose(y.full_tensor(), ((X * 2.0 + 1.0) * 2.0 + 1.0) * 2.0 + 1.0, 1e-12, 1e-12));

    EXPECT_TRUE(
        sharding_error([&] { mm.task(affine, "embedding"); },
                       {"[task]", "no registered matcher matches task 'embedding'", "layer(\\d+), head, layer1"}));
    EXPECT_TRUE(sharding_error([&] { mm.register_task("layer(", Task()); },
                               {"[register_task]", "matcher 'layer(' is not a regular expression"}));
  });
}

TEST(TaskValue, LoopDependentMeshSliceFollowsTheIteration) {
  for_each_world({2, 4}, [] {
    const MultiMesh mm = stages();
    const Task stage = mm.task(affine, "stage", Task().mesh_slice({{"pp", 0}}).loop_dependent_mesh_slice([](int64_t i) {
      return MeshSlice{{"pp", i % 2}};
    }));
    const Tensor X = data({4, 6}, 4);
    Tensor expected = X;
    DTensor x = distribute_tensor(X, stage.mesh(), {Shard{1}});
    for (int64_t i = 0; i < 4; ++i) {
      const Task now = stage.iteration(i);
      EXPECT_EQ(now.mesh().spec(), mm.slice({{"pp", i % 2}}).spec());
      x = now({x})[0];
      expected = expected * 2.0 + 1.0;
    }
    EXPECT_TRUE(allclose(everywhere(mm, x), expected, 1e-12, 1e-12));
  });
}

TEST(TaskValue, ErrorsNameTheTask) {
  for_each_world({2, 4}, [] {
    const MultiMesh mm = stages();
    EXPECT_TRUE(sharding_error(
        [&] {
          mm.task(affine, "both", Task().mesh(mm.global()).mesh_slice({{"pp", 0}}));
        },
        {"[task]", "task 'both' gives both a mesh and a mesh_slice {pp=0}"}));
    EXPECT_TRUE(sharding_error([&] { mm.task(affine, "none", Task()); },
                               {"[task]", "task 'none' gives neither a mesh nor a mesh_slice"}));
    EXPECT_TRUE(sharding_error([&] { mm.task(affine, "bad", Task().mesh_slice({{"tp", 0}})); }, {"tp"}));
    EXPECT_TRUE(sharding_error([&] { Task().name("value")({}); },
                               {"[task]", "task 'value' is a Task value without a function"}));
    // Iteration 1's slice is the whole mesh: more devices than the stage's.
    const Task growing =
        mm.task(affine, "growing", Task().mesh_slice({{"pp", 0}}).loop_dependent_mesh_slice([](int64_t i) {
          return i == 0 ? MeshSlice{{"pp", 0}} : MeshSlice{};
        }));
    EXPECT_TRUE(sharding_error([&] { growing.iteration(1); },
                               {"[task]", "task 'growing' iteration 1: the loop-dependent slice {} holds " +
                                              std::to_string(world_size()) + " devices"}));
    Task plain("plain", mm.global(), affine);
    plain.loop_dependent_mesh_slice([](int64_t) { return MeshSlice{}; });
    EXPECT_TRUE(sharding_error([&] { plain.iteration(0); },
                               {"[task]", "task 'plain' has a loop_dependent_mesh_slice but no MultiMesh built it"}));
  });
}
