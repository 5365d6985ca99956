#include <tessera/controller/controller.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>

#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/comm/word_messages.hpp>
#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/wire.hpp>
#include <tessera/core/error.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller {

namespace detail {

namespace {
std::atomic<ControllerState*> running{nullptr};
}  // namespace

ControllerState* current() { return running.load(); }

ControllerState& require(const char* call) {
  ControllerState* state = current();
  TESSERA_CHECK(state != nullptr, ValueError, call, "no controller is running (call it inside controller::run's body)");
  return *state;
}

ControllerState& require_mesh(const char* call) {
  ControllerState& state = require(call);
  TESSERA_CHECK(state.no_mesh == 0, ValueError, call, "inside a no_mesh scope no work is issued (", call,
                " would run on workers); end the NoMesh scope first");
  return state;
}

void ControllerState::send(const std::vector<int>& ranks, std::shared_ptr<const Command> command) {
  if (!mpi) {
    for (int r : ranks) ports[static_cast<size_t>(r)]->route(command);
    return;
  }
  auto words = std::make_shared<const std::vector<int64_t>>(encode_command(*command));
  Communicator& comm = world();
  for (int r : ranks)
    for (Work& w : isend_words(comm, words, r, kCommandLengthTag, kCommandTag)) outbox.push_back(std::move(w));
  drop_completed(outbox);  // a failed send throws here
}

std::vector<int> ControllerState::all_workers() const {
  std::vector<int> ranks(static_cast<size_t>(workers));
  for (int r = 0; r < workers; ++r) ranks[static_cast<size_t>(r)] = r + first_worker();
  return ranks;
}

void ControllerState::order(const std::vector<int>& ranks, int64_t before, int64_t after) {
  const uint64_t event = next_event++;
  auto signal = std::make_shared<Command>();
  signal->kind = Command::Kind::signal;
  signal->stream = before;
  signal->event = event;
  auto wait = std::make_shared<Command>(*signal);
  wait->kind = Command::Kind::wait;
  wait->stream = after;
  send(ranks, std::move(signal));
  send(ranks, std::move(wait));
}

namespace {

// MPI: the future's value comes as request `request`'s reply from world rank `worker`: a header
// (see Reply), then a tensor's bytes. `mesh` decodes a layout.
template <class T>
void expect_reply(ControllerState& state, const std::shared_ptr<FutureState<T>>& future, int worker, uint64_t request,
                  const MeshSpec& mesh) {
  future->pull = [worker, request, mesh](FutureState<T>& f) {
    Communicator& comm = world();
    const int tag = reply_tag(request);
    const Reply reply = decode_reply(recv_words(comm, worker, tag, tag, wait_polling));
    if (!reply.ok) return f.fail(reply.error);
    if constexpr (std::is_same_v<T, Tensor>) {
      Tensor t = empty(reply.shape, reply.dtype);
      if (t.numel() > 0) wait_polling(comm.irecv(t.raw_data(), t.numel(), t.dtype(), worker, tag));
      f.set(std::move(t));
    } else {
      f.set(WordReader(reply.layout_words, "controller").layout(mesh));
    }
  };
  // Kept (even when the caller drops the future) until received: a worker cannot end with its
  // reply unsent. Entries already received are forgotten as new ones come.
  std::erase_if(state.unreceived, [](const auto& pending) { return !pending(false); });
  state.unreceived.push_back([future](bool receive) {
    if (!future->pull) return false;
    if (receive) {
      auto pull = std::move(future->pull);
      future->pull = nullptr;
      pull(*future);
    }
    return receive ? false : true;
  });
}

}  // namespace

TensorHandle::~TensorHandle() {
  // The workers drop the tensor once every op enqueued before has run. After shutdown there is
  // nothing to drop.
  ControllerState* state = current();
  if (!state) return;
  auto command = std::make_shared<Command>();
  command->kind = Command::Kind::drop;
  command->mesh = mesh.id();
  command->stream = stream;  // after its owner's work (a borrower's drop made the owner wait for it)
  command->output = id;
  state->send(mesh.spec().ranks(), std::move(command));
}

}  // namespace detail

