// The pipeline's schedules and its step: each rank runs its stages' actions in order. Sends never
// block (the boundary's isends are waited at the end of the step), so a rank only waits for what
// its next action reads: the activation from the stage before (a forward) or the gradient from
// the stage after (a backward). Every schedule orders those waits so that no cycle forms. The
// protocol across a boundary is detail/stage_boundary.
#include <tessera/comm/tags.hpp>
#include <tessera/mpmd/pipeline.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/detail/stage_boundary.hpp>
#include <tessera/mpmd/microbatch.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/mesh_move.hpp>

namespace tessera::mpmd {

namespace {

using tessera::detail::concat;
using tessera::mpmd::detail::StageBoundary;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The exception kind of `e` with a new message: a stage's ValueError stays a ValueError.
[[noreturn]] void rethrow_as(const std::exception& e, const std::string& message) {
  if (dynamic_cast<const ValueError*>(&e)) throw ValueError(message);
  if (dynamic_cast<const ShardingError*>(&e)) throw ShardingError(message);
  if (dynamic_cast<const CommError*>(&e)) throw CommError(message);
  if (dynamic_cast<const InternalError*>(&e)) throw InternalError(message);
  throw Error(message);
}

// One step of a rank's stages (one, or v interleaved on one mesh): the microbatches'
// activations and outputs, the target's microbatches, the boundary to the neighbouring stages.
class StageRunner {
 public:
  StageRunner(const std::vector<Stage>& stages, const Pipeline::Loss& loss, const PipelineOptions& options,
              const std::vector<int64_t>& mine, const DTensor& input, const DTensor& target, Communicator& comm,
              PipelineStats& stats, bool& waiting_on_peer)
      : stages_(stages),
        loss_(loss),
        options_(options),
        count_(static_cast<int64_t>(stages.size())),
        mesh_(stages[static_cast<size_t>(mine.front())].mesh),
        target_(target),
        has_last_(mine.back() + 1 == count_),
        received_(per_stage<DTensor>()),
        produced_(per_stage<DTensor>()),
        sent_layouts_(per_stage<Layout>()),
        boundary_(comm, mesh_.spec(), mesh_.coordinate(), options.microbatches, stats, waiting_on_peer) {
    const MeshSpec& spec = mesh_.spec();
    if (mine.front() == 0) {
      TESSERA_CHECK(input.defined() && input.layout().mesh() == spec, ShardingError, "Pipeline::step", "the input ",
                    input.defined() ? input.layout().to_string() : "(undefined)", " is not on stage 0's mesh ",
                    spec.to_string());
      inputs_ = split_microbatches(input, options.batch_dim, options.microbatches);
      // The input's pieces along the batch dim decide which rows each microbatch holds; they
      // travel in every header, so the last stage picks the same rows of the target.
      input_pieces_ = input.layout().piece_sizes(options.batch_dim);
    }
    if (has_last_)
      TESSERA_CHECK(target.defined() && target.layout().mesh() == spec, ShardingError, "Pipeline::step", "the target ",
                    target.defined() ? target.layout().to_string() : "(undefined)", " is not on the last stage's mesh ",
                    spec.to_string());
  }

  void run(const PipelineAction& a) {
    if (a.forward)
      forward(a.stage, a.microbatch);
    else
      backward(a.stage, a.microbatch);
  }

  // The deferred gradient reductions and every send; returns the step's loss on the last stage.
  double finish() {
    once_.reset();
    boundary_.finish();
    return has_last_ ? loss_total_.full_tensor().item<double>() : 0.0;
  }

 private:
  template <class T>
  std::vector<std::vector<T>> per_stage() const {
    return std::vector<std::vector<T>>(static_cast<size_t>(count_),
                                       std::vector<T>(static_cast<size_t>(options_.microbatches)));
  }
  const MeshSpec& mesh_of(int64_t c) const { return stages_[static_cast<size_t>(c)].mesh.spec(); }

  // Microbatch i of the target: the rows microbatch i of the input holds.
  DTensor target_of(int64_t i) {
    const int64_t n = options_.microbatches;
    if (targets_.empty()) {
      if (target_.layout().piece_sizes(options_.batch_dim) == input_pieces_) {
        targets_ = split_microbatches(target_, options_.batch_dim, n);  // the same rows, nothing moves
      } else {
        const Placements whole(static_cast<size_t>(mesh_.ndim()), Replicate{});
        for (int64_t k = 0; k < n; ++k) {
          const std::vector<int64_t> rows = microbatch_rows(input_pieces_, n, k);
          const DTensor index =
              DTensor::from_local(from_vector(rows, Shape{static_cast<int64_t>(rows.size())}), mesh_, whole);
          targets_.push_back(index_select(target_, options_.batch_dim, index));
        }
      }
    }
    return targets_[static_cast<size_t>(i)];
  }

