#pragma once
// The MPI backend's point-to-point engine: isend/irecv as requests that progress whenever any
// of them is waited for or polled (MPI progresses only inside MPI calls).
//
// The protocol of one transfer (user tag t, on the communicator's own send/recv duplicate):
// - the sender posts a header (count, dtype) on tag 3t, its data on tag 3t+1 (in pieces of at
//   most max_message_elements) and a receive for the receiver's answer on tag 3t+2, all at once;
// - the receiver posts a receive for the header; once the header is in, it posts the data
//   receives (into the user's buffer if count and dtype match, else into a discard buffer of
//   the sender's size, so no data is left in flight) and sends its answer (match, count, dtype).
// So both sides name a mismatch, and a send finishes once the receiver has matched it. Header,
// data and answer each have their own tag so that several transfers between two ranks on one
// tag pair up in posting order (MPI's non-overtaking rule holds per tag); a receive posts its
// data receives only after every earlier receive from that peer on that tag posted theirs.
#include <memory>
#include <mutex>
#include <vector>

#include <tessera/comm/collective.hpp>
#include <tessera/comm/mpi/detail/mpi_impl.hpp>
#include <tessera/core/dtype.hpp>

namespace tessera::detail {
struct WorkState;
}

namespace tessera::mpi::detail {

class P2pEngine : public std::enable_shared_from_this<P2pEngine> {
 public:
  /// comm: the send/recv duplicate (not owned); group: the communicator's state (outlives the
  /// engine: the communicator destroys the engine first).
  P2pEngine(MPI_Comm comm, int rank, std::vector<int> world_ranks, GroupState& group);
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  /// Posts one side of a transfer; the returned state's wait/poll hooks drive the engine.
  std::shared_ptr<tessera::detail::WorkState> post(bool is_send, void* data, int64_t count, DType dtype, int peer,
                                                   int tag, const CollectiveCall& call);
  /// Largest user tag this MPI can carry (3t + 2 <= MPI_TAG_UB).
  static int max_tag();

 private:
  struct Request;

  // One pass over every pending request in posting order (mutex_ held): header arrivals,
  // completions. Finished requests leave the list. True if anything moved.
  bool progress_locked();
  // Work::wait of one request: progresses all until it finished, with the timeout and the side
  // channel's diagnosis of failed or ended peers.
  void wait(Request& request);
  void poll(Request& request);
  // A failure of the group (timeout, a peer's failure): every pending request fails with it and
  // stays in leaked_, whose buffers MPI may still write.
  void fail_all_locked(std::exception_ptr error);

  MPI_Comm comm_;
  int rank_;
  std::vector<int> world_ranks_;
  GroupState& group_;
  int64_t max_message_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<Request>> pending_;
  std::vector<std::shared_ptr<Request>> leaked_;
};

}  // namespace tessera::mpi::detail