namespace {

// "mesh[gpu=2] on workers [0, 1]": the workers are what tells two slices of one shape apart.
std::string describe(const WorkerMesh& mesh) {
  std::string text = mesh.spec().to_string();
  text = text.substr(0, text.find(" ranks")) + " on workers [";
  for (size_t i = 0; i < mesh.spec().ranks().size(); ++i) text.append(i ? ", " : "").append(std::to_string(mesh.spec().ranks()[i]));
  return text + "]";
}

std::string stream_name(const detail::ControllerState& state, int64_t id) {
  return "'" + state.streams[static_cast<size_t>(id)] + "'";
}

// The stream rules for reading t on the active stream: its own stream unless a mutable borrow
// has it; another stream only through a borrow.
void check_read(const detail::ControllerState& state, const RemoteTensor& t, const std::string& call) {
  const detail::TensorHandle& h = detail::HandleAccess::of(t);
  const int64_t s = state.active_stream;
  if (h.stream == s) {
    for (const auto& [borrower, is_mutable] : h.borrows)
      TESSERA_CHECK(!is_mutable, ValueError, call, "tensor ", h.id, " of stream ", stream_name(state, s),
                    " is mutably borrowed by stream ", stream_name(state, borrower), " until drop()");
    return;
  }
  for (const auto& [borrower, is_mutable] : h.borrows)
    if (borrower == s) return;
  TESSERA_CHECK(false, ValueError, call, "tensor ", h.id, " belongs to stream ", stream_name(state, h.stream),
                "; borrow it onto stream ", stream_name(state, s), " first");
}

// Writing t on the active stream: its own stream with nothing lent out, or a mutable borrower.
void check_write(const detail::ControllerState& state, const RemoteTensor& t, const std::string& call) {
  const detail::TensorHandle& h = detail::HandleAccess::of(t);
  const int64_t s = state.active_stream;
  if (h.stream == s) {
    for (const auto& [borrower, is_mutable] : h.borrows)
      TESSERA_CHECK(false, ValueError, call, "tensor ", h.id, " of stream ", stream_name(state, s), " is ",
                    is_mutable ? "mutably" : "immutably", " borrowed by stream ", stream_name(state, borrower),
                    is_mutable ? "" : " (while lent immutably, neither stream writes)", " until drop()");
    return;
  }
  for (const auto& [borrower, is_mutable] : h.borrows)
    if (borrower == s && is_mutable) return;
  TESSERA_CHECK(false, ValueError, call, "tensor ", h.id, " belongs to stream ", stream_name(state, h.stream),
                "; stream ", stream_name(state, s), " writes it only through a mutable borrow");
}

// An op's inputs: defined, on `mesh` (else an error naming both meshes), readable on the active
// stream.
void check_inputs(const detail::ControllerState& state, const std::string& call, const std::vector<RemoteTensor>& inputs,
                  const WorkerMesh& mesh) {
  for (const RemoteTensor& t : inputs) {
    TESSERA_CHECK(t.defined(), ValueError, call, "an input is an undefined RemoteTensor");
    TESSERA_CHECK(t.mesh().id() == mesh.id(), ShardingError, call, "inputs live on two meshes: ", describe(mesh), " and ",
                  describe(t.mesh()), "; move one onto the other's mesh first");
    check_read(state, t, call);
  }
}

}  // namespace

namespace {

// Under MPI: world rank 0 runs the controller, every other rank a worker.
int run_mpi(int argc, char** argv, const std::function<void()>& body) {
  int body_status = 0;
  const int status = tessera::run(argc, argv, [&] {
    if (rank() != 0) return detail::mpi_worker_loop();
    TESSERA_CHECK(world_size() >= 2, ValueError, "controller::run", "under MPI the controller is rank 0 and the "
                  "workers the others: run at least 2 processes, got ", world_size());
    detail::ControllerState state;
    state.mpi = true;
    state.workers = world_size() - 1;
    detail::running.store(&state);
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "controller: %s\n", e.what());
      body_status = 1;
    }
    // Receive every reply still owed (a worker cannot end with one unsent), then stop the workers.
    for (auto& pending : state.unreceived) {
      try {
        pending(true);
      } catch (const std::exception&) {
        // a reply that failed to arrive: nothing waits for it any more
      }
    }
    auto stop = std::make_shared<detail::Command>();
    stop->kind = detail::Command::Kind::stop;
    state.send(state.all_workers(), stop);
    for (const Work& w : state.outbox) w.wait();
    detail::running.store(nullptr);
  });
  return status != 0 ? status : body_status;
}

}  // namespace

