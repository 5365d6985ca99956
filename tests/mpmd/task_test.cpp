// MultiMesh and TaskMesh build the submeshes tasks run on; a task runs only on its mesh's ranks,
// moves inputs from other meshes through the planner (uneven, Partial reduced first), and every
// other rank gets its outputs' layouts; tasks registered by name pattern.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

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

TEST(MultiMesh, SlicesAndSplits) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    if (n % 2) return;
    const MultiMesh mm({2, n / 2}, {"pp", "dp"});
    EXPECT_EQ(mm.global().size(), n);
    const DeviceMesh second = mm.slice({{"pp", 1}});
    EXPECT_EQ(second.spec().names(), (std::vector<std::string>{"dp"}));
    std::vector<int> expected;
    for (int r = n / 2; r < n; ++r) expected.push_back(r);
    EXPECT_EQ(second.spec().ranks(), expected);
    EXPECT_EQ(second.is_member(), rank() >= n / 2);
    const auto stages = mm.split("pp");
    ASSERT_EQ(stages.size(), 2u);
    EXPECT_EQ(stages[1].spec().ranks(), expected);
    EXPECT_TRUE(sharding_error([&] { mm.slice({{"tp", 0}}); }, {"tp"}));
  });
}

TEST(TaskMesh, DevicesAndPlace) {
  for_each_world({4}, [] {
    if (world_size() < 4) return;
    const TaskMesh first({0, 1}, {2}, {"dp"});
    const TaskMesh moved = first.place({3, 2});
    EXPECT_EQ(moved.devices(), (std::vector<int>{3, 2}));
    EXPECT_EQ(moved.mesh().spec().names(), (std::vector<std::string>{"dp"}));
    EXPECT_EQ(moved.mesh().spec().ranks(), (std::vector<int>{3, 2}));
    EXPECT_EQ(moved.mesh().is_member(), rank() == 2 || rank() == 3);
    EXPECT_TRUE(sharding_error([&] { TaskMesh({0, 0}, {2}, {"dp"}); }, {"[TaskMesh]", "device 0 is listed twice"}));
    EXPECT_TRUE(sharding_error([&] { TaskMesh({0, 9}, {2}, {"dp"}); }, {"[TaskMesh]", "device 9 is not a rank"}));
  });
}

// multimesh.jax's other constructors: MultiMesh over an explicit devices array (part of the
// world) or wrapping an existing mesh; TaskMesh from an abstract mesh (axes, no ranks).
TEST(MultiMesh, FromDevicesOrAnExistingMesh) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    if (n < 4) return;  // mpirun -np 2
    // The last four ranks, in reverse, as a 2 x 2 global mesh: slices follow the devices array.
    const std::vector<int> devices = {n - 1, n - 2, n - 3, n - 4};
    const MultiMesh mm({2, 2}, {"pp", "dp"}, devices);
    EXPECT_EQ(mm.global().spec().ranks(), devices);
    EXPECT_EQ(mm.global().is_member(), rank() >= n - 4);
    EXPECT_EQ(mm.slice({{"pp", 1}}).spec().ranks(), (std::vector<int>{n - 3, n - 4}));
    // A task on a slice runs there only, and its result equals the unsharded one.
    const Tensor a = data({5, 3}, 3);
    const DeviceMesh stage = mm.slice({{"pp", 0}});
    const Task twice =
        task("twice", stage, [](const std::vector<DTensor>& in) { return std::vector<DTensor>{in[0] * Scalar(2.0)}; });
    const DTensor y = twice({distribute_tensor(a, stage, {Shard{0}})})[0];
    if (stage.is_member()) {
      EXPECT_TRUE(same(y.full_tensor(), mul(a, Scalar(2.0))));
    }
    // Wrapping an existing mesh: its axes and ranks, sliced alike.
    const DeviceMesh grid({2, n / 2}, {"a", "b"});
    const MultiMesh wrapped(grid);
    EXPECT_TRUE(wrapped.global().spec() == grid.spec());
    EXPECT_EQ(wrapped.slice({{"a", 1}}).spec().ranks(), grid.slice({{"a", 1}}).spec().ranks());
    EXPECT_TRUE(sharding_error(
        [&] {
          MultiMesh({2, 2}, {"pp", "dp"}, {0, 1, 2});
        },
        {"[MultiMesh]", "shape [2, 2] holds 4 ranks but 3 devices were given"}));
    EXPECT_TRUE(sharding_error([&] { MultiMesh({2}, {"pp"}, {0, n}); }, {"[MultiMesh]", "is not a rank of the world"}));
  });
}

TEST(TaskMesh, FromAnAbstractMesh) {
  for_each_world({4}, [] {
    if (world_size() < 4) return;
    const AbstractMesh axes({2}, {"dp"});
    EXPECT_EQ(axes.size(), 2);
    EXPECT_EQ(axes.to_string(), "AbstractMesh[dp=2]");
    const TaskMesh first({0, 1}, axes), second({2, 3}, axes);
    EXPECT_EQ(second.mesh().spec().ranks(), (std::vector<int>{2, 3}));
    EXPECT_EQ(second.mesh().spec().names(), (std::vector<std::string>{"dp"}));
    EXPECT_EQ(first.abstract(), axes);
    EXPECT_EQ(first.place({3, 1}).abstract(), axes);
    EXPECT_TRUE(sharding_error([] { AbstractMesh({2, 0}, {"a", "b"}); }, {"[AbstractMesh]", "axis 'b'", "has size 0"}));
    EXPECT_TRUE(sharding_error([] { AbstractMesh({2}, {"a", "b"}); }, {"[AbstractMesh]", "2 axis names"}));
    EXPECT_TRUE(sharding_error([&] { TaskMesh({0, 1, 2}, axes); }, {"[TaskMesh]", "holds 2 ranks but 3 devices"}));
  });
}

