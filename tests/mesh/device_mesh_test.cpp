// DeviceMesh and MeshSpec: pure layout tables without ranks, then meshes on real ranks (threads
// worlds of several sizes, or the MPI world), checked by communicating over the mesh's comms.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include <tessera/mesh/device_mesh.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// A 2-d factorisation of n: (n/2, 2) when n is even, else (1, n).
std::vector<int64_t> grid_2d(int n) { return n % 2 == 0 ? std::vector<int64_t>{n / 2, 2} : std::vector<int64_t>{1, n}; }

// Sum over a communicator of this rank's world rank: the sum of the group's world ranks.
int sum_of_world_ranks(Communicator& comm) {
  int value = rank();
  comm.all_reduce(&value, 1, DType::i32, ReduceOp::sum);
  return value;
}

}  // namespace

// --- MeshSpec (pure) ---------------------------------------------------------------------------

TEST(MeshSpec, RowMajorLayoutAndText) {
  const MeshSpec mesh(Shape{2, 3}, {"dp", "tp"});
  EXPECT_EQ(mesh.to_string(), "mesh[dp=2, tp=3]");
  EXPECT_EQ(mesh.size(), 6);
  EXPECT_EQ(mesh.size("tp"), 3);
  EXPECT_EQ(mesh.dim_of("dp"), 0);
  EXPECT_EQ(mesh.coordinate_of(5), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(mesh.coordinate_of(3), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(mesh.rank_at({0, 2}), 2);
  EXPECT_TRUE(mesh.contains(4));
  EXPECT_FALSE(mesh.contains(6));
}

TEST(MeshSpec, ExplicitRanksShowInText) {
  const MeshSpec mesh(Shape{2}, {"tp"}, {4, 6});
  EXPECT_EQ(mesh.to_string(), "mesh[tp=2] ranks [4, 6]");
  EXPECT_EQ(mesh.rank_at({1}), 6);
  EXPECT_EQ(mesh.coordinate_of(6), (std::vector<int64_t>{1}));
  EXPECT_EQ(mesh, MeshSpec(Shape{2}, {"tp"}, {4, 6}));
  EXPECT_NE(mesh, MeshSpec(Shape{2}, {"tp"}, {6, 4}));
  EXPECT_EQ(std::hash<MeshSpec>{}(mesh), std::hash<MeshSpec>{}(MeshSpec(Shape{2}, {"tp"}, {4, 6})));
}

TEST(MeshSpec, ZeroDimMeshHoldsOneRank) {
  const MeshSpec mesh(Shape{}, {}, {3});
  EXPECT_EQ(mesh.size(), 1);
  EXPECT_EQ(mesh.to_string(), "mesh[] ranks [3]");
  EXPECT_TRUE(mesh.coordinate_of(3).empty());
}

TEST(MeshSpec, Errors) {
  EXPECT_TRUE(sharding_error([] { MeshSpec(Shape{2, 2}, {"dp"}); }, {"[DeviceMesh]", "[2, 2]", "1 axis names"}));
  EXPECT_TRUE(sharding_error([] { MeshSpec(Shape{2, 2}, {"dp", "dp"}); }, {"[DeviceMesh]", "'dp' appears twice"}));
  EXPECT_TRUE(sharding_error([] { MeshSpec(Shape{2}, {""}); }, {"[DeviceMesh]", "empty name"}));
  EXPECT_TRUE(sharding_error([] { MeshSpec(Shape{0}, {"dp"}); }, {"[DeviceMesh]", "size 0"}));
  EXPECT_TRUE(sharding_error([] { MeshSpec(Shape{2}, {"dp"}, {1, 2, 3}); }, {"[DeviceMesh]", "2 grid points but 3 ranks"}));
  EXPECT_TRUE(sharding_error([] { MeshSpec(Shape{2}, {"dp"}, {1, 1}); }, {"[DeviceMesh]", "rank 1 appears twice"}));
  const MeshSpec mesh(Shape{2, 2}, {"dp", "tp"});
  EXPECT_TRUE(sharding_error([&] { (void)mesh.dim_of("pp"); }, {"[DeviceMesh]", "unknown axis 'pp'", "mesh[dp=2, tp=2]"}));
  EXPECT_TRUE(sharding_error([&] { (void)mesh.rank_at({0, 2}); }, {"[DeviceMesh]", "out of range", "'tp' has size 2"}));
  EXPECT_TRUE(sharding_error([&] { (void)mesh.coordinate_of(7); }, {"[DeviceMesh]", "world rank 7 is not in"}));
}

// --- DeviceMesh on ranks -------------------------------------------------------------------------

TEST(DeviceMesh, OneDimMeshOverTheWorld) {
  for_each_world({1, 2, 3, 4, 8}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{rank()}));
    EXPECT_EQ(mesh.comm("x").size(), world_size());
    EXPECT_EQ(mesh.comm(0).rank(), rank());
    const int n = world_size();
    EXPECT_EQ(sum_of_world_ranks(mesh.comm("x")), n * (n - 1) / 2);
    EXPECT_EQ(mesh.to_string(), "mesh[x=" + std::to_string(n) + "]");
  });
}

