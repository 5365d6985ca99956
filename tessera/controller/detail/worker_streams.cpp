// A worker's threads. The rank's own thread receives the controller's commands and runs the
// ones that concern every stream (a new mesh, a new stream); every stream has a thread of the
// rank (rank_thread) that runs the stream's commands in order on its own copies of the meshes.
// So streams run concurrently, and their collectives, on duplicated communicators, never meet:
// what orders two streams is only a borrow (the borrower waits for the owner's work before it)
// and its drop (the owner waits for the borrower's).
#include <tessera/controller/detail/worker.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/word_messages.hpp>
#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller::detail {

void ReplyOutbox::tensor(uint64_t request, const Tensor& t) {
  Reply header;
  header.dtype = t.dtype();
  header.shape = t.shape();
  push(request, header, &t);
}

void ReplyOutbox::layout(uint64_t request, const Layout& layout) {
  Reply header;
  header.is_tensor = false;
  header.layout_words = layout_words(layout);
  push(request, header, nullptr);
}

void ReplyOutbox::error(uint64_t request, const std::string& message) {
  Reply header;
  header.ok = false;
  header.error = message;
  push(request, header, nullptr);
}

void ReplyOutbox::push(uint64_t request, const Reply& header, const Tensor* payload) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_.push_back(Queued{request, encode_reply(header), payload ? payload->contiguous() : Tensor()});
  }
  queued_cv_.notify_all();
}

void ReplyOutbox::send_queued() {
  std::vector<Queued> sending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sending.swap(queued_);
  }
  Communicator& comm = world();
  for (Queued& q : sending) {
    const int tag = reply_tag(q.request);
    auto words = std::make_shared<const std::vector<int64_t>>(std::move(q.words));
    for (Work& w : isend_words(comm, words, 0, tag, tag)) inflight_.push_back(std::move(w));
    if (q.payload.defined() && q.payload.numel() > 0) {
      const Tensor bytes = q.payload.contiguous();
      inflight_.push_back(comm.isend(bytes.raw_data(), bytes.numel(), bytes.dtype(), 0, tag));
      inflight_.back().keep_alive(bytes.storage());
    }
  }
  drop_completed(inflight_);  // rethrows a failed send
}

void ReplyOutbox::wait_sending(const Work& work) {
  auto pause = std::chrono::microseconds(5);
  while (!work.is_completed()) {
    send_queued();
    // Sleeps until a stream queues a reply, or a while (backing off), then looks again.
    std::unique_lock<std::mutex> lock(mutex_);
    if (queued_cv_.wait_for(lock, pause, [&] { return !queued_.empty(); })) continue;
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  work.wait();  // rethrows a failure
}

void ReplyOutbox::finish() {
  send_queued();
  for (const Work& w : inflight_) w.wait();
  inflight_.clear();
}

void MeshHandoff::put(int64_t stream, int64_t mesh, StreamMesh copies) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.insert_or_assign({stream, mesh}, std::move(copies));
  }
  ready_cv_.notify_all();
}

StreamMesh MeshHandoff::take(int64_t stream, int64_t mesh, Health& health) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::pair<int64_t, int64_t> key{stream, mesh};
  while (!ready_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return ready_.count(key) > 0; })) {
    const std::string failure = health.get();
    TESSERA_CHECK(failure.empty(), CommError, "controller worker", "stream ", stream, " waits for mesh ", mesh,
                  " but the worker failed: ", failure);
  }
  StreamMesh copies = std::move(ready_.at(key));
  ready_.erase(key);
  return copies;
}

WorkerPort::WorkerPort() { streams_.emplace(0, std::make_shared<CommandQueue>()); }

std::shared_ptr<CommandQueue> WorkerPort::stream(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

bool WorkerPort::route(std::shared_ptr<const Command> command) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::holds_alternative<MakeMesh>(*command) || std::holds_alternative<SliceMesh>(*command)) {
    // The worker's thread builds a mesh (collective) and hands each stream a copy; a slice each
    // stream cuts from its own copy.
    const bool built_here = std::holds_alternative<MakeMesh>(*command);
    if (built_here) control.push(command);
    meshes_.push_back(command);
    for (auto& [id, queue] : streams_) queue->push(command);
    return built_here;
  }
  if (const auto* made = std::get_if<MakeStream>(command.get())) {
    auto queue = std::make_shared<CommandQueue>();
    for (const auto& mesh : meshes_) queue->push(mesh);
    streams_.insert_or_assign(made->stream, std::move(queue));
    control.push(std::move(command));
    return true;
  }
  if (std::holds_alternative<Stop>(*command)) {
    for (auto& [id, queue] : streams_) queue->push(command);
    control.push(std::move(command));
    return true;
  }
  const auto it = streams_.find(stream_of(*command));
  // Unknown streams cannot come from the controller; the worker's thread answers them.
  if (it == streams_.end()) {
    control.push(std::move(command));
    return true;
  }
  it->second->push(std::move(command));
  return false;
}

