// The torch_xla / JAX front end on ranks: sharding annotations, manual regions, meshes from
// device ids and hosts, the global mesh. Each sharded result is compared with the unsharded
// computation.
#include <gtest/gtest.h>

#include <cstdlib>

#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/spec/mark_sharding.hpp>
#include <tessera/spec/spec_mesh.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using P = PartitionSpec;

namespace {

// A 2-d mesh ("dp", "tp") over the world: 2 x n/2 when the world is even and above 2, else 1 x n.
DeviceMesh grid() {
  const int n = world_size();
  const int64_t dp = n > 2 && n % 2 == 0 ? 2 : 1;
  return DeviceMesh({dp, n / dp}, {"dp", "tp"});
}

}  // namespace

TEST(MarkSharding, AnnotatedOpsEqualTheUnshardedComputation) {
  for_each_world({2, 4, 6, 8}, [] {
    const DeviceMesh mesh = grid();
    // Uneven on purpose: 7 and 5 rows split over 2 x 3 or 2 x 4 ranks.
    const Tensor x = data({7, 6}, 1), w = data({6, 5}, 2), b = data({5}, 3);
    const Tensor expected = relu(matmul(x, w) + b);
    for (const P& xs : {P{"dp"}, P{{"dp", "tp"}}, P{{"tp", "dp"}}, P{std::nullopt, "tp"}, P{}})
      for (const P& ws : {P{}, P{std::nullopt, "tp"}, P{"tp"}, P{"dp", "tp"}}) {
        const DTensor xd = mark_sharding(x, mesh, xs), wd = mark_sharding(w, mesh, ws);
        EXPECT_EQ(xd.layout(), layout_from_spec(x.shape(), x.dtype(), mesh.spec(), xs));
        EXPECT_TRUE(equal(xd.to_local(), my_block(x, xd))) << xs.to_string();
        const DTensor y = relu(matmul(xd, wd) + distribute_tensor(b, mesh, {Replicate{}, Replicate{}}));
        EXPECT_TRUE(allclose(clear_sharding(y), expected)) << xs.to_string() << " x " << ws.to_string();
      }
  });
}

TEST(MarkSharding, ReannotatingADTensorRedistributesIt) {
  for_each_world({4, 8}, [] {
    const DeviceMesh mesh = grid();
    const Tensor x = data({9, 4}, 4);
    const DTensor a = mark_sharding(x, mesh, P{"dp", "tp"});
    for (const P& spec : {P{{"tp", "dp"}}, P{std::nullopt, {"dp", "tp"}}, P{}, P{"tp"}}) {
      const DTensor b = mark_sharding(a, spec), c = with_sharding_constraint(a, spec);
      EXPECT_EQ(b.layout(), layout_from_spec(x.shape(), x.dtype(), mesh.spec(), spec));
      EXPECT_EQ(c.layout(), b.layout());
      EXPECT_TRUE(equal(b.to_local(), my_block(x, b))) << spec.to_string();
      EXPECT_TRUE(equal(clear_sharding(c), x));
    }
    // Already so laid out: the same DTensor, nothing moves.
    EXPECT_EQ(with_sharding_constraint(a, P{"dp", "tp"}).to_local().raw_data(), a.to_local().raw_data());
    // A Partial source is reduced on the way.
    const DTensor partial = DTensor::from_local(x, mesh, {Partial{}, Replicate{}});
    EXPECT_TRUE(allclose(clear_sharding(with_sharding_constraint(partial, P{"tp"})),
                         x * static_cast<double>(mesh.size("dp"))));
  });
}

