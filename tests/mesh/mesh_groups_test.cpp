// The communicators of a DeviceMesh over several dims (issue 34, meshes at scale): construction
// splits the world once for the mesh and once per dim; a group over several dims is made on first
// use, once, from the mesh's own group (or a slice's), and equals the flattened group.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// A 4-d grid of the world: 2x2x2x2 on 16 ranks, 2x2x1x1 on 4 (mpirun -np 4), 2x1x1x1 on 2.
std::vector<int64_t> grid_4d(int n) {
  std::vector<int64_t> shape(4, 1);
  for (auto& size : shape)
    if (n % 2 == 0) size = 2, n /= 2;
  shape.back() *= n;
  return shape;
}

const std::vector<std::string> kAxes{"a", "b", "c", "d"};

int64_t splits_during(const std::function<void()>& body) {
  CommDebugMode mode;
  body();
  return mode.count(CollectiveKind::split);
}

// What a collective over `comm` sees: its members' world ranks, and a sum over them.
std::pair<std::vector<int>, int64_t> members_and_sum(Communicator& comm) {
  std::vector<int> gathered(static_cast<size_t>(comm.size()));
  const int me = rank();
  comm.all_gather(&me, gathered.data(), 1, DType::i32);
  int64_t value = int64_t{rank()} * rank() + 1;
  comm.all_reduce(&value, 1, DType::i64, ReduceOp::sum);
  return {gathered, value};
}

}  // namespace

TEST(DeviceMeshGroups, ConstructionSplitsPerDimAndSpansOnFirstUse) {
  for_each_world({16}, [] {
    const std::vector<int64_t> shape = grid_4d(world_size());
    std::optional<DeviceMesh> built;
    // The mesh's own group and one per dim; none of the 11 groups over several dims.
    EXPECT_EQ(splits_during([&] { built.emplace(shape, kAxes); }), 1 + 4);
    const DeviceMesh& mesh = *built;
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{0, 1}, {1, 3}, {0, 1, 2}, {1, 2, 3}}) {
      std::shared_ptr<Communicator> comm;
      EXPECT_EQ(splits_during([&] { comm = mesh.comm_ptr(dims); }), 1) << "first use";
      EXPECT_EQ(splits_during([&] { EXPECT_EQ(mesh.comm_ptr(dims), comm); }), 0) << "cached";
      // The same group, in the same order, as the mesh flattened over those axes.
      std::vector<std::string> axes;
      for (int64_t d : dims) axes.push_back(kAxes[static_cast<size_t>(d)]);
      const DeviceMesh flat = mesh.flatten(axes);
      EXPECT_EQ(comm->world_ranks(), flat.spec().ranks());
      EXPECT_EQ(comm->rank(), flat.coordinate()[0]);
      EXPECT_EQ(members_and_sum(*comm), members_and_sum(flat.comm(0)));
    }
    // All dims: the mesh's own group, made with it.
    EXPECT_EQ(splits_during([&] { EXPECT_EQ(mesh.comm_ptr({0, 1, 2, 3}), mesh.mesh_comm_ptr()); }), 0);
  });
}

