#pragma once
// What the controller sends a worker: data only (an op's name and its arguments, tensor ids),
// never code, so that a transport other than in-process queues can carry it. Replies (fetched
// tensors, layouts, errors) go to futures the controller holds.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <tessera/comm/tags.hpp>
#include <tessera/comm/work.hpp>
#include <tessera/controller/controller.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera::controller::detail {

/// Whether the workers are still serving: the first failure outside an op (a worker's loop
/// itself, the worker world) is kept here, and every future still waiting fails with it.
struct Health {
  std::mutex mutex;
  std::string failure;
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure.empty()) failure = what;
  }
  std::string get() {
    std::lock_guard<std::mutex> lock(mutex);
    return failure;
  }
};

template <class T>
struct FutureState {
  explicit FutureState(std::shared_ptr<Health> health = nullptr) : health(std::move(health)) {}
  std::mutex mutex;
  std::condition_variable ready_cv;
  std::optional<T> value;
  std::string error;  // set instead of value on failure
  bool done = false;
  std::shared_ptr<Health> health;
  /// With workers in other processes: receives the reply (get() calls it, outside the lock).
  std::function<void(FutureState&)> pull;

  void set(T v) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (done) return;
      value = std::move(v);
      done = true;
    }
    ready_cv.notify_all();
  }
  void fail(std::string message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (done) return;
      error = std::move(message);
      done = true;
    }
    ready_cv.notify_all();
  }
};

/// The arguments of an op besides its input tensors.
struct OpArgs {
  std::vector<double> scalars;
  std::vector<int64_t> ints;
  Shape shape;
  Placements placements;
  DType dtype = DType::f32;
};

struct Command {
  enum class Kind : uint8_t {
    make_mesh, slice_mesh, run_op, seed, fetch_shard, fetch_full, drop, stop, query_layout,
    make_stream,  // a new stream (`stream`) on every worker
    signal,       // on `stream`: marks `event` once everything before it on the stream ran
    wait,         // on `stream`: runs nothing after it until `event` is marked
  };
  Kind kind = Kind::stop;
  int64_t mesh = -1;    // the mesh it runs on (make/slice: the new mesh's id)
  int64_t stream = 0;   // the stream it runs on
  int64_t target = -1;  // mesh_reduce onto a slice: the slice's id
  // make_mesh / slice_mesh
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_names;
  int64_t parent = -1;
  std::map<std::string, int64_t> at;
  // run_op: an op of the table, or a remote function (remote = true) with several outputs
  std::string op;
  bool remote = false;
  std::vector<uint64_t> inputs;
  OpArgs args;
  uint64_t output = 0;                                        // the op's (fetch, drop: the tensor)
  std::shared_ptr<FutureState<Layout>> layout;                // the first worker reports it
  std::vector<uint64_t> outputs;                              // a remote function's
  std::vector<std::shared_ptr<FutureState<Layout>>> layouts;  // theirs
  // fetch
  std::shared_ptr<FutureState<Tensor>> reply;
  // Workers in other processes answer a request by id instead of through the futures above
  // (fetch_shard, fetch_full, query_layout); 0: no answer wanted.
  uint64_t request = 0;
  uint64_t event = 0;  // signal / wait
};

/// Tags of the controller's messages on the world communicator: a command's length and words;
/// a reply to request r (its header length, header words, then a tensor's bytes).
inline constexpr int kCommandLengthTag = kControllerTags.first;
inline constexpr int kCommandTag = kControllerTags.first + 1;
inline int reply_tag(uint64_t request) {
  return kControllerTags.first + 2 + static_cast<int>(request % static_cast<uint64_t>(kControllerTags.size() - 2));
}

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
/// new mesh as a make_mesh command in its queue: it takes its copy from the handoff there.
class WorkerPort {
 public:
  WorkerPort();
  /// Queues `command` where it runs; true when that is `control` (the worker's own thread).
  bool route(std::shared_ptr<const Command> command);
  /// The queue of stream `id` (made by route(make_stream)), or null.
  std::shared_ptr<CommandQueue> stream(int64_t id);

  CommandQueue control;
  MeshHandoff handoff;

 private:
  std::mutex mutex_;
  std::map<int64_t, std::shared_ptr<CommandQueue>> streams_;
  // The meshes and slices made so far, in order: a new stream's queue starts with them.
  std::vector<std::shared_ptr<const Command>> meshes_;
};