TEST(DeviceMesh, PerDimCommunicatorsFollowRowMajorLines) {
  for_each_world({2, 4, 6, 8}, [] {
    const auto shape = grid_2d(world_size());
    const DeviceMesh mesh(shape, {"dp", "tp"});
    const int64_t rows = shape[0], cols = shape[1];
    const int64_t i = rank() / cols, j = rank() % cols;
    EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{i, j}));
    EXPECT_EQ(mesh.coordinate("tp"), j);
    // tp line: ranks i*cols + 0..cols-1; dp line: ranks j + cols*0..rows-1.
    EXPECT_EQ(mesh.comm("tp").size(), cols);
    EXPECT_EQ(mesh.comm("tp").rank(), j);
    EXPECT_EQ(sum_of_world_ranks(mesh.comm("tp")), static_cast<int>(i * cols * cols + cols * (cols - 1) / 2));
    EXPECT_EQ(mesh.comm("dp").size(), rows);
    EXPECT_EQ(mesh.comm("dp").rank(), i);
    EXPECT_EQ(sum_of_world_ranks(mesh.comm("dp")), static_cast<int>(j * rows + cols * rows * (rows - 1) / 2));
  });
}

TEST(DeviceMesh, ThreeDimMesh) {
  for_each_world({8}, [] {
    if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
    const DeviceMesh mesh({2, 2, 2}, {"pp", "dp", "tp"});
    const int r = rank();
    EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{r / 4, (r / 2) % 2, r % 2}));
    // The pp line through r is {r % 4, r % 4 + 4}.
    EXPECT_EQ(sum_of_world_ranks(mesh.comm("pp")), 2 * (r % 4) + 4);
    EXPECT_EQ(mesh["dp"].to_string(), "mesh[dp=2] ranks [" + std::to_string(r / 4 * 4 + r % 2) + ", " +
                                          std::to_string(r / 4 * 4 + r % 2 + 2) + "]");
  });
}

TEST(DeviceMesh, SubmeshAlongAxisReusesTheComm) {
  for_each_world({4, 8}, [] {
    const auto shape = grid_2d(world_size());
    const DeviceMesh mesh(shape, {"dp", "tp"});
    const DeviceMesh tp = mesh["tp"];
    EXPECT_EQ(tp.ndim(), 1);
    EXPECT_EQ(tp.size(), shape[1]);
    EXPECT_EQ(&tp.comm(0), &mesh.comm("tp"));  // no new communicator
    EXPECT_EQ(tp.coordinate(), (std::vector<int64_t>{mesh.coordinate("tp")}));
    EXPECT_TRUE(tp.spec().contains(rank()));
  });
}

