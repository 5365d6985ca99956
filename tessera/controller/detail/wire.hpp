#pragma once
// Commands and replies as flat lists of 64-bit words, for workers in other processes (MPI): the
// controller sends a command's words (comm/word_messages); a worker answers a request with a
// reply's words, then (for a tensor) its bytes. A command's words are its kind, then its fields
// in the order its `fields` lists them.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/controller/detail/command.hpp>
#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace controller::detail {

std::vector<int64_t> encode_command(const Command& command);
/// Throws CommError for words that are not a whole command.
Command decode_command(const std::vector<int64_t>& words);

/// A reply's header: an error's message, or a tensor's dtype and shape (its bytes follow), or a
/// layout's words (sharding/layout_words.hpp).
struct Reply {
  bool ok = true;
  std::string error;
  bool is_tensor = true;
  DType dtype = DType::f32;
  Shape shape;
  std::vector<int64_t> layout_words;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.ok, s.error, s.is_tensor, s.dtype, s.shape, s.layout_words);
  }
  bool operator==(const Reply&) const = default;
};
std::vector<int64_t> encode_reply(const Reply& reply);
Reply decode_reply(const std::vector<int64_t>& words);

}  // namespace controller::detail
}  // namespace tessera