TEST(MarkSharding, ErrorsNameTheCall) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = grid();
    const Tensor x = data({4, 4}, 1);
    EXPECT_TRUE(sharding_error([&] { mark_sharding(x, mesh, P{"ep"}); },
                               {"[mark_sharding]", "P('ep')", "'ep'", "[4, 4]"}));
    EXPECT_TRUE(sharding_error([&] { mark_sharding(x, mesh, P{"dp", "dp"}); }, {"[mark_sharding]", "twice"}));
    EXPECT_TRUE(sharding_error([&] { mark_sharding(x, DeviceMesh(), P{}); }, {"[mark_sharding]", "the mesh is empty"}));
    EXPECT_TRUE(sharding_error([&] { mark_sharding(Tensor(), mesh, P{}); }, {"[mark_sharding]", "undefined tensor"}));
    const DTensor d = mark_sharding(x, mesh, P{"dp"});
    EXPECT_TRUE(sharding_error([&] { with_sharding_constraint(d, P{"dp", "tp", "x"}); },
                               {"[with_sharding_constraint]", "3 entries for a tensor of 2 dims"}));
    EXPECT_TRUE(sharding_error([&] { enable_manual_sharding(d, P{"zz"}); }, {"[enable_manual_sharding]", "'zz'"}));
  });
}

TEST(MarkSharding, TypeStringNamesSizesAndAxes) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = grid();
    const Tensor x = data({8, 4}, 1);
    EXPECT_EQ(type_string(mark_sharding(x, mesh, P{"dp"})), "f32[8@dp,4]");
    EXPECT_EQ(type_string(mark_sharding(x, mesh, P{{"tp", "dp"}})), "f32[8@(tp,dp),4]");
    EXPECT_EQ(type_string(mark_sharding(x, mesh, P{})), "f32[8,4]");
    EXPECT_EQ(type_string(DTensor::from_local(x, mesh, {Shard{1}, Partial{}})),
              "f32[8," + std::to_string(4 * mesh.size("dp")) + "@dp]{P(sum)@tp}");
  });
}

TEST(ManualSharding, EnableGivesTheBlockAndDisableTakesItBack) {
  for_each_world({2, 4, 6}, [] {
    const DeviceMesh mesh = grid();
    const Tensor x = data({7, 5}, 2);
    const DTensor d = mark_sharding(x, mesh, P{});
    for (const P& spec : {P{"dp"}, P{{"dp", "tp"}}, P{std::nullopt, "tp"}, P{"tp", "dp"}}) {
      const Tensor local = enable_manual_sharding(d, spec);
      const Layout layout = layout_from_spec(x.shape(), x.dtype(), mesh.spec(), spec);
      EXPECT_TRUE(equal(local, block_of(x, layout.block(mesh.coordinate())))) << spec.to_string();
      const DTensor back = disable_manual_sharding(local * 2.0, spec, x.shape(), mesh);
      EXPECT_EQ(back.layout(), layout);
      EXPECT_TRUE(equal(clear_sharding(back), x * 2.0));
    }
  });
}

TEST(ManualSharding, DisableAcceptsUnevenPiecesAndChecksThem) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh = grid();
    const int64_t me = mesh.coordinate("tp"), n = mesh.size("tp");
    // Rank i along tp holds i + 1 rows: pieces 1, 2, ... adding up to n(n+1)/2.
    const int64_t rows = n * (n + 1) / 2, begin = me * (me + 1) / 2;
    const Tensor global = data({rows, 3}, 5);
    const Tensor local = global.narrow(0, begin, me + 1).clone();
    const DTensor d = disable_manual_sharding(local, P{"tp"}, {rows, 3}, mesh);
    EXPECT_TRUE(d.layout().has_explicit_sizes(0));
    EXPECT_TRUE(equal(clear_sharding(d), global));
    EXPECT_TRUE(equal(clear_sharding(with_sharding_constraint(d, P{"dp"})), global));
    // Pieces that do not add up: every rank throws alike, naming the sizes.
    EXPECT_TRUE(sharding_error([&] { disable_manual_sharding(local, P{"tp"}, {rows + 1, 3}, mesh); },
                               {"[disable_manual_sharding]", "add up to " + std::to_string(rows),
                                "not the full shape's " + std::to_string(rows + 1)}));
    // An unsharded dim that is not whole.
    EXPECT_TRUE(sharding_error([&] { disable_manual_sharding(local, P{"tp"}, {rows, 4}, mesh); },
                               {"[disable_manual_sharding]", "is not its block", "unsharded dims be whole"}));
    if (mesh.size("dp") > 1) {
      // Replicas along dp that disagree in shape.
      const Tensor odd = mesh.coordinate("dp") == 0 ? local : global.narrow(0, 0, 1).clone();
      EXPECT_TRUE(sharding_error([&] { disable_manual_sharding(odd, P{"tp"}, {rows, 3}, mesh); },
                                 {"[disable_manual_sharding]", "rank "}));
    }
    EXPECT_TRUE(sharding_error([&] { disable_manual_sharding(local, P{"tp"}, {rows}, mesh); },
                               {"[disable_manual_sharding]", "has 2 dims, the full shape [" + std::to_string(rows) + "]"}));
  });
}