  void forward(int64_t c, int64_t i) {
    const auto at = [i](auto& per_stage, int64_t s) -> auto& {
      return per_stage[static_cast<size_t>(s)][static_cast<size_t>(i)];
    };
    DTensor x;
    if (c == 0) {
      x = inputs_[static_cast<size_t>(i)];
    } else {
      StageBoundary::Arrival arrival = boundary_.receive_activation(c - 1, i, mesh_of(c - 1));
      input_pieces_ = std::move(arrival.input_pieces);
      x = DTensor(std::move(arrival.local), mesh_, arrival.layout);
      at(sent_layouts_, c) = std::move(arrival.sent);
      if (is_floating(x.dtype())) x.requires_grad_();
    }
    at(received_, c) = x;
    DTensor y = stages_[static_cast<size_t>(c)].forward(x);
    if (c + 1 == count_) {
      const DTensor t = target_of(i);
      const int64_t rows = target_.shape()[options_.batch_dim];
      const double share =
          rows > 0 ? static_cast<double>(t.shape()[options_.batch_dim]) / static_cast<double>(rows) : 1.0;
      // An empty microbatch (fewer rows than microbatches) adds nothing, but still runs its
      // backward so the stages before it exchange its (zero) gradients.
      const DTensor loss = share > 0 ? loss_(y, t) * Scalar(share) : sum(y) * Scalar(0.0);
      at(produced_, c) = loss;
      loss_total_ = loss_total_.defined() ? loss_total_ + loss.detach() : loss.detach();
      return;
    }
    // A Partial activation is reduced on this stage first: blocks of values cross the boundary.
    y = y.redistribute(mesh_, gradient_layout(y.layout()));  // no-op without a Partial
    boundary_.send_activation(c, i, y.to_local(), y.layout(), mesh_of(c + 1), input_pieces_);
    at(produced_, c) = y;
  }

  void backward(int64_t c, int64_t i) {
    DTensor& y = produced_[static_cast<size_t>(c)][static_cast<size_t>(i)];
    if (c + 1 == count_) {
      y.backward();
    } else {
      // The gradient comes back the way the activation went, block pieces in reverse.
      const Layout there = layout_on_mesh(y.layout(), mesh_of(c + 1));
      y.backward(DTensor(boundary_.receive_gradient(c, i, there, y.layout()), mesh_, y.layout()));
    }
    DTensor& x = received_[static_cast<size_t>(c)][static_cast<size_t>(i)];
    if (c > 0) {
      DTensor g = x.grad();
      if (g.defined() && g.layout().has_partial())
        g = g.redistribute(mesh_, gradient_layout(x.layout()));  // values cross
      boundary_.send_gradient(c - 1, i, g.defined() ? g.to_local() : zeros(x.to_local().shape(), x.dtype()), x.layout(),
                              sent_layouts_[static_cast<size_t>(c)][static_cast<size_t>(i)]);
    }
    y = DTensor();
    x = DTensor();
  }

