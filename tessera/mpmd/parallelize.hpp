#pragma once
// multimesh.jax's automatic parallelism: choose a parallel plan for a model on a mesh by the
// planner's cost model and a memory budget, print it, apply it. The candidates are the plans
// Tessera can apply to a transformer: data parallel (DDP, gradients all-reduced), fully sharded
// (FSDP over one axis), tensor parallel (the Megatron plan over one axis, with or without
// sequence parallelism), and their 2-d combinations; each layer's tensor parallel style is the
// plan's (transformer_tp_plan), and under a memory budget FSDP can cover some layers only (the
// others DDP). Each is priced as
//
//     compute: one unsharded step's measured time on this mesh at a rank's share of the batch
//       (the batch divided by the ranks that split the work), so that per-op costs, which do
//       not shrink with the shard, count
//   + communication: every redistribution the plan implies per step (parameter all-gathers and
//     gradient reductions, tensor parallel activation all-reduces), each priced by plan() under
//     the backend's CostModel, its per-call latency re-measured on this mesh as it runs now
//
// and its memory per rank (parameters, gradients and AdamW moments by their shards, the linear
// layers' and norms' saved activations) is checked against the budget.
//
// With a pipeline axis, the mesh's slices along it become stages: the model is cut into
// contiguous runs of units (the embeddings, each block, the final norm and head), one per stage,
// and every stage applies the same plan over the remaining axes. Each unit's forward + backward
// is measured unsharded at a rank's share of the microbatch; a stage's time per microbatch is
// its units' plus their communication and the activation or gradient
// it receives across each boundary; the step is sum(stage) + (microbatches - 1) * max(stage),
// the first microbatch's trip through every stage and then one per microbatch at the slowest
// stage's pace, or the host's work over its cores where ranks share cores. The boundaries
// minimise the slowest stage among those whose memory fits (a 1F1B stage s holds min(n, S - s)
// microbatches' activations, GPipe n).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/mpmd/pipeline.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/sharding/cost_model.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

struct ParallelizeOptions {
  int64_t batch = 8;    ///< the step's shapes the plan is chosen for: tokens [batch, seq]
  int64_t seq = 16;
  bool print = true;    ///< rank 0 prints the candidates and the choice
  /// The time of one unsharded step (forward, loss, backward) of the whole batch on this mesh,
  /// in us, a plan's compute taken as this divided by the ranks splitting it; 0: parallelize
  /// measures the step at each plan's per-rank share of the batch (one warm-up and three timed
  /// steps, the median, the slowest rank).
  double unsharded_step_us = 0;
  /// The communication model; default: the running backend's, its call latency re-measured here.
  std::optional<CostModel> cost = {};

  /// A mesh axis whose slices become pipeline stages; empty: no pipeline. The model is then this
  /// rank's copy, built on its stage's mesh (mesh.slice({axis: this rank's index})), with the
  /// same seed on every stage.
  std::string pipeline_axis = {};
  int64_t microbatches = 4;                   ///< the pipeline's, splitting `batch`
  Schedule schedule = Schedule::one_f_one_b;  ///< the pipeline's (how many microbatches a stage holds)
  /// The forward + backward time of each unit (the embeddings, each block, the norm and head)
  /// at one microbatch's shape on a stage's mesh, unsharded, in us, divided by the ranks
  /// splitting it; empty: measured at each plan's per-rank share of the microbatch (the median
  /// of three, the slowest rank's).
  std::vector<double> unit_us = {};
  /// A module other than TransformerLM: its tensor parallel plan (parallelize_module's; empty:
  /// no tensor parallel candidates) and the loss of an unsharded batch of `rows` rows on its mesh
  /// (what parallelize times; activations are priced as [rows, seq, features]).
  std::map<std::string, nn::ParallelStyle> tp_plan = {};
  std::function<DTensor(int64_t rows)> loss = {};
  /// Ranks sharing each core (a pipeline's step is at least its host's work over its cores); 0:
  /// this host's ranks over std::thread::hardware_concurrency(), at least 1.
  double ranks_per_core = 0;
};

/// Tensor parallelism: the Megatron plan over one axis (transformer_tp_plan, or the module's).
struct TensorParallel {
  std::string axis;
  bool sequence_parallel = false;  ///< the norms on sequence shards of the axis (transformer_tp_plan(true))
  bool operator==(const TensorParallel&) const = default;
};

/// Data parallelism: the axes splitting the batch, the parameters replicated (DDP) or sharded
/// (FSDP, over one axis).
struct DataParallel {
  std::vector<std::string> axes;
  bool sharded = false;
  /// With sharded: the module paths sharded (FSDP2's fully_shard per submodule), the rest DDP
  /// over the same axis; empty: every module. parallelize considers it where a plan's DDP form
  /// does not fit the budget, choosing the units whose sharding fits with the least communication.
  std::vector<std::string> sharded_modules;
  std::vector<std::string> sharded_units;  ///< their units' labels ("b0", "head"), for the name
  bool operator==(const DataParallel&) const = default;
};

