// The pipeline's step: each rank runs its stage's schedule. Sends never block (isend, waited at
// the end of the step), so a rank only waits for what its next action reads: the activation from
// the stage before (a forward) or the gradient from the stage after (a backward). Both schedules
// order those waits so that no cycle forms.
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
#include <tessera/mpmd/microbatch.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/block_exchange.hpp>
#include <tessera/sharding/layout_words.hpp>
#include <tessera/sharding/mesh_move.hpp>

namespace tessera::mpmd {

namespace {

using tessera::detail::concat;

// Microbatch i's messages across the boundary after stage b: header length, header (the
// activation's layout and the input's pieces along the batch dim), activation, gradient.
int tag(int64_t boundary, int64_t microbatches, int64_t microbatch, int kind) {
  return kPipelineTags.first + static_cast<int>(4 * (boundary * microbatches + microbatch)) + kind;
}
enum Kind { kHeaderLength = 0, kHeader = 1, kActivation = 2, kGradient = 3 };

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

// The part of a rank's block (of `layout`, at `coordinate`) that a transfer's box covers.
Tensor piece_of_block(const Tensor& local, const Layout& layout, const std::vector<int64_t>& coordinate, const Block& box) {
  const Block mine = layout.block(coordinate);
  Tensor piece = local;
  for (int64_t d = 0; d < layout.ndim(); ++d) piece = piece.narrow(d, box.begin[d] - mine.begin[d], box.end[d] - box.begin[d]);
  return piece;
}

}  // namespace

std::vector<std::pair<bool, int64_t>> schedule_actions(Schedule schedule, int64_t s, int64_t stages, int64_t n) {
  std::vector<std::pair<bool, int64_t>> actions;
  if (schedule == Schedule::gpipe) {
    for (int64_t i = 0; i < n; ++i) actions.emplace_back(true, i);
    for (int64_t i = 0; i < n; ++i) actions.emplace_back(false, i);
    return actions;
  }
  // 1F1B: stage s runs S - 1 - s forwards ahead, then one forward and one backward in turn, then
  // the remaining backwards; the last stage alternates from the start.
  const int64_t warmup = std::min(stages - 1 - s, n);
  for (int64_t i = 0; i < warmup; ++i) actions.emplace_back(true, i);
  for (int64_t i = 0; i < n - warmup; ++i) {
    actions.emplace_back(true, warmup + i);
    actions.emplace_back(false, i);
  }
  for (int64_t i = n - warmup; i < n; ++i) actions.emplace_back(false, i);
  return actions;
}

std::vector<PipelineAction> pipeline_actions(Schedule schedule, int64_t p, int64_t groups, int64_t chunks, int64_t n) {
  std::vector<PipelineAction> actions;
  if (schedule != Schedule::interleaved_one_f_one_b) {
    for (const auto& [forward, i] : schedule_actions(schedule, p, groups, n)) actions.push_back({forward, p, i});
    return actions;
  }
  // Megatron-LM's order: virtual microbatch k runs chunk (k mod P v) / P (backwards: the chunks
  // in reverse) on microbatch (k / P v) P + k mod P; the warm-up fills the pipeline of P v stages.
  const int64_t total = n * chunks, round = groups * chunks;
  const auto action = [&](int64_t k, bool forward) {
    int64_t chunk = (k % round) / groups;
    if (!forward) chunk = chunks - 1 - chunk;
    return PipelineAction{forward, chunk * groups + p, (k / round) * groups + k % groups};
  };
  const int64_t warmup = std::min((groups - p - 1) * 2 + (chunks - 1) * groups, total);
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
  groups_ = count;
  if (options_.schedule == Schedule::interleaved_one_f_one_b) {
    // The stages cycle over the meshes up to the first that repeats stage 0's.
    for (int64_t c = 1; c < count && groups_ == count; ++c)
      if (stages_[static_cast<size_t>(c)].mesh.spec() == stages_[0].mesh.spec()) groups_ = c;
    TESSERA_CHECK(groups_ >= 2 && count % groups_ == 0, ShardingError, "Pipeline",
                  "interleaved 1F1B needs the stages to cycle over P >= 2 meshes (stage c on stage c mod P's); "
                  "stage 0's mesh ", stages_[0].mesh.to_string(), " recurs after ", groups_, " of ", count, " stages");
    for (int64_t c = groups_; c < count; ++c)
      TESSERA_CHECK(stages_[static_cast<size_t>(c)].mesh.spec() == stages_[static_cast<size_t>(c % groups_)].mesh.spec(),
                    ShardingError, "Pipeline", "interleaved 1F1B: stage ", c, "'s mesh ",
                    stages_[static_cast<size_t>(c)].mesh.to_string(), " is not stage ", c % groups_, "'s ",
                    stages_[static_cast<size_t>(c % groups_)].mesh.to_string(), " (the stages cycle over ", groups_,
                    " meshes)");
    TESSERA_CHECK(options_.microbatches % groups_ == 0, ValueError, "Pipeline", "interleaved 1F1B over ", groups_,
                  " meshes needs microbatches a multiple of ", groups_, ", got ", options_.microbatches);
  }
  std::set<int> seen;
  for (int64_t s = 0; s < count; ++s) {
    const Stage& stage = stages_[static_cast<size_t>(s)];
    TESSERA_CHECK(static_cast<bool>(stage.forward), ShardingError, "Pipeline", "stage ", s, " has no forward");
    if (stage.mesh.is_member()) mine_.push_back(s);
    if (s >= groups_) continue;  // an interleaved stage on a mesh already checked
    for (int r : stage.mesh.spec().ranks())
      TESSERA_CHECK(seen.insert(r).second, ShardingError, "Pipeline", "world rank ", r, " is in two stages (stage ",
                    s, "'s mesh ", stage.mesh.spec().to_string(), ")");
  }
}

std::string Pipeline::describe() const {
  std::ostringstream out;
  const int64_t n = options_.microbatches, chunks = stages() / groups_;
  for (int64_t p = 0; p < groups_; ++p) {
    out << "stage " << p;
    for (int64_t c = 1; c < chunks; ++c) out << (c == 1 ? " (and " : ", ") << p + c * groups_ << (c + 1 == chunks ? ")" : "");
    out << ":";
    for (const PipelineAction& a : pipeline_actions(options_.schedule, p, groups_, chunks, n)) {
      out << ' ' << (a.forward ? 'F' : 'B') << a.microbatch;
      if (chunks > 1) out << '@' << a.stage;
    }
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
  const int64_t count = stages(), n = options_.microbatches, chunks = count / groups_;
  stats_.ideal_bubble = static_cast<double>(groups_ - 1) / static_cast<double>(n * chunks + groups_ - 1);
  // The pipeline's own group over the world: a failing stage aborts it to release every rank
  // waiting on the pipeline, without spending the world's communicator. Made on first use and
  // again after a failure (a failed group is not reused); every rank of the world calls step.
  if (!comm_) comm_ = world().split(0, rank());
  Communicator& comm = *comm_;
  // What this rank is doing, for the error that ends the step.
  PipelineAction current{true, -1, -1};
  bool waiting_on_peer = false;
  double loss_value = 0;
  try {
  if (!mine_.empty()) {
    // This rank's stages all run on one mesh (interleaved: stages p, p + P, ...).
    const DeviceMesh& mesh = stages_[static_cast<size_t>(mine_.front())].mesh;
    const MeshSpec& spec = mesh.spec();
    const auto index = static_cast<size_t>(std::find(spec.ranks().begin(), spec.ranks().end(), rank()) - spec.ranks().begin());
    const std::vector<int64_t> coordinate = mesh.coordinate();
    const bool has_first = mine_.front() == 0, has_last = mine_.back() + 1 == count;
    const auto mesh_of = [&](int64_t c) -> const MeshSpec& { return stages_[static_cast<size_t>(c)].mesh.spec(); };
    std::vector<DTensor> inputs, targets;
    if (has_first) {
      TESSERA_CHECK(input.defined() && input.layout().mesh() == spec, ShardingError, "Pipeline::step", "the input ",
                    input.defined() ? input.layout().to_string() : "(undefined)", " is not on stage 0's mesh ",
                    spec.to_string());
      inputs = split_microbatches(input, options_.batch_dim, n);
    }
    if (has_last)
      TESSERA_CHECK(target.defined() && target.layout().mesh() == spec, ShardingError, "Pipeline::step",
                    "the target ", target.defined() ? target.layout().to_string() : "(undefined)",
                    " is not on the last stage's mesh ", spec.to_string());
    // The input's pieces along the batch dim decide which rows each microbatch holds; they
    // travel in every header, so the last stage picks the same rows of the target.
    std::vector<int64_t> input_pieces;
    if (has_first) input_pieces = input.layout().piece_sizes(options_.batch_dim);
    const auto target_of = [&](int64_t i) {
      if (targets.empty()) {
        if (target.layout().piece_sizes(options_.batch_dim) == input_pieces) {
          targets = split_microbatches(target, options_.batch_dim, n);  // the same rows, nothing moves
        } else {
          const Placements whole(static_cast<size_t>(mesh.ndim()), Replicate{});
          for (int64_t k = 0; k < n; ++k) {
            const std::vector<int64_t> rows = microbatch_rows(input_pieces, n, k);
            const DTensor index = DTensor::from_local(from_vector(rows, Shape{static_cast<int64_t>(rows.size())}), mesh, whole);
            targets.push_back(index_select(target, options_.batch_dim, index));
          }
        }
      }
      return targets[static_cast<size_t>(i)];
    };
    // The parameters' gradients owed over a stage's data-parallel ranks are reduced once, after
    // the last microbatch's backward.
    std::optional<NoSync> once(std::in_place);
    // Per stage (of this rank's) and microbatch: the activation received, the output produced,
    // and the received activation's layout on the stage before.
    const auto per_stage = [&](auto value) {
      return std::vector<std::vector<decltype(value)>>(static_cast<size_t>(count),
                                                       std::vector<decltype(value)>(static_cast<size_t>(n)));
    };
    auto received = per_stage(DTensor()), produced = per_stage(DTensor());
    auto source_layouts = per_stage(Layout());
    DTensor loss_total;
    // Sends in flight, waited at the end of the step. Each keeps its buffer alive itself, so an
    // error that unwinds the step before they complete frees nothing a peer may still read.
    std::vector<Work> outbox;
    const auto wait = [&](const Work& w) {
      const auto waiting = Clock::now();
      waiting_on_peer = true;
      w.wait();
      waiting_on_peer = false;
      stats_.wait_seconds += seconds_since(waiting);
    };
    const auto send_block = [&](const Tensor& local, int peer, int message) {
      const Tensor block = local.contiguous();
      outbox.push_back(comm.isend(block.raw_data(), block.numel(), block.dtype(), peer, message));
      outbox.back().keep_alive(block.storage());
      stats_.bytes_sent += block.numel() * itemsize(block.dtype());
    };
    // Moves a tensor across a boundary as the direct exchange of its blocks: each piece of a
    // destination block from one source rank holding it. Both sides compute the same transfers,
    // each only its own.
    const auto send_pieces = [&](const Tensor& local, const Layout& from, const Layout& to, int message) {
      for (const Transfer& t : exchange_transfers(from, to, rank()))
        if (t.src_rank == rank()) send_block(piece_of_block(local, from, coordinate, t.block), t.dst_rank, message);
    };
    const auto receive_pieces = [&](const Layout& from, const Layout& to, int message) {
      Tensor local = empty(to.local_shape(coordinate), to.dtype());
      std::vector<std::pair<Tensor, Block>> pieces;
      std::vector<Work> works;
      for (const Transfer& t : exchange_transfers(from, to, rank())) {
        if (t.dst_rank != rank()) continue;
        Tensor piece = empty(t.block.shape(), to.dtype());
        works.push_back(comm.irecv(piece.raw_data(), piece.numel(), piece.dtype(), t.src_rank, message));
        works.back().keep_alive(piece.storage());
        stats_.bytes_received += piece.numel() * itemsize(piece.dtype());
        pieces.emplace_back(piece, t.block);
      }
      for (const Work& w : works) wait(w);
      for (const auto& [piece, box] : pieces) piece_of_block(local, to, coordinate, box).copy_(piece);
      return local;
    };
    const auto forward = [&](int64_t c, int64_t i) {
      DTensor x;
      if (c == 0) {
        x = inputs[static_cast<size_t>(i)];
      } else {
        // The header (the activation's layout on the previous stage) first, from the rank of the
        // previous stage that serves this one; then the pieces of this rank's block.
        const MeshSpec& previous = mesh_of(c - 1);
        const int from_rank = previous.ranks()[index % previous.ranks().size()];
        int64_t length = 0;
        wait(comm.irecv(&length, 1, DType::i64, from_rank, tag(c - 1, n, i, kHeaderLength)));
        std::vector<int64_t> words(static_cast<size_t>(length));
        wait(comm.irecv(words.data(), length, DType::i64, from_rank, tag(c - 1, n, i, kHeader)));
        stats_.bytes_received += (1 + length) * 8;
        // [layout length, layout words, the input's batch pieces]
        const auto layout_end = words.begin() + 1 + words.front();
        const Layout from = WordReader(std::vector<int64_t>(words.begin() + 1, layout_end), "stage boundary").layout(previous);
        input_pieces.assign(layout_end, words.end());
        const Layout to = layout_on_mesh(from, spec);
        x = DTensor(receive_pieces(from, to, tag(c - 1, n, i, kActivation)), mesh, to);
        source_layouts[static_cast<size_t>(c)][static_cast<size_t>(i)] = from;
        if (is_floating(x.dtype())) x.requires_grad_();
      }
      received[static_cast<size_t>(c)][static_cast<size_t>(i)] = x;
      DTensor y = stages_[static_cast<size_t>(c)].forward(x);
      if (c + 1 == count) {
        const DTensor t = target_of(i);
        const int64_t rows = target.shape()[options_.batch_dim];
        const double share = rows > 0 ? static_cast<double>(t.shape()[options_.batch_dim]) / static_cast<double>(rows) : 1.0;
        // An empty microbatch (fewer rows than microbatches) adds nothing, but still runs its
        // backward so the stages before it exchange its (zero) gradients.
        const DTensor loss = share > 0 ? loss_(y, t) * Scalar(share) : sum(y) * Scalar(0.0);
        produced[static_cast<size_t>(c)][static_cast<size_t>(i)] = loss;
        loss_total = loss_total.defined() ? loss_total + loss.detach() : loss.detach();
        return;
      }
      // A Partial activation is reduced on this stage first: blocks of values cross the boundary.
      y = y.redistribute(mesh, gradient_layout(y.layout()));  // no-op without a Partial
      const MeshSpec& next = mesh_of(c + 1);
      const std::vector<int64_t> layout = layout_words(y.layout());
      auto header = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(layout.size()));
      header->insert(header->end(), layout.begin(), layout.end());
      header->insert(header->end(), input_pieces.begin(), input_pieces.end());
      auto length = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(header->size()));
      for (size_t j = index; j < next.ranks().size(); j += spec.ranks().size()) {
        const int to_rank = next.ranks()[j];
        outbox.push_back(comm.isend(length->data(), 1, DType::i64, to_rank, tag(c, n, i, kHeaderLength)));
        outbox.back().keep_alive(length);
        outbox.push_back(comm.isend(header->data(), static_cast<int64_t>(header->size()), DType::i64, to_rank,
                                    tag(c, n, i, kHeader)));
        outbox.back().keep_alive(header);
        stats_.bytes_sent += static_cast<int64_t>(1 + header->size()) * 8;
      }
      send_pieces(y.to_local(), y.layout(), layout_on_mesh(y.layout(), next), tag(c, n, i, kActivation));
      produced[static_cast<size_t>(c)][static_cast<size_t>(i)] = y;
    };
    const auto backward = [&](int64_t c, int64_t i) {
      DTensor& y = produced[static_cast<size_t>(c)][static_cast<size_t>(i)];
      if (c + 1 == count) {
        y.backward();
      } else {
        // The gradient comes back the way the activation went, block pieces in reverse.
        const Layout there = layout_on_mesh(y.layout(), mesh_of(c + 1));
        y.backward(DTensor(receive_pieces(there, y.layout(), tag(c, n, i, kGradient)), mesh, y.layout()));
      }
      DTensor& x = received[static_cast<size_t>(c)][static_cast<size_t>(i)];
      if (c > 0) {
        DTensor g = x.grad();
        if (g.defined() && g.layout().has_partial()) g = g.redistribute(mesh, gradient_layout(x.layout()));  // values cross
        send_pieces(g.defined() ? g.to_local() : zeros(x.to_local().shape(), x.dtype()), x.layout(),
                    source_layouts[static_cast<size_t>(c)][static_cast<size_t>(i)], tag(c - 1, n, i, kGradient));
      }
      y = DTensor();
      x = DTensor();
    };
    for (const PipelineAction& a : pipeline_actions(options_.schedule, mine_.front(), groups_, chunks, n)) {
      current = a;
      if (a.forward)
        forward(a.stage, a.microbatch);
      else
        backward(a.stage, a.microbatch);
    }
    current = PipelineAction{true, -1, -1};
    once.reset();  // the deferred gradient reductions
    for (const Work& w : outbox) wait(w);
    if (has_last) loss_value = loss_total.full_tensor().item<double>();
  }
  // Every rank learns the loss from the last stage's first rank.
  waiting_on_peer = true;
  comm.broadcast(&loss_value, 1, DType::f64, stages_.back().mesh.spec().ranks().front());
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
