#pragma once
// Elementwise reduction of whole buffers, shared by the backends.
#include <cstdint>

#include <tessera/core/dtype.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera::detail {

/// dst[i] = op over k of srcs[k][i], folded in k order (so every rank that runs it gets the same
/// bits). avg divides the sum by nsrc. 16-bit floats accumulate in f32 and round once. dst may
/// be one of the sources.
void reduce_buffers(void* dst, const void* const* srcs, int nsrc, int64_t count, DType dtype, ReduceOp op);

/// inout[i] = op(in[i], inout[i]) for sum/product/max/min (avg folds as sum: divide afterwards
/// with scale_for_avg). For MPI_Op callbacks and pairwise algorithms.
void reduce_pair(void* inout, const void* in, int64_t count, DType dtype, ReduceOp op);

/// buf[i] /= n (integers truncate toward zero): the last step of an avg built from sums.
void scale_for_avg(void* buf, int64_t count, DType dtype, int n);

}  // namespace tessera::detail
