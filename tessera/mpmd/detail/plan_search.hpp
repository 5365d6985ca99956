#pragma once
// parallelize's search, without ranks or data: the candidate strategies on a mesh, each
// parameter's communication and memory under a strategy (priced by plan() on layouts), the FSDP
// units that fit a budget, and a pipeline's stage boundaries. parallelize.cpp measures the
// compute and feeds these; tests/mpmd/plan_search_test.cpp checks them as tables.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/mesh/mesh_spec.hpp>
#include <tessera/mpmd/parallelize.hpp>
#include <tessera/nn/parallel.hpp>
#include <tessera/sharding/cost_model.hpp>

namespace tessera TESSERA_API {
namespace mpmd::detail {

/// Every strategy on a mesh of one or two axes: data parallel (DDP, FSDP), tensor parallel with
/// and without sequence parallelism, and their 2-d combinations; tensor or sequence parallel ones
/// only where allowed. Throws ShardingError naming parallelize for three axes or more.
std::vector<ParallelStrategy> candidate_strategies(const MeshSpec& spec, bool tensor_parallel, bool sequence_parallel);

/// The ranks that split the batch under a strategy, and those that split its compute.
int64_t data_parallel_ways(const ParallelStrategy& s, const MeshSpec& spec);
int64_t compute_ways(const ParallelStrategy& s, const MeshSpec& spec);

/// What pricing needs of a parameter: where it lives and what kind of module owns it.
struct ParameterInfo {
  enum class Owner { linear, embedding, norm, other };
  std::string path;  ///< "blocks.0.attn.q.weight"
  int64_t unit = 0;  ///< the unit it belongs to (what a stage or an FSDP choice takes whole)
  Shape shape;       ///< a Linear's weight is [out, in], an Embedding's [rows, dim]
  DType dtype = DType::f32;
  Owner owner = Owner::other;
};

/// One unit's share of a strategy's cost per step.
struct UnitCost {
  double comm_us = 0;
  int64_t calls = 0, bytes = 0;  ///< the busiest rank's receives
  int64_t state_bytes = 0;       ///< parameters, gradients and AdamW moments by their stored shard
  int64_t activation_bytes = 0;  ///< one microbatch's saved activations of the linear layers and norms
  int64_t gather_bytes = 0;      ///< the largest parameter an FSDP all-gather materialises
  bool operator==(const UnitCost&) const = default;
};

/// The shapes one step is priced at: microbatches of [rows, seq] tokens.
struct StepShape {
  int64_t rows = 1, seq = 1, microbatches = 1;
};

/// Prices a strategy's communication and memory unit by unit (`units` of them): what moves per
/// microbatch (FSDP's gathers and gradient reduce-scatters, tensor parallel activations) counts
/// `microbatches` times, DDP's gradient all-reduce once (NoSync defers it). `tp_plan` is the
/// tensor parallel plan of the strategy's sequence parallelism (ignored without a tp axis).
std::vector<UnitCost> price_units(const ParallelStrategy& s, const std::vector<ParameterInfo>& parameters,
                                  int64_t units, const std::map<std::string, nn::ParallelStyle>& tp_plan,
                                  const MeshSpec& spec, const CostModel& cost, const StepShape& step);

/// The memory per rank of units [first, end) holding `held` microbatches' activations: their
/// state, the activations, and the largest FSDP gather (one at a time).
int64_t memory_of(const std::vector<UnitCost>& units, int64_t first, int64_t end, int64_t held);

/// FSDP for some units only, the rest DDP over the same axis: the units to shard that fit
/// `budget` with the least communication (empty: none fits).
std::vector<int64_t> choose_sharded_units(const std::vector<UnitCost>& ddp, const std::vector<UnitCost>& fsdp,
                                          int64_t budget);

/// What pricing a pipeline's stage of units [first, end) needs.
struct PipelinePricing {
  std::vector<UnitCost> units;
  std::vector<double> compute_us;  ///< per unit per microbatch, split over the stage's ranks
  double boundary_us = 0;          ///< one activation (or its gradient) across a boundary
  int64_t boundary_bytes = 0;
  int64_t stages = 1, microbatches = 1;
  Schedule schedule = Schedule::one_f_one_b;

  /// The stage's time per microbatch, with or without its communication.
  double time_us(int64_t stage, int64_t first, int64_t end, bool with_comm) const;
  /// Stage s receives the activation from s - 1 and the gradient from s + 1.
  int64_t boundaries(int64_t stage) const { return (stage > 0 ? 1 : 0) + (stage + 1 < stages ? 1 : 0); }
  /// Microbatches whose activations stage s holds at once: all under GPipe, min(n, S - s) under 1F1B.
  int64_t held(int64_t stage) const;
  int64_t memory_bytes(int64_t stage, int64_t first, int64_t end) const {
    return memory_of(units, first, end, held(stage));
  }
};

/// Stage boundaries minimising the slowest stage's time per microbatch over contiguous runs of at
/// least one unit, among those whose every stage fits `budget` (0: any). Returns the S + 1
/// boundaries, or none when nothing fits.
std::vector<int64_t> choose_boundaries(const PipelinePricing& p, int64_t budget);

}  // namespace mpmd::detail
}  // namespace tessera
