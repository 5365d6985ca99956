#pragma once
// Internals of the MPI backend shared by mpi.cpp and ring.cpp: the process lock, datatypes,
// and Op, the context of one call (its group, its tag, polling with the timeout).
// The C API only: OpenMPI's mpi.h otherwise pulls in its deprecated C++ bindings (libmpi_cxx).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tessera/comm/collective.hpp>
#include <tessera/core/dtype.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera::mpi::detail {

/// True when MPI gave only MPI_THREAD_SERIALIZED: Tessera then serialises its MPI calls.
/// (Async calls run on one worker thread per communicator, so two communicators can call
/// MPI at once: MPI_THREAD_MULTIPLE, or this lock.)
extern std::atomic<bool> serialize_calls;
/// True when this node runs more ranks than it has cores: waits then yield at once.
extern std::atomic<bool> oversubscribed;
/// MPI_TAG_UB of this MPI (at least 32767; OpenMPI's is 2^31 - 1).
extern std::atomic<int> tag_upper_bound;
std::mutex& call_mutex();

/// Runs f (one MPI call, returning its error code) under the process lock if needed.
template <class F>
int locked(F&& f) {
  if (!serialize_calls.load(std::memory_order_relaxed)) return f();
  std::lock_guard lock(call_mutex());
  return f();
}

/// The MPI datatype that moves elements of dtype (f16/bf16 as 16-bit integers).
MPI_Datatype transfer_type(DType dtype);

/// "MPI_ERR_TRUNCATE: message truncated".
std::string error_string(int code);

/// "[0, 2, 3]": ranks for messages.
std::string join_ranks(const std::vector<int>& ranks);

/// What a rank says on its group's side channel (fixed size, sent as bytes).
struct Report {
  int64_t failed = 0;  ///< 1: this rank's call on the group failed (reason); 0: it waits in the call
  int64_t ended = 0;   ///< 1: this rank ended its program (sent on the world's channel only)
  int64_t p2p = 0;     ///< the call is a send/recv (their sequence numbers are counted apart)
  int64_t kind = 0, dtype = 0, count = 0, op = 0, root = 0, sequence = 0;
  uint64_t counts_hash = 0;  ///< the _v forms' counts (Op's counts_hash)
  char reason[440] = {};

  static Report waiting(const CollectiveCall& call, uint64_t counts_hash = 0);
  static Report failure(const CollectiveCall& call, const std::string& why);
  static Report end_of_program();
  CollectiveCall call() const;
};

/// A group's side channel: a duplicate of its communicator that carries only Reports, sent when
/// a wait passes the grace period (the call this rank waits in) or when a call fails (why). The
/// normal path sends and tests nothing. Waiting ranks read the reports to name a desync (two
/// calls of one sequence number that cannot meet), a failed peer, or the ranks that never came.
class SideChannel {
 public:
  /// Takes ownership of comm (MPI_COMM_NULL for a group of one: nothing to say).
  void open(MPI_Comm comm, int rank, int size);
  /// Frees the communicator; reports still in flight are let go (their buffers leak).
  void close();
  bool is_open() const { return comm_ != MPI_COMM_NULL; }
  /// Sends the report to every other rank of the group. Never blocks.
  void post(const Report& report);
  /// Takes in every report that has arrived. Never blocks.
  void drain();
  /// The latest report of a group rank (a failure sticks), or nullptr if none came.
  const Report* latest(int group_rank) const;

 private:
  struct InFlight {
    std::unique_ptr<Report> report;
    std::vector<MPI_Request> requests;
  };
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::vector<std::unique_ptr<Report>> latest_;
  std::vector<InFlight> in_flight_;
  mutable std::mutex mutex_;
};

/// Shared state of one communicator's group: failed groups are not reused.
struct GroupState {
  std::string description;  // "group[0, 1] (mpi)"
  std::atomic<bool> broken{false};
  std::mutex mutex;
  std::string reason;
  SideChannel side;

  /// Marks the group failed (the first reason wins) and, the first time, tells the other ranks
  /// on the side channel (unless the failure was told by one of them).
  void fail(const std::string& why, const CollectiveCall& call, bool tell_peers = true);
  /// Throws CommError if the group failed earlier.
  void check_usable(const CollectiveCall& call);
};

/// What a wait was waiting for, built only on timeout from the indices of the unfinished
/// requests (a non-owning reference to a callable: pass a lambda in the call).
class PendingText {
 public:
  template <class F>
  PendingText(const F& f)  // NOLINT: implicit from any callable
      : object_(&f), call_([](const void* o, const std::vector<int>& unfinished) {
          return std::string((*static_cast<const F*>(o))(unfinished));
        }) {}
  std::string operator()(const std::vector<int>& unfinished) const { return call_(object_, unfinished); }

 private:
  const void* object_;
  std::string (*call_)(const void*, const std::vector<int>&);
};

