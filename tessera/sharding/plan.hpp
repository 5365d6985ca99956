#pragma once
// The redistribute planner. Pure: from two layouts it finds the cheapest way to
// move data, as a printable list of steps with their cost; the dtensor layer runs the steps.
//
// Two families compete: collective steps (all_gather, all_to_all, reduce_scatter, all_reduce,
// local chunk) over one mesh dim or over several at once (one call over the flattened group),
// found by a shortest-path search over layouts, and a direct block exchange (block_exchange.hpp)
// from any non-Partial layout of the search to the destination. Cost of a step: its estimated
// time under a per-backend CostModel (call latency + message latency + the busiest rank's bytes).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/block_exchange.hpp>
#include <tessera/sharding/cost_model.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

#define TESSERA_FORALL_PLAN_STEPS(_) \
  _(local_chunk)                     \
  _(all_gather)                      \
  _(all_to_all)                      \
  _(reduce_scatter)                  \
  _(all_reduce)                      \
  _(to_partial)                      \
  _(exchange)

/// What one step does. local_chunk and to_partial move no data; exchange is one all_to_all_v
/// over every rank involved; the others are collectives over one mesh dim, or one call over the
/// group of several mesh dims (all_reduce, all_gather, reduce_scatter; local_chunk likewise).
enum class StepKind : uint8_t {
#define TESSERA_PLAN_STEP_ENUM(name) name,
  TESSERA_FORALL_PLAN_STEPS(TESSERA_PLAN_STEP_ENUM)
#undef TESSERA_PLAN_STEP_ENUM
};
std::string_view name(StepKind kind);

/// One step from `before` to `after`. For a mesh-dim step, only the placements (and shard
/// order) at `mesh_dims` change. Figures are the busiest rank's and totals over ranks, computed
/// on one rank per class of ranks with the same block geometry: a step's size and the cost of
/// computing it do not grow with the rank count (docs/architecture.md, Plans at scale). Value type.
struct PlanStep {
  StepKind kind = StepKind::exchange;
  /// The mesh dims whose ranks form the step's groups, ascending (group rank = row-major index
  /// over them); empty for exchange.
  std::vector<int64_t> mesh_dims;
  int64_t mesh_dim = -1;             ///< the one mesh dim of a single-dim step; -1 otherwise
  ReduceOp op = ReduceOp::sum;       ///< reduce_scatter / all_reduce / to_partial
  Layout before;
  Layout after;
  int64_t max_received = 0;          ///< bytes the busiest rank receives from other ranks
  int64_t total_received = 0;        ///< bytes all ranks receive from other ranks
  /// Most messages one rank sends in this step: rounds of the collective's algorithm
  /// (ceil(log2 k) for reduce_scatter and all_gather, twice that for all_reduce), or the peers of
  /// an all_to_all; for an exchange the source blocks one rank receives pieces of.
  int64_t messages = 0;
  int64_t calls = 0;                 ///< collective calls each rank makes: 1, or 0 if nothing moves

  int64_t max_bytes_received() const { return max_received; }
  /// Bytes `world_rank` receives from / sends to other ranks in this step (0 outside its meshes):
  /// exactly what running the step moves (an exchange's by exchange_transfers). O(group size).
  int64_t bytes_received(int world_rank) const;
  int64_t bytes_sent(int world_rank) const;
  /// "all_gather over tp (mesh dim 1, 2 ranks): (S(0), S(1)) -> (S(0), R); recv <= 96 B/rank, 1 msg".
  std::string to_string() const;
};

/// Knobs of the planner.
struct PlanOptions {
  /// The step-time model: the dtensor layer passes its backend's (CostModel::for_backend);
  /// CostModel::bytes_only() plans for bytes alone. Within a host when `spans_hosts` is set.
  CostModel cost = CostModel::threads();
  /// Allow a Partial destination (Replicate -> Partial is a local step). Internal: sharded
  /// operators need it; a user's redistribute to Partial is an error.
  bool allow_partial_destination = false;
  /// Hosts: whether mesh dim `mesh_dim` of `mesh` has lines whose ranks sit on different hosts
  /// (the dtensor layer answers from the HostTopology, once per mesh). A step over such dims, and
  /// an exchange over a mesh that spans hosts, is priced with `across_hosts`, so plans keep bytes
  /// inside hosts where they can. Unset: every step within one host.
  std::function<bool(const MeshSpec& mesh, int64_t mesh_dim)> spans_hosts = {};
  /// Names the host topology spans_hosts answers for (plan caches key on it); 0 with none.
  size_t hosts_id = 0;
  CostModel across_hosts = CostModel::across_hosts();
};

/// Steps turning `src` into `dst`, with their cost. Empty when the layouts are equal. Value type.
struct Plan {
  Layout src;
  Layout dst;
  std::vector<PlanStep> steps;
  double cost = 0;  ///< the model's score in bytes (estimated time x bandwidth), what the search minimised
  double estimated_us = 0;  ///< the same score as estimated microseconds under the plan's CostModel

  /// Bytes one world rank receives over the whole plan.
  int64_t bytes_received(int world_rank) const;
  int64_t bytes_sent(int world_rank) const;
  /// Bytes the busiest rank receives over the whole plan (classes of ranks, not every rank, for
  /// plans on one mesh).
  int64_t max_bytes_received() const;
  int64_t total_bytes_received() const;
  /// Collective calls each rank makes (steps that move data).
  int64_t calls() const;
  /// Messages over all steps, summed over the steps' per-rank maxima.
  int64_t messages() const;
  /// One line per step.
  std::string to_string() const;
};

/// The cheapest plan from `src` to `dst` (same global shape and dtype; the meshes may differ but
/// must be of one world). No intermediate layout holds more elements on a rank than the larger of
/// src's and dst's largest block, so the full tensor is only materialised when dst asks for it.
/// Throws ShardingError naming both layouts for: different shapes or dtypes, a Partial
/// destination (unless allowed), P(op) -> P(other op), or Partial values moving between meshes
/// through a dim the destination does not reduce.
Plan plan(const Layout& src, const Layout& dst, const PlanOptions& options = {});
/// A lower bound on plan(src, dst, options).cost, without searching: the bytes the busiest
/// destination rank lacks, one call and one message if any must move (log2 of the ranks whose
/// Partial values must be combined, rounded up), one step if the layouts differ. Cheap (one
/// block intersection per class of ranks); the op dispatcher prices a strategy with it first
/// and plans only the strategies it cannot rule out.
double plan_cost_lower_bound(const Layout& src, const Layout& dst, const PlanOptions& options = {});
/// How many times the calling thread has run plan() (dispatch benchmarks show 0 on cache hits).
uint64_t plan_call_count();

/// The dry run: what moves, over which groups, how many bytes, and the lower bound. Multi-line.
std::string explain(const Plan& plan);

/// Bytes the most loaded rank must receive at least. Non-Partial source: the part of its
/// destination block it does not hold (receive_lower_bound). Partial source with K contributions
/// per element over the Partial mesh dims dst does not keep: each rank receives its whole
/// destination block at least, and all ranks together (K - 1) + (H - 1) copies of each element
/// held by H destination ranks, so the busiest at least their average. Exact for one Partial dim
/// (all-reduce, reduce-scatter) and for [P, P] -> [R, R]; checked against every plan in the tests.
int64_t plan_lower_bound(const Layout& src, const Layout& dst);

}  // namespace tessera
