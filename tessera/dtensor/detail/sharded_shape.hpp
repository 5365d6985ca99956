#pragma once
// pad and roll along sharded dims by a row exchange (ops_shape_sharded.cpp); ops_shape.cpp routes
// here when a padded or rolled dim is sharded.
#include <tessera/core/scalar.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera::detail {

/// True when a dim padded (or cropped) by before/after is sharded in `layout`.
bool touches_sharded_dim(const Layout& layout, const DimVector& before, const DimVector& after);
/// pad(x, ...) for a validated spec: the unsharded dims pad locally, each sharded one by a row
/// exchange (its first and last pieces grow or shrink). x holds no P(sum) under a non-zero fill.
DTensor pad_sharded(const DTensor& x, const PadSpec& spec, PadMode mode, Scalar value);
/// roll(x, ...) with a shift per dim (roll_shifts): unsharded dims roll locally, each sharded one
/// by a row exchange; the layout stays.
DTensor roll_sharded(const DTensor& x, const DimVector& shifts);

}  // namespace tessera::detail