int run(int argc, char** argv, std::function<void()> body) {
  TESSERA_CHECK(!in_rank() && !detail::current(), ValueError, "controller::run",
                "called inside a rank or a running controller; the controller is the program's main thread");
  const char* forced = std::getenv("TESSERA_BACKEND");
  if (mpi::launched_by_mpirun() || (forced && std::string_view(forced) == "mpi")) return run_mpi(argc, argv, body);
  const int workers = ranks_from_args(argc, argv);
  detail::ControllerState state;
  state.workers = workers;
  for (int r = 0; r < workers; ++r) state.ports.push_back(std::make_unique<detail::WorkerPort>());
  // The workers: one in-process world running its queues until stopped.
  std::exception_ptr worker_failure;
  std::thread pool([&] {
    try {
      launch(workers, [&] { detail::worker_loop(*state.ports[static_cast<size_t>(rank())], *state.health); });
    } catch (...) {
      worker_failure = std::current_exception();
      try {
        std::rethrow_exception(worker_failure);
      } catch (const std::exception& e) {
        state.health->fail(e.what());
      } catch (...) {
        state.health->fail("a non-standard exception");
      }
    }
  });
  detail::running.store(&state);
  int status = 0;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "controller: %s\n", e.what());
    status = 1;
  }
  // Every worker finishes what was queued, then stops; handles dropped after this send nothing.
  detail::running.store(nullptr);
  auto stop = std::make_shared<detail::Command>();
  stop->kind = detail::Command::Kind::stop;
  for (auto& port : state.ports) port->route(stop);
  pool.join();
  if (worker_failure) {
    try {
      std::rethrow_exception(worker_failure);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "controller: a worker failed: %s\n", e.what());
    }
    status = 1;
  }
  return status;
}

int num_workers() { return detail::require("controller::num_workers").workers; }

template <class T>
T Future<T>::get() const {
  if (state_->pull) {  // a reply from a worker process: receive it now
    auto pull = std::move(state_->pull);
    state_->pull = nullptr;
    pull(*state_);
  }
  std::unique_lock<std::mutex> lock(state_->mutex);
  // Waits for the worker, looking every 50 ms whether the workers failed (then nothing comes).
  while (!state_->ready_cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return state_->done; })) {
    const std::string failure = state_->health ? state_->health->get() : std::string();
    if (!failure.empty()) throw CommError("[Future::get] the workers failed: " + failure);
  }
  if (!state_->error.empty()) throw CommError(state_->error);
  return *state_->value;
}

template <class T>
bool Future<T>::ready() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

template class Future<Tensor>;
template class Future<Layout>;

WorkerMesh::WorkerMesh(std::vector<int64_t> shape, std::vector<std::string> names) {
  detail::ControllerState& state = detail::require("WorkerMesh");
  int64_t points = 1;
  for (int64_t n : shape) points *= n;
  TESSERA_CHECK(points == state.workers, ShardingError, "WorkerMesh", "a mesh of shape ", Shape(shape).to_string(),
                " has ", points, " points; there are ", state.workers, " workers");
  const std::vector<int> ranks = state.all_workers();
  spec_ = MeshSpec(Shape(shape), names, ranks);
  id_ = state.next_mesh++;
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::make_mesh;
  command->mesh = id_;
  command->mesh_shape = shape;
  command->mesh_names = names;
  command->args.ints.assign(ranks.begin(), ranks.end());
  state.send(spec_.ranks(), std::move(command));  // collective among all workers
  // Under MPI the controller is a rank of the world too: it takes part in the construction.
  if (state.mpi) state.meshes.emplace_back(shape, names, ranks);
}

