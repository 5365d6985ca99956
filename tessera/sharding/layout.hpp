#pragma once
// Layout: where every element of a global tensor lives on a mesh. Pure: metadata only, no
// communication, no tensor data; the redistribute planner and DTensor build on it.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/dtype.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/mesh/mesh_spec.hpp>
#include <tessera/sharding/placement.hpp>

namespace tessera TESSERA_API {

/// A box of the global index space: [begin[d], end[d]) per tensor dim. Value type.
/// Example: `[0:3, 0:2]`.
struct Block {
  DimVector begin;
  DimVector end;
  Shape shape() const;
  int64_t numel() const { return shape().numel(); }
  /// The overlap of two blocks (possibly empty).
  Block intersect(const Block& other) const;
  std::string to_string() const;
  friend bool operator==(const Block&, const Block&) = default;
};

/// Per tensor dim, the mesh dims that shard it, in splitting order (absent: ascending mesh dim).
using ShardOrder = std::map<int64_t, std::vector<int64_t>>;
/// Per tensor dim, explicit piece sizes (PhysicsNeMo `sharding_shapes`), one per piece in
/// splitting order (the mixed-radix index over the shard order's mesh dims).
using ShardSizes = std::map<int64_t, std::vector<int64_t>>;

/// Global shape, dtype, mesh and placements, plus per tensor dim the ordered list of mesh dims
/// that shard it and the size of every piece. Several mesh dims sharding one tensor dim nest:
/// the first splits the dim into chunks, the next splits each chunk again (torch.chunk
/// semantics: chunk c = ceil(L/k), trailing pieces short or empty). Immutable value.
///
/// Constraints: one placement per mesh dim; shard dims in [-ndim, ndim) (normalised); a shard
/// order lists exactly the mesh dims sharding that tensor dim; explicit sizes have one
/// non-negative entry per piece and add up to the dim's size.
/// Example: `[18, 2] f32 on mesh[dp=4, tp=2] as (S(0), S(0))` gives rank (dp=1, tp=1) rows [8, 10).
class Layout {
 public:
  Layout();
  /// Throws ShardingError naming the layout in its text form for any broken constraint.
  Layout(Shape global_shape, DType dtype, MeshSpec mesh, Placements placements, ShardOrder shard_order = {},
         ShardSizes sizes = {});

  const Shape& global_shape() const { return data_->global_shape; }
  DType dtype() const { return data_->dtype; }
  const MeshSpec& mesh() const { return data_->mesh; }
  const Placements& placements() const { return data_->placements; }
  int64_t ndim() const { return data_->global_shape.size(); }

  /// Mesh dims sharding tensor dim `dim`, in splitting order (empty when not sharded).
  const std::vector<int64_t>& shard_order(int64_t dim) const { return data_->orders[static_cast<size_t>(dim)]; }
  /// Number of pieces of tensor dim `dim`: the product of the sizes of the mesh dims sharding it.
  int64_t piece_count(int64_t dim) const { return data_->counts[dim]; }
  /// Sizes of the pieces of tensor dim `dim` in splitting order ({size} when not sharded). Built
  /// on each call (O(piece_count)): chunk pieces are not stored, piece_range gives one.
  std::vector<int64_t> piece_sizes(int64_t dim) const;
  /// [begin, end) of piece `piece` (splitting order) of tensor dim `dim`, in O(mesh dims).
  std::pair<int64_t, int64_t> piece_range(int64_t dim, int64_t piece) const;
  /// The largest piece of tensor dim `dim`.
  int64_t max_piece_size(int64_t dim) const;
  /// Elements of the largest block of any rank, without visiting the ranks.
  int64_t max_block_numel() const;
  /// True when piece sizes were given explicitly rather than by chunk semantics.
  bool has_explicit_sizes(int64_t dim) const {
    return !data_->pieces.empty() && !data_->pieces[static_cast<size_t>(dim)].empty();
  }
  /// The shard orders the constructor needs to rebuild this layout: the dims split over more
  /// than one mesh dim (empty when every order is the default).
  ShardOrder shard_orders() const;
  /// The explicit piece sizes, as the constructor takes them (dims with chunk sizes left out).
  ShardSizes explicit_sizes() const;
  /// True when any mesh dim holds a Partial.
  bool has_partial() const;
  /// True when every placement is Replicate (or the mesh has no dims).
  bool is_replicated() const;

