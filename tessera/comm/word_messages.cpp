#include <tessera/comm/word_messages.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>

namespace tessera {

std::array<Work, 2> isend_words(Communicator& comm, std::shared_ptr<const std::vector<int64_t>> words, int peer,
                                int length_tag, int words_tag) {
  auto length = std::make_shared<const int64_t>(static_cast<int64_t>(words->size()));
  Work first = comm.isend(length.get(), 1, DType::i64, peer, length_tag);
  first.keep_alive(std::move(length));
  Work second = comm.isend(words->data(), static_cast<int64_t>(words->size()), DType::i64, peer, words_tag);
  second.keep_alive(std::move(words));
  return {std::move(first), std::move(second)};
}

std::vector<int64_t> recv_words(Communicator& comm, int peer, int length_tag, int words_tag,
                                const std::function<void(const Work&)>& wait) {
  const auto wait_for = [&](const Work& w) { wait ? wait(w) : w.wait(); };
  int64_t length = 0;
  wait_for(comm.irecv(&length, 1, DType::i64, peer, length_tag));
  TESSERA_CHECK(length >= 0, CommError, "recv_words", "rank ", peer, " announced a message of ", length,
                " words on tag ", length_tag);
  std::vector<int64_t> words(static_cast<size_t>(length));
  wait_for(comm.irecv(words.data(), length, DType::i64, peer, words_tag));
  return words;
}

void drop_completed(std::vector<Work>& in_flight) {
  const auto done = std::partition(in_flight.begin(), in_flight.end(), [](const Work& w) { return !w.is_completed(); });
  for (auto it = done; it != in_flight.end(); ++it) it->wait();
  in_flight.erase(done, in_flight.end());
}

}  // namespace tessera
