#pragma once
// The redistribute planner. Pure: from two layouts it finds the cheapest way to
// move data, as a printable list of steps with their cost; the dtensor layer runs the steps.
//
// Two families compete: per-mesh-dim collective steps (all_gather, all_to_all, reduce_scatter,
// all_reduce, local chunk) found by a shortest-path search over layouts, and a direct block
// exchange (block_exchange.hpp) from any non-Partial layout of the search to the destination.
// Cost of a step: the most bytes any rank receives, plus a per-message latency term.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/block_exchange.hpp>
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
/// over every rank involved; the others are collectives over one mesh dim.
enum class StepKind : uint8_t {
#define TESSERA_PLAN_STEP_ENUM(name) name,
  TESSERA_FORALL_PLAN_STEPS(TESSERA_PLAN_STEP_ENUM)
#undef TESSERA_PLAN_STEP_ENUM
};
std::string_view name(StepKind kind);

/// One step from `before` to `after`. For a mesh-dim step, only the placement (and shard
/// order) at `mesh_dim` changes. Costs are per world rank (index = world rank). Value type.
struct PlanStep {
  StepKind kind = StepKind::exchange;
  int64_t mesh_dim = -1;             ///< -1 for exchange
  ReduceOp op = ReduceOp::sum;       ///< reduce_scatter / all_reduce / to_partial
  Layout before;
  Layout after;
  std::vector<Transfer> transfers;   ///< exchange only
  std::vector<int64_t> bytes_sent;   ///< per world rank, to other ranks
  std::vector<int64_t> bytes_received;
  int64_t messages = 0;              ///< most messages one rank sends in this step

  int64_t max_bytes_sent() const;
  int64_t max_bytes_received() const;
  /// "all_gather over tp (mesh dim 1, 2 ranks): (S(0), S(1)) -> (S(0), R); recv <= 96 B/rank, 1 msg".
  std::string to_string() const;
};

/// Knobs of the cost model.
struct PlanOptions {
  /// Cost of one message in bytes (latency x bandwidth; 5 us at 5 GB/s). 0 plans for bytes alone.
  double message_cost_bytes = 25000;
  /// Allow a Partial destination (Replicate -> Partial is a local step). Internal: sharded
  /// operators need it; a user's redistribute to Partial is an error.
  bool allow_partial_destination = false;
};

/// Steps turning `src` into `dst`, with their cost. Empty when the layouts are equal. Value type.
struct Plan {
  Layout src;
  Layout dst;
  std::vector<PlanStep> steps;
  double cost = 0;  ///< the model's score (bytes + message cost), what the search minimised

  /// Bytes one world rank receives over the whole plan.
  int64_t bytes_received(int world_rank) const;
  int64_t bytes_sent(int world_rank) const;
  int64_t max_bytes_received() const;
  int64_t total_bytes_received() const;
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
/// destination rank lacks, one message if any must move, one step if the layouts differ. Cheap
/// (one block intersection per rank); the op dispatcher prices a strategy with it first and
/// plans only the strategies it cannot rule out.
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
