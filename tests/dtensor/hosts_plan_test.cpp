// Plans priced by host (issue 34): plan_options() tells the planner which mesh dims span hosts
// (from the HostTopology: machines under MPI, TESSERA_HOSTS on threads), and a redistribution
// over a mesh that spans hosts reduces inside hosts first, with values equal to the unsharded.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Sets an environment variable for the scope; restores it after.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (saved_) setenv(name_, saved_->c_str(), 1);
    else unsetenv(name_);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

}  // namespace

TEST(HostsPlan, MeshDimsSpanningHostsArePricedAcrossAndReducedInsideFirst) {
  TESSERA_SKIP_UNDER_MPI();  // the hosts are simulated here; multi-host MPI runs test the machines'
  clear_plan_cache();
  EnvGuard hosts("TESSERA_HOSTS", "2");
  launch(8, [] {
    // 2 hosts of 4 ranks: dcn (mesh dim 0) spans them, ici stays inside each.
    const DeviceMesh mesh({2, 4}, {"dcn", "ici"});
    const PlanOptions options = plan_options();
    ASSERT_TRUE(static_cast<bool>(options.spans_hosts));
    EXPECT_TRUE(options.spans_hosts(mesh.spec(), 0));
    EXPECT_FALSE(options.spans_hosts(mesh.spec(), 1));
    // A mesh inside one host spans none.
    const DeviceMesh inside({4}, {"ici"}, {0, 1, 2, 3});
    EXPECT_FALSE(options.spans_hosts(inside.spec(), 0));

    // (P, P) -> (R, R): each rank holds its own addend; the sum over all 8 is the full tensor.
    const Shape shape{256, 64};
    const Tensor addend = ones(shape) * static_cast<double>(rank() + 1);
    const DTensor partial = DTensor::from_local(addend, mesh, {Partial{}, Partial{}});
    CommDebugMode mode;
    const DTensor whole = partial.redistribute({Replicate{}, Replicate{}});
    EXPECT_TRUE(allclose(whole.to_local(), ones(shape) * 36.0));
    // Reduced inside each host before crossing: more than the one all_reduce a single host uses.
    EXPECT_GE(mode.total_count(), 2) << mode.to_string();
    const std::shared_ptr<const Plan> p = cached_plan(partial.layout(), whole.layout(), options);
    ASSERT_FALSE(p->steps.empty());
    EXPECT_EQ(p->steps.front().mesh_dims, (std::vector<int64_t>{1})) << explain(*p);
  });
  clear_plan_cache();
}