namespace {

// A stream's thread: runs its queue's commands in order, with its own copies of the meshes.
class StreamThread {
 public:
  StreamThread(WorkerShared& shared, MeshHandoff& handoff, int64_t id, std::shared_ptr<CommandQueue> queue)
      : queue_(std::move(queue)) {
    thread_ = rank_thread([this, &shared, &handoff, id] { loop(shared, handoff, id); });
  }
  StreamThread(const StreamThread&) = delete;
  StreamThread& operator=(const StreamThread&) = delete;
  ~StreamThread() {
    if (!thread_.joinable()) return;
    queue_->push(std::make_shared<const Command>());  // stop (the worker failed before it sent one)
    thread_.join();
  }
  void join() { thread_.join(); }

 private:
  void loop(WorkerShared& shared, MeshHandoff& handoff, int64_t id) {
    StreamMeshes meshes;
    for (;;) {
      const std::shared_ptr<const Command> command = queue_->pop();
      const Command& c = *command;
      try {
        if (const auto* made = std::get_if<MakeMesh>(&c)) {
          meshes.insert_or_assign(made->mesh, handoff.take(id, made->mesh, shared.health));
          continue;
        }
        if (!execute(c, shared, meshes)) return;
      } catch (const std::exception& e) {
        // Not an op's failure (those stay with its output): this stream's state is broken, so
        // every future still waiting fails with this.
        shared.health.fail(worker_error(e.what()));
        reply_error(shared, c, worker_error(e.what()));
      }
    }
  }

  std::shared_ptr<CommandQueue> queue_;
  std::thread thread_;
};

// The worker's own thread: builds the meshes (collective over the world) and starts the
// streams; each stream gets two duplicates of every mesh (StreamMesh), made in stream order then
// mesh order on every worker, so the duplicates' splits meet.
class Dispatcher {
 public:
  Dispatcher(WorkerShared& shared, WorkerPort& port) : shared_(shared), port_(port) { start_stream(0); }

  // Runs one command of `control`; false after stop (every stream finished what it had).
  bool run(const Command& c) {
    if (const auto* made = std::get_if<MakeMesh>(&c)) {
      const DeviceMesh& built =
          built_
              .insert_or_assign(made->mesh, DeviceMesh(made->shape, made->names,
                                                       std::vector<int>(made->ranks.begin(), made->ranks.end())))
              .first->second;
      for (auto& [id, stream] : streams_) port_.handoff.put(id, made->mesh, copies_of(built));
      return true;
    }
    if (const auto* made = std::get_if<MakeStream>(&c)) {
      start_stream(made->stream);
      return true;
    }
    if (std::holds_alternative<Stop>(c)) {
      for (auto& [id, stream] : streams_) stream->join();
      return false;
    }
    reply_error(shared_, c, worker_error("[controller] no stream " + std::to_string(stream_of(c))));
    return true;
  }

 private:
  void start_stream(int64_t id) {
    for (const auto& [mesh_id, mesh] : built_) port_.handoff.put(id, mesh_id, copies_of(mesh));
    streams_.emplace(id, std::make_unique<StreamThread>(shared_, port_.handoff, id, port_.stream(id)));
  }

  // Collective over the workers: the same order (working copy, then agreement copy) on each.
  static StreamMesh copies_of(const DeviceMesh& mesh) {
    DeviceMesh working = mesh.duplicate();
    return {std::move(working), mesh.duplicate()};
  }

  WorkerShared& shared_;
  WorkerPort& port_;
  std::map<int64_t, std::unique_ptr<StreamThread>> streams_;
  std::map<int64_t, DeviceMesh> built_;
};

}  // namespace

void worker_loop(WorkerPort& port, Health& health, ReplySink& replies) {
  WorkerShared shared(health, replies);
  Dispatcher dispatcher(shared, port);
  for (;;) {
    const std::shared_ptr<const Command> command = port.control.pop();
    try {
      if (!dispatcher.run(*command)) return;
    } catch (const std::exception& e) {
      health.fail(worker_error(e.what()));
      reply_error(shared, *command, worker_error(e.what()));
    }
  }
}

void mpi_worker_loop() {
  Health health;  // a failure outside an op: the streams stop waiting on this thread
  ReplyOutbox outbox;
  WorkerShared shared(health, outbox);
  WorkerPort port;  // fed by this thread, from the controller's messages
  Dispatcher dispatcher(shared, port);
  Communicator& comm = world();
  for (bool running = true; running;) {
    // Replies go out while the next command is awaited.
    const std::vector<int64_t> words =
        recv_words(comm, 0, kCommandLengthTag, kCommandTag, [&](const Work& w) { outbox.wait_sending(w); });
    auto command = std::make_shared<const Command>(decode_command(words));
    try {
      // What went to this thread's own queue runs now.
      if (port.route(command)) running = dispatcher.run(*port.control.pop());
    } catch (const std::exception& e) {
      health.fail(worker_error(e.what()));  // a stream waiting for this thread's mesh gives up
      reply_error(shared, *command, worker_error(e.what()));
    }
  }
  // The controller receives every reply it asked for before stopping the workers.
  outbox.finish();
}

}  // namespace tessera::controller::detail