WorkerMesh WorkerMesh::slice(const std::map<std::string, int64_t>& at) const {
  detail::ControllerState& state = detail::require("WorkerMesh::slice");
  std::vector<int64_t> fixed(static_cast<size_t>(spec_.ndim()), -1);
  for (const auto& [axis, index] : at) {
    const int64_t d = spec_.dim_of(axis, "WorkerMesh::slice");
    TESSERA_CHECK(index >= 0 && index < spec_.size(d), ShardingError, "WorkerMesh::slice", "index ", index,
                  " is outside axis '", axis, "' of ", spec_.to_string());
    fixed[static_cast<size_t>(d)] = index;
  }
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  for (int64_t d = 0; d < spec_.ndim(); ++d)
    if (fixed[static_cast<size_t>(d)] < 0) shape.push_back(spec_.size(d)), names.push_back(spec_.names()[static_cast<size_t>(d)]);
  std::vector<int> ranks;
  for (int r : spec_.ranks()) {
    const std::vector<int64_t>& c = spec_.coordinate_of(r);
    bool inside = true;
    for (size_t d = 0; d < c.size(); ++d) inside = inside && (fixed[d] < 0 || fixed[d] == c[d]);
    if (inside) ranks.push_back(r);
  }
  const int64_t id = state.next_mesh++;
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::slice_mesh;
  command->mesh = id;
  command->parent = id_;
  command->at = at;
  state.send(spec_.ranks(), std::move(command));  // every worker of the parent holds the slice's handle
  return WorkerMesh(MeshSpec(Shape(shape), names, ranks), id);
}

const WorkerMesh& RemoteTensor::mesh() const {
  TESSERA_CHECK(handle_ != nullptr, ValueError, "RemoteTensor::mesh", "undefined RemoteTensor");
  return handle_->mesh;
}

uint64_t RemoteTensor::id() const { return handle_ ? handle_->id : 0; }

Layout RemoteTensor::layout() const {
  TESSERA_CHECK(handle_ != nullptr, ValueError, "RemoteTensor::layout", "undefined RemoteTensor");
  detail::ControllerState* state = detail::current();
  const auto& future = handle_->layout;
  if (state && state->mpi && !future->done && !future->pull) {
    // Workers in other processes report a layout when asked: the mesh's first worker answers.
    auto command = std::make_shared<detail::Command>();
    command->kind = detail::Command::Kind::query_layout;
    command->mesh = handle_->mesh.id();
    command->stream = handle_->writer;  // after the op that made the layout
    command->output = handle_->id;
    command->request = state->next_request++;
    const int worker = handle_->mesh.spec().ranks().front();
    detail::expect_reply(*state, future, worker, command->request, handle_->mesh.spec());
    state->send({worker}, std::move(command));
  }
  return Future<Layout>(future).get();
}

Shape RemoteTensor::shape() const { return layout().global_shape(); }

RemoteTensor call(const std::string& op, const std::vector<RemoteTensor>& inputs, const std::vector<double>& scalars,
                  const std::vector<int64_t>& ints, const WorkerMesh* mesh, const Shape& shape,
                  const Placements& placements, DType dtype) {
  detail::ControllerState& state = detail::require_mesh(op.c_str());
  TESSERA_CHECK(detail::has_op(op), ValueError, "controller::call", "no op '", op, "' in the op table");
  const WorkerMesh* on = mesh;
  if (!on && !inputs.empty()) {
    TESSERA_CHECK(inputs.front().defined(), ValueError, op, "an input is an undefined RemoteTensor");
    on = &inputs.front().mesh();
  }
  TESSERA_CHECK(on != nullptr, ShardingError, op, "no mesh: a factory needs one, an op an input");
  check_inputs(state, op, inputs, *on);
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::run_op;
  command->mesh = on->id();
  command->op = op;
  for (const RemoteTensor& t : inputs) command->inputs.push_back(t.id());
  command->args = detail::OpArgs{scalars, ints, shape, placements, dtype};
  command->output = state.next_tensor++;
  command->layout = state.future<Layout>();
  RemoteTensor result = detail::TensorHandle::make(command->output, *on, command->layout, state.active_stream);
  command->stream = state.active_stream;
  state.send(on->spec().ranks(), std::move(command));
  return result;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names = detail::table_op_names();
  std::sort(names.begin(), names.end());
  return names;
}

