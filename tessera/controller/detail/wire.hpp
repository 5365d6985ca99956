#pragma once
// Commands and replies as flat lists of 64-bit words, for workers in other processes (MPI): the
// controller sends a command as [length] then its words; a worker answers a request with a
// reply's words, then (for a tensor) its bytes.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/controller/detail/command.hpp>

namespace tessera::controller::detail {

std::vector<int64_t> encode_command(const Command& command);
Command decode_command(const std::vector<int64_t>& words);

/// A reply's header: [ok, kind, ...]: kind 0 a tensor ([dtype, ndim, dims...], its bytes follow),
/// 1 a layout (its words), and for an error the message.
struct Reply {
  bool ok = true;
  std::string error;
  bool is_tensor = true;
  DType dtype = DType::f32;
  Shape shape;
  std::vector<int64_t> layout_words;
};
std::vector<int64_t> encode_reply(const Reply& reply);
Reply decode_reply(const std::vector<int64_t>& words);

/// Waits for `work` by polling, without the communication timeout: a worker waits for its next
/// command, and the controller for a reply, as long as the other side takes.
void wait_polling(const Work& work);

}  // namespace tessera::controller::detail