  const std::vector<Stage>& stages_;
  const Pipeline::Loss& loss_;
  const PipelineOptions& options_;
  const int64_t count_;
  const DeviceMesh& mesh_;  // this rank's stages all run on one mesh (interleaved: p, p + P, ...)
  const DTensor& target_;
  const bool has_last_;
  std::vector<DTensor> inputs_, targets_;
  std::vector<int64_t> input_pieces_;
  // Per stage and microbatch: the activation received, the output produced, and the layout the
  // received activation was sent in.
  std::vector<std::vector<DTensor>> received_, produced_;
  std::vector<std::vector<Layout>> sent_layouts_;
  DTensor loss_total_;
  // The parameters' gradients owed over a stage's data-parallel ranks are reduced once, after
  // the last microbatch's backward.
  std::optional<NoSync> once_{std::in_place};
  StageBoundary boundary_;
};

}  // namespace

std::string PipelineAction::to_string() const {
  return std::to_string(stage) + (forward ? 'F' : 'B') + std::to_string(microbatch);
}

std::vector<PipelineAction> schedule_actions(Schedule schedule, int64_t s, int64_t stages, int64_t n) {
  std::vector<PipelineAction> actions;
  if (schedule == Schedule::gpipe) {
    for (int64_t i = 0; i < n; ++i) actions.push_back({true, s, i});
    for (int64_t i = 0; i < n; ++i) actions.push_back({false, s, i});
    return actions;
  }
  // 1F1B: stage s runs S - 1 - s forwards ahead, then one forward and one backward in turn, then
  // the remaining backwards; the last stage alternates from the start.
  const int64_t warmup = std::min(stages - 1 - s, n);
  for (int64_t i = 0; i < warmup; ++i) actions.push_back({true, s, i});
  for (int64_t i = 0; i < n - warmup; ++i) {
    actions.push_back({true, s, warmup + i});
    actions.push_back({false, s, i});
  }
  for (int64_t i = n - warmup; i < n; ++i) actions.push_back({false, s, i});
  return actions;
}

std::vector<PipelineAction> pipeline_actions(Schedule schedule, int64_t p, int64_t meshes, int64_t stages_per_mesh,
                                             int64_t n) {
  if (schedule != Schedule::interleaved_one_f_one_b) return schedule_actions(schedule, p, meshes, n);
  // Megatron-LM's order: virtual microbatch k runs local stage (k mod P v) / P (backwards: in
  // reverse) on microbatch (k / P v) P + k mod P; the warm-up fills the pipeline of P v stages.
  const int64_t v = stages_per_mesh, total = n * v, round = meshes * v;
  const auto action = [&](int64_t k, bool forward) {
    int64_t local = (k % round) / meshes;
    if (!forward) local = v - 1 - local;
    return PipelineAction{forward, local * meshes + p, (k / round) * meshes + k % meshes};
  };
  std::vector<PipelineAction> actions;
  const int64_t warmup = std::min((meshes - p - 1) * 2 + (v - 1) * meshes, total);
  for (int64_t k = 0; k < warmup; ++k) actions.push_back(action(k, true));
  for (int64_t k = 0; k < total - warmup; ++k) {
    actions.push_back(action(warmup + k, true));
    actions.push_back(action(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) actions.push_back(action(k, false));
  return actions;
}

Pipeline::Pipeline(std::vector<Stage> stages, Loss loss, PipelineOptions options)
    : stages_(std::move(stages)), loss_(std::move(loss)), options_(options) {
  TESSERA_CHECK(!stages_.empty(), ShardingError, "Pipeline", "no stages");
  TESSERA_CHECK(options_.microbatches >= 1, ValueError, "Pipeline", "microbatches = ", options_.microbatches,
                "; need at least 1");
  const auto count = static_cast<int64_t>(stages_.size());
  // Four messages per (stage boundary, microbatch), each with a tag of its own.
  TESSERA_CHECK((count - 1) * options_.microbatches <= kPipelineTags.size() / 4, ValueError, "Pipeline", count,
                " stages x ", options_.microbatches, " microbatches need more message tags than a pipeline has (",
                kPipelineTags.size() / 4, " boundary-microbatch pairs)");
  meshes_ = count;
  if (options_.schedule == Schedule::interleaved_one_f_one_b) {
    // The stages cycle over the meshes up to the first that repeats stage 0's.
    for (int64_t c = 1; c < count && meshes_ == count; ++c)
      if (stages_[static_cast<size_t>(c)].mesh.spec() == stages_[0].mesh.spec()) meshes_ = c;
    TESSERA_CHECK(meshes_ >= 2 && count % meshes_ == 0, ShardingError, "Pipeline",
                  "interleaved 1F1B needs the stages to cycle over P >= 2 meshes (stage c on stage c mod P's); "
                  "stage 0's mesh ",
                  stages_[0].mesh.to_string(), " recurs after ", meshes_, " of ", count, " stages");
    for (int64_t c = meshes_; c < count; ++c)
      TESSERA_CHECK(
          stages_[static_cast<size_t>(c)].mesh.spec() == stages_[static_cast<size_t>(c % meshes_)].mesh.spec(),
          ShardingError, "Pipeline", "interleaved 1F1B: stage ", c, "'s mesh ",
          stages_[static_cast<size_t>(c)].mesh.to_string(), " is not stage ", c % meshes_, "'s ",
          stages_[static_cast<size_t>(c % meshes_)].mesh.to_string(), " (the stages cycle over ", meshes_, " meshes)");
    TESSERA_CHECK(options_.microbatches % meshes_ == 0, ValueError, "Pipeline", "interleaved 1F1B over ", meshes_,
                  " meshes needs microbatches a multiple of ", meshes_, ", got ", options_.microbatches);
  }
  std::set<int> seen;
  for (int64_t s = 0; s < count; ++s) {
    const Stage& stage = stages_[static_cast<size_t>(s)];
    TESSERA_CHECK(static_cast<bool>(stage.forward), ShardingError, "Pipeline", "stage ", s, " has no forward");
    if (stage.mesh.is_member()) mine_.push_back(s);
    if (s >= meshes_) continue;  // an interleaved stage on a mesh already checked
    for (int r : stage.mesh.spec().ranks())
      TESSERA_CHECK(seen.insert(r).second, ShardingError, "Pipeline", "world rank ", r, " is in two stages (stage ",
                    s, "'s mesh ", stage.mesh.spec().to_string(), ")");
  }
}

std::string Pipeline::describe() const {
  std::ostringstream out;
  const int64_t v = stages_per_mesh();
  for (int64_t p = 0; p < meshes_; ++p) {
    out << (v > 1 ? "stages " : "stage ") << p;
    for (int64_t c = 1; c < v; ++c) out << ", " << p + c * meshes_;
    out << ":";
    for (const PipelineAction& a : pipeline_actions(options_.schedule, p, meshes_, v, options_.microbatches))
      out << ' ' << a.to_string();
    out << '\n';
  }
  return out.str();
}

void Pipeline::fail_step(const std::exception& e, const PipelineAction& current, bool waiting_on_peer) {
  // Waiting on the pipeline's group, this rank was released by a peer's failure (the group's
  // error names it) or timed out: say where this rank stood.
  const std::string action =
      current.stage < 0 ? std::string("after its stages")
                        : concat("in the ", current.forward ? "forward" : "backward", " of microbatch ", current.microbatch);
  const std::string message =
      waiting_on_peer
          ? concat("[Pipeline::step] world rank ", rank(),
                   my_stage() < 0 ? std::string(" (in no stage)") : concat(" (stage ", my_stage(), ")"),
                   " stopped waiting ", action, ": ", e.what())
          : concat("[Pipeline::step] stage ", current.stage < 0 ? my_stage() : current.stage, " failed on world rank ",
                   rank(), " ", action, ": ", e.what());
  // Releases every rank waiting on the pipeline at once (a no-op when a peer failed it first);
  // the next step makes a new group.
  comm_->abort(message);
  comm_.reset();
  rethrow_as(e, message);
}

double Pipeline::step(const DTensor& input, const DTensor& target) {
  const auto start = Clock::now();
  stats_ = PipelineStats{};
  const int64_t n = options_.microbatches;
  stats_.ideal_bubble = static_cast<double>(meshes_ - 1) / static_cast<double>(n * stages_per_mesh() + meshes_ - 1);
  // The pipeline's own group over the world: a failing stage aborts it to release every rank
  // waiting on the pipeline, without spending the world's communicator. Made on first use and
  // again after a failure (a failed group is not reused); every rank of the world calls step.
  if (!comm_) comm_ = world().split(0, rank());
  // What this rank is doing, for the error that ends the step.
  PipelineAction current{true, -1, -1};
  bool waiting_on_peer = false;
  double loss_value = 0;
  try {
    if (!mine_.empty()) {
      StageRunner runner(stages_, loss_, options_, mine_, input, target, *comm_, stats_, waiting_on_peer);
      for (const PipelineAction& a :
           pipeline_actions(options_.schedule, mine_.front(), meshes_, stages_per_mesh(), n)) {
        current = a;
        runner.run(a);
      }
      current = PipelineAction{true, -1, -1};
      loss_value = runner.finish();
    }
    // Every rank learns the loss from the last stage's first rank.
    waiting_on_peer = true;
    comm_->broadcast(&loss_value, 1, DType::f64, stages_.back().mesh.spec().ranks().front());
    waiting_on_peer = false;
  } catch (const std::exception& e) {
    fail_step(e, current, waiting_on_peer);
  } catch (...) {
    comm_->abort(concat("[Pipeline::step] world rank ", rank(), " failed with a non-standard exception"));
    comm_.reset();
    throw;
  }
  stats_.step_seconds = seconds_since(start);
  return loss_value;
}

}  // namespace tessera::mpmd
