#pragma once
// One rule for the per-spatial-dim arguments of window and resampling ops (kernel, stride,
// padding, dilation, output sizes), torch's int-or-tuple: one value for every spatial dim, or one
// per dim. The ops layer's convolutions, pools and interpolation and the domain layer's sharded
// forms of them all parse their arguments here.
#include <cstdint>
#include <vector>

namespace tessera::detail {

/// `values` as one per spatial dim: a single value repeated, or `spatial` values as given. Throws
/// ValueError naming `op`: "stride [1, 1, 1] has 3 values; expected 1 or 2".
std::vector<int64_t> per_spatial_dim(const std::vector<int64_t>& values, int64_t spatial, const char* op,
                                     const char* what);

}  // namespace tessera::detail
