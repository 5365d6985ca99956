#pragma once
// DeviceMesh: a cheap handle on a named grid of ranks and its communicators.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/mesh/mesh_spec.hpp>

namespace tessera TESSERA_API {

/// A named n-d grid of ranks (MeshSpec) plus, for the calling rank, one communicator per mesh
/// dim over the ranks that differ from it only in that coordinate, created once at construction
/// and shared by every copy of the handle; those over several dims at once are created when first
/// used (a mesh of n dims makes n + 1 at construction, not 2^n).
///
/// Every rank of the world constructs the same mesh (construction is collective over the world,
/// and so is flatten() over the mesh it is called on). A rank outside the mesh (a mesh over a
/// subset of the world, or a slice that excludes it) gets a handle whose queries of the mesh as
/// a whole work (shape, names, to_string) and whose per-rank uses (coordinate, comm, [] ...)
/// throw ShardingError naming the rank and the mesh.
/// Example: `DeviceMesh mesh({2, 2}, {"dp", "tp"});` prints `mesh[dp=2, tp=2]`.
class DeviceMesh {
 public:
  /// An empty handle: no ranks, no communicators (what a default-constructed DTensor holds).
  DeviceMesh();
  /// Ranks 0..N-1 row-major; N must equal world_size(). Collective over the world.
  /// Throws ShardingError for a shape/rank-count mismatch, duplicate or empty names, sizes < 1.
  DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> names);
  /// Explicit world ranks (row-major), possibly a subset of the world. Collective over the world.
  DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> names, std::vector<int> ranks);

  /// The pure description the sharding layer sees.
  const MeshSpec& spec() const;
  int64_t ndim() const { return spec().ndim(); }
  int64_t size() const { return spec().size(); }
  int64_t size(std::string_view axis) const { return spec().size(axis); }
  int64_t size(int64_t dim) const { return spec().size(dim); }
  const std::vector<std::string>& axis_names() const { return spec().names(); }
  /// True if the calling rank is one of the mesh's ranks.
  bool is_member() const;
  /// The calling rank's coordinates. Throws ShardingError for a rank outside the mesh.
  std::vector<int64_t> coordinate() const;
  /// The calling rank's index along one axis.
  int64_t coordinate(std::string_view axis) const;
  /// Communicator of one mesh dim through the calling rank (group rank = coordinate on that dim).
  Communicator& comm(int64_t dim) const;
  Communicator& comm(std::string_view axis) const { return comm(spec().dim_of(axis, "DeviceMesh::comm")); }
  std::shared_ptr<Communicator> comm_ptr(int64_t dim) const;
  /// Communicator over the ranks that differ from the calling rank only in `dims` (ascending;
  /// group rank = row-major index over them), for collectives spanning several mesh dims at
  /// once. Made on the first call for a set of two or more dims (not all): collective over the
  /// mesh's ranks, which all make that call, as in the step that needs it; then cached and shared
  /// by copies of the handle, with no communication. Like the mesh's other communicators, one
  /// thread of a rank uses it at a time (duplicate() for another thread). Throws CommError if the
  /// mesh failed (abort, or a slice of a failed mesh).
  std::shared_ptr<Communicator> comm_ptr(const std::vector<int64_t>& dims) const;
  /// Communicator over exactly the mesh's ranks (group rank = index in spec().ranks()), or null on
  /// ranks outside the mesh and for a 0-d slice; callers then fall back to point-to-point
  /// messages over the world. No communication. Throws CommError for a slice of several axes cut
  /// from a failed mesh (its group could not be made).
  std::shared_ptr<Communicator> mesh_comm_ptr() const;

  /// The 1-d mesh along `axis` through the calling rank. No communication.
  DeviceMesh operator[](std::string_view axis) const;
  /// Fixes some coordinates (Monarch slice_mesh): the mesh of the remaining axes over the ranks
  /// at those coordinates. No communication, except for the first slice of this mesh that keeps
  /// a given set of two or more axes (not all): it makes the group over every such slice at once,
  /// collectively over this mesh's ranks, so every rank of the mesh slices (each at any
  /// coordinates, e.g. its own pipeline stage); later slices keeping those axes reuse it. Throws
  /// ShardingError for an unknown axis or a coordinate out of range.
  DeviceMesh slice(const std::map<std::string, int64_t>& at) const;
  /// The 1-d mesh over `axes` (row-major in the order given) through the calling rank, named
  /// `name` (default: the axis names joined by '_'). Collective over this mesh's whole world
  /// (every rank that built it); the result is cached, so later calls communicate no more.
  DeviceMesh flatten(const std::vector<std::string>& axes, std::string name = "") const;
  /// The same mesh over new communicators (MPI_Comm_dup of each): its collectives never meet
  /// this one's, so another thread of the rank (rank_thread) can communicate on it while this
  /// one is in use. Collective over every rank that built the mesh, as flatten.
  DeviceMesh duplicate() const;
  /// Fails every communicator of the mesh through the calling rank (Communicator::abort; a
  /// slice's, not its parent's): the
  /// ranks waiting in any of its collectives are released with CommError naming `reason`, and
  /// later collectives on it fail the same way (duplicate() before, for a fresh copy). Not
  /// collective.
  void abort(const std::string& reason) const;

  /// "mesh[dp=2, tp=2]".
  std::string to_string() const { return spec().to_string(); }


 private:
  struct State;  // the grid, the calling rank's place in it and its communicators
  static std::shared_ptr<State> construct(std::vector<int64_t> shape, std::vector<std::string> names,
                                          std::vector<int> ranks);
  explicit DeviceMesh(std::shared_ptr<State> state) : state_(std::move(state)) {}
  const State& member_state(const char* op) const;

  std::shared_ptr<State> state_;
};

}  // namespace tessera