TEST(SpecMesh, MeshFromDeviceIdsLaysRanksOutInTheGivenOrder) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    std::vector<int> ids;
    for (int r = n - 1; r >= 0; --r) ids.push_back(r);
    const DeviceMesh mesh = mesh_from_device_ids(ids, {2, n / 2}, {"dp", "tp"});
    EXPECT_EQ(mesh.spec().ranks(), ids);
    const auto grid_rows = logical_mesh(mesh);
    ASSERT_EQ(grid_rows.size(), 2u);
    EXPECT_EQ(grid_rows[0].front(), n - 1);
    EXPECT_EQ(grid_rows[1].back(), 0);
    // The mesh works: rank n-1 is at (0, 0) and holds the first block.
    const Tensor x = data({4, 6}, 3);
    const DTensor d = mark_sharding(x, mesh, P{"dp", "tp"});
    EXPECT_TRUE(equal(d.to_local(), my_block(x, d)));
    if (rank() == n - 1) {
      EXPECT_EQ(d.layout().block(mesh.coordinate()).begin, (DimVector{0, 0}));
    }
    EXPECT_EQ(logical_mesh(DeviceMesh({n}, {"x"})), (std::vector<std::vector<int>>{[&] {
                std::vector<int> all(static_cast<size_t>(n));
                for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = r;
                return all;
              }()}));
    EXPECT_EQ(mesh_from_device_ids(ids, {n}, {}).axis_names(), (std::vector<std::string>{"axis0"}));
    EXPECT_TRUE(sharding_error([&] { mesh_from_device_ids(ids, {2, n}, {"dp", "tp"}); },
                               {"[mesh_from_device_ids]", std::to_string(n) + " device ids for mesh shape [2, " +
                                                              std::to_string(n) + "]"}));
    auto twice = ids;
    twice[1] = twice[0];
    EXPECT_TRUE(sharding_error([&] { mesh_from_device_ids(twice, {n}, {"x"}); },
                               {"[mesh_from_device_ids]", "appears twice"}));
    auto outside = ids;
    outside[0] = n;
    EXPECT_TRUE(sharding_error([&] { mesh_from_device_ids(outside, {n}, {"x"}); },
                               {"[mesh_from_device_ids]", "device id " + std::to_string(n) + " is not a rank"}));
  });
}

TEST(SpecMesh, GlobalMeshIsPerRank) {
  for_each_world({2, 4}, [] {
    EXPECT_FALSE(has_global_mesh());
    EXPECT_TRUE(sharding_error([] { global_mesh(); }, {"[global_mesh]", "set_global_mesh"}));
    const DeviceMesh line = get_1d_mesh("data");
    EXPECT_EQ(line.axis_names(), (std::vector<std::string>{"data"}));
    EXPECT_EQ(line.size(), world_size());
    EXPECT_EQ(get_1d_mesh().axis_names(), (std::vector<std::string>{"axis0"}));
    set_global_mesh(line);
    EXPECT_TRUE(has_global_mesh());
    EXPECT_EQ(global_mesh().spec(), line.spec());
    EXPECT_EQ(global_mesh().coordinate("data"), rank());  // this rank's own handle
    set_global_mesh(grid());
    EXPECT_EQ(global_mesh().axis_names(), (std::vector<std::string>{"dp", "tp"}));
  });
}

