#pragma once
// multimesh.jax's microbatching: a step unrolled over n slices of its batch, the gradients
// accumulating in the parameters' layouts as the slices' backward passes run.
#include <cstdint>
#include <functional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

/// The n microbatches of x along `dim`. Microbatch i holds part i of every piece's rows (each
/// rank's block cut into n parts of nearly equal size, the larger first; explicit piece sizes),
/// so nothing moves and a sharded batch stays spread over its ranks. Inputs with the same
/// layout along `dim` are cut alike: their microbatches hold the same rows. Differentiable.
/// Throws ValueError for n < 1 or a dim out of range.
std::vector<DTensor> split_microbatches(const DTensor& x, int64_t dim, int64_t n);

/// The global rows (in order) that microbatch i of n holds when the dim's pieces have sizes
/// `pieces` (a layout's piece_sizes(dim)): part i of every piece. Pure.
std::vector<int64_t> microbatch_rows(const std::vector<int64_t>& pieces, int64_t n, int64_t i);

/// How a step's loss combines over its microbatches.
enum class MicrobatchLoss : uint8_t {
  mean,  ///< the step's loss is a mean over rows: microbatch i's counts by its share of the rows
  sum,   ///< the step's loss is a sum: the microbatches' add up
};

/// Runs `step` (a scalar loss of its inputs) on each of the n microbatches of `inputs` along
/// `dim` (split_microbatches) and calls backward on each, scaled by its share (mean) or not
/// (sum), so every parameter's gradient accumulates to the unsplit step's gradient up to the
/// order of summation (1e-12 relative in f64 in the tests). Returns the combined loss, detached.
/// Every input must have the same layout along `dim` (ShardingError otherwise); the step must
/// communicate alike on every rank (SPMD).
DTensor microbatch(const std::function<DTensor(const std::vector<DTensor>&)>& step, const std::vector<DTensor>& inputs,
                   int64_t dim, int64_t n, MicrobatchLoss loss = MicrobatchLoss::mean);

/// microbatch over the inputs `argnums` names only (multimesh.jax's argnum): those are split
/// along `dim` and must share their layout along it; the others (parameters, a mask) are passed
/// whole to every microbatch, and their gradients accumulate over the microbatches too. An empty
/// `argnums` splits every input. Throws ValueError for an index out of range or named twice.
DTensor microbatch(const std::function<DTensor(const std::vector<DTensor>&)>& step, const std::vector<DTensor>& inputs,
                   int64_t dim, int64_t n, const std::vector<int64_t>& argnums,
                   MicrobatchLoss loss = MicrobatchLoss::mean);

/// multimesh.jax's form: microbatch(fn, dim, n) is the step unrolled over n microbatches, a
/// function of the inputs (each call runs microbatch(fn, inputs, dim, n, loss)).
std::function<DTensor(const std::vector<DTensor>&)> microbatch(std::function<DTensor(const std::vector<DTensor>&)> step,
                                                               int64_t dim, int64_t n,
                                                               MicrobatchLoss loss = MicrobatchLoss::mean);
/// microbatch(fn, dim, n, argnums): only the inputs `argnums` names are split.
/// Example: `microbatch(step, 0, 4, {1})(params, batch)` splits `batch` into 4 and passes `params` whole.
std::function<DTensor(const std::vector<DTensor>&)> microbatch(std::function<DTensor(const std::vector<DTensor>&)> step,
                                                               int64_t dim, int64_t n, std::vector<int64_t> argnums,
                                                               MicrobatchLoss loss = MicrobatchLoss::mean);

}  // namespace mpmd
}  // namespace tessera
