#pragma once
// Sharding of views (reshape, permute, expand, narrow): the layout an input must have and the
// layout of the result. Pure. A sharded dim keeps its sharding where it maps cleanly onto the
// result; otherwise the proposal asks for it replicated (a planned redistribution), never for a
// silently wrong layout. Partial placements pass through (views are linear).
#include <cstdint>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/op_rule.hpp>

namespace tessera TESSERA_API {

/// Dims reordered: result dim j is input dim dims[j]. Shard orders and sizes follow their dims.
/// `dims` must be a permutation of the input's dims (the caller validates).
OpProposal permute_proposal(const Layout& input, const std::vector<int64_t>& dims);

/// Reshape to `shape` (same element count; no -1). Groups of input and result dims with equal
/// products map onto each other; a sharded input dim keeps its sharding when it is the group's
/// outermost non-unit dim, no other dim of the group is sharded and every piece maps to whole
/// rows of the result's outermost dim (flattening a sharded leading dim; splitting a dim whose
/// outer factor is sharded). Uneven pieces become explicit sizes.
/// Example: [6, 4] as (S(0)) on 2 ranks -> [24] as (S(0)); [12] as (S(0)) -> [3, 4] when each
/// piece is a multiple of 4.
OpProposal reshape_proposal(const Layout& input, const Shape& shape);

/// Broadcast to `shape`: expanded unit dims must be replicated; new leading dims are unsharded.
OpProposal expand_proposal(const Layout& input, const Shape& shape);

/// [start, start + length) of `dim` (validated by the caller). No data moves: a sharded dim keeps
/// its placements and each piece is clipped, giving explicit sizes (ShardTensor-style uneven).
OpProposal narrow_proposal(const Layout& input, int64_t dim, int64_t start, int64_t length);

/// The explicit sizes of a layout (the dims that have them).
ShardSizes explicit_sizes(const Layout& layout);
/// The shard order of every sharded dim.
ShardOrder shard_orders(const Layout& layout);

}  // namespace tessera
