#pragma once
// multimesh.jax's automatic parallelism: choose a parallel plan for a model on a mesh by the
// planner's cost model and a memory budget, print it, apply it. The candidates are the plans
// Tessera can apply to a transformer: data parallel (DDP, gradients all-reduced), fully sharded
// (FSDP over one axis), tensor parallel (the Megatron plan over one axis), and their 2-d
// combinations. Each is priced as
//
//     compute: one unsharded step's measured time on this mesh, divided by the ranks that split it
//   + communication: every redistribution the plan implies per step (parameter all-gathers and
//     gradient reductions, tensor parallel activation all-reduces), each priced by plan() under
//     the backend's CostModel, its per-call latency re-measured on this mesh as it runs now
//
// and its memory per rank (parameters, gradients and AdamW moments by their shards, the linear
// layers' saved activations) is checked against the budget.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/sharding/cost_model.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

struct ParallelizeOptions {
  int64_t batch = 8;    ///< the step's shapes the plan is chosen for: tokens [batch, seq]
  int64_t seq = 16;
  bool print = true;    ///< rank 0 prints the candidates and the choice
  /// The measured time of one unsharded step (forward, loss, backward) on this mesh, in us; 0:
  /// parallelize measures it (one warm-up and three timed steps, the median, the slowest rank).
  double unsharded_step_us = 0;
  /// The communication model; default: the running backend's, its call latency re-measured here.
  std::optional<CostModel> cost;
};

/// One candidate plan and its estimate.
struct PlanEstimate {
  std::string name;                  ///< "tp(tp) + fsdp(dp)", "ddp(x)", ...
  std::string tp_axis;               ///< empty: no tensor parallelism
  std::vector<std::string> dp_axes;  ///< the axes splitting the batch
  bool fsdp = false;                 ///< parameters sharded over dp_axes (one axis)
  double compute_us = 0, comm_us = 0;
  int64_t comm_calls = 0, comm_bytes = 0;  ///< per rank per step (the busiest rank's receives)
  int64_t memory_bytes = 0;                ///< per rank
  bool fits = true;
  double estimated_us() const { return compute_us + comm_us; }
};

struct ParallelPlan {
  std::vector<PlanEstimate> candidates;  ///< in the order considered
  PlanEstimate chosen;
  CostModel cost;   ///< the communication model used (the backend's, its call latency re-measured)
  Placements data;  ///< where the step's tokens and targets go: Shard(0) on the dp axes
  std::string to_string() const;
};

/// The candidates' estimates for `model` on its mesh, without applying any (collective: it
/// measures the unsharded step unless given). The model must still be unsharded.
ParallelPlan plan_parallelism(nn::TransformerLM& model, int64_t memory_budget_bytes,
                              const ParallelizeOptions& options = {});

/// Chooses the cheapest plan that fits `memory_budget_bytes` per rank (0: no limit), applies it
/// to `model` (parallelize_module over the tp axis, fully_shard over the dp axis) and returns it.
/// `mesh` must be the model's mesh. Throws ShardingError for another mesh or a model already
/// sharded, ValueError naming the smallest plan's memory when none fits.
ParallelPlan parallelize(nn::TransformerLM& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options = {});

}  // namespace mpmd
}  // namespace tessera