/// The controller's side while run's body executes: the workers' queues and the id counters.
struct ControllerState {
  int workers = 0;
  /// Workers are MPI processes (world ranks 1..workers; the controller is rank 0), else
  /// in-process threads (ranks 0..workers-1) fed through `ports`.
  bool mpi = false;
  std::atomic<uint64_t> next_request{1};
  std::vector<Work> outbox;  // MPI sends in flight, each keeping its buffer alive
  /// MPI: every reply requested and not yet received; shutdown receives them (a worker cannot end
  /// with a reply unsent).
  std::vector<std::function<bool(bool receive)>> unreceived;  // (false): still owed? (true): receive it
  std::vector<DeviceMesh> meshes;  // MPI: the controller's handles of the workers' meshes
  std::shared_ptr<Health> health = std::make_shared<Health>();
  template <class T>
  std::shared_ptr<FutureState<T>> future() const {
    return std::make_shared<FutureState<T>>(health);
  }
  std::vector<std::unique_ptr<WorkerPort>> ports;
  std::atomic<uint64_t> next_tensor{1};
  std::atomic<int64_t> next_mesh{0};
  uint64_t next_event = 1;
  // Streams: names by id (0 is "main") and the one ops are issued on now.
  std::vector<std::string> streams{"main"};
  int64_t active_stream = 0;
  int no_mesh = 0;  // open NoMesh scopes
  /// Sends `command` to every worker in `ranks` (world ranks).
  void send(const std::vector<int>& ranks, std::shared_ptr<const Command> command);
  /// The world rank of the first worker.
  int first_worker() const { return mpi ? 1 : 0; }
  /// Every worker's world rank.
  std::vector<int> all_workers() const;
  /// On the workers `ranks`: stream `after` runs nothing issued from now on until stream
  /// `before` ran everything issued so far (an event signalled on one, waited for on the other).
  void order(const std::vector<int>& ranks, int64_t before, int64_t after);
};

/// The running controller, or null outside run's body.
ControllerState* current();
/// Same, throwing ValueError naming `call` outside run's body.
ControllerState& require(const char* call);
/// require(), and no NoMesh scope open: for calls that issue work.
ControllerState& require_mesh(const char* call);

/// A tensor's controller-side handle: its id, mesh, and the future of its layout. The last
/// copy's destruction drops the tensor on the workers.
struct TensorHandle {
  TensorHandle(uint64_t id, WorkerMesh mesh, std::shared_ptr<FutureState<Layout>> layout, int64_t stream)
      : id(id), mesh(std::move(mesh)), layout(std::move(layout)), stream(stream), writer(stream) {}
  TensorHandle(const TensorHandle&) = delete;
  TensorHandle& operator=(const TensorHandle&) = delete;
  ~TensorHandle();

  uint64_t id;
  WorkerMesh mesh;
  std::shared_ptr<FutureState<Layout>> layout;
  int64_t stream;                                // the owner
  int64_t writer;                                // the stream that wrote it last (reports its layout)
  std::vector<std::pair<int64_t, bool>> borrows;  // (stream, mutable) lent out now

  static RemoteTensor make(uint64_t id, WorkerMesh mesh, std::shared_ptr<FutureState<Layout>> layout,
                           int64_t stream) {
    return RemoteTensor(std::make_shared<TensorHandle>(id, std::move(mesh), std::move(layout), stream));
  }
};

/// The controller's access to a RemoteTensor's handle (its stream and borrows).
struct HandleAccess {
  static TensorHandle& of(const RemoteTensor& t) { return *t.handle_; }
};

/// Runs commands on this worker (a rank of the workers' world) until a stop command. A failure
/// outside an op goes to `health` (the worker keeps serving).
void worker_loop(WorkerPort& port, Health& health);
/// The same for a worker process: commands arrive from world rank 0, replies go back to it.
void mpi_worker_loop();
/// The remote functions registered by name (every worker of this process sees them).
using RemoteFn = std::function<std::vector<DTensor>(const DeviceMesh&, const std::vector<DTensor>&)>;
const RemoteFn* find_remote(const std::string& name);
/// Whether the op table has `name`, and all its names.
bool has_op(const std::string& name);
std::vector<std::string> table_op_names();

}  // namespace tessera::controller::detail
