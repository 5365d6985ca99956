#pragma once
// What every rank keeps of its block when one layout becomes another on the same mesh, without
// visiting the ranks (docs/architecture.md, Plans at scale). Pure.
//
// A rank keeps, in each tensor dim, the overlap of the piece it holds and the piece it wants;
// both are picked by its coordinates on the mesh dims splitting that dim in either layout. Where
// two layouts split dims in crossing orders ((S(0), S(1)) -> (S(1), S(0))), the ranks' block
// geometry differs from coordinate to coordinate, yet few coordinates keep anything: the
// overlapping pairs of pieces of each dim are as many as the pieces, and joining them over the
// mesh dims they share lists exactly the coordinates that keep something. Every other coordinate
// keeps nothing and lacks its whole block, whose size and sources are products over dims.
#include <cstdint>
#include <optional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {
namespace detail {

/// Figures over the ranks of the mesh for the tensor dims `dims` of held -> want: a rank keeps
/// the product over those dims of its held and wanted pieces' overlap, wants the product of its
/// wanted pieces' lengths, and its wanted block overlaps the product of how many held pieces its
/// wanted pieces overlap (its source blocks). Sums are over every rank of the mesh.
struct KeptFigures {
  int64_t least_kept = 0;       // the least any rank keeps
  int64_t most_lacking = 0;     // the most any rank wants less what it keeps
  int64_t kept_sum = 0;         // kept, summed over the ranks
  int64_t wanted_sum = 0;       // wanted, summed over the ranks
  int64_t keeping_blocks = -1;  // the most source blocks of a rank that keeps something; -1: none does
  int64_t empty_blocks = -1;    // the most source blocks of a rank that keeps nothing; -1: every rank keeps
};

/// KeptFigures by joining, dim by dim, the pairs of held and wanted pieces that overlap, over the
/// mesh dims they share: the coordinates that keep something. The others' figures are products
/// over dims of their wanted pieces'. nullopt where that would list more than `budget` pieces or
/// coordinates (the caller then visits classes of ranks). Layouts on one mesh.
std::optional<KeptFigures> kept_by_join(const Layout& held, const Layout& want, const std::vector<int64_t>& dims,
                                        int64_t budget);

/// KeptFigures where every tensor dim of `dims` split in either layout is split evenly in both,
/// into pieces one of whose lengths is a multiple of the other's (the others whole): a rank then
/// keeps its smaller piece or nothing, and the keepers are counted digit by digit over the mesh
/// dims (a rank's held and wanted pieces start at sums over its coordinates), visiting only the
/// digits that straddle the keeping interval's ends: a few per mesh dim, not one per rank.
/// nullopt otherwise, or past `budget` visits. Layouts on one mesh.
std::optional<KeptFigures> kept_by_digits(const Layout& held, const Layout& want, const std::vector<int64_t>& dims,
                                          int64_t budget);

}  // namespace detail
}  // namespace tessera
