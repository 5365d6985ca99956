#pragma once
// CommDebugMode: counts the communication a block of code does on the calling rank (PyTorch's
// torch.distributed.tensor.debug.CommDebugMode). Built on the CommObserver hook at the
// communicator's choke point so it sees every call on every communicator of
// this rank: world, mesh axes, splits, and the ones DTensor issues internally.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/comm/collective.hpp>
#include <tessera/comm/communicator.hpp>

namespace tessera TESSERA_API {

/// RAII scope on the calling rank (thread) that records every communication call issued while
/// it is open: collectives, send/recv, barrier and split all count, one per call, with the
/// bytes this rank sends and receives (CollectiveCall::bytes_sent/bytes_received: the
/// algorithm-independent minimum). Async calls count when issued. Scopes nest: every open scope
/// of the thread sees each call. Each rank opens its own scope; a scope is never shared across
/// ranks or threads, and must close on the thread that opened it (it is non-copyable and
/// non-movable, so a local variable does that). Throws nothing.
///
/// Example:
///   CommDebugMode mode;
///   world().all_reduce(buf, 1024, DType::f32, ReduceOp::sum);
///   mode.count(CollectiveKind::all_reduce) == 1;
///   mode.bytes_sent(CollectiveKind::all_reduce) == 1024 * 4 * 2 * (n - 1) / n;  // n = world_size()
class CommDebugMode final : public CommObserver {
 public:
  /// Starts recording the calling thread's calls.
  CommDebugMode();
  /// Stops recording.
  ~CommDebugMode() override;
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;
  CommDebugMode(CommDebugMode&&) = delete;
  CommDebugMode& operator=(CommDebugMode&&) = delete;

  /// Calls of one kind so far. Example: `count(CollectiveKind::all_gather) == 2`.
  int64_t count(CollectiveKind kind) const;
  /// Calls of every kind so far (send, recv, barrier and split included).
  int64_t total_count() const { return static_cast<int64_t>(calls_.size()); }
  /// Bytes this rank sent in calls of one kind. Example: all_gather of 6 f32 on 4 ranks: 72.
  int64_t bytes_sent(CollectiveKind kind) const;
  /// Bytes this rank received in calls of one kind.
  int64_t bytes_received(CollectiveKind kind) const;
  /// Bytes this rank sent, over all calls.
  int64_t total_bytes_sent() const;
  /// Bytes this rank received, over all calls.
  int64_t total_bytes_received() const;
  /// Count per kind, only kinds with at least one call. Example: `{all_reduce: 1, barrier: 2}`.
  std::map<CollectiveKind, int64_t> counts() const;
  /// Every call in issue order (with its sequence number), for tests and tracing.
  const std::vector<CollectiveCall>& calls() const { return calls_; }
  /// Forgets the calls so far; the scope stays open.
  void reset();
  /// A table of the kinds with calls (in CollectiveKind order), then a total row; "no
  /// communication" when empty. Example, an all_reduce of 6 f32 on 2 ranks:
  ///   kind        count  bytes sent  bytes received
  ///   all_reduce      1          24              24
  ///   total           1          24              24
  std::string to_string() const;

  /// PyTorch's names for counts() and total_count().
  std::map<CollectiveKind, int64_t> get_comm_counts() const { return counts(); }
  int64_t get_total_counts() const { return total_count(); }

  /// One rank's totals in all_ranks(): its rank in the communicator, its calls, the bytes it sent
  /// and received.
  struct RankFigures {
    int rank = 0;
    int64_t calls = 0;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    bool operator==(const RankFigures&) const = default;
  };
  /// Every rank's totals so far, not only the calling one's, in rank order: gathered over `comm`,
  /// so it is collective (every rank of comm calls it, each with its own scope open, on the thread
  /// that opened it). This scope does not record the gather itself; scopes around it do. Throws
  /// what the gather throws, with the scope recording again.
  std::vector<RankFigures> all_ranks(Communicator& comm);
  /// all_ranks(comm) as a table, a row per rank, then a total row. Example, 2 ranks after one
  /// all_reduce of 6 f32 each:
  ///   rank   count  bytes sent  bytes received
  ///       0      1          24              24
  ///       1      1          24              24
  ///   total      2          48              48
  std::string all_ranks_table(Communicator& comm);

  /// Wall seconds this rank spent inside blocking calls of one kind (waiting for peers included).
  double seconds(CollectiveKind kind) const;
  /// Wall seconds inside blocking calls, over all kinds.
  double total_seconds() const;

  /// CommObserver hooks: record the call and its time.
  void on_call(const Communicator& comm, const CollectiveCall& call) override;
  void on_done(const Communicator& comm, const CollectiveCall& call, double seconds) override;

 private:
  std::vector<CollectiveCall> calls_;
  std::map<CollectiveKind, double> seconds_;
};

}  // namespace tessera