RemoteTensor zeros(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return call("zeros", {}, {}, {}, &mesh, shape, placements, dtype);
}
RemoteTensor ones(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return call("ones", {}, {}, {}, &mesh, shape, placements, dtype);
}
RemoteTensor full(const Shape& shape, double value, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return call("full", {}, {value}, {}, &mesh, shape, placements, dtype);
}
RemoteTensor randn(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return call("randn", {}, {}, {}, &mesh, shape, placements, dtype);
}
RemoteTensor rand(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return call("rand", {}, {}, {}, &mesh, shape, placements, dtype);
}

void manual_seed(uint64_t seed, const WorkerMesh& mesh) {
  detail::ControllerState& state = detail::require_mesh("controller::manual_seed");
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::seed;
  command->mesh = mesh.id();
  command->stream = state.active_stream;  // each stream draws from its own generator
  command->args.ints = {static_cast<int64_t>(seed)};
  state.send(mesh.spec().ranks(), std::move(command));
}

RemoteTensor add(const RemoteTensor& a, const RemoteTensor& b) { return call("add", {a, b}); }
RemoteTensor sub(const RemoteTensor& a, const RemoteTensor& b) { return call("sub", {a, b}); }
RemoteTensor mul(const RemoteTensor& a, const RemoteTensor& b) { return call("mul", {a, b}); }
RemoteTensor div(const RemoteTensor& a, const RemoteTensor& b) { return call("div", {a, b}); }
RemoteTensor matmul(const RemoteTensor& a, const RemoteTensor& b) { return call("matmul", {a, b}); }
RemoteTensor scale(const RemoteTensor& a, double factor) { return call("mul_scalar", {a}, {factor}); }
RemoteTensor neg(const RemoteTensor& a) { return call("neg", {a}); }
RemoteTensor exp(const RemoteTensor& a) { return call("exp", {a}); }
RemoteTensor tanh(const RemoteTensor& a) { return call("tanh", {a}); }
RemoteTensor relu(const RemoteTensor& a) { return call("relu", {a}); }
RemoteTensor gelu(const RemoteTensor& a) { return call("gelu", {a}); }
RemoteTensor softmax(const RemoteTensor& a, int64_t dim) { return call("softmax", {a}, {}, {dim}); }
RemoteTensor sum(const RemoteTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<int64_t> ints{keepdim ? 1 : 0};
  ints.insert(ints.end(), dims.begin(), dims.end());
  return call("sum", {a}, {}, ints);
}
RemoteTensor mean(const RemoteTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<int64_t> ints{keepdim ? 1 : 0};
  ints.insert(ints.end(), dims.begin(), dims.end());
  return call("mean", {a}, {}, ints);
}
RemoteTensor transpose(const RemoteTensor& a, int64_t dim0, int64_t dim1) { return call("transpose", {a}, {}, {dim0, dim1}); }
RemoteTensor reshape(const RemoteTensor& a, const Shape& shape) { return call("reshape", {a}, {}, {}, nullptr, shape); }
RemoteTensor redistribute(const RemoteTensor& a, const Placements& placements) {
  return call("redistribute", {a}, {}, {}, nullptr, {}, placements);
}

namespace detail {

namespace {
std::mutex remote_mutex;
std::map<std::string, RemoteFn>& remotes() {
  static std::map<std::string, RemoteFn> table;
  return table;
}
}  // namespace

const RemoteFn* find_remote(const std::string& name) {
  std::lock_guard<std::mutex> lock(remote_mutex);
  const auto it = remotes().find(name);
  return it == remotes().end() ? nullptr : &it->second;
}

}  // namespace detail

void register_remote(const std::string& name, RemoteFunction fn) {
  TESSERA_CHECK(!name.empty() && fn, ValueError, "register_remote", "needs a name and a function");
  std::lock_guard<std::mutex> lock(detail::remote_mutex);
  TESSERA_CHECK(detail::remotes().emplace(name, std::move(fn)).second, ValueError, "register_remote", "'", name,
                "' is registered already");
}