// Two tasks on disjoint halves, a third on an overlapping mesh reading both: inputs move in,
// each task runs only where its mesh is, and the result equals the unsharded computation.
TEST(Task, DisjointAndOverlappingSubmeshes) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    if (n % 2) return;
    const MultiMesh mm({2, n / 2}, {"half", "x"});
    const DeviceMesh left = mm.slice({{"half", 0}}), right = mm.slice({{"half", 1}});
    const Tensor a = data({7, 5}, 1), b = data({7, 5}, 2);
    int ran_left = 0, ran_right = 0;
    const Task double_it = task("double", left, [&](const std::vector<DTensor>& in) {
      ++ran_left;
      return std::vector<DTensor>{in[0] * Scalar(2.0)};
    });
    const Task square_it = task("square", right, [&](const std::vector<DTensor>& in) {
      ++ran_right;
      return std::vector<DTensor>{in[0] * in[0]};
    });
    // Uneven pieces (7 rows over n / 2), and a Partial source reduced before it moves.
    const DTensor xa = distribute_tensor(a, left, {Shard{0}});
    const DTensor xb = sum(distribute_tensor(stack({b, b}), mm.global(), {Shard{0}, Replicate{}}), {0}) * Scalar(0.5);
    const DTensor ya = double_it({xa})[0];
    const DTensor yb = square_it({xb})[0];
    EXPECT_EQ(ran_left, left.is_member() ? 1 : 0);
    EXPECT_EQ(ran_right, right.is_member() ? 1 : 0);
    // Every rank knows both outputs' layouts.
    EXPECT_EQ(ya.layout().mesh(), left.spec());
    EXPECT_EQ(yb.layout().mesh(), right.spec());
    EXPECT_EQ(ya.shape(), (Shape{7, 5}));
    // A task on the whole mesh reads both.
    const Task combine = task("combine", mm.global(), [](const std::vector<DTensor>& in) {
      return std::vector<DTensor>{in[0] + in[1]};
    });
    const DTensor z = combine({ya, yb})[0];
    EXPECT_TRUE(allclose(z.full_tensor(), a * 2.0 + b * b, 0, 0));
    // Outputs on the wrong mesh are refused, naming the task.
    const Task wrong = task("wrong", left, [&](const std::vector<DTensor>&) { return std::vector<DTensor>{z}; });
    if (left.is_member()) {
      EXPECT_TRUE(sharding_error([&] { wrong({}); }, {"[task]", "task 'wrong' returned", "not a DTensor on its mesh"}));
    }
  });
}

TEST(Task, RegisteredByNamePattern) {
  for_each_world({2, 4}, [] {
    const int n = world_size();
    const DeviceMesh first({1}, {"x"}, {0}), rest({n - 1}, {"x"}, [&] {
      std::vector<int> ranks;
      for (int r = 1; r < n; ++r) ranks.push_back(r);
      return ranks;
    }());
    register_task("encoder.*", first);
    register_task("decoder.*", rest);
    const Task enc = task("encoder.layer0", [](const std::vector<DTensor>& in) { return in; });
    const Task dec = task("decoder.head", [](const std::vector<DTensor>& in) { return in; });
    EXPECT_EQ(enc.mesh().spec(), first.spec());
    EXPECT_EQ(dec.mesh().spec(), rest.spec());
    EXPECT_TRUE(sharding_error([&] { task("embedding", [](const std::vector<DTensor>& in) { return in; }); },
                               {"[task]", "no registered pattern matches task 'embedding'", "encoder.*, decoder.*"}));
  });
}

// launch: ranks outside a task do not wait for it, so a second task on a disjoint mesh runs while
// the first is still running (the first waits, bounded, until the second has started: with
// blocking calls it would time out).
TEST(Task, LaunchedTasksOnDisjointMeshesRunAtTheSameTime) {
  TESSERA_SKIP_UNDER_MPI();
  std::atomic<bool> second_started{false}, first_saw_it{false};
  launch(4, [&] {
    const DeviceMesh left({2}, {"x"}, {0, 1}), right({2}, {"x"}, {2, 3});
    const Task first = task("first", left, [&](const std::vector<DTensor>& in) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!second_started && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      first_saw_it = second_started.load();
      return std::vector<DTensor>{in[0] * Scalar(2.0)};
    });
    const Task second = task("second", right, [&](const std::vector<DTensor>& in) {
      second_started = true;
      return std::vector<DTensor>{in[0] + Scalar(1.0)};
    });
    const Tensor a = data({5, 3}, 1), b = data({4, 3}, 2);
    TaskFuture fa = first.launch({distribute_tensor(a, left, {Shard{0}})});
    TaskFuture fb = second.launch({distribute_tensor(b, right, {Shard{0}})});
    EXPECT_EQ(fa.ready(), left.is_member());
    const DTensor ya = fa.get()[0], yb = fb.get()[0];
    EXPECT_EQ(ya.shape(), (Shape{5, 3}));
    EXPECT_EQ(yb.layout().mesh(), right.spec());
    // A consumer on the whole world reads both.
    const DeviceMesh all({world_size()}, {"x"});
    const DTensor z = task("sum", all, [](const std::vector<DTensor>& in) {
      return std::vector<DTensor>{sum(in[0]) + sum(in[1])};
    })({ya, yb})[0];
    EXPECT_NEAR(z.full_tensor().item<double>(), sum(a * 2.0).item<double>() + sum(b + 1.0).item<double>(), 1e-9);
  });
  EXPECT_TRUE(first_saw_it);
}
