#pragma once
// Classes of ranks with the same block geometry (docs/architecture.md, Plans at scale): the planner prices a step
// on one representative rank per class instead of on every rank. Pure.
//
// Under chunk semantics a mesh dim's coordinates fall into at most three runs along a tensor dim
// (full chunks, the remainder, empty chunks), and every coordinate of a run sees the same
// geometry, shifted: its blocks in every layout move by the same offset (or, in a layout that
// does not split the dim that deep, stay one block that contains them). An even split is one run.
// So a mesh of 16,384 ranks whose layouts are even is one class; chunked uneven dims give two
// or three classes per mesh dim. Mesh dims whose runs cannot be shown to shift alike (explicit
// piece sizes, or two layouts splitting one tensor dim in different orders) are enumerated
// coordinate by coordinate: linear in those mesh dims' sizes.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {
namespace detail {

/// Calls visit(coordinate, count) once per class of the ranks of `mesh` whose blocks in every
/// layout of `layouts` (all on `mesh`) have the same sizes and the same overlaps with each
/// other: `coordinate` is one rank of the class, `count` how many ranks it stands for. The
/// counts add up to the mesh's size. Pure. (The initializer-list forms spare the planner's hot
/// paths a vector per call; a visitor capturing much is best passed as std::ref(lambda).)
void for_each_rank_class(const MeshSpec& mesh, const std::vector<const Layout*>& layouts,
                         const std::function<void(const std::vector<int64_t>& coordinate, int64_t count)>& visit);
void for_each_rank_class(const MeshSpec& mesh, std::initializer_list<const Layout*> layouts,
                         const std::function<void(const std::vector<int64_t>& coordinate, int64_t count)>& visit);
/// for_each_rank_class that stops at the first class for which visit returns false; returns
/// false then, true when every class was visited. With `sample`, where the mesh dims listed
/// coordinate by coordinate would make more than 4096 classes, they give four of their
/// coordinates only (each with count 1): some ranks, not all, so what is found bounds a maximum
/// (and a sum) from below at a cost independent of those dims' sizes. With `varying` (one flag
/// per mesh dim), only the flagged mesh dims vary: the others stay at coordinate 0 and count
/// all their coordinates (for figures that do not depend on them).
bool for_each_rank_class_until(const MeshSpec& mesh, const std::vector<const Layout*>& layouts,
                               const std::function<bool(const std::vector<int64_t>& coordinate, int64_t count)>& visit,
                               bool sample = false, const std::vector<bool>& varying = {});
bool for_each_rank_class_until(const MeshSpec& mesh, std::initializer_list<const Layout*> layouts,
                               const std::function<bool(const std::vector<int64_t>& coordinate, int64_t count)>& visit,
                               bool sample = false, const std::vector<bool>& varying = {});

/// How many coordinates for_each_rank_class_until lists one by one for these arguments (the
/// product of the sizes of the mesh dims it cannot compress into runs), at most cap + 1: what
/// visiting the classes costs, without visiting them.
int64_t listed_coordinates(const MeshSpec& mesh, std::initializer_list<const Layout*> layouts,
                           const std::vector<bool>& varying, int64_t cap);

/// [begin, end) of tensor dim `dim` held at `coordinate` in `layout` ([0, size) when unsharded).
std::pair<int64_t, int64_t> dim_range(const Layout& layout, int64_t dim, const std::vector<int64_t>& coordinate);

/// The part of tensor dim `dim` that the pieces of `layout` at `coordinate` cover when the
/// coordinates of the mesh dims `group` vary (the others fixed), if that union is one interval
/// that the pieces tile: true when `group`'s mesh dims that split `dim` are the innermost ones of
/// its shard order (or none), which makes the union the piece one level up. Else nullopt.
std::optional<std::pair<int64_t, int64_t>> group_union(const Layout& layout, int64_t dim,
                                                       const std::vector<int64_t>& coordinate,
                                                       const std::vector<int64_t>& group);

/// Calls visit(coordinate) for every coordinate that differs from `coordinate` only on the mesh
/// dims `group` that split tensor dim `dim` in `layout` (one call when none do): the pieces of
/// `dim` a collective over `group` brings together. Stops early when visit returns false.
void for_each_group_piece(const Layout& layout, int64_t dim, std::vector<int64_t> coordinate,
                          const std::vector<int64_t>& group,
                          const std::function<bool(const std::vector<int64_t>& coordinate)>& visit);

/// Tensor dim `dim` of `layout` is not empty and split into pieces of one length (no explicit
/// sizes): a piece's range, and the pieces overlapping a range, are arithmetic.
bool evenly_split(const Layout& layout, int64_t dim);

/// Pieces of tensor dim `dim` of `layout` that overlap [begin, end) (non-empty overlap), as a
/// range of piece indices in splitting order [first, last) and the count of those that do (a
/// nested split may leave empty pieces between them). O(log pieces) plus the empty pieces' scan.
struct PieceSpan {
  int64_t first = 0, last = 0, overlapping = 0;
};
PieceSpan pieces_overlapping(const Layout& layout, int64_t dim, int64_t begin, int64_t end);

}  // namespace detail
}  // namespace tessera
