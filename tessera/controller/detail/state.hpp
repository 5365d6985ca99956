#pragma once
// The controller's side while run's body executes: the transport, the id counters, the streams,
// and the handles of remote tensors.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/futures.hpp>
#include <tessera/controller/detail/transport.hpp>

namespace tessera::controller::detail {

struct ControllerState {
  int workers = 0;
  std::shared_ptr<Health> health = std::make_shared<Health>();
  std::unique_ptr<Transport> transport;
  std::atomic<uint64_t> next_tensor{1};
  std::atomic<int64_t> next_mesh{0};
  uint64_t next_event = 1;
  // Streams: names by id (0 is "main") and the one ops are issued on now.
  std::vector<std::string> streams{"main"};
  int64_t active_stream = 0;
  int no_mesh = 0;                // open NoMesh scopes
  int64_t all_workers_mesh = -1;  // a 1-d mesh of every worker, made by the first to_mesh

  template <class T>
  std::shared_ptr<FutureState<T>> future() const {
    return std::make_shared<FutureState<T>>(health);
  }
  /// Sends `command` to every worker in `ranks` (world ranks).
  void send(const std::vector<int>& ranks, Command command) {
    transport->send(ranks, std::make_shared<const Command>(std::move(command)));
  }
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

/// Where the first worker of `mesh` reports the layout of a result it makes: a request when the
/// transport has workers report as they go, else 0 (they report when asked).
uint64_t layout_request(ControllerState& state, const std::shared_ptr<FutureState<Layout>>& layout,
                        const WorkerMesh& mesh);
/// ValueError naming `call` unless the active stream may read t (not dropped, its own or
/// borrowed, not lent mutably).
void check_readable(const ControllerState& state, const RemoteTensor& t, const std::string& call);
/// "mesh[gpu=2] on workers [0, 1]".
std::string describe_mesh(const WorkerMesh& mesh);

/// A remote function's call (call_remote, Remote::call): its inputs checked (ValueError and
/// ShardingError naming `call`), the command issued, `outputs` results returned. With
/// `expected` (one layout per output: a propagation's), the results' layouts are those at once
/// and the workers check theirs against them; else the mesh's first worker reports them.
std::vector<RemoteTensor> issue_remote(const char* call, const std::string& name, const WorkerMesh& mesh,
                                       const std::vector<RemoteTensor>& inputs, int64_t outputs,
                                       const std::vector<Layout>* expected);

/// A tensor's controller-side handle: its id, mesh, and the future of its layout. The last
/// copy's destruction drops the tensor on the workers.
struct TensorHandle {
  TensorHandle(uint64_t id, WorkerMesh mesh, std::shared_ptr<FutureState<Layout>> layout, int64_t stream)
      : id(id), mesh(std::move(mesh)), layout(std::move(layout)), stream(stream), writer(stream) {}
  TensorHandle(const TensorHandle&) = delete;
  TensorHandle& operator=(const TensorHandle&) = delete;
  ~TensorHandle();

  /// Has the workers drop the tensor, on its owner's stream after its work (a borrower's drop
  /// made the owner wait for it).
  void drop_on_workers(ControllerState& state) const;
  /// A write on stream `stream`: the tensor's layout is the one `layout` will report.
  void written(std::shared_ptr<FutureState<Layout>> layout_now, int64_t stream) {
    layout = std::move(layout_now);
    writer = stream;
  }

  uint64_t id;
  WorkerMesh mesh;
  std::shared_ptr<FutureState<Layout>> layout;
  int64_t stream;                                 // the owner
  int64_t writer;                                 // the stream that wrote it last (reports its layout)
  std::vector<std::pair<int64_t, bool>> borrows;  // (stream, mutable) lent out now
  bool dropped = false;                           // by RemoteTensor::drop: the workers freed it

  static RemoteTensor make(uint64_t id, WorkerMesh mesh, std::shared_ptr<FutureState<Layout>> layout, int64_t stream) {
    return RemoteTensor(std::make_shared<TensorHandle>(id, std::move(mesh), std::move(layout), stream));
  }
};

/// The controller's access to a RemoteTensor's handle (its stream and borrows).
struct HandleAccess {
  static TensorHandle& of(const RemoteTensor& t) { return *t.handle_; }
};

}  // namespace tessera::controller::detail
