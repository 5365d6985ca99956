#pragma once
// A worker's inbox: the queues its threads take commands from, whichever transport fed them.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/futures.hpp>
#include <tessera/mesh/device_mesh.hpp>

namespace tessera::controller::detail {

/// A queue of commands: the controller (or a worker's receiving thread) pushes, a worker's
/// thread pops in order.
class CommandQueue {
 public:
  void push(std::shared_ptr<const Command> command) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      commands_.push_back(std::move(command));
    }
    cv_.notify_one();
  }
  std::shared_ptr<const Command> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !commands_.empty(); });
    auto command = std::move(commands_.front());
    commands_.pop_front();
    return command;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const Command>> commands_;
};

/// A stream's two copies of a mesh (each over communicators of its own): `working` runs the
/// stream's ops and remote functions; `agreement` only the workers' agreement after a remote
/// function, so user code that failed half way through a collective cannot desync it.
struct StreamMesh {
  DeviceMesh working;
  DeviceMesh agreement;
  StreamMesh slice(const std::map<std::string, int64_t>& at) const { return {working.slice(at), agreement.slice(at)}; }
};

/// A stream's copies of the meshes, handed from the worker's own thread (which makes them:
/// collective) to the stream's thread (which waits for each where its commands need it).
class MeshHandoff {
 public:
  void put(int64_t stream, int64_t mesh, StreamMesh copies);
  /// Waits for the copies; throws CommError if `health` fails first.
  StreamMesh take(int64_t stream, int64_t mesh, Health& health);

 private:
  std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::map<std::pair<int64_t, int64_t>, StreamMesh> ready_;
};

/// One worker's inbox, whoever feeds it: route() sends each command where it runs. Commands
/// about every stream (a new mesh, a new stream, stop) go to the worker's own thread (`control`);
/// the others straight to their stream's thread, so an op costs one hand-over. A stream sees a
/// new mesh as a MakeMesh command in its queue: it takes its copy from the handoff there.
class WorkerPort {
 public:
  WorkerPort();
  /// Queues `command` where it runs; true when that is `control` (the worker's own thread).
  bool route(std::shared_ptr<const Command> command);
  /// The queue of stream `id` (made by route(MakeStream)), or null.
  std::shared_ptr<CommandQueue> stream(int64_t id);

  CommandQueue control;
  MeshHandoff handoff;

 private:
  std::mutex mutex_;
  std::map<int64_t, std::shared_ptr<CommandQueue>> streams_;
  // The meshes and slices made so far, in order: a new stream's queue starts with them.
  std::vector<std::shared_ptr<const Command>> meshes_;
};

}  // namespace tessera::controller::detail
