#pragma once
// MeshSpec: the pure description of a device mesh (shape, axis names, ranks). What the
// sharding layer sees; no communicators, no runtime.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/shape.hpp>

namespace tessera TESSERA_API {

/// Ranks laid out on a named n-d grid, row-major. Immutable value; copies share the description
/// (layouts copy their mesh often: a copy is a reference count, not three vectors).
/// Constraints: one name per dim, names unique and non-empty, sizes >= 1, one world rank per
/// grid point, ranks distinct and >= 0. A 0-d mesh holds one rank.
/// Example: `mesh[dp=2, tp=2]` over ranks [0, 1, 2, 3]: rank 2 is at (dp=1, tp=0).
class MeshSpec {
 public:
  MeshSpec();
  /// Ranks default to 0..size-1. Throws ShardingError naming the mesh for any broken constraint.
  MeshSpec(Shape shape, std::vector<std::string> names, std::vector<int> ranks = {});

  const Shape& shape() const { return data_->shape; }
  const std::vector<std::string>& names() const { return data_->names; }
  /// World rank at each grid point, row-major.
  const std::vector<int>& ranks() const { return data_->ranks; }
  int64_t ndim() const { return data_->shape.size(); }
  int64_t size() const { return static_cast<int64_t>(data_->ranks.size()); }
  int64_t size(int64_t dim) const;
  int64_t size(std::string_view axis) const { return data_->shape[dim_of(axis, "DeviceMesh::size")]; }
  /// Index of the named axis. Throws ShardingError naming `call` (the user's), the axis, the mesh
  /// and its axes if unknown.
  int64_t dim_of(std::string_view axis, std::string_view call = "DeviceMesh") const;
  /// True if world_rank is one of the mesh's ranks.
  bool contains(int world_rank) const;
  /// Grid coordinates of world_rank (a table lookup). Throws ShardingError if it is not in the mesh.
  const std::vector<int64_t>& coordinate_of(int world_rank) const;
  /// World rank at coordinates. Throws ShardingError if out of range.
  int rank_at(const std::vector<int64_t>& coordinate) const;
  /// The coordinates that differ from `coordinate` only along `dims`, in group-rank order
  /// (row-major over `dims` as given): the group a collective over those mesh dims spans.
  std::vector<std::vector<int64_t>> group(std::vector<int64_t> coordinate, const std::vector<int64_t>& dims) const;
  /// "mesh[dp=2, tp=2]"; ranks are shown when they are not 0..size-1: "mesh[tp=2] ranks [4, 5]".
  std::string to_string() const;

  /// Equal shapes, names and ranks (a shared description compares at once).
  friend bool operator==(const MeshSpec& a, const MeshSpec& b) { return a.data_ == b.data_ || a.same_as(b); }
  /// Computed once, at construction.
  size_t hash() const { return data_->hash; }

 private:
  bool same_as(const MeshSpec& other) const;  // compares the contents
  struct Data {
    Shape shape;
    std::vector<std::string> names;
    std::vector<int> ranks;
    size_t hash = 0;
    std::vector<int64_t> index_of_rank;              // by world rank: position in ranks, or -1
    std::vector<std::vector<int64_t>> coordinates;  // by position in ranks
  };
  std::shared_ptr<const Data> data_;
};

}  // namespace tessera

template <>
struct std::hash<tessera::MeshSpec> {
  size_t operator()(const tessera::MeshSpec& mesh) const noexcept;
};
