#pragma once
// Layouts and placements as flat lists of 64-bit words, for messages between processes (a
// pipeline stage's activation header, a controller's commands and replies): one codec for every
// layer that sends a layout. Pure. The mesh does not travel: the receiver names it.
#include <cstdint>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

/// Appends a count, then (kind, argument) per placement: Shard (0, dim), Replicate (1, 0),
/// Partial (2, reduce op).
void append_placement_words(const Placements& placements, std::vector<int64_t>& words);
/// Appends [dtype, ndim, shape..., placements as above, per tensor dim: its shard order's count
/// and mesh dims, per tensor dim: its explicit sizes' count (0: chunks) and sizes].
void append_layout_words(const Layout& layout, std::vector<int64_t>& words);
/// append_layout_words into an empty list.
std::vector<int64_t> layout_words(const Layout& layout);

/// Reads words in the order they were appended. A read past the end throws CommError naming
/// `call` (a truncated message); a layout of another number of mesh dims than the receiver's
/// mesh, ShardingError; a broken layout, the Layout constructor's ShardingError.
class TESSERA_API WordReader {
 public:
  WordReader(const std::vector<int64_t>& words, std::string_view call) : words_(words), call_(call) {}
  int64_t next();
  Placements placements();
  Layout layout(const MeshSpec& mesh);
  /// Words not read yet.
  size_t left() const { return words_.size() - at_; }

 private:
  const std::vector<int64_t>& words_;
  std::string_view call_;
  size_t at_ = 0;
};

}  // namespace tessera
