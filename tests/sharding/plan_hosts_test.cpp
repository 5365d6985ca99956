// Topology in the planner's cost (issue 34): a step over mesh dims whose lines span hosts is
// priced at the network between hosts, so plans move bytes inside hosts where they can. Pure:
// the hosts come in PlanOptions::spans_hosts, as the dtensor layer gives them.
#include <gtest/gtest.h>

#include <tessera/sharding/plan.hpp>

using namespace tessera;

namespace {

// Bytes the busiest rank receives in steps over a mesh dim that spans hosts.
int64_t across(const Plan& p, const PlanOptions& options) {
  int64_t bytes = 0;
  for (const PlanStep& s : p.steps) {
    bool spans = s.kind == StepKind::exchange;
    for (int64_t m : s.mesh_dims) spans = spans || options.spans_hosts(s.before.mesh(), m);
    if (spans) bytes += s.max_bytes_received();
  }
  return bytes;
}

// A 2-host cluster as hybrid_mesh lays it out: dcn (mesh dim 0) spans the hosts, ici stays inside.
PlanOptions two_hosts() {
  PlanOptions options;
  options.cost = CostModel::for_backend("mpi");
  options.spans_hosts = [](const MeshSpec&, int64_t mesh_dim) { return mesh_dim == 0; };
  options.hosts_id = 1;
  return options;
}

}  // namespace

TEST(PlanHosts, PartialsAreReducedInsideHostsFirst) {
  const MeshSpec mesh(Shape{2, 4}, {"dcn", "ici"});
  const Layout src(Shape{4096, 1024}, DType::f32, mesh, {Partial{}, Partial{}});
  const Layout dst(Shape{4096, 1024}, DType::f32, mesh, {Replicate{}, Replicate{}});
  const PlanOptions hosts = two_hosts();
  PlanOptions one_host = hosts;
  one_host.spans_hosts = {};
  const Plan flat = plan(src, dst, one_host), aware = plan(src, dst, hosts);
  // Within one host, one all_reduce over both dims; across hosts, what crosses is reduced inside
  // each host first (reduce_scatter over ici), so only a quarter of the block crosses.
  ASSERT_EQ(flat.steps.size(), 1u) << explain(flat);
  EXPECT_EQ(flat.steps[0].kind, StepKind::all_reduce);
  EXPECT_LT(across(aware, hosts), across(flat, hosts) / 4) << explain(aware);
  EXPECT_EQ(aware.steps.front().kind, StepKind::reduce_scatter) << explain(aware);
  EXPECT_EQ(aware.steps.front().mesh_dims, (std::vector<int64_t>{1})) << explain(aware);
  // The search bound still holds with steps priced across hosts.
  EXPECT_LE(plan_cost_lower_bound(src, dst, hosts), aware.cost + 1e-9);
}

TEST(PlanHosts, GathersAcrossHostsMoveTheLeastThere) {
  // (S(0), S(0)) -> (R, R) over dcn x ici: within one host, one all_gather over both dims, 7/8 of
  // the tensor per rank. Across hosts, each rank first takes a quarter of its host's half by an
  // all_to_all inside it, so only an eighth of the tensor crosses to each rank, in more bytes
  // overall: the network between hosts is the slow part.
  const MeshSpec mesh(Shape{2, 4}, {"dcn", "ici"});
  const Layout src(Shape{4096, 1024}, DType::f32, mesh, {Shard{0}, Shard{0}});
  const Layout dst(Shape{4096, 1024}, DType::f32, mesh, {Replicate{}, Replicate{}});
  const PlanOptions hosts = two_hosts();
  PlanOptions one_host = hosts;
  one_host.spans_hosts = {};
  const Plan flat = plan(src, dst, one_host), aware = plan(src, dst, hosts);
  const int64_t tensor_bytes = 4096 * 1024 * 4;
  EXPECT_EQ(flat.max_bytes_received(), plan_lower_bound(src, dst)) << explain(flat);
  EXPECT_EQ(across(flat, hosts), tensor_bytes * 7 / 8) << explain(flat);
  EXPECT_LE(across(aware, hosts), tensor_bytes / 8) << explain(aware);
  EXPECT_GE(aware.max_bytes_received(), plan_lower_bound(src, dst));
}

TEST(PlanHosts, OneHostPlansAsBefore) {
  // spans_hosts answering false everywhere prices every step within the host.
  const MeshSpec mesh(Shape{2, 4}, {"a", "b"});
  PlanOptions none = two_hosts();
  none.spans_hosts = [](const MeshSpec&, int64_t) { return false; };
  PlanOptions unset = none;
  unset.spans_hosts = {};
  for (const auto& [from, to] : std::vector<std::pair<Placements, Placements>>{
           {{Partial{}, Partial{}}, {Replicate{}, Replicate{}}}, {{Shard{0}, Shard{1}}, {Shard{1}, Shard{0}}}}) {
    const Layout src(Shape{64, 32}, DType::f32, mesh, from), dst(Shape{64, 32}, DType::f32, mesh, to);
    EXPECT_EQ(plan(src, dst, none).cost, plan(src, dst, unset).cost);
  }
}
