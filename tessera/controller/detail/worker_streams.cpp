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
#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::controller::detail {

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
    auto words = std::make_shared<std::vector<int64_t>>(std::move(q.words));
    auto length = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(words->size()));
    inflight_.emplace_back(comm.isend(length->data(), 1, DType::i64, 0, tag), length);
    inflight_.emplace_back(comm.isend(words->data(), static_cast<int64_t>(words->size()), DType::i64, 0, tag), words);
    if (q.payload.defined() && q.payload.numel() > 0) {
      auto bytes = std::make_shared<Tensor>(std::move(q.payload));
      inflight_.emplace_back(comm.isend(bytes->raw_data(), bytes->numel(), bytes->dtype(), 0, tag), bytes);
    }
  }
  const auto done = std::partition(inflight_.begin(), inflight_.end(), [](const auto& w) { return !w.first.is_completed(); });
  for (auto it = done; it != inflight_.end(); ++it) it->first.wait();  // rethrows a failed send
  inflight_.erase(done, inflight_.end());
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
  for (auto& [work, buffer] : inflight_) work.wait();
  inflight_.clear();
}

namespace {

// What a stream's thread receives: a command, or a copy of a mesh made for it.
struct StreamItem {
  std::shared_ptr<const Command> command;
  int64_t mesh_id = -1;
  DeviceMesh mesh;
};

class StreamThread {
 public:
  explicit StreamThread(WorkerShared& shared) {
    thread_ = rank_thread([this, &shared] { loop(shared); });
  }
  StreamThread(const StreamThread&) = delete;
  StreamThread& operator=(const StreamThread&) = delete;
  ~StreamThread() {
    if (!thread_.joinable()) return;
    push(std::make_shared<const Command>());  // stop (the dispatcher failed before it sent one)
    thread_.join();
  }
  void push(std::shared_ptr<const Command> command) { queue_.push(StreamItem{std::move(command), -1, {}}); }
  void adopt(int64_t mesh_id, DeviceMesh mesh) { queue_.push(StreamItem{nullptr, mesh_id, std::move(mesh)}); }
  void join() { thread_.join(); }

 private:
  void loop(WorkerShared& shared) {
    StreamMeshes meshes;
    for (;;) {
      StreamItem item = queue_.pop();
      if (!item.command) {
        meshes.emplace(item.mesh_id, std::move(item.mesh));
        continue;
      }
      const Command& c = *item.command;
      try {
        if (!execute(c, shared, meshes)) return;
      } catch (const std::exception& e) {
        // Not an op's failure (those stay with its output): this stream's state is broken, so
        // every future still waiting fails with this.
        shared.health.fail(worker_error(e.what()));
        reply_error(shared, c, worker_error(e.what()));
      }
    }
  }

  BlockingQueue<StreamItem> queue_;
  std::thread thread_;
};

// The rank's own thread: receives commands (from `next`), keeps the meshes as built (each
// stream gets a duplicate) and the slices (each stream slices its own copy), and routes the
// rest to the streams.
class Dispatcher {
 public:
  explicit Dispatcher(WorkerShared& shared) : shared_(shared) { start_stream(0); }

  // Runs one command; false after stop (every stream finished what it had).
  bool route(const std::shared_ptr<const Command>& command) {
    const Command& c = *command;
    switch (c.kind) {
      case Command::Kind::make_mesh: {
        // Collective over the world; then one duplicate per stream, in stream order on every
        // worker, so the duplicates' splits meet.
        DeviceMesh& built = built_.emplace(c.mesh, DeviceMesh(c.mesh_shape, c.mesh_names,
                                                              std::vector<int>(c.args.ints.begin(), c.args.ints.end())))
                                .first->second;
        for (auto& [id, stream] : streams_) stream->adopt(c.mesh, built.duplicate());
        return true;
      }
      case Command::Kind::slice_mesh:
        slices_.push_back(command);
        for (auto& [id, stream] : streams_) stream->push(command);
        return true;
      case Command::Kind::make_stream:
        start_stream(c.stream);
        return true;
      case Command::Kind::stop:
        for (auto& [id, stream] : streams_) stream->push(command);
        for (auto& [id, stream] : streams_) stream->join();
        return false;
      default: {
        const auto it = streams_.find(c.stream);
        if (it == streams_.end()) {
          reply_error(shared_, c, worker_error("[controller] no stream " + std::to_string(c.stream)));
          return true;
        }
        it->second->push(command);
        return true;
      }
    }
  }

 private:
  void start_stream(int64_t id) {
    auto stream = std::make_unique<StreamThread>(shared_);
    for (const auto& [mesh_id, mesh] : built_) stream->adopt(mesh_id, mesh.duplicate());  // by id, as on every worker
    for (const auto& slice : slices_) stream->push(slice);
    streams_.emplace(id, std::move(stream));
  }

  WorkerShared& shared_;
  std::map<int64_t, std::unique_ptr<StreamThread>> streams_;
  std::map<int64_t, DeviceMesh> built_;
  std::vector<std::shared_ptr<const Command>> slices_;
};

}  // namespace

void worker_loop(CommandQueue& queue, Health& health) {
  WorkerShared shared(health, nullptr);
  Dispatcher dispatcher(shared);
  for (;;) {
    const std::shared_ptr<const Command> command = queue.pop();
    try {
      if (!dispatcher.route(command)) return;
    } catch (const std::exception& e) {
      health.fail(worker_error(e.what()));
      reply_error(shared, *command, worker_error(e.what()));
    }
  }
}

void mpi_worker_loop() {
  Health health;  // a failure outside an op: reported when the controller asks
  ReplyOutbox outbox;
  WorkerShared shared(health, &outbox);
  Dispatcher dispatcher(shared);
  Communicator& comm = world();
  for (bool running = true; running;) {
    int64_t length = 0;
    outbox.wait_sending(comm.irecv(&length, 1, DType::i64, 0, kCommandLengthTag));
    std::vector<int64_t> words(static_cast<size_t>(length));
    comm.recv(words.data(), length, DType::i64, 0, kCommandTag);
    auto command = std::make_shared<const Command>(decode_command(words));
    try {
      running = dispatcher.route(command);
    } catch (const std::exception& e) {
      reply_error(shared, *command, worker_error(e.what()));
    }
  }
  // The controller receives every reply it asked for before stopping the workers.
  outbox.finish();
}

}  // namespace tessera::controller::detail