Remote remote(const std::string& name, RemoteFunction fn) {
  register_remote(name, std::move(fn));
  return Remote(name);
}

std::vector<RemoteTensor> call_remote(const std::string& name, const WorkerMesh& mesh,
                                      const std::vector<RemoteTensor>& inputs, int64_t outputs) {
  detail::ControllerState& state = detail::require_mesh("call_remote");
  TESSERA_CHECK(detail::find_remote(name) != nullptr, ValueError, "call_remote", "no remote function '", name,
                "' (register_remote it before controller::run)");
  TESSERA_CHECK(outputs >= 0, ValueError, "call_remote", "outputs = ", outputs);
  for (const RemoteTensor& t : inputs) {
    TESSERA_CHECK(t.defined(), ValueError, "call_remote", "an input of '", name, "' is an undefined RemoteTensor");
    TESSERA_CHECK(t.mesh().id() == mesh.id(), ShardingError, "call_remote", "'", name, "' runs on ", describe(mesh),
                  "; an input lives on ", describe(t.mesh()));
    check_read(state, t, "call_remote");
  }
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::run_op;
  command->remote = true;
  command->mesh = mesh.id();
  command->op = name;
  command->stream = state.active_stream;
  for (const RemoteTensor& t : inputs) command->inputs.push_back(t.id());
  std::vector<RemoteTensor> results;
  for (int64_t i = 0; i < outputs; ++i) {
    command->outputs.push_back(state.next_tensor++);
    command->layouts.push_back(state.future<Layout>());
    results.push_back(detail::TensorHandle::make(command->outputs.back(), mesh, command->layouts.back(), state.active_stream));
  }
  state.send(mesh.spec().ranks(), std::move(command));
  return results;
}

Stream::Stream(std::string name) : name_(std::move(name)), id_(0) {
  detail::ControllerState& state = detail::require("Stream");
  id_ = static_cast<int64_t>(state.streams.size());
  state.streams.push_back(name_);
  // Every worker starts the stream's thread, with its own copy of every mesh.
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::make_stream;
  command->stream = id_;
  state.send(state.all_workers(), std::move(command));
}

Stream Stream::main() {
  detail::ControllerState& state = detail::require("Stream::main");
  return Stream(state.streams.front(), 0);
}

Stream::Activation Stream::activate() const {
  detail::ControllerState& state = detail::require("Stream::activate");
  const int64_t previous = state.active_stream;
  state.active_stream = id_;
  return Activation(previous);
}

Stream::Activation::~Activation() {
  if (detail::ControllerState* state = detail::current()) state->active_stream = previous_;
}

Borrow Stream::borrow(const RemoteTensor& t, bool mutable_borrow) const {
  detail::ControllerState& state = detail::require("Stream::borrow");
  TESSERA_CHECK(t.defined(), ValueError, "Stream::borrow", "undefined RemoteTensor");
  detail::TensorHandle& h = detail::HandleAccess::of(t);
  TESSERA_CHECK(h.stream != id_, ValueError, "Stream::borrow", "tensor ", h.id, " belongs to stream ",
                stream_name(state, id_), " already");
  for (const auto& [borrower, is_mutable] : h.borrows) {
    TESSERA_CHECK(!is_mutable, ValueError, "Stream::borrow", "tensor ", h.id, " is mutably borrowed by stream ",
                  stream_name(state, borrower), " until drop()");
    TESSERA_CHECK(!mutable_borrow, ValueError, "Stream::borrow", "a mutable borrow of tensor ", h.id,
                  " needs it unshared; stream ", stream_name(state, borrower), " borrows it until drop()");
    TESSERA_CHECK(borrower != id_, ValueError, "Stream::borrow", "stream ", stream_name(state, id_),
                  " borrows tensor ", h.id, " already");
  }
  h.borrows.emplace_back(id_, mutable_borrow);
  state.order(t.mesh().spec().ranks(), h.stream, id_);  // the borrower's uses come after the owner's work
  return Borrow(t, id_, mutable_borrow);
}

