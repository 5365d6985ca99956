#include "stream_copy.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <initializer_list>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tessera::detail {

void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  // Streaming stores need 16-byte aligned destinations: copy up to the first aligned byte.
  size_t head = (16 - (reinterpret_cast<uintptr_t>(out) & 15)) & 15;
  if (head > bytes) head = bytes;
  std::memcpy(out, in, head);
  out += head;
  in += head;
  bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {  // one cache line per iteration: full-line writes combine
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 48), d);
  }
  std::memcpy(out + i, in + i, bytes - i);
  // Streaming stores are weakly ordered: fence them before the rendezvous that publishes them.
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

namespace {
// The kernel's view first (sysfs, what lscpu reports): virtual machines often report a far larger
// cache through cpuid, which sysconf reads (320 MiB for a 32 MiB L3 on the machine this was
// measured on). Then sysconf, then 32 MiB.
int64_t last_level_cache_bytes() {
  int64_t best_level = 0, bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int64_t level = 0, size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;  // "32768K" reads as 32768 then "K"
    if (!unit.empty() && (unit[0] == 'K' || unit[0] == 'k')) size <<= 10;
    if (!unit.empty() && unit[0] == 'M') size <<= 20;
    if (level > best_level) best_level = level, bytes = size;
  }
  if (bytes > 0) return bytes;
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long sys = sysconf(name);
    if (sys > 0) return sys;
  }
  return int64_t{32} << 20;
}
}  // namespace

bool streaming_pays(int64_t group_bytes) {
  // TESSERA_STREAMING_MIN_BYTES overrides the threshold (a huge value turns streaming off), for
  // measuring both ways on one machine.
  static const int64_t threshold = [] {
    const char* text = std::getenv("TESSERA_STREAMING_MIN_BYTES");
    return text && *text ? std::strtoll(text, nullptr, 10) : last_level_cache_bytes() / 2;
  }();
  return group_bytes >= threshold;
}

}  // namespace tessera::detail
