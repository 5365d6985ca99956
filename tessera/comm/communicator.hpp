#pragma once
// Communicator: collectives over a fixed group of ranks on contiguous typed buffers.
// Backends (threads, mpi) implement the protected do_* methods; every public
// call first passes the one choke point (validation, sequence numbers, observers such as
// CommDebugMode, tracing), then the backend, which does the desync check and the timeouts.
//
// Conventions: counts are elements of `dtype`, int64 (beyond 2^31 works); buffers are
// contiguous; ranks are group ranks in [0, size()). f16/bf16 reductions accumulate in f32 and
// round once. A call on a communicator whose group failed earlier (timeout, desync, a peer's
// failure) throws CommError at once: a failed group is not reused.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/comm/collective.hpp>
#include <tessera/comm/work.hpp>
#include <tessera/core/dtype.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera TESSERA_API {

namespace detail {
class AsyncQueue;
}

/// Point-to-point tags are in [0, kMaxP2pTag) on every backend.
inline constexpr int kMaxP2pTag = 1 << 28;

/// A group of ranks that communicate. Non-copyable; shared through std::shared_ptr.
class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This rank's index in the group.
  int rank() const { return rank_; }
  /// Number of ranks in the group.
  int size() const { return static_cast<int>(world_ranks_.size()); }
  /// World rank of each group rank.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  /// Backend name: "threads" or "mpi".
  virtual std::string_view backend() const = 0;
  /// "group[0, 2, 4] (threads)".
  std::string to_string() const;

  /// In place: buf (count elements) becomes the reduction over the group. Collective.
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op);
  /// recv (size()*count) gets every rank's send (count), in rank order. Collective.
  void all_gather(const void* send, void* recv, int64_t count, DType dtype);
  /// Uneven all_gather: rank r contributes recv_counts[r] elements (0 allowed); recv holds their
  /// sum, packed in rank order. recv_counts must be equal on every rank. Collective.
  void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& recv_counts, DType dtype);
  /// send holds size()*recv_count; rank r gets the reduction of block r. Collective.
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op);
  /// Uneven reduce_scatter: send holds sum(counts) packed in rank order; rank r gets counts[r].
  void reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype, ReduceOp op);
  /// Block p (count elements) of send goes to rank p; recv block p comes from rank p. Collective.
  void all_to_all(const void* send, void* recv, int64_t count, DType dtype);
  /// Uneven all_to_all with packed blocks: send_counts[p] elements to rank p, recv_counts[p]
  /// from rank p (0 allowed). send_counts[p] on rank r must equal recv_counts[r] on rank p.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType dtype);
  /// buf on every rank becomes root's buf. Collective.
  void broadcast(void* buf, int64_t count, DType dtype, int root);
  /// recv on root becomes the reduction of every rank's send (recv is ignored elsewhere).
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root);
  /// recv on root (size()*count) gets every rank's send in rank order.
  void gather(const void* send, void* recv, int64_t count, DType dtype, int root);
  /// Rank r's recv (count) gets block r of root's send (size()*count).
  void scatter(const void* send, void* recv, int64_t count, DType dtype, int root);
  /// Blocking point-to-point send to `peer`; matched with peer's recv of equal count and tag.
  /// Returns once the receiver has the data. send = isend + wait; recv = irecv + wait.
  void send(const void* buf, int64_t count, DType dtype, int peer, int tag = 0);
  void recv(void* buf, int64_t count, DType dtype, int peer, int tag = 0);
  /// Non-blocking point-to-point: posts the transfer and returns at once. Sends and receives
  /// between two ranks match by tag in posting order (as in MPI); every set of posted pairs
  /// completes whatever order the ranks wait in, so no posting order can deadlock. The buffer
  /// must stay alive and untouched until the Work's wait() returns; a count or dtype mismatch
  /// fails both sides' Works with CommError. Tags: [0, kMaxP2pTag).
  Work isend(const void* buf, int64_t count, DType dtype, int peer, int tag = 0);
  Work irecv(void* buf, int64_t count, DType dtype, int peer, int tag = 0);
  /// Sends to `dest` and receives from `source` at once, as MPI_Sendrecv: the shift of a ring
  /// or a halo without even/odd ordering. dest or source may be -1 (no transfer that side).
  void sendrecv(const void* send, int64_t send_count, int dest, void* recv, int64_t recv_count, int source,
                DType dtype, int tag = 0);
  /// Returns once every rank of the group has called barrier. Collective.
  void barrier();
  /// Collective: ranks passing the same color >= 0 form a new group, ordered by (key, rank);
  /// a rank passing a negative color gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key);

  /// Asynchronous forms: return at once; the call runs in order with this rank's other calls
  /// on this communicator (a blocking call first waits for the async calls before it).
  Work all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op);
  Work all_gather_async(const void* send, void* recv, int64_t count, DType dtype);
  Work reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op);
  Work all_to_all_v_async(const void* send, std::vector<int64_t> send_counts, void* recv,
                          std::vector<int64_t> recv_counts, DType dtype);
  /// Waits for every async call issued so far on this communicator.
  void synchronize();

  /// Fails this group on every rank, from this one: calls blocked in it, and all later calls,
  /// throw CommError naming `reason` (on the threads backend at once, under MPI within the desync
  /// grace period). For a rank that will not reach the call its peers wait in (a controller's
  /// worker whose remote function threw). Not collective. A failed group is not reused.
  void abort(const std::string& reason);

 protected:
  Communicator(int rank, std::vector<int> world_ranks);

  virtual void do_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, const CollectiveCall& call) = 0;
  virtual void do_all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype,
                               const CollectiveCall& call) = 0;
  virtual void do_reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype,
                                   ReduceOp op, const CollectiveCall& call) = 0;
  virtual void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                               const std::vector<int64_t>& recv_counts, DType dtype, const CollectiveCall& call) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType dtype, int root, const CollectiveCall& call) = 0;
  virtual void do_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root,
                         const CollectiveCall& call) = 0;
  virtual void do_gather(const void* send, void* recv, int64_t count, DType dtype, int root,
                         const CollectiveCall& call) = 0;
  virtual void do_scatter(const void* send, void* recv, int64_t count, DType dtype, int root,
                          const CollectiveCall& call) = 0;
  /// Posts one side of a point-to-point transfer; the state finishes when it completed.
  virtual std::shared_ptr<detail::WorkState> do_isend(const void* buf, int64_t count, DType dtype, int peer, int tag,
                                                      const CollectiveCall& call) = 0;
  virtual std::shared_ptr<detail::WorkState> do_irecv(void* buf, int64_t count, DType dtype, int peer, int tag,
                                                      const CollectiveCall& call) = 0;
  virtual void do_barrier(const CollectiveCall& call) = 0;
  virtual std::shared_ptr<Communicator> do_split(int color, int key, const CollectiveCall& call) = 0;
  virtual void do_abort(const std::string& reason) = 0;
  /// Even forms default to the _v forms; backends override them where a faster path exists.
  virtual void do_all_gather(const void* send, void* recv, int64_t count, DType dtype, const CollectiveCall& call);
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                 const CollectiveCall& call);
  virtual void do_all_to_all(const void* send, void* recv, int64_t count, DType dtype, const CollectiveCall& call);

 private:
  // The choke point: validation already done by the caller; numbers, observes, traces, runs.
  void enter(CollectiveCall& call);
  // The async path: numbers the call here (issue order), runs body(numbered call) in the queue.
  Work enqueue(CollectiveCall call, std::function<void(const CollectiveCall&)> body);
  // Checks, numbers and posts one side of a point-to-point transfer (`op` names the user's call).
  Work post_p2p(const char* op, bool is_send, void* buf, int64_t count, DType dtype, int peer, int tag,
                CollectiveCall* numbered = nullptr);

  int rank_;
  std::vector<int> world_ranks_;
  uint64_t sequence_ = 0;      // collectives
  uint64_t p2p_sequence_ = 0;  // send/recv
  std::unique_ptr<detail::AsyncQueue> async_;
};

/// Sees every communication call the calling thread makes (CommDebugMode builds on it).
class CommObserver {
 public:
  virtual ~CommObserver() = default;
  /// Called once per call, on the issuing thread, before it runs.
  virtual void on_call(const Communicator& comm, const CollectiveCall& call) = 0;
  /// Called when a blocking call returns (not for async forms), with its wall time in seconds:
  /// the transfer and any wait for the other ranks to arrive.
  virtual void on_done(const Communicator& comm, const CollectiveCall& call, double seconds) {
    (void)comm, (void)call, (void)seconds;
  }
};
/// Registers an observer for the calling thread (the innermost sees calls first; all see them).
void add_comm_observer(CommObserver* observer);
/// Unregisters it. Throws ValueError if it was not registered on this thread.
void remove_comm_observer(CommObserver* observer);

/// Timeout of every blocking wait, in seconds: TESSERA_TIMEOUT_S, default 300.
double comm_timeout_seconds();
/// Overrides the timeout for this process (tests use a few seconds). Throws ValueError if <= 0.
void set_comm_timeout_seconds(double seconds);

}  // namespace tessera
