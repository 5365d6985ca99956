#pragma once
// How commands reach the workers and answers come back: in-process queues (workers are threads
// of this process, world ranks 0..n-1) or MPI messages (workers are processes, world ranks 1..n;
// the controller is rank 0). The controller and the workers see only these two interfaces.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tessera/comm/tags.hpp>
#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/futures.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera::controller::detail {

/// The controller's side.
class Transport {
 public:
  virtual ~Transport() = default;
  /// The world rank of the first worker; the others follow it.
  virtual int first_worker() const = 0;
  /// Sends `command` to the workers `ranks` (world ranks), after what was sent to them before.
  virtual void send(const std::vector<int>& ranks, std::shared_ptr<const Command> command) = 0;
  /// A request id whose answer, sent by world rank `worker`, reaches `future`; a layout is read
  /// as one on `mesh`.
  virtual uint64_t expect(const std::shared_ptr<FutureState<Tensor>>& future, int worker, const MeshSpec& mesh) = 0;
  virtual uint64_t expect(const std::shared_ptr<FutureState<Layout>>& future, int worker, const MeshSpec& mesh) = 0;
  /// Whether workers report each result's layout as they make it (a request per result), or
  /// only when asked (QueryLayout): between processes that spares a message per op.
  virtual bool reports_layouts() const = 0;
  /// Stops the workers once they ran everything sent, and waits for them; false if a worker
  /// failed (said on stderr).
  virtual bool stop() = 0;
};

/// The workers' side: where a worker answers request `request`. Any stream's thread.
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  virtual void tensor(uint64_t request, const Tensor& t) = 0;
  virtual void layout(uint64_t request, const Layout& layout) = 0;
  virtual void error(uint64_t request, const std::string& message) = 0;
};

/// In-process workers, started at once: one world of `workers` ranks in a thread of its own.
std::unique_ptr<Transport> in_process_transport(int workers, std::shared_ptr<Health> health);
/// Worker processes; called on world rank 0 of an MPI world (the workers are the other ranks).
std::unique_ptr<Transport> mpi_transport();
/// A worker process's side (world ranks 1..n): runs the controller's commands until Stop.
void mpi_worker_loop();

/// Tags of the controller's messages on the world communicator: a command's length and words;
/// a reply to request r (its header length, header words, then a tensor's bytes).
inline constexpr int kCommandLengthTag = kControllerTags.first;
inline constexpr int kCommandTag = kControllerTags.first + 1;
inline int reply_tag(uint64_t request) {
  return kControllerTags.first + 2 + static_cast<int>(request % static_cast<uint64_t>(kControllerTags.size() - 2));
}

}  // namespace tessera::controller::detail