Borrow::Borrow(Borrow&& other) noexcept
    : tensor_(std::move(other.tensor_)), stream_(other.stream_), mutable_(other.mutable_), dropped_(other.dropped_) {
  other.dropped_ = true;
}

Borrow::~Borrow() {
  if (!dropped_ && detail::current()) drop();
}

void Borrow::drop() {
  TESSERA_CHECK(!dropped_, ValueError, "Borrow::drop", "tensor ", tensor_.id(), " was returned already");
  dropped_ = true;
  auto& borrows = detail::HandleAccess::of(tensor_).borrows;
  const auto it = std::find(borrows.begin(), borrows.end(), std::make_pair(stream_, mutable_));
  if (it != borrows.end()) borrows.erase(it);
  // The owner's later work comes after the borrower's uses. After shutdown nothing runs.
  if (detail::ControllerState* state = detail::current())
    state->order(tensor_.mesh().spec().ranks(), stream_, detail::HandleAccess::of(tensor_).stream);
}

void call_inplace(const std::string& op, const RemoteTensor& target, const std::vector<RemoteTensor>& inputs,
                  const std::vector<double>& scalars, const std::vector<int64_t>& ints) {
  detail::ControllerState& state = detail::require_mesh(op.c_str());
  TESSERA_CHECK(detail::has_op(op), ValueError, "controller::call_inplace", "no op '", op, "' in the op table");
  TESSERA_CHECK(target.defined(), ValueError, op, "the target is an undefined RemoteTensor");
  check_inputs(state, op, inputs, target.mesh());
  check_write(state, target, op);
  detail::TensorHandle& h = detail::HandleAccess::of(target);
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::run_op;
  command->mesh = target.mesh().id();
  command->stream = state.active_stream;
  command->op = op;
  command->inputs.push_back(target.id());
  for (const RemoteTensor& t : inputs) command->inputs.push_back(t.id());
  command->args = detail::OpArgs{scalars, ints, {}, {}, DType::f32};
  command->output = target.id();  // the result replaces the target's value
  command->layout = state.future<Layout>();
  h.layout = command->layout;
  h.writer = state.active_stream;
  state.send(target.mesh().spec().ranks(), std::move(command));
}

void add_(const RemoteTensor& target, const RemoteTensor& other) { call_inplace("add", target, {other}); }
void mul_(const RemoteTensor& target, const RemoteTensor& other) { call_inplace("mul", target, {other}); }

namespace {

// [op, scatter, mesh dims...]: mesh_reduce's integer arguments.
std::vector<int64_t> reduce_args(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op, bool scatter,
                                 const char* call) {
  TESSERA_CHECK(!axes.empty(), ShardingError, call, "no mesh axes to reduce over");
  std::vector<int64_t> ints{static_cast<int64_t>(op), scatter ? 1 : 0};
  for (const std::string& axis : axes) ints.push_back(t.mesh().spec().dim_of(axis, call));
  return ints;
}

}  // namespace

NoMesh::NoMesh() { ++detail::require("NoMesh").no_mesh; }

NoMesh::~NoMesh() {
  if (detail::ControllerState* state = detail::current()) --state->no_mesh;
}

