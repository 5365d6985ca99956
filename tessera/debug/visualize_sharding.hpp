#pragma once
// visualize_sharding: which rank holds which block of a 1-d or 2-d tensor, as a terminal table
// (JAX's visualize_array_sharding, PyTorch DTensor's visualize_sharding). Plain ASCII so it
// prints in any terminal and log.
#include <string>

#include <tessera/core/export.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

class DTensor;

/// The blocks of a 1-d or 2-d layout and the ranks holding each. Pure.
/// First line: the layout's text form, then " = " and its PartitionSpec when it has one (no
/// Partial): `... as (S(0), R) = P('a', None)`. Then a table: a 1-d tensor gives one row of cells, one per
/// distinct non-empty block in index order; a 2-d tensor gives a grid whose rows are the distinct
/// row ranges and whose columns are the distinct column ranges. Each cell shows its block and the
/// ranks whose block is exactly that cell (replicas listed together). A line per Partial mesh
/// dim and a line listing the ranks whose block is empty (uneven sharding) follow.
/// Throws ShardingError if the tensor is not 1-d or 2-d.
///
/// Example: `[4, 6] f32 on mesh[a=2, b=2] as (S(0), S(1))` gives
///   [4, 6] f32 on mesh[a=2, b=2] as (S(0), S(1)) = P('a', 'b')
///   +------------+------------+
///   | [0:2, 0:3] | [0:2, 3:6] |
///   | rank 0     | rank 1     |
///   +------------+------------+
///   | [2:4, 0:3] | [2:4, 3:6] |
///   | rank 2     | rank 3     |
///   +------------+------------+
std::string visualize_sharding(const Layout& layout);

/// visualize_sharding(t.layout()): the same on every rank, no communication. Pure.
/// Throws ShardingError if the tensor is not 1-d or 2-d.
std::string visualize_sharding(const DTensor& t);

}  // namespace tessera
