#pragma once
// Messages of i64 words whose length the receiver does not know: sent as two point-to-point
// messages, the length and then the words, so the receiver sizes its buffer from the first. The
// library's own protocols (a pipeline's boundary headers, a task's output layouts, the
// controller's commands and replies) all travel so.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <tessera/comm/communicator.hpp>

namespace tessera TESSERA_API {

/// Sends `words` to `peer`: its length on `length_tag`, then the words on `words_tag` (the same
/// tag is fine: messages between two ranks on one tag arrive in order). Both sends stay in
/// flight; each Work keeps what it reads alive, so the caller may drop `words` and unwind.
std::array<Work, 2> isend_words(Communicator& comm, std::shared_ptr<const std::vector<int64_t>> words, int peer,
                                int length_tag, int words_tag);

/// Receives one such message from `peer`. `wait` waits each of the two receives (plainly, polling
/// for a failure elsewhere, or timing the wait); empty: Work::wait.
std::vector<int64_t> recv_words(Communicator& comm, int peer, int length_tag, int words_tag,
                                const std::function<void(const Work&)>& wait = {});

/// Drops the sends of `in_flight` that finished, after waiting each (which rethrows a failed
/// one); the others stay in flight. For outboxes that keep sending and never wait them all.
void drop_completed(std::vector<Work>& in_flight);

}  // namespace tessera
