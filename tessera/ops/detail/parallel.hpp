#pragma once
// Intra-op parallelism of the CPU kernels. A rank given several threads (set_blas_threads(n) or
// TESSERA_BLAS_THREADS=n, for fewer ranks than cores) runs BLAS on n threads and splits the
// kernels' independent iterations (attention's batch entries, a norm's rows, an elementwise
// pass's blocks) over n threads too: the calling thread and n - 1 pool threads. With one thread,
// the default (ranks are threads), everything runs inline on the caller.
//
// The split never changes a result: each iteration is computed as it would be inline.
#include <cstdint>
#include <functional>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace detail {

/// Runs fn(begin, end) over contiguous chunks covering [0, n) exactly once each, at most
/// blas_threads() chunks of at least `grain` iterations, and returns when all have run. Inline
/// (fn(0, n) on the caller) with one thread, for fewer than 2 * grain iterations, or while another
/// thread's parallel_for holds the pool. The first exception a chunk throws is rethrown here after
/// every chunk has finished.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace detail
}  // namespace tessera
