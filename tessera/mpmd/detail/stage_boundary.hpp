#pragma once
// The protocol across a pipeline's stage boundaries, for one rank and one step. Microbatch i's
// activation crosses the boundary after stage b as a header (its layout on stage b's mesh and the
// input's pieces along the batch dim, a length and then the words) and the pieces of each
// destination block, straight from the source ranks holding them (the planner's direct
// exchange; between meshes of one shape, rank to rank at the same coordinates); its gradient
// comes back the same way in reverse. Sends never block: they stay in flight, each keeping its
// buffer alive, until finish(). Pipeline::step drives it.
#include <cstdint>
#include <vector>

#include <tessera/comm/work.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/mesh/mesh_spec.hpp>
#include <tessera/mpmd/pipeline.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera {
class Communicator;
}

namespace tessera::mpmd::detail {

class StageBoundary {
 public:
  /// This rank's end of every boundary of a step of `microbatches`: it runs on `mesh` (at
  /// `coordinate`); `stats` counts the bytes and the time spent waiting, `waiting_on_peer` says
  /// while a receive waits (what an error then names).
  StageBoundary(Communicator& comm, const MeshSpec& mesh, std::vector<int64_t> coordinate, int64_t microbatches,
                PipelineStats& stats, bool& waiting_on_peer);

  /// An activation that arrived: its block on this mesh in `layout`, the layout it left in, and
  /// the input's pieces along the batch dim (which rows the microbatch holds).
  struct Arrival {
    Tensor local;
    Layout layout, sent;
    std::vector<int64_t> input_pieces;
  };

  /// Sends microbatch i's activation `y` (no Partial) across the boundary after stage b to the
  /// ranks of `next` this rank serves.
  void send_activation(int64_t b, int64_t i, const Tensor& local, const Layout& y, const MeshSpec& next,
                       const std::vector<int64_t>& input_pieces);
  /// Receives microbatch i's activation across the boundary after stage b, from `previous`.
  Arrival receive_activation(int64_t b, int64_t i, const MeshSpec& previous);
  /// Sends the gradient of an activation that arrived in `here` back to the layout it was `sent` in.
  void send_gradient(int64_t b, int64_t i, const Tensor& local, const Layout& here, const Layout& sent);
  /// Receives the gradient of an activation sent in `sent` that arrived as `there`.
  Tensor receive_gradient(int64_t b, int64_t i, const Layout& there, const Layout& sent);
  /// Waits every send still in flight.
  void finish();

 private:
  enum Kind { kHeaderLength = 0, kHeader = 1, kActivation = 2, kGradient = 3 };
  int tag(int64_t b, int64_t i, Kind kind) const;
  void wait(const Work& w);
  void send_pieces(const Tensor& local, const Layout& from, const Layout& to, int message);
  Tensor receive_pieces(const Layout& from, const Layout& to, int message);

  Communicator& comm_;
  const MeshSpec& mesh_;
  size_t index_;  // this rank's place in mesh_.ranks()
  std::vector<int64_t> coordinate_;
  int64_t microbatches_;
  PipelineStats& stats_;
  bool& waiting_on_peer_;
  std::vector<Work> outbox_;
};

}  // namespace tessera::mpmd::detail
