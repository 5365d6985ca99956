#pragma once
// Pipeline parallelism (multimesh.jax / GPipe / PipeDream's 1F1B): a model split into stages,
// each a function on its own submesh (itself dp x tp as any mesh), a step run as n microbatches
// flowing through the stages. Activations travel forward and their gradients back across stage
// boundaries by isend/irecv: each destination block's pieces from the source ranks holding them
// (the planner's direct exchange; between meshes of one shape, rank to rank at the same
// coordinates). Each stage runs autograd on its own piece of the graph.
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {
class Communicator;
namespace mpmd {

/// The order in which a stage runs its microbatches' forward (F) and backward (B) passes.
enum class Schedule : uint8_t {
  gpipe,        ///< every F, then every B: simple, holds n microbatches' activations
  one_f_one_b,  ///< after S - 1 - s warm-up Fs, stage s alternates F and B: holds at most S - s
  /// Megatron-LM's interleaved 1F1B: the stages cycle over P meshes (stage c on stage c mod P's),
  /// so each rank runs v = S / P model chunks; its ideal bubble is (P - 1) / (v n + P - 1)
  /// instead of (P - 1) / (n + P - 1). Needs microbatches a multiple of P and P >= 2.
  interleaved_one_f_one_b,
};

/// One action of a rank's schedule: the forward or backward of a microbatch through a stage.
struct PipelineAction {
  bool forward;
  int64_t stage;
  int64_t microbatch;
  /// "2F0": stage 2's forward of microbatch 0 ("1B3" a backward), as torch.distributed.pipelining
  /// prints its schedules' actions.
  std::string to_string() const;
  friend bool operator==(const PipelineAction&, const PipelineAction&) = default;
};

/// One stage: the submesh it runs on and its forward (its parameters live on that mesh).
struct Stage {
  DeviceMesh mesh;
  std::function<DTensor(const DTensor&)> forward;
};

struct PipelineOptions {
  Schedule schedule = Schedule::one_f_one_b;
  int64_t microbatches = 4;
  int64_t batch_dim = 0;  ///< the dim of the input and target the microbatches split
};

/// What the last step did on this rank.
struct PipelineStats {
  double step_seconds = 0;        ///< this rank's wall time in step()
  double wait_seconds = 0;        ///< of which waiting for activations or gradients
  int64_t bytes_sent = 0;         ///< across stage boundaries (headers included)
  int64_t bytes_received = 0;
  /// (S - 1) / (n + S - 1): the idle share of the schedule with equal stage times.
  double ideal_bubble = 0;
  /// wait_seconds / step_seconds: the share this rank spent idle.
  double bubble() const { return step_seconds > 0 ? wait_seconds / step_seconds : 0; }
};

/// A model split into stages on disjoint submeshes (every world rank in at most one stage; the
/// meshes may differ in shape and size; interleaved: the stages cycle over P disjoint meshes),
/// with a loss on the last stage's output. An activation
/// arrives in its layout where the meshes have one shape, otherwise with each mesh dim placed as
/// the source's mesh dim of the same name (else Replicate); a Partial is reduced before it
/// leaves. Constructed and stepped by every rank of the world. Throws ShardingError for no
/// stages or stages sharing a rank (interleaved: stages not cycling over P >= 2 disjoint meshes),
/// ValueError for fewer than 1 microbatch (interleaved: not a multiple of P).
class Pipeline {
 public:
  using Loss = std::function<DTensor(const DTensor& output, const DTensor& target)>;
  Pipeline(std::vector<Stage> stages, Loss loss, PipelineOptions options = {});

  /// One forward and backward over options.microbatches microbatches: `input` lives on the first
  /// stage's mesh, `target` on the last's (elsewhere their handles are ignored). Microbatch i
  /// holds part i of every piece of the input (split_microbatches); the target's microbatch holds
  /// the same rows (its own split when its pieces match the input's, else index_select of them). The loss is a
  /// mean over rows: microbatch i's loss counts by its share of the rows, so the stages'
  /// parameters accumulate (in their .grad) the unsplit step's gradients up to the order of
  /// summation. Returns the step's loss on every rank of the world. Collective over the world.
  /// An error on any rank (a stage that throws) fails the step on every rank at once, none left
  /// waiting: the failing rank rethrows its error's kind as "[Pipeline::step] stage s failed on
  /// world rank r in the forward of microbatch i: ...", the others a CommError carrying that text.
  /// The pipeline stays usable: the next step starts afresh.
  double step(const DTensor& input, const DTensor& target);

  const PipelineStats& stats() const { return stats_; }
  int64_t stages() const { return static_cast<int64_t>(stages_.size()); }
  /// This rank's (first) stage, or -1.
  int64_t my_stage() const { return mine_.empty() ? -1 : mine_.front(); }
  /// This rank's stages: one, none, or (interleaved) v of them.
  const std::vector<int64_t>& my_stages() const { return mine_; }
  /// The meshes the stages cycle over (P; the stage count without interleaving).
  int64_t meshes() const { return meshes_; }
  /// The stages each mesh runs (v = S / P; 1 without interleaving).
  int64_t stages_per_mesh() const { return stages() / meshes_; }
  /// The schedule as run, a line per mesh of its actions in order: "stage 1: 1F0 1F1 1B0 1F2 ..."
  /// (interleaved: "stages 0, 2: 0F0 0F1 2F0 ...").
  std::string describe() const;

 private:
  std::vector<Stage> stages_;
  Loss loss_;
  PipelineOptions options_;
  int64_t meshes_ = 0;
  std::vector<int64_t> mine_;
  PipelineStats stats_;
  std::shared_ptr<Communicator> comm_;  // the pipeline's group over the world (step)

  // Ends a step that failed on this rank: aborts the pipeline's group, rethrows naming the stage.
  [[noreturn]] void fail_step(const std::exception& e, const PipelineAction& current, bool waiting_on_peer);
};

/// The actions of stage s of S over n microbatches, in order (GPipe, 1F1B).
std::vector<PipelineAction> schedule_actions(Schedule schedule, int64_t s, int64_t stages, int64_t n);
/// The actions of the ranks of mesh p of P (`meshes`), each running v stages (p, p + P, ...;
/// `stages_per_mesh`), over n microbatches, in order. For GPipe and 1F1B v is 1 and this is
/// schedule_actions's order.
std::vector<PipelineAction> pipeline_actions(Schedule schedule, int64_t p, int64_t meshes, int64_t stages_per_mesh,
                                             int64_t n);

}  // namespace mpmd
}  // namespace tessera
