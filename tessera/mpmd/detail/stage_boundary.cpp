#include <tessera/mpmd/detail/stage_boundary.hpp>

#include <algorithm>
#include <chrono>
#include <memory>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/tags.hpp>
#include <tessera/comm/word_messages.hpp>
#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/block_exchange.hpp>
#include <tessera/sharding/layout_words.hpp>
#include <tessera/sharding/mesh_move.hpp>

namespace tessera::mpmd::detail {

namespace {

// The part of a rank's block (of `layout`, at `coordinate`) that a transfer's box covers.
Tensor piece_of_block(const Tensor& local, const Layout& layout, const std::vector<int64_t>& coordinate,
                      const Block& box) {
  const Block mine = layout.block(coordinate);
  Tensor piece = local;
  for (int64_t d = 0; d < layout.ndim(); ++d)
    piece = piece.narrow(d, box.begin[d] - mine.begin[d], box.end[d] - box.begin[d]);
  return piece;
}

}  // namespace

StageBoundary::StageBoundary(Communicator& comm, const MeshSpec& mesh, std::vector<int64_t> coordinate,
                             int64_t microbatches, PipelineStats& stats, bool& waiting_on_peer)
    : comm_(comm),
      mesh_(mesh),
      index_(static_cast<size_t>(std::find(mesh.ranks().begin(), mesh.ranks().end(), rank()) - mesh.ranks().begin())),
      coordinate_(std::move(coordinate)),
      microbatches_(microbatches),
      stats_(stats),
      waiting_on_peer_(waiting_on_peer) {}

// Each (boundary, microbatch) has four tags of its own; the Pipeline checks they fit the range.
int StageBoundary::tag(int64_t b, int64_t i, Kind kind) const {
  return kPipelineTags.first + static_cast<int>(4 * (b * microbatches_ + i)) + kind;
}

void StageBoundary::wait(const Work& w) {
  const auto start = std::chrono::steady_clock::now();
  waiting_on_peer_ = true;
  w.wait();
  waiting_on_peer_ = false;
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Each piece of a destination block from one source rank holding it. Both sides compute the
// same transfers, each only its own.
void StageBoundary::send_pieces(const Tensor& local, const Layout& from, const Layout& to, int message) {
  for (const Transfer& t : exchange_transfers(from, to, rank())) {
    if (t.src_rank != rank()) continue;
    const Tensor block = piece_of_block(local, from, coordinate_, t.block).contiguous();
    outbox_.push_back(comm_.isend(block.raw_data(), block.numel(), block.dtype(), t.dst_rank, message));
    outbox_.back().keep_alive(block.storage());
    stats_.bytes_sent += block.numel() * itemsize(block.dtype());
  }
}

Tensor StageBoundary::receive_pieces(const Layout& from, const Layout& to, int message) {
  Tensor local = empty(to.local_shape(coordinate_), to.dtype());
  std::vector<std::pair<Tensor, Block>> pieces;
  std::vector<Work> works;
  for (const Transfer& t : exchange_transfers(from, to, rank())) {
    if (t.dst_rank != rank()) continue;
    Tensor piece = empty(t.block.shape(), to.dtype());
    works.push_back(comm_.irecv(piece.raw_data(), piece.numel(), piece.dtype(), t.src_rank, message));
    works.back().keep_alive(piece.storage());
    stats_.bytes_received += piece.numel() * itemsize(piece.dtype());
    pieces.emplace_back(piece, t.block);
  }
  for (const Work& w : works) wait(w);
  for (const auto& [piece, box] : pieces) piece_of_block(local, to, coordinate_, box).copy_(piece);
  return local;
}

void StageBoundary::send_activation(int64_t b, int64_t i, const Tensor& local, const Layout& y, const MeshSpec& next,
                                    const std::vector<int64_t>& input_pieces) {
  // [layout length, layout words, the input's batch pieces], to each rank of `next` at this
  // rank's place modulo this mesh's size.
  const std::vector<int64_t> layout = layout_words(y);
  auto header = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(layout.size()));
  header->insert(header->end(), layout.begin(), layout.end());
  header->insert(header->end(), input_pieces.begin(), input_pieces.end());
  for (size_t j = index_; j < next.ranks().size(); j += mesh_.ranks().size()) {
    for (Work& w : isend_words(comm_, header, next.ranks()[j], tag(b, i, kHeaderLength), tag(b, i, kHeader)))
      outbox_.push_back(std::move(w));
    stats_.bytes_sent += static_cast<int64_t>(1 + header->size()) * 8;
  }
  send_pieces(local, y, layout_on_mesh(y, next), tag(b, i, kActivation));
}

StageBoundary::Arrival StageBoundary::receive_activation(int64_t b, int64_t i, const MeshSpec& previous) {
  // The header first, from the rank of the previous stage that serves this one.
  const int from_rank = previous.ranks()[index_ % previous.ranks().size()];
  const std::vector<int64_t> words =
      recv_words(comm_, from_rank, tag(b, i, kHeaderLength), tag(b, i, kHeader), [this](const Work& w) { wait(w); });
  stats_.bytes_received += static_cast<int64_t>(1 + words.size()) * 8;
  TESSERA_CHECK(!words.empty() && words.front() >= 0 && words.front() < static_cast<int64_t>(words.size()), CommError,
                "Pipeline::step", "a stage boundary header of ", words.size(), " words from world rank ", from_rank,
                " is cut short");
  const auto layout_end = words.begin() + 1 + words.front();
  Arrival arrival;
  arrival.sent = WordReader(std::vector<int64_t>(words.begin() + 1, layout_end), "stage boundary").layout(previous);
  arrival.input_pieces.assign(layout_end, words.end());
  arrival.layout = layout_on_mesh(arrival.sent, mesh_);
  arrival.local = receive_pieces(arrival.sent, arrival.layout, tag(b, i, kActivation));
  return arrival;
}

void StageBoundary::send_gradient(int64_t b, int64_t i, const Tensor& local, const Layout& here, const Layout& sent) {
  send_pieces(local, here, sent, tag(b, i, kGradient));
}

Tensor StageBoundary::receive_gradient(int64_t b, int64_t i, const Layout& there, const Layout& sent) {
  return receive_pieces(there, sent, tag(b, i, kGradient));
}

void StageBoundary::finish() {
  for (const Work& w : outbox_) wait(w);
  outbox_.clear();
}

}  // namespace tessera::mpmd::detail
