#pragma once
// CommDebugMode: counts the communication a block of code does on the calling rank (PyTorch's
// torch.distributed.tensor.debug.CommDebugMode). Built on the CommObserver hook at the
// communicator's choke point so it sees every call on every communicator of
// this rank: world, mesh axes, splits, and the ones DTensor issues internally.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <tessera/comm/collective.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/core/export.hpp>
#include <tessera/core/module_position.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/op_observer.hpp>
#include <tessera/nn/forward_observer.hpp>

namespace tessera TESSERA_API {

/// RAII scope on the calling rank (thread) that records every communication call issued while
/// it is open: collectives, send/recv, barrier and split all count, one per call, with the
/// bytes this rank sends and receives (CollectiveCall::bytes_sent/bytes_received: the
/// algorithm-independent minimum). Async calls count when issued. Scopes nest: every open scope
/// of the thread sees each call. Each rank opens its own scope; a scope is never shared across
/// ranks or threads, and must close on the thread that opened it (it is non-copyable and
/// non-movable, so a local variable does that). Throws nothing.
///
/// Per module, as PyTorch's: while it is open, every call also counts against the modules whose
/// forward issued it (nn::ForwardScope; the innermost and its parents, and "Global" for all), in
/// forward, or in backward for the backward of ops recorded under them; the DTensor ops each
/// module runs are traced with their inputs' shapes and placements, and each module's parameters
/// are recorded as its forward starts. generate_comm_debug_tracing_table and generate_json_dump
/// show them at PyTorch's noise levels.
///
/// Example:
///   CommDebugMode mode;
///   world().all_reduce(buf, 1024, DType::f32, ReduceOp::sum);
///   mode.count(CollectiveKind::all_reduce) == 1;
///   mode.bytes_sent(CollectiveKind::all_reduce) == 1024 * 4 * 2 * (n - 1) / n;  // n = world_size()
class CommDebugMode final : public CommObserver, public OpObserver, public nn::ForwardObserver {
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

  // --- per module (PyTorch's module tracking) ------------------------------------------------
  /// The calls counted against one module: those issued in its forward (its submodules'
  /// included), and those of the backward of the ops recorded there.
  struct ModuleCounts {
    std::map<CollectiveKind, int64_t> forward, backward;
    bool operator==(const ModuleCounts&) const = default;
  };
  /// Per module path (nn::Module::path, e.g. "TransformerLM.blocks.0.attn"; "Global" counts every
  /// call), PyTorch's comm_module_counts. Modules whose forward issued no call have no entry.
  const std::map<std::string, ModuleCounts>& comm_module_counts() const { return module_counts_; }
  /// Per module path, the module's own parameters as its first forward in the scope found them
  /// (they share storage with the module's), PyTorch's get_parameter_info().
  std::map<std::string, std::map<std::string, DTensor>> get_parameter_info() const;
  /// Per parameter path ("MLP.fc1.weight"), its placements, PyTorch's get_sharding_info().
  std::map<std::string, Placements> get_sharding_info() const;
  /// One DTensor op as traced: its name, its DTensor inputs' global shapes and placements, their
  /// mesh, and whether it ran in backward.
  struct TracedOp {
    std::string name;
    std::vector<Shape> input_shapes;
    std::vector<Placements> input_placements;
    std::string device_mesh;
    bool backward = false;
  };
  /// Per module path ("Global" outside every module), the DTensor ops it ran itself (not its
  /// submodules'), in order.
  const std::map<std::string, std::vector<TracedOp>>& module_operations() const { return operations_; }
  /// PyTorch's tracing table: every module in the order its forward first ran, indented by depth,
  /// with its FORWARD PASS and BACKWARD PASS calls ("*all_reduce: 2"). noise_level 0: the calls
  /// only; 1 and 2: also each module's type and parameters and its DTensor ops (with shapes,
  /// placements and mesh) but the trivial ones (reshape, permute: PyTorch's view and transpose);
  /// 3: every op. (Level 2 adds non-DTensor ops in PyTorch; Tessera traces DTensor ops only.) No
  /// ANSI colours. Throws ValueError naming the call for a level outside 0-3.
  std::string generate_comm_debug_tracing_table(int noise_level = 3) const;
  /// The same as JSON, PyTorch's tree ({"fqn", "module_type", "parameters", "children",
  /// "collectives_forward", "collectives_backward", "operations_forward", "operations_backward"}
  /// from "Global"), written to `file_name`. Throws ValueError for a bad level, Error naming the
  /// file when it cannot be written.
  void generate_json_dump(const std::string& file_name = "comm_mode_log.json", int noise_level = 3) const;
  /// The tracing table written to `file_name`. Throws as generate_json_dump.
  void log_comm_debug_tracing_table_to_file(const std::string& file_name = "comm_mode_log.txt",
                                            int noise_level = 3) const;

  /// CommObserver hooks: record the call and its time.
  void on_call(const Communicator& comm, const CollectiveCall& call) override;
  void on_done(const Communicator& comm, const CollectiveCall& call, double seconds) override;
  /// OpObserver hook: traces a DTensor op against the innermost module.
  void on_op(std::string_view op, std::span<const DTensor* const> inputs) override;
  /// nn::ForwardObserver hook: records a module (type, depth, parent, parameters) at its first forward.
  void on_forward(const std::string& path, const nn::Module& module) override;

 private:
  struct ModuleInfo {
    std::string type;
    int64_t depth = 0;  // Global 0, a root module 1
    std::vector<std::pair<std::string, DTensor>> parameters;
    std::vector<std::string> children;
  };
  void clear_modules();

  detail::ModuleTracing tracing_;  // before the hooks: nodes recorded in the scope keep positions
  std::vector<CollectiveCall> calls_;
  std::map<CollectiveKind, double> seconds_;
  std::vector<std::string> module_order_;  // "Global", then first forward order
  std::map<std::string, ModuleInfo> modules_;
  std::map<std::string, ModuleCounts> module_counts_;
  std::map<std::string, std::vector<TracedOp>> operations_;
};

}  // namespace tessera