TEST(DeviceMesh, SliceFixesCoordinates) {
  for_each_world({4, 8}, [] {
    const auto shape = grid_2d(world_size());
    const DeviceMesh mesh(shape, {"dp", "tp"});
    const int64_t last = shape[0] - 1;  // the last row (row 0 when the mesh has one row)
    const DeviceMesh row1 = mesh.slice({{"dp", last}});
    std::vector<int> expected(static_cast<size_t>(shape[1]));
    std::iota(expected.begin(), expected.end(), static_cast<int>(last * shape[1]));
    EXPECT_EQ(row1.spec().ranks(), expected);
    EXPECT_EQ(row1.spec().names(), (std::vector<std::string>{"tp"}));
    const bool in_row1 = rank() / shape[1] == last;
    EXPECT_EQ(row1.is_member(), in_row1);
    if (in_row1) {
      EXPECT_EQ(&row1.comm("tp"), &mesh.comm("tp"));
      EXPECT_EQ(sum_of_world_ranks(row1.comm("tp")), std::accumulate(expected.begin(), expected.end(), 0));
    } else {
      EXPECT_TRUE(sharding_error([&] { (void)row1.coordinate(); }, {"[DeviceMesh::coordinate]", "is not in", "mesh[tp="}));
      EXPECT_TRUE(sharding_error([&] { (void)row1.comm("tp"); }, {"[DeviceMesh::comm]", "is not in"}));
    }
    const DeviceMesh point = mesh.slice({{"dp", 0}, {"tp", 1}});
    EXPECT_EQ(point.size(), 1);
    EXPECT_EQ(point.spec().ranks(), (std::vector<int>{1}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.slice({{"dp", 9}}); }, {"[DeviceMesh::slice]", "index 9 out of range"}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.slice({{"pp", 0}}); }, {"[DeviceMesh::slice]", "unknown axis 'pp'"}));
  });
}

TEST(DeviceMesh, FlattenMergesAxesAndCaches) {
  for_each_world({4, 8}, [] {
    if (world_size() % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
    const int n = world_size();
    const DeviceMesh mesh({2, 2, n / 4}, {"a", "b", "c"});
    const DeviceMesh ab = mesh.flatten({"a", "b"});
    EXPECT_EQ(ab.to_string().rfind("mesh[a_b=4]", 0), 0u) << ab.to_string();
    const auto c = mesh.coordinate();
    EXPECT_EQ(ab.coordinate(), (std::vector<int64_t>{c[0] * 2 + c[1]}));
    EXPECT_EQ(ab.comm(0).size(), 4);
    EXPECT_EQ(ab.comm(0).rank(), c[0] * 2 + c[1]);
    // The group: all ranks with this rank's c coordinate.
    const int cc = static_cast<int>(c[2]), q = n / 4;
    EXPECT_EQ(sum_of_world_ranks(ab.comm(0)), cc * 4 + q * (0 + 1 + 2 + 3));
    const DeviceMesh again = mesh.flatten({"a", "b"});
    EXPECT_EQ(&again.comm(0), &ab.comm(0));  // cached: no second split
    const DeviceMesh ba = mesh.flatten({"b", "a"}, "ba");
    EXPECT_EQ(ba.coordinate(), (std::vector<int64_t>{c[1] * 2 + c[0]}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.flatten({"a", "a"}); }, {"[DeviceMesh::flatten]", "'a' given twice"}));
  });
}

TEST(DeviceMesh, MeshOverPartOfTheWorld) {
  for_each_world({3, 4}, [] {
    const int n = world_size();
    const DeviceMesh sub({2}, {"tp"}, {n - 1, 0});  // reversed order, a subset
    EXPECT_EQ(sub.to_string(), "mesh[tp=2] ranks [" + std::to_string(n - 1) + ", 0]");
    const bool member = rank() == 0 || rank() == n - 1;
    EXPECT_EQ(sub.is_member(), member);
    if (member) {
      EXPECT_EQ(sub.coordinate(), (std::vector<int64_t>{rank() == 0 ? 1 : 0}));
      EXPECT_EQ(sub.comm("tp").rank(), rank() == 0 ? 1 : 0);  // group rank follows mesh order
      EXPECT_EQ(sum_of_world_ranks(sub.comm("tp")), n - 1);
    } else {
      EXPECT_TRUE(sharding_error([&] { (void)sub.coordinate(); }, {"[DeviceMesh::coordinate]", "world rank",
                                                                    "is not in mesh[tp=2]"}));
      EXPECT_TRUE(sharding_error([&] { (void)sub["tp"]; }, {"[DeviceMesh::operator[]]", "is not in"}));
    }
  });
}

