#pragma once
// The point-to-point tags of the library's own messages, one named range each, checked at
// compile time not to overlap and to fit every backend's tags (kMaxP2pTag). A new kind of
// message takes a range here. User code sending on the same communicators keeps to the tags no
// range holds (below 1 << 20, other than 7 and 11 to 14).
#include <array>

#include <tessera/comm/communicator.hpp>

namespace tessera TESSERA_API {

/// Tags [first, end).
struct TagRange {
  int first;
  int end;
  constexpr int size() const { return end - first; }
};

/// A row exchange (halos, sharded pad and roll): one tag unless two are in flight at once.
inline constexpr TagRange kRowExchangeTags{7, 8};
/// Ring attention's four streams: keys, values and their gradients.
inline constexpr TagRange kRingAttentionTags{11, 15};
/// A task launch's two layout messages, for 4096 launches in flight.
inline constexpr TagRange kTaskTags{(1 << 20) - 2 * 4096, 1 << 20};
/// A pipeline's stage boundaries: four messages per (boundary, microbatch).
inline constexpr TagRange kPipelineTags{1 << 20, 1 << 27};
/// The controller: a command's length and words, then replies by request.
inline constexpr TagRange kControllerTags{1 << 27, (1 << 27) + 2 + (1 << 26)};
/// The controller's to_mesh: a block's header (length, words) and its data.
inline constexpr TagRange kControllerMoveTags{kControllerTags.end, kControllerTags.end + 3};

namespace detail {
inline constexpr std::array kLibraryTagRanges{kRowExchangeTags, kRingAttentionTags, kTaskTags,
                                              kPipelineTags,    kControllerTags,    kControllerMoveTags};
constexpr bool tag_ranges_disjoint_and_valid() {
  for (size_t i = 0; i < kLibraryTagRanges.size(); ++i) {
    const TagRange a = kLibraryTagRanges[i];
    if (a.first < 0 || a.size() <= 0 || a.end > kMaxP2pTag) return false;
    for (size_t j = i + 1; j < kLibraryTagRanges.size(); ++j) {
      const TagRange b = kLibraryTagRanges[j];
      if (a.first < b.end && b.first < a.end) return false;
    }
  }
  return true;
}
static_assert(tag_ranges_disjoint_and_valid(), "the library's tag ranges overlap or leave [0, kMaxP2pTag)");
}  // namespace detail

}  // namespace tessera