// A slice keeping several axes makes its group when cut (collective over the sliced mesh, once
// per set of kept axes); its own groups over several axes come from it, collectively over the
// slice's ranks only: here the two halves use different groups, a different number of times.
TEST(DeviceMeshGroups, SliceGroupsAreCollectiveOverTheSliceOnly) {
  for_each_world({16}, [] {
    const std::vector<int64_t> shape = grid_4d(world_size());
    const DeviceMesh mesh(shape, kAxes);
    const int64_t half = mesh.coordinate("a");
    std::optional<DeviceMesh> mine;
    EXPECT_EQ(splits_during([&] { mine.emplace(mesh.slice({{"a", half}})); }), 1);
    EXPECT_EQ(splits_during([&] { (void)mesh.slice({{"a", 1 - half % 2}}); }), 0) << "the same axes: made already";
    EXPECT_EQ(splits_during([&] { (void)mesh.slice({{"a", 0}, {"b", 0}, {"c", 0}}); }), 0) << "one axis kept";
    const DeviceMesh& stage = *mine;
    EXPECT_EQ(stage.mesh_comm_ptr()->world_ranks(), stage.spec().ranks());
    const std::vector<int64_t> dims = half == 0 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 2};
    std::shared_ptr<Communicator> comm;
    EXPECT_EQ(splits_during([&] { comm = stage.comm_ptr(dims); }), 1);
    // The parent's group over the same axes holds the same ranks. Making a parent's group is
    // collective over the whole parent: every rank makes both, in one order.
    const auto b_c = mesh.comm_ptr({1, 2}), c_d = mesh.comm_ptr({2, 3});
    EXPECT_EQ(comm->world_ranks(), (half == 0 ? b_c : c_d)->world_ranks());
    for (int64_t repeat = 0; repeat <= half; ++repeat) {
      int64_t one = 1;
      comm->all_reduce(&one, 1, DType::i64, ReduceOp::sum);
      EXPECT_EQ(one, comm->size());
    }
  });
}

// Two threads of each rank (DeviceMesh::duplicate, as the controller's streams) make and use the
// same group over several dims at once: each copy gets its own, and neither waits for the other.
TEST(DeviceMeshGroups, DuplicatesMakeTheirGroupsConcurrently) {
  for_each_world({16}, [] {
    const DeviceMesh mesh(grid_4d(world_size()), kAxes);
    const DeviceMesh copy = mesh.duplicate();
    const auto use = [](const DeviceMesh& m) {
      int64_t total = 0;
      for (int i = 0; i < 20; ++i) {
        int64_t value = rank() + i;
        m.comm_ptr({0, 2, 3})->all_reduce(&value, 1, DType::i64, ReduceOp::sum);
        total += value;
      }
      return total;
    };
    int64_t other = 0;
    std::thread second = rank_thread([&] { other = use(copy); });
    const int64_t here = use(mesh);
    second.join();
    EXPECT_EQ(here, other);
    EXPECT_NE(mesh.comm_ptr({0, 2, 3}), copy.comm_ptr({0, 2, 3}));
    EXPECT_EQ(mesh.comm_ptr({0, 2, 3})->world_ranks(), copy.comm_ptr({0, 2, 3})->world_ranks());
  });
}

// After abort, the groups made before and those asked for later fail with the reason; a slice
// still cuts, and its collectives over several axes fail the same way.
TEST(DeviceMeshGroups, AnAbortedMeshFailsItsGroupsMadeLater) {
  TESSERA_SKIP_UNDER_MPI();
  for_each_world({8}, [] {
    const DeviceMesh mesh({2, 2, 2}, {"a", "b", "c"});
    const auto made = mesh.comm_ptr({0, 1});
    mesh.abort("the step failed");
    int64_t value = 1;
    EXPECT_TRUE(throws_with<CommError>([&] { made->all_reduce(&value, 1, DType::i64, ReduceOp::sum); },
                                       {"the step failed"}));
    EXPECT_TRUE(throws_with<CommError>([&] { mesh.comm_ptr({1, 2})->all_reduce(&value, 1, DType::i64, ReduceOp::sum); },
                                       {"the step failed"}));
    const DeviceMesh slice = mesh.slice({{"a", mesh.coordinate("a")}});
    EXPECT_TRUE(throws_with<CommError>([&] { slice.comm_ptr({0, 1}); }, {"[DeviceMesh::comm]", "mesh[b=2, c=2]",
                                                                          "the step failed"}));
    EXPECT_TRUE(throws_with<CommError>([&] { slice.mesh_comm_ptr(); }, {"[DeviceMesh::mesh_comm_ptr]", "failed"}));
  });
}