TEST(DeviceMesh, ConstructionErrors) {
  for_each_world({2, 4}, [] {
    const int n = world_size();
    EXPECT_TRUE(sharding_error([&] { DeviceMesh({n + 1}, {"x"}); },
                               {"[DeviceMesh]", "holds " + std::to_string(n + 1) + " ranks but the world has"}));
    EXPECT_TRUE(sharding_error([&] { DeviceMesh({1, n}, {"x", "x"}); }, {"[DeviceMesh]", "'x' appears twice"}));
    EXPECT_TRUE(sharding_error([&] { DeviceMesh({1}, {"x"}, {n}); },
                               {"[DeviceMesh]", "names rank " + std::to_string(n), "world has"}));
    const DeviceMesh mesh({n}, {"x"});
    EXPECT_TRUE(sharding_error([&] { (void)mesh.size("y"); }, {"[DeviceMesh::size]", "unknown axis 'y'", "(its axes: "}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh["y"]; }, {"[DeviceMesh::operator[]]", "unknown axis 'y'"}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.coordinate("y"); }, {"[DeviceMesh::coordinate]", "unknown axis 'y'"}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.flatten({"y"}); }, {"[DeviceMesh::flatten]", "unknown axis 'y'"}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.comm("y"); }, {"[DeviceMesh::comm]", "unknown axis 'y'"}));
    EXPECT_TRUE(sharding_error([&] { (void)mesh.comm(1); }, {"[DeviceMesh::comm]", "mesh dim 1 out of range"}));
  });
}

TEST(DeviceMesh, OutsideARankIsAClearError) {
  if (under_mpi()) GTEST_SKIP() << "under MPI every test runs inside a rank";
  EXPECT_TRUE(value_error([] { DeviceMesh({1}, {"x"}); }, {"[DeviceMesh]", "outside a rank"}));
}

// Issue 12 item 7: a collective over several mesh dims runs on the mesh's communicator for that
// set of dims: its ranks are MeshSpec::group's, in that order, on the mesh and on its slices.
TEST(DeviceMesh, GroupsOverSeveralDimsMatchMeshSpecGroups) {
  for_each_world({8}, [] {
    if (world_size() != 8) return;  // the 2x2x2 mesh needs 8 ranks
    const DeviceMesh cube({2, 2, 2}, {"a", "b", "c"});
    const auto world_ranks_of = [](const MeshSpec& spec, const std::vector<std::vector<int64_t>>& group) {
      std::vector<int> ranks;
      for (const auto& c : group) ranks.push_back(spec.rank_at(c));
      return ranks;
    };
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{0, 1}, {0, 2}, {1, 2}, {0, 1, 2}}) {
      const auto comm = cube.comm_ptr(dims);
      EXPECT_EQ(comm->world_ranks(), world_ranks_of(cube.spec(), cube.spec().group(cube.coordinate(), dims)));
      int64_t one = 1;
      comm->all_reduce(&one, 1, DType::i64, ReduceOp::sum);
      EXPECT_EQ(one, static_cast<int64_t>(comm->size()));
    }
    const DeviceMesh slice = cube.slice({{"b", 0}});
    if (slice.is_member()) {
      EXPECT_EQ(slice.comm_ptr({0, 1})->world_ranks(),
                world_ranks_of(slice.spec(), slice.spec().group(slice.coordinate(), {0, 1})));
      EXPECT_EQ(slice.mesh_comm_ptr()->world_ranks(), slice.spec().ranks());
    }
    EXPECT_TRUE(throws_with<ShardingError>([&] { cube.comm_ptr({2, 0}); }, {"[DeviceMesh::comm]", "ascending"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { cube.comm_ptr({0, 3}); }, {"[DeviceMesh::comm]", "dim 3"}));
  });
}