/// A pipeline: the mesh axis whose slices are the stages, each stage's module paths.
struct PipelineStages {
  std::string axis;
  std::vector<std::vector<std::string>> modules;  ///< {"tok", "pos", "blocks.0"}, ...
  std::vector<std::string> units;                 ///< each stage's units, "emb-b1", for the name
  bool operator==(const PipelineStages&) const = default;
};

/// How a plan parallelizes a model: what apply_plan applies.
struct ParallelStrategy {
  std::optional<PipelineStages> pipeline;
  std::optional<TensorParallel> tensor;
  DataParallel data;
  /// The plan's name, the one place it is built: its parts joined by " + ", in the order
  /// pipeline, tensor, data: "pp(pp)[emb-b1|b2-head] + tp+sp(tp) + fsdp(dp)", "ddp(x,y)",
  /// "fsdp(x)[b0,head] + ddp(x)" (FSDP of some units, DDP of the rest).
  std::string to_string() const;
  bool operator==(const ParallelStrategy&) const = default;
};

/// One candidate plan and its estimate.
struct PlanEstimate {
  ParallelStrategy strategy;
  double compute_us = 0, comm_us = 0;
  int64_t comm_calls = 0, comm_bytes = 0;  ///< per rank per step (the busiest rank's receives)
  int64_t memory_bytes = 0;                ///< per rank
  bool fits = true;
  double estimated_us() const { return compute_us + comm_us; }
  std::string name() const { return strategy.to_string(); }
};

struct ParallelPlan {
  std::vector<PlanEstimate> candidates;  ///< in the order considered
  PlanEstimate chosen;
  CostModel cost;   ///< the communication model used (the backend's, its call latency re-measured)
  Placements data;  ///< where the step's tokens and targets go: Shard(0) on the dp axes
  /// With a pipeline axis: the axis, the stages' meshes (its slices, in order), the schedule.
  std::string pipeline_axis = {};
  std::vector<DeviceMesh> stage_meshes;
  int64_t microbatches = 1;
  Schedule schedule = Schedule::one_f_one_b;
  std::string to_string() const;
};

/// The candidates' estimates for `model` on `mesh`, without applying any (collective over `mesh`:
/// it measures the unsharded step unless given). The model must still be unsharded, on `mesh`, or
/// with options.pipeline_axis on this rank's slice of `mesh` along it. Throws ShardingError for a
/// model on another mesh, an unknown pipeline axis, or fewer units than stages.
ParallelPlan plan_parallelism(nn::TransformerLM& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                              const ParallelizeOptions& options = {});
/// plan_parallelism on the model's own mesh (no pipeline axis).
ParallelPlan plan_parallelism(nn::TransformerLM& model, int64_t memory_budget_bytes,
                              const ParallelizeOptions& options = {});

/// Chooses the cheapest plan that fits `memory_budget_bytes` per rank (0: no limit), applies it
/// to `model` (parallelize_module over the tp axis, sequence parallel where chosen, fully_shard
/// over the dp axis) and returns it.
/// `mesh` must be the model's mesh, or with a pipeline axis the mesh it slices. Throws
/// ShardingError as plan_parallelism and for a model already sharded, ValueError naming the
/// smallest plan's memory when none fits. With a pipeline axis, make_pipeline builds the
/// pipeline that runs the plan.
ParallelPlan parallelize(nn::TransformerLM& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options = {});

/// Any module (a TransformerLM goes to the overloads above): DDP, FSDP (of every module or, under
/// a budget, of some) and, with options.tp_plan, tensor parallel plans and their 2-d
/// combinations, each module owning parameters a unit. The step is timed by options.loss unless
/// unsharded_step_us is given. Throws ValueError for a pipeline axis or no way to time the step.
ParallelPlan plan_parallelism(nn::Module& model, int64_t memory_budget_bytes, const ParallelizeOptions& options);
ParallelPlan parallelize(nn::Module& model, const DeviceMesh& mesh, int64_t memory_budget_bytes,
                         const ParallelizeOptions& options);

/// Applies one candidate's strategy to an unsharded model on its mesh (a stage's mesh for a
/// pipeline): parallelize_module over the tp axis, fully_shard over the dp axis (on
/// sharded_modules only where given). parallelize applies its choice so.
void apply_plan(nn::TransformerLM& model, const ParallelStrategy& plan);
/// The same for any module, with its tensor parallel plan.
void apply_plan(nn::Module& model, const ParallelStrategy& plan,
                const std::map<std::string, nn::ParallelStyle>& tp_plan);

/// The pipeline of a plan with a pipeline axis: stage s runs plan.chosen.strategy.pipeline's
/// modules[s] of
/// `model` (this rank's copy) on plan.stage_meshes[s], the loss the model's next-token
/// cross-entropy. Its step takes tokens on the first stage's mesh and targets on the last's, both
/// placed as plan.data. Throws ValueError for a plan without a pipeline axis.
Pipeline make_pipeline(nn::TransformerLM& model, const ParallelPlan& plan);
/// The parameters this rank's stage trains (every parameter without a pipeline axis): what its
/// optimizer steps.
std::vector<DTensor*> stage_parameters(nn::TransformerLM& model, const ParallelPlan& plan);

}  // namespace mpmd
}  // namespace tessera
