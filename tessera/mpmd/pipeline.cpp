// The pipeline's step: each rank runs its stage's schedule. Sends never block (isend, waited at
// the end of the step), so a rank only waits for what its next action reads: the activation from
// the stage before (a forward) or the gradient from the stage after (a backward). Both schedules
// order those waits so that no cycle forms.
#include <tessera/mpmd/pipeline.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <sstream>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/detail/layout_wire.hpp>
#include <tessera/mpmd/microbatch.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::mpmd {

namespace {

// Microbatch i's messages: header length, header, activation, gradient.
constexpr int kTagBase = 1 << 20;
int tag(int64_t microbatch, int kind) { return kTagBase + static_cast<int>(4 * microbatch) + kind; }
enum Kind { kHeaderLength = 0, kHeader = 1, kActivation = 2, kGradient = 3 };

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sends in flight and the buffers they read, kept until the end of the step.
struct Outbox {
  std::vector<Work> works;
  std::vector<Tensor> blocks;
  std::vector<std::shared_ptr<std::vector<int64_t>>> headers;

  void wait() {
    for (const Work& w : works) w.wait();
    works.clear();
  }
};

// A rank's view of its stage's neighbours: the world ranks at its coordinates in the stages
// before and after (-1 at the ends).
struct Neighbours {
  int previous = -1, next = -1;
};

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

Pipeline::Pipeline(std::vector<Stage> stages, Loss loss, PipelineOptions options)
    : stages_(std::move(stages)), loss_(std::move(loss)), options_(options) {
  TESSERA_CHECK(!stages_.empty(), ShardingError, "Pipeline", "no stages");
  TESSERA_CHECK(options_.microbatches >= 1, ValueError, "Pipeline", "microbatches = ", options_.microbatches,
                "; need at least 1");
  std::set<int> seen;
  const MeshSpec& first = stages_.front().mesh.spec();
  for (size_t s = 0; s < stages_.size(); ++s) {
    const MeshSpec& spec = stages_[s].mesh.spec();
    TESSERA_CHECK(spec.shape() == first.shape(), ShardingError, "Pipeline", "stage ", s, "'s mesh ", spec.to_string(),
                  " differs in shape from stage 0's ", first.to_string(),
                  "; stage boundaries move blocks between the ranks at the same coordinates");
    for (int r : spec.ranks())
      TESSERA_CHECK(seen.insert(r).second, ShardingError, "Pipeline", "world rank ", r, " is in two stages (stage ",
                    s, "'s mesh ", spec.to_string(), ")");
    TESSERA_CHECK(static_cast<bool>(stages_[s].forward), ShardingError, "Pipeline", "stage ", s, " has no forward");
    if (stages_[s].mesh.is_member()) me_ = static_cast<int64_t>(s);
  }
}

std::string Pipeline::describe() const {
  std::ostringstream out;
  const int64_t n = options_.microbatches, count = stages();
  for (int64_t s = 0; s < count; ++s) {
    out << "stage " << s << ":";
    for (const auto& [forward, i] : schedule_actions(options_.schedule, s, count, n)) out << ' ' << (forward ? 'F' : 'B') << i;
    out << '\n';
  }
  return out.str();
}

double Pipeline::step(const DTensor& input, const DTensor& target) {
  const auto start = Clock::now();
  stats_ = PipelineStats{};
  const int64_t count = stages(), n = options_.microbatches;
  stats_.ideal_bubble = static_cast<double>(count - 1) / static_cast<double>(n + count - 1);
  Communicator& comm = world();
  double loss_value = 0;
  if (me_ >= 0) {
    const Stage& stage = stages_[static_cast<size_t>(me_)];
    const DeviceMesh& mesh = stage.mesh;
    const MeshSpec& spec = mesh.spec();
    const auto index = static_cast<size_t>(std::find(spec.ranks().begin(), spec.ranks().end(), rank()) - spec.ranks().begin());
    Neighbours peers;
    if (me_ > 0) peers.previous = stages_[static_cast<size_t>(me_ - 1)].mesh.spec().ranks()[index];
    if (me_ + 1 < count) peers.next = stages_[static_cast<size_t>(me_ + 1)].mesh.spec().ranks()[index];
    const bool first = me_ == 0, last = me_ + 1 == count;
    std::vector<DTensor> inputs, targets;
    if (first) {
      TESSERA_CHECK(input.defined() && input.layout().mesh() == spec, ShardingError, "Pipeline::step", "the input ",
                    input.defined() ? input.layout().to_string() : "(undefined)", " is not on stage 0's mesh ",
                    spec.to_string());
      inputs = split_microbatches(input, options_.batch_dim, n);
    }
    if (last) {
      TESSERA_CHECK(target.defined() && target.layout().mesh() == spec, ShardingError, "Pipeline::step",
                    "the target ", target.defined() ? target.layout().to_string() : "(undefined)",
                    " is not on the last stage's mesh ", spec.to_string());
      targets = split_microbatches(target, options_.batch_dim, n);
    }
    std::vector<DTensor> received(static_cast<size_t>(n)), produced(static_cast<size_t>(n));
    DTensor loss_total;
    Outbox outbox;
    const auto wait = [&](const Work& w) {
      const auto waiting = Clock::now();
      w.wait();
      stats_.wait_seconds += seconds_since(waiting);
    };
    const auto send_block = [&](const Tensor& local, int peer, int message) {
      const Tensor block = local.contiguous();
      outbox.blocks.push_back(block);
      outbox.works.push_back(comm.isend(block.raw_data(), block.numel(), block.dtype(), peer, message));
      stats_.bytes_sent += block.numel() * itemsize(block.dtype());
    };
    const auto forward = [&](int64_t i) {
      DTensor x;
      if (first) {
        x = inputs[static_cast<size_t>(i)];
      } else {
        // The header (the activation's layout) first: it sizes the block that follows.
        int64_t length = 0;
        wait(comm.irecv(&length, 1, DType::i64, peers.previous, tag(i, kHeaderLength)));
        std::vector<int64_t> words(static_cast<size_t>(length));
        wait(comm.irecv(words.data(), length, DType::i64, peers.previous, tag(i, kHeader)));
        const Layout layout = detail::decode_layout(words, spec);
        Tensor block = empty(layout.local_shape(mesh.coordinate()), layout.dtype());
        wait(comm.irecv(block.raw_data(), block.numel(), block.dtype(), peers.previous, tag(i, kActivation)));
        stats_.bytes_received += (1 + length) * 8 + block.numel() * itemsize(block.dtype());
        x = DTensor(block, mesh, layout);
        if (is_floating(x.dtype())) x.requires_grad_();
      }
      received[static_cast<size_t>(i)] = x;
      const DTensor y = stage.forward(x);
      if (last) {
        const DTensor& t = targets[static_cast<size_t>(i)];
        const int64_t rows = target.shape()[options_.batch_dim];
        const double share = rows > 0 ? static_cast<double>(t.shape()[options_.batch_dim]) / static_cast<double>(rows) : 1.0;
        // An empty microbatch (fewer rows than microbatches) adds nothing, but still runs its
        // backward so the stages before it exchange its (zero) gradients.
        const DTensor loss = share > 0 ? loss_(y, t) * Scalar(share) : sum(y) * Scalar(0.0);
        produced[static_cast<size_t>(i)] = loss;
        loss_total = loss_total.defined() ? loss_total + loss.detach() : loss.detach();
        return;
      }
      auto header = std::make_shared<std::vector<int64_t>>(detail::encode_layout(y.layout()));
      auto length = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(header->size()));
      outbox.headers.push_back(length);
      outbox.headers.push_back(header);
      outbox.works.push_back(comm.isend(length->data(), 1, DType::i64, peers.next, tag(i, kHeaderLength)));
      outbox.works.push_back(comm.isend(header->data(), static_cast<int64_t>(header->size()), DType::i64, peers.next,
                                        tag(i, kHeader)));
      stats_.bytes_sent += static_cast<int64_t>(1 + header->size()) * 8;
      send_block(y.to_local(), peers.next, tag(i, kActivation));
      produced[static_cast<size_t>(i)] = y;
    };
    const auto backward = [&](int64_t i) {
      DTensor& y = produced[static_cast<size_t>(i)];
      if (last) {
        y.backward();
      } else {
        const Layout grad_layout = gradient_layout(y.layout());
        Tensor grad = empty(grad_layout.local_shape(mesh.coordinate()), y.dtype());
        wait(comm.irecv(grad.raw_data(), grad.numel(), grad.dtype(), peers.next, tag(i, kGradient)));
        stats_.bytes_received += grad.numel() * itemsize(grad.dtype());
        y.backward(DTensor(grad, mesh, grad_layout));
      }
      if (!first) {
        const DTensor& x = received[static_cast<size_t>(i)];
        const DTensor g = x.grad();
        send_block(g.defined() ? g.to_local() : zeros(x.to_local().shape(), x.dtype()), peers.previous,
                   tag(i, kGradient));
      }
      y = DTensor();
      received[static_cast<size_t>(i)] = DTensor();
    };
    for (const auto& [is_forward, i] : schedule_actions(options_.schedule, me_, count, n)) {
      if (is_forward)
        forward(i);
      else
        backward(i);
    }
    outbox.wait();
    if (last) loss_value = loss_total.full_tensor().item<double>();
  }
  // Every rank learns the loss from the last stage's first rank.
  comm.broadcast(&loss_value, 1, DType::f64, stages_.back().mesh.spec().ranks().front());
  stats_.step_seconds = seconds_since(start);
  return loss_value;
}

}  // namespace tessera::mpmd