  /// The block of the rank at a mesh coordinate. Throws ShardingError if the coordinate is out of range.
  Block block(const std::vector<int64_t>& coordinate) const;
  /// The block of a world rank of the mesh. Throws ShardingError if the rank is not in the mesh.
  Block block_of_rank(int world_rank) const;
  /// Shape of the local piece at a coordinate.
  Shape local_shape(const std::vector<int64_t>& coordinate) const { return block(coordinate).shape(); }
  /// Global index of the local piece's first element, as PyTorch's
  /// compute_local_shape_and_global_offset gives it: a piece empty along a sharded dim sits at
  /// the dim's size there (out of bounds, so it never aliases a real offset), in every shard
  /// order. (block() keeps an empty piece where its parent piece ends, which views need.)
  DimVector global_offset(const std::vector<int64_t>& coordinate) const;

  /// The same layout with other placements (shard order and explicit sizes kept where they still
  /// apply: a mesh dim newly sharding a tensor dim with explicit pieces splits each piece, by
  /// chunk semantics, innermost; inner mesh dims that stop sharding it merge their pieces back).
  Layout with_placements(Placements placements) const;

  /// The same layout for a tensor of another dtype.
  Layout with_dtype(DType dtype) const;
  /// "[8, 6] f32 on mesh[dp=2, tp=2] as (S(0), R)", plus " order {0: [1, 0]}" for a
  /// non-default shard order and " sizes {0: [3, 5]}" for explicit sizes.
  std::string to_string() const;
  /// Hash of the whole layout, computed once at construction (dispatch caches key on it).
  size_t hash() const { return data_->hash; }

  friend bool operator==(const Layout& a, const Layout& b) {
    if (a.data_ == b.data_) return true;
    const Data& x = *a.data_;
    const Data& y = *b.data_;
    return x.hash == y.hash && x.global_shape == y.global_shape && x.dtype == y.dtype && x.mesh == y.mesh &&
           x.placements == y.placements && x.orders == y.orders && x.pieces == y.pieces;
  }

 private:
  // Immutable once built and shared by copies: the planner and the dispatcher copy layouts
  // often, and a copy is then a reference count rather than a dozen vectors.
  struct Data {
    Shape global_shape;
    DType dtype = DType::f32;
    MeshSpec mesh;
    Placements placements;
    std::vector<std::vector<int64_t>> orders;  // per tensor dim
    DimVector counts;                          // per tensor dim: pieces
    // Explicit piece sizes per tensor dim (empty for chunk pieces, which are computed, so a
    // layout's size is O(mesh dims), not O(ranks), unless the user gave every piece's size).
    // Both lists stay empty unless some dim has explicit sizes: most layouts have none, and the
    // dispatcher builds many per miss.
    std::vector<std::vector<int64_t>> pieces;
    std::vector<std::vector<int64_t>> starts;  // prefix sums of pieces
    size_t hash = 0;
  };
  std::shared_ptr<const Data> data_;
};

/// Sizes of torch.chunk-style pieces of `length` split by each of `splits` in turn.
/// Example: chunk_sizes(4, {2, 3}) == [1, 1, 0, 1, 1, 0].
std::vector<int64_t> chunk_sizes(int64_t length, const std::vector<int64_t>& splits);

/// The sizes along tensor dim `dim` of the pieces of a dim sharded over `order` (mesh dims in
/// splitting order), read off per-rank local shapes given in the order of mesh.ranks(): piece p
/// (mixed radix over `order`) is the local of the rank at those coordinates and 0 on the other
/// mesh dims. What explicit sizes inferred from locals (PhysicsNeMo sharding_shapes="infer",
/// torch_xla disable_manual_sharding) are built from.
/// The piece of a tensor dim split over the mesh dims `order` (splitting order, major first) that
/// the rank at `coordinate` holds: the mixed-radix number of its coordinates on those mesh dims.
/// Example: order [1, 0] on mesh[dp=2, tp=3]: coordinate (dp=1, tp=2) holds piece 2 * 2 + 1 = 5.
int64_t piece_of(const MeshSpec& mesh, const std::vector<int64_t>& order, const std::vector<int64_t>& coordinate);
/// The inverse of piece_of on the order's mesh dims: the coordinate (0 on every other mesh dim)
/// that holds `piece`.
std::vector<int64_t> piece_coordinate(const MeshSpec& mesh, const std::vector<int64_t>& order, int64_t piece);

std::vector<int64_t> pieces_from_local_shapes(const MeshSpec& mesh, const std::vector<std::vector<int64_t>>& shapes,
                                              const std::vector<int64_t>& order, int64_t dim);

}  // namespace tessera

template <>
struct std::hash<tessera::Layout> {
  size_t operator()(const tessera::Layout& layout) const noexcept;
};