namespace {

// The world ranks of the group a mesh dim's communicator spans through the calling rank.
std::vector<int> axis_group(const DeviceMesh& mesh, const std::string& axis) {
  return mesh.comm(axis).world_ranks();
}

// Checks that the dcn axes' groups span distinct hosts and the ici axes' groups one host.
void expect_hybrid_axes(const DeviceMesh& mesh, const std::vector<std::string>& dcn, const std::vector<std::string>& ici) {
  for (const auto& axis : dcn) {
    std::vector<int> hosts;
    for (int r : axis_group(mesh, axis)) hosts.push_back(host_of(r));
    std::sort(hosts.begin(), hosts.end());
    EXPECT_EQ(std::unique(hosts.begin(), hosts.end()), hosts.end()) << axis << " stays on a host";
  }
  for (const auto& axis : ici)
    for (int r : axis_group(mesh, axis)) EXPECT_EQ(host_of(r), host_of(rank())) << axis << " leaves the host";
}

// Runs body with TESSERA_HOSTS set for the worlds it launches (threads backend).
void with_simulated_hosts(int hosts, const std::vector<int>& worlds, const std::function<void()>& body) {
  setenv("TESSERA_HOSTS", std::to_string(hosts).c_str(), 1);
  for_each_world(worlds, body);
  unsetenv("TESSERA_HOSTS");
}

}  // namespace

TEST(HybridMesh, DcnAxesCrossHostsAndIciAxesDoNot) {
  TESSERA_SKIP_UNDER_MPI();  // hosts are simulated here; HybridMesh.OnTheJobsHosts runs on real ones
  with_simulated_hosts(2, {4, 8}, [] {
    const int per_host = world_size() / 2;
    ASSERT_EQ(num_hosts(), 2);
    // One axis per kind: dcn across the 2 hosts, ici within each.
    const DeviceMesh m = hybrid_mesh({1, per_host}, {2, 1}, {"dcn", "ici"});
    EXPECT_EQ(m.spec().shape(), (Shape{2, per_host}));
    expect_hybrid_axes(m, {"dcn"}, {"ici"});
    // A mixed axis: size ici * dcn, its index dcn_index * ici + ici_index.
    const DeviceMesh mixed = hybrid_mesh({per_host}, {2}, {"x"});
    EXPECT_EQ(mixed.spec().ranks()[static_cast<size_t>(per_host)], per_host);  // host 1's first rank
    // torch_xla's usual shape: ici (1, per_host), dcn (2, 1) on 2 axes "data", "model".
    const Tensor x = data({6, 8}, 7);
    const DTensor d = mark_sharding(x, m, P{"dcn", "ici"});
    EXPECT_TRUE(equal(clear_sharding(d), x));
    EXPECT_TRUE(sharding_error([] { hybrid_mesh({2, 1}, {3, 1}, {"a", "b"}); },
                               {"[hybrid_mesh]", "spans 3 hosts", "2 hosts"}));
    EXPECT_TRUE(sharding_error([&] { hybrid_mesh({per_host + 1}, {2}, {"a"}); },
                               {"[hybrid_mesh]", "needs " + std::to_string(per_host + 1) + " ranks on every host"}));
    EXPECT_TRUE(sharding_error([] { hybrid_mesh({1, 2}, {2}, {"a", "b"}); }, {"[hybrid_mesh]", "differ in length"}));
  });
}

TEST(HybridMesh, OnTheJobsHosts) {
  // The job's own hosts: one on threads, the namespaces' under make test-multihost.
  for_each_world({4}, [] {
    const int hosts = num_hosts();
    if (static_cast<int>(host_topology().ranks_on(0).size()) * hosts != world_size()) return;  // unequal hosts
    const int per_host = world_size() / hosts;
    const DeviceMesh m = hybrid_mesh({1, per_host}, {hosts, 1}, {"dcn", "ici"});
    expect_hybrid_axes(m, {"dcn"}, {"ici"});
    // A collective over each axis gives the same sum as the unsharded one.
    const Tensor x = data({hosts * 2, per_host * 3}, 9);
    EXPECT_TRUE(equal(clear_sharding(mark_sharding(x, m, P{"dcn", "ici"})), x));
    DTensor s = sum(mark_sharding(x, m, P{"dcn", "ici"}));
    EXPECT_TRUE(allclose(s.full_tensor(), sum(x)));
  });
}