RemoteTensor reduce(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op, bool scatter,
                    const WorkerMesh* onto, const RemoteTensor* out) {
  detail::ControllerState& state = detail::require_mesh("reduce");
  TESSERA_CHECK(t.defined(), ValueError, "reduce", "undefined RemoteTensor");
  const std::vector<int64_t> ints = reduce_args(t, axes, op, scatter, "reduce");
  check_read(state, t, "reduce");
  const MeshSpec& from = t.mesh().spec();
  if (onto) {
    // A slice of t's mesh without the reduced axes: its ranks are t's, its axes the others.
    std::vector<std::string> rest;
    for (const std::string& name : from.names())
      if (std::find(axes.begin(), axes.end(), name) == axes.end()) rest.push_back(name);
    bool inside = onto->spec().names() == rest;
    for (int r : onto->spec().ranks()) inside = inside && from.contains(r);
    TESSERA_CHECK(inside && !scatter, ShardingError, "reduce", "the target ", describe(*onto),
                  " must be a slice of ", describe(t.mesh()), " over its other axes", scatter ? ", without scatter" : "");
  }
  const WorkerMesh& result_mesh = onto ? *onto : t.mesh();
  if (out) {
    TESSERA_CHECK(out->defined(), ValueError, "reduce", "out is an undefined RemoteTensor");
    TESSERA_CHECK(out->mesh().id() == result_mesh.id(), ShardingError, "reduce", "out lives on ", describe(out->mesh()),
                  "; the result lives on ", describe(result_mesh));
    check_write(state, *out, "reduce");
  }
  auto command = std::make_shared<detail::Command>();
  command->kind = detail::Command::Kind::run_op;
  command->mesh = t.mesh().id();
  command->stream = state.active_stream;
  command->op = "mesh_reduce";
  command->inputs = {t.id()};
  command->args.ints = ints;
  command->target = onto ? onto->id() : -1;
  command->output = out ? out->id() : state.next_tensor++;
  command->layout = state.future<Layout>();
  RemoteTensor result = out ? *out
                            : detail::TensorHandle::make(command->output, result_mesh, command->layout,
                                                         state.active_stream);
  if (out) {
    detail::HandleAccess::of(*out).layout = command->layout;
    detail::HandleAccess::of(*out).writer = state.active_stream;
  }
  state.send(from.ranks(), std::move(command));
  return result;
}

void reduce_(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op, bool scatter) {
  TESSERA_CHECK(t.defined(), ValueError, "reduce_", "undefined RemoteTensor");
  call_inplace("mesh_reduce", t, {}, {}, reduce_args(t, axes, op, scatter, "reduce_"));
}

namespace {

// A fetch of t: sent to `to`, answered by world rank `replier`.
Future<Tensor> fetch(detail::ControllerState& state, detail::Command::Kind kind, const RemoteTensor& t,
                     const std::vector<int>& to, int replier) {
  check_read(state, t, kind == detail::Command::Kind::fetch_shard ? "fetch_shard" : "fetch_full");
  auto command = std::make_shared<detail::Command>();
  command->kind = kind;
  command->mesh = t.mesh().id();
  command->stream = state.active_stream;
  command->output = t.id();
  command->reply = state.future<Tensor>();
  if (state.mpi) {
    command->request = state.next_request++;
    detail::expect_reply(state, command->reply, replier, command->request, t.mesh().spec());
  }
  Future<Tensor> future(command->reply);
  state.send(to, std::move(command));
  return future;
}

}  // namespace

Future<Tensor> fetch_shard(const RemoteTensor& t, const std::vector<int64_t>& coordinate) {
  detail::ControllerState& state = detail::require("fetch_shard");
  TESSERA_CHECK(t.defined(), ValueError, "fetch_shard", "undefined RemoteTensor");
  const MeshSpec& spec = t.mesh().spec();
  TESSERA_CHECK(static_cast<int64_t>(coordinate.size()) == spec.ndim(), ShardingError, "fetch_shard", "coordinate of ",
                coordinate.size(), " dims on ", spec.to_string());
  for (size_t d = 0; d < coordinate.size(); ++d)
    TESSERA_CHECK(coordinate[d] >= 0 && coordinate[d] < spec.size(static_cast<int64_t>(d)), ShardingError,
                  "fetch_shard", "coordinate ", Shape(coordinate).to_string(), " is outside ", describe(t.mesh()));
  const int worker = spec.rank_at(coordinate);
  return fetch(state, detail::Command::Kind::fetch_shard, t, {worker}, worker);
}

Future<Tensor> fetch_full(const RemoteTensor& t) {
  detail::ControllerState& state = detail::require("fetch_full");
  TESSERA_CHECK(t.defined(), ValueError, "fetch_full", "undefined RemoteTensor");
  const std::vector<int>& workers = t.mesh().spec().ranks();
  return fetch(state, detail::Command::Kind::fetch_full, t, workers, workers.front());  // collective over the mesh
}

}  // namespace tessera::controller
