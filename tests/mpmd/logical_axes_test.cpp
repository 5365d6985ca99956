// Logical axis names: rules map a model's dim names to mesh axes (first usable rule wins, an axis
// used once per tensor), with_sharding_constraint by names redistributes accordingly, and a task's
// rules are in force while its function runs.
#include <gtest/gtest.h>

#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/logical_axes.hpp>
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
const LogicalRules kRules = {{"batch", {"dp"}}, {"mlp", {"tp"}}, {"heads", {"tp"}}, {"embed", {}}, {"vocab", {"tp"}}};
}

TEST(LogicalAxes, RulesResolveToSpecs) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"dp", "tp"});
    EXPECT_EQ(logical_to_spec({"batch", "embed", "mlp"}, kRules, mesh.spec()), (PartitionSpec{"dp", std::nullopt, "tp"}));
    // tp is taken by heads, so mlp stays whole; an unknown name and an empty one are unsharded.
    EXPECT_EQ(logical_to_spec({"heads", "mlp"}, kRules, mesh.spec()), (PartitionSpec{"tp", std::nullopt}));
    EXPECT_EQ(logical_to_spec({"length", "", "batch"}, kRules, mesh.spec()), (PartitionSpec{std::nullopt, std::nullopt, "dp"}));
    // A rule naming an axis the mesh lacks is skipped for the next one; a tuple of axes.
    const DeviceMesh line({n}, {"dp"});
    EXPECT_EQ(logical_to_spec({"batch", "mlp"}, kRules, line.spec()), (PartitionSpec{"dp", std::nullopt}));
    const LogicalRules fsdp = {{"batch", {"dp", "tp"}}, {"batch", {"dp"}}};
    EXPECT_EQ(logical_to_spec({"batch"}, fsdp, mesh.spec()), (PartitionSpec{{"dp", "tp"}}));
    EXPECT_EQ(logical_to_spec({"batch"}, fsdp, line.spec()), (PartitionSpec{"dp"}));
  });
}

// The same model code under two rule tables: the activation's layout follows the rules, the
// values do not change.
TEST(LogicalAxes, ConstraintsByNameFollowTheTaskRules) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"dp", "tp"});
    const Tensor x = data({6, 5}, 1), w = data({5, 7}, 2);
    const auto model = [&](const std::vector<DTensor>& in) {
      const DTensor h = mpmd::with_sharding_constraint(matmul(in[0], in[1]), {"batch", "mlp"});
      return std::vector<DTensor>{h};
    };
    const DTensor xd = distribute_tensor(x, mesh, {Replicate{}, Replicate{}});
    const DTensor wd = distribute_tensor(w, mesh, {Replicate{}, Replicate{}});
    const DTensor tensor_parallel = task("tp", mesh, model, kRules)({xd, wd})[0];
    const DTensor data_only = task("dp", mesh, model, {{"batch", {"dp"}}})({xd, wd})[0];
    EXPECT_EQ(tensor_parallel.placements(), (Placements{Shard{0}, Shard{1}}));
    EXPECT_EQ(data_only.placements(), (Placements{Shard{0}, Replicate{}}));
    EXPECT_TRUE(allclose(tensor_parallel.full_tensor(), matmul(x, w), 0, 0));
    EXPECT_TRUE(allclose(data_only.full_tensor(), matmul(x, w), 0, 0));
    // The rules hold only inside the task; outside none are in force.
    EXPECT_TRUE(current_logical_rules().empty());
    {
      const LogicalAxes scope(kRules);
      EXPECT_EQ(current_logical_rules().size(), kRules.size());
    }
    EXPECT_TRUE(sharding_error([&] { mpmd::with_sharding_constraint(xd, {"batch"}); },
                               {"[with_sharding_constraint]", "1 logical dim names for", "one per dim"}));
  });
}
