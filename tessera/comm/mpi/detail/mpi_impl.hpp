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
#include <cstdint>
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

/// Shared state of one communicator's group: failed groups are not reused.
struct GroupState {
  std::string description;  // "group[0, 1] (mpi)"
  std::atomic<bool> broken{false};
  std::mutex mutex;
  std::string reason;

  /// Marks the group failed (the first reason wins).
  void fail(const std::string& why);
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

/// One call in progress on one MPI communicator: polling with the timeout, error checks, tags.
class Op {
 public:
  /// world_ranks and group must outlive the Op.
  Op(MPI_Comm comm, int rank, const std::vector<int>& world_ranks, const CollectiveCall& call, GroupState& group);

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const CollectiveCall& call() const { return call_; }
  /// Tag of this call's point-to-point messages: distinct between consecutive collectives, so
  /// a desynchronised group times out instead of matching messages of different calls.
  int tag() const { return static_cast<int>(call_.sequence % 32768); }
  /// World rank of a group rank, for messages.
  int world_rank(int group_rank) const { return world_ranks_[static_cast<size_t>(group_rank)]; }

  /// Throws CommError naming `function` and MPI's message if rc is not MPI_SUCCESS.
  void check(int rc, const char* function) const;
  /// Polls until every request completed (completed ones become MPI_REQUEST_NULL). If none
  /// completes for comm_timeout_seconds(), fails the group and throws CommError naming the
  /// call, its sequence number, the group and pending(indices of the unfinished requests).
  void wait(MPI_Request* requests, int n, PendingText pending);
  void wait(MPI_Request& request, PendingText pending) { wait(&request, 1, pending); }
  /// True if the request completed (it then becomes MPI_REQUEST_NULL). Never blocks.
  bool test(MPI_Request& request);
  /// Fails the group and throws CommError "[kind] what on group".
  [[noreturn]] void fail(const std::string& what) const;

  /// Posting helpers that check the return code. Counts are elements of `type`.
  void isend(const void* buf, int64_t count, MPI_Datatype type, int peer, int tag, MPI_Request& request);
  void irecv(void* buf, int64_t count, MPI_Datatype type, int peer, int tag, MPI_Request& request);

 private:
  MPI_Comm comm_;
  int rank_;
  const std::vector<int>& world_ranks_;
  CollectiveCall call_;
  GroupState& group_;
};

/// The pending text of MPI's own collectives, which do not say which ranks are missing.
inline constexpr auto library_pending = [](const std::vector<int>&) {
  return std::string("ranks of the group did not arrive (MPI's collectives do not say which)");
};

}  // namespace tessera::mpi::detail
