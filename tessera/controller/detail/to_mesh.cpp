// Monarch's to_mesh on the workers: each worker of the target mesh receives the block of the
// source mesh's worker at its coordinates of the axes both meshes have (an axis only the target
// has broadcasts), point to point over the stream's copy of the mesh of every worker. A source
// worker sends its block to each target worker that maps to it, a header first (the source
// layout, or the source value's error), so a failed source fails the result on every target
// worker instead of leaving one waiting.
#include <tessera/controller/detail/worker.hpp>

#include <algorithm>
#include <memory>
#include <string>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/tags.hpp>
#include <tessera/comm/word_messages.hpp>
#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>
#include <tessera/sharding/mesh_move.hpp>

namespace tessera::controller::detail {

namespace {

constexpr int kLengthTag = kControllerMoveTags.first, kWordsTag = kLengthTag + 1, kDataTag = kLengthTag + 2;

// The source worker (world rank) of the target worker at `to_coordinate`: the source's
// coordinate on each axis is the target's on the axis of that name (0 on an axis of size 1 the
// target lacks; the controller refuses any other).
int source_of(const MeshSpec& from, const MeshSpec& to, const std::vector<int64_t>& to_coordinate) {
  std::vector<int64_t> at(static_cast<size_t>(from.ndim()), 0);
  for (int64_t d = 0; d < from.ndim(); ++d)
    for (int64_t e = 0; e < to.ndim(); ++e)
      if (to.names()[static_cast<size_t>(e)] == from.names()[static_cast<size_t>(d)])
        at[static_cast<size_t>(d)] = to_coordinate[static_cast<size_t>(e)];
  return from.rank_at(at);
}

// The result's layout: each target axis placed as the source axis of its name (a Partial too:
// each worker's value moves as it is), Replicate on the axes only the target has.
Layout target_layout(const Layout& source, const MeshSpec& to) {
  Placements carried;
  for (int64_t e = 0; e < to.ndim(); ++e) {
    const auto& names = source.mesh().names();
    const auto it = std::find(names.begin(), names.end(), to.names()[static_cast<size_t>(e)]);
    carried.push_back(it == names.end() ? Placement{Replicate{}}
                                        : source.placements()[static_cast<size_t>(it - names.begin())]);
  }
  Placements without_partial = source.placements();
  for (Placement& p : without_partial)
    if (is_partial(p)) p = Replicate{};
  return layout_on_mesh(source.with_placements(without_partial), to).with_placements(carried);
}

// The header: [1, source layout words...] or [0, the error's characters...].
std::vector<int64_t> header_of(const Value* value, const std::string& error) {
  std::vector<int64_t> words{error.empty() ? 1 : 0};
  if (error.empty())
    append_layout_words(value->tensor.layout(), words);
  else
    words.insert(words.end(), error.begin(), error.end());
  return words;
}

}  // namespace

void to_mesh(const ToMesh& c, WorkerShared& shared, StreamMeshes& meshes) {
  const DeviceMesh& from = meshes.at(c.from).working;
  const DeviceMesh& to = meshes.at(c.to).working;
  const DeviceMesh& all = meshes.at(c.all).working;
  Communicator& comm = all.comm(0);
  const auto& workers = all.spec().ranks();
  const auto peer = [&](int world_rank) {
    return static_cast<int>(std::find(workers.begin(), workers.end(), world_rank) - workers.begin());
  };
  const int me = rank();
  // The source side: this worker's block (or why it has none) to every target worker it feeds.
  std::vector<Work> sends;
  std::shared_ptr<const std::vector<int64_t>> header;
  Tensor block;
  if (from.is_member()) {
    std::string error = shared.unreadable(c.tensor, "to_mesh", "tensor");
    Value value;
    if (error.empty()) {
      value.tensor = shared.tensor(c.tensor, c.stream, meshes);
      block = value.tensor.to_local().contiguous();
    }
    header = std::make_shared<const std::vector<int64_t>>(header_of(&value, error));
    for (int target : to.spec().ranks()) {
      if (target == me || source_of(from.spec(), to.spec(), to.spec().coordinate_of(target)) != me) continue;
      for (Work& w : isend_words(comm, header, peer(target), kLengthTag, kWordsTag)) sends.push_back(std::move(w));
      if (error.empty() && block.numel() > 0) {
        sends.push_back(comm.isend(block.raw_data(), block.numel(), block.dtype(), peer(target), kDataTag));
        sends.back().keep_alive(block.storage());
      }
    }
  }
  // The target side: this worker's block from its source worker.
  if (to.is_member()) {
    Value out{{}, {}, c.stream, c.to};
    const int source = source_of(from.spec(), to.spec(), to.spec().coordinate_of(me));
    try {
      const std::vector<int64_t> words = source == me ? *header : recv_words(comm, peer(source), kLengthTag, kWordsTag);
      if (words.at(0) == 0) {
        out.error = std::string(words.begin() + 1, words.end());
      } else {
        const std::vector<int64_t> layout_part(words.begin() + 1, words.end());
        const Layout source_layout = WordReader(layout_part, "to_mesh").layout(from.spec());
        const Layout layout = target_layout(source_layout, to.spec());
        Tensor local;
        if (source == me) {
          local = block.clone();  // a value of its own: in-place ops on either must not reach the other
        } else {
          local = empty(source_layout.block(from.spec().coordinate_of(source)).shape(), source_layout.dtype());
          if (local.numel() > 0) comm.recv(local.raw_data(), local.numel(), local.dtype(), peer(source), kDataTag);
        }
        out.tensor = DTensor(local, to, layout);
      }
    } catch (const std::exception& e) {
      out.error = worker_error(e.what());
    }
    if (to.spec().ranks().front() == me) report(shared, c.layout_request, out);
    shared.store(c.output, std::move(out));
  }
  for (const Work& w : sends) w.wait();
}

}  // namespace tessera::controller::detail
