#pragma once
// Copies for collectives whose output does not fit in the cache: non-temporal ("streaming")
// stores write the destination straight to memory instead of first reading each line into the
// cache (read-for-ownership), which cuts the memory traffic of a copy from three passes to two.
// glibc's memcpy switches to such stores only above a threshold it derives from the cache size
// (240 MiB on a machine reporting a 320 MiB shared cache), far above the blocks of a collective.
#include <cstddef>
#include <cstdint>

namespace tessera::detail {

/// Copies `bytes` from src to dst (not overlapping) with non-temporal stores where the CPU has
/// them (x86-64: SSE2), then fences them, so another thread that synchronises with this one
/// afterwards sees the data. Elsewhere a plain memcpy.
void stream_copy(void* dst, const void* src, size_t bytes);

/// True when a call whose ranks write `group_bytes` in all is large enough that streaming stores
/// pay: it is at least half the last-level cache (sysfs, else sysconf, else 32 MiB), so the written data
/// would evict itself before anyone reads it back from the cache. TESSERA_STREAMING_MIN_BYTES
/// overrides the threshold.
bool streaming_pays(int64_t group_bytes);

}  // namespace tessera::detail