/// How a poll waits between its tries. MPI progresses only inside MPI calls (the receiver of a
/// large shared-memory message copies it in MPI_Test), so polling is the wait: spin while a
/// message is likely imminent (not at all where ranks outnumber cores), then yield the core for
/// kYieldPhase, then sleep 200 us at a time, so that a rank waiting seconds for a slow peer does
/// not burn a core. Every wait of the backend (Op::wait, the point-to-point engine's, the end of
/// program) paces itself with one.
class PollBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kYieldPhase = std::chrono::milliseconds(20);

  PollBackoff();
  /// Something completed: spinning starts over.
  void progressed() {
    spins_ = 0;
    last_progress_ = Clock::now();
  }
  /// How long since the last progress (since the start, before any).
  Clock::duration idle() const { return Clock::now() - last_progress_; }
  /// Whether the spins are spent (then the poll checks its timeout and rests between tries).
  bool spun_out() const { return spins_ >= spin_limit_; }
  /// One spin (a pause of the CPU) while any are left; false once they are spent.
  bool spin();
  /// Gives the core away: a yield within kYieldPhase of the last progress, else a 200 us sleep.
  void rest() const;

 private:
  int spin_limit_;
  int spins_ = 0;
  Clock::time_point last_progress_ = Clock::now();
};

/// One call in progress on one MPI communicator: polling with the timeout, error checks, tags.
class Op {
 public:
  /// world_ranks and group must outlive the Op. `counts_hash` joins the call's signature in the
  /// tag (the _v forms' counts, which every rank passes alike).
  Op(MPI_Comm comm, int rank, const std::vector<int>& world_ranks, const CollectiveCall& call, GroupState& group,
     uint64_t counts_hash = 0);

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const CollectiveCall& call() const { return call_; }
  /// Tag of this call's point-to-point messages: the sequence number's low 12 bits and, above
  /// them, 18 bits of the call's signature hash. Calls that cannot meet (another kind, dtype,
  /// count, op, root or _v counts) or other calls of the group never match each other's
  /// messages: a mismatched rank waits instead of taking wrong data, and the side channel names
  /// the mismatch. (With an MPI whose tags stop below 2^30: the sequence number only.)
  int tag() const { return tag_; }
  /// World rank of a group rank, for messages.
  int world_rank(int group_rank) const { return world_ranks_[static_cast<size_t>(group_rank)]; }

  /// Throws CommError naming `function` and MPI's message if rc is not MPI_SUCCESS.
  void check(int rc, const char* function) const;
  /// Polls until every request completed (completed ones become MPI_REQUEST_NULL). If none
  /// completes for comm_timeout_seconds(), fails the group and throws CommError naming the
  /// call, its sequence number, the group and pending(indices of the unfinished requests).
  /// With `statuses` (n of them), each completed request's status lands at its index, and a
  /// receive that MPI truncated fails the call naming the sender.
  void wait(MPI_Request* requests, int n, PendingText pending, MPI_Status* statuses = nullptr);
  void wait(MPI_Request& request, PendingText pending) { wait(&request, 1, pending); }
  /// For a wait that polls by other means (the point-to-point engine), after `idle` without
  /// progress: past the grace period reports this call on the side channel and reads the peers'
  /// reports (throws CommError when a peer failed, ended or desynchronised); past the timeout
  /// fails the group and throws CommError naming missing_text() (or, if empty, the absent ranks).
  void check_idle(std::chrono::steady_clock::duration idle, const std::function<std::string()>& missing_text);
  /// True if the request completed (it then becomes MPI_REQUEST_NULL). Never blocks.
  bool test(MPI_Request& request);
  /// Fails the group and throws CommError "[kind] what on group".
  [[noreturn]] void fail(const std::string& what) const;

  /// Posting helpers that check the return code. Counts are elements of `type`.
  void isend(const void* buf, int64_t count, MPI_Datatype type, int peer, int tag, MPI_Request& request);
  void irecv(void* buf, int64_t count, MPI_Datatype type, int peer, int tag, MPI_Request& request);

 private:
  bool is_p2p() const { return call_.kind == CollectiveKind::send || call_.kind == CollectiveKind::recv; }
  /// Fails the call: the receive of `status` was truncated (its sender sent more).
  [[noreturn]] void truncated(const MPI_Status& status) const;
  /// Reads the side channel; throws CommError if a peer waits in a call of this sequence number
  /// that cannot meet this one, or if a peer's call on the group failed.
  void diagnose();
  /// For a timeout: which ranks the side channel heard waiting in this call, and which not.
  std::string arrivals();

  MPI_Comm comm_;
  int rank_;
  const std::vector<int>& world_ranks_;
  CollectiveCall call_;
  GroupState& group_;
  uint64_t counts_hash_;
  int tag_;
  bool reported_ = false;  // this call's waiting report went out
  std::chrono::duration<double> grace_{-1};  // read from the tuning once a wait is slow
  std::chrono::steady_clock::time_point last_look_{};
};

/// The pending text of MPI's own collectives, which do not say which ranks are missing: the
/// side channel's reports say it instead (Op::wait asks them when the text is empty).
inline constexpr auto library_pending = [](const std::vector<int>&) { return std::string(); };

}  // namespace tessera::mpi::detail
