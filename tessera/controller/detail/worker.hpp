#pragma once
// A worker's inside: its values (by tensor id) and events, shared by its streams, and the
// execution of one stream's command. Each stream runs on its own thread of the worker's rank
// (rank_thread) with its own copies of the meshes (DeviceMesh::duplicate), so the streams'
// collectives never meet and one stream's transfer overlaps another's compute.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <tessera/comm/work.hpp>
#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/futures.hpp>
#include <tessera/controller/detail/transport.hpp>
#include <tessera/controller/detail/wire.hpp>
#include <tessera/controller/detail/worker_port.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>

namespace tessera::controller::detail {

/// A value, or why it failed; the stream that made it and its mesh's id.
struct Value {
  DTensor tensor;
  std::string error;
  int64_t stream = 0;
  int64_t mesh = -1;
};

/// A stream's meshes by id: its own copies, so its collectives never meet another stream's.
using StreamMeshes = std::unordered_map<int64_t, StreamMesh>;

/// A worker process's replies to the controller (world rank 0). Streams queue them; the worker's
/// receiving thread sends them, since it alone uses the world communicator.
class ReplyOutbox final : public ReplySink {
 public:
  void tensor(uint64_t request, const Tensor& t) override;
  void layout(uint64_t request, const Layout& layout) override;
  void error(uint64_t request, const std::string& message) override;
  /// Waits for `work` (the next command's arrival), sending queued replies meanwhile.
  void wait_sending(const Work& work);
  /// Sends what is queued and waits until every reply went out.
  void finish();

 private:
  struct Queued {
    uint64_t request;
    std::vector<int64_t> words;
    Tensor payload;
  };
  /// Queues request `request`'s reply (a header, then payload's bytes if any). Any thread.
  void push(uint64_t request, const Reply& header, const Tensor* payload);
  void send_queued();  // the receiving thread only

  std::mutex mutex_;
  std::condition_variable queued_cv_;
  std::vector<Queued> queued_;
  std::vector<Work> inflight_;  // the receiving thread only; each keeps its buffer alive
};

/// What the streams of one worker share: the values, the events that order streams (a borrow
/// or its drop), and where failures and replies go.
class WorkerShared {
 public:
  WorkerShared(Health& health, ReplySink& replies) : health(health), replies(replies) {}

  /// Why value `id` cannot be read ("" when it can): dropped, or failed (its error, passed on).
  std::string unreadable(uint64_t id, const std::string& call, const char* what);
  /// Values `ids` on stream `stream`'s meshes; on failure, why (a failed input fails the op alike).
  std::string gather(const std::vector<uint64_t>& ids, int64_t stream, const std::string& call,
                     const StreamMeshes& meshes, std::vector<DTensor>& inputs);
  /// Value `id` on stream `stream`: one another stream made (a borrow) is rebound to this
  /// stream's copy of its mesh, so its collectives use this stream's communicators.
  DTensor tensor(uint64_t id, int64_t stream, const StreamMeshes& meshes);
  void store(uint64_t id, Value value);
  void erase(uint64_t id);

  /// Marks `event`; wait() returns once it is marked (each event is waited for once).
  void signal(uint64_t event);
  /// Throws CommError naming `stream` after the communication timeout.
  void wait(uint64_t event, int64_t stream);

  Health& health;
  ReplySink& replies;

 private:
  std::mutex values_mutex_;
  std::unordered_map<uint64_t, Value> values_;
  std::mutex events_mutex_;
  std::condition_variable events_cv_;
  std::unordered_set<uint64_t> signaled_;
};

/// Runs command `c` of a stream; false for Stop.
bool execute(const Command& c, WorkerShared& shared, StreamMeshes& meshes);
/// Runs a remote function: the user's code, then the agreement of the mesh's workers on whether
/// it failed anywhere and whether the stream's communicators of the mesh are still usable (see
/// remote_call.cpp).
void run_remote(const CallRemote& c, WorkerShared& shared, const StreamMeshes& meshes);
/// Reports a result's layout (or its error) where the controller asked for it (request 0: it
/// did not).
void report(WorkerShared& shared, uint64_t request, const Value& out);
/// Runs a to_mesh on this worker, of the source mesh, the target mesh, or both (to_mesh.cpp).
void to_mesh(const ToMesh& c, WorkerShared& shared, StreamMeshes& meshes);
/// Answers `c` (a fetch or a query) with an error, when it wants an answer.
void reply_error(WorkerShared& shared, const Command& c, const std::string& error);
/// Runs commands on this worker (a rank of the workers' world) until Stop, answering through
/// `replies`. A failure outside an op goes to `health` (the worker keeps serving).
void worker_loop(WorkerPort& port, Health& health, ReplySink& replies);
/// "worker rank R: what".
std::string worker_error(const std::string& what);

}  // namespace tessera::controller::detail
