#include <tessera/controller/controller.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>

#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/controller/detail/command.hpp>
#include <tessera/controller/detail/op_rows.hpp>
#include <tessera/controller/detail/state.hpp>
#include <tessera/controller/detail/transport.hpp>
#include <tessera/core/error.hpp>
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

std::vector<int> ControllerState::all_workers() const {
  std::vector<int> ranks(static_cast<size_t>(workers));
  for (int r = 0; r < workers; ++r) ranks[static_cast<size_t>(r)] = r + transport->first_worker();
  return ranks;
}

void ControllerState::order(const std::vector<int>& ranks, int64_t before, int64_t after) {
  const uint64_t event = next_event++;
  send(ranks, Signal{before, event});
  send(ranks, Wait{after, event});
}

TensorHandle::~TensorHandle() {
  // The workers drop the tensor once every op enqueued before has run. After shutdown there is
  // nothing to drop.
  ControllerState* state = current();
  if (state && !dropped) drop_on_workers(*state);
}

void TensorHandle::drop_on_workers(ControllerState& state) const {
  state.send(mesh.spec().ranks(), Drop{mesh.id(), stream, id});
}

namespace {

// Op `op` with typed arguments run by the workers of `mesh`, its inputs checked already: a new
// tensor on `mesh`, or with `onto` (a slice of mesh) kept by the slice's workers (run_op's onto).
RemoteTensor issue_op(ControllerState& state, const std::string& op, const std::vector<RemoteTensor>& inputs,
                      OpArgs args, const WorkerMesh& mesh, const WorkerMesh* onto = nullptr) {
  const WorkerMesh& result_mesh = onto ? *onto : mesh;
  RunOp command;
  command.mesh = mesh.id();
  command.stream = state.active_stream;
  command.op = op;
  for (const RemoteTensor& t : inputs) command.inputs.push_back(t.id());
  command.args = std::move(args);
  command.onto = onto ? onto->id() : -1;
  command.output = state.next_tensor++;
  auto layout = state.future<Layout>();
  command.layout_request = layout_request(state, layout, result_mesh);
  RemoteTensor result = TensorHandle::make(command.output, result_mesh, layout, state.active_stream);
  state.send(mesh.spec().ranks(), std::move(command));
  return result;
}

// The row of `op`, with `inputs` input tensors: ValueError naming `call` otherwise.
const OpRow& row_of(const std::string& op, size_t inputs, const char* call) {
  const OpRow* row = find_op(op);
  TESSERA_CHECK(row != nullptr, ValueError, call, "no op '", op, "' in the op table");
  TESSERA_CHECK(row->takes(inputs), ValueError, call, "'", op, "' takes ", row->inputs,
                row->most_inputs > row->inputs ? " to " + std::to_string(row->most_inputs) : std::string(),
                " input tensors; got ", inputs);
  return *row;
}

}  // namespace

}  // namespace detail

namespace {

// "mesh[gpu=2] on workers [0, 1]": the workers are what tells two slices of one shape apart.
std::string describe(const WorkerMesh& mesh) {
  std::string text = mesh.spec().to_string();
  text = text.substr(0, text.find(" ranks")) + " on workers [";
  for (size_t i = 0; i < mesh.spec().ranks().size(); ++i) text.append(i ? ", " : "").append(std::to_string(mesh.spec().ranks()[i]));
  return text + "]";
}

// Whether `slice` is a slice of `from` keeping the axes `kept` (in from's order): its axes are
// those, its workers all from's (reduce onto a slice, slice_mesh).
bool is_slice_keeping(const MeshSpec& from, const MeshSpec& slice, const std::vector<std::string>& kept) {
  if (slice.names() != kept) return false;
  for (int r : slice.ranks())
    if (!from.contains(r)) return false;
  return true;
}

std::string stream_name(const detail::ControllerState& state, int64_t id) {
  return "'" + state.streams[static_cast<size_t>(id)] + "'";
}

// A tensor dropped by RemoteTensor::drop is used no more.
void check_not_dropped(const RemoteTensor& t, const std::string& call) {
  TESSERA_CHECK(!detail::HandleAccess::of(t).dropped, ValueError, call, "tensor ", t.id(),
                " was dropped (RemoteTensor::drop); the workers freed it");
}

// The stream rules for reading t on the active stream: its own stream unless a mutable borrow
// has it; another stream only through a borrow.
void check_read(const detail::ControllerState& state, const RemoteTensor& t, const std::string& call) {
  check_not_dropped(t, call);
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
  check_not_dropped(t, call);
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

// Runs `body` as the controller of `state`'s workers, then stops them once they ran everything
// issued. 1 when the body threw or a worker failed.
int drive(detail::ControllerState& state, const std::function<void()>& body) {
  detail::running.store(&state);
  int status = 0;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "controller: %s\n", e.what());
    status = 1;
  }
  // Handles dropped after this send nothing.
  detail::running.store(nullptr);
  return state.transport->stop() ? status : 1;
}

// Under MPI: world rank 0 runs the controller, every other rank a worker.
int run_mpi(int argc, char** argv, const std::function<void()>& body) {
  int body_status = 0;
  const int status = tessera::run(argc, argv, [&] {
    if (rank() != 0) return detail::mpi_worker_loop();
    TESSERA_CHECK(world_size() >= 2, ValueError, "controller::run", "under MPI the controller is rank 0 and the "
                  "workers the others: run at least 2 processes, got ", world_size());
    detail::ControllerState state;
    state.workers = world_size() - 1;
    state.transport = detail::mpi_transport();
    body_status = drive(state, body);
  });
  return status != 0 ? status : body_status;
}

}  // namespace

int run(int argc, char** argv, std::function<void()> body) {
  TESSERA_CHECK(!in_rank() && !detail::current(), ValueError, "controller::run",
                "called inside a rank or a running controller; the controller is the program's main thread");
  const char* forced = std::getenv("TESSERA_BACKEND");
  if (mpi::launched_by_mpirun() || (forced && std::string_view(forced) == "mpi")) return run_mpi(argc, argv, body);
  detail::ControllerState state;
  state.workers = ranks_from_args(argc, argv);
  state.transport = detail::in_process_transport(state.workers, state.health);
  return drive(state, body);
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
  // Collective among all workers.
  state.send(spec_.ranks(), detail::MakeMesh{id_, shape, names, std::vector<int64_t>(ranks.begin(), ranks.end())});
}

namespace {

// The index `at` fixes on each dim of `spec` (-1 where the dim is kept): every axis known, every
// index inside its axis. Errors name `call` and the mesh as `shown()` gives it.
template <class Shown>
std::vector<int64_t> fixed_indices(const MeshSpec& spec, const std::map<std::string, int64_t>& at, const char* call,
                                   Shown shown) {
  std::vector<int64_t> fixed(static_cast<size_t>(spec.ndim()), -1);
  for (const auto& [axis, index] : at) {
    const int64_t d = spec.dim_of(axis, call);
    TESSERA_CHECK(index >= 0 && index < spec.size(d), ShardingError, call, "index ", index, " is outside axis '", axis,
                  "' of ", shown());
    fixed[static_cast<size_t>(d)] = index;
  }
  return fixed;
}

}  // namespace

WorkerMesh WorkerMesh::slice(const std::map<std::string, int64_t>& at) const {
  detail::ControllerState& state = detail::require("WorkerMesh::slice");
  const std::vector<int64_t> fixed = fixed_indices(spec_, at, "WorkerMesh::slice", [&] { return spec_.to_string(); });
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
  state.send(spec_.ranks(), detail::SliceMesh{id, id_, at});  // every worker of the parent holds the slice's handle
  return WorkerMesh(MeshSpec(Shape(shape), names, ranks), id);
}

namespace {

// The mesh dims of `axes` (Monarch's dims of mesh.rank): one or more, each once.
std::vector<int64_t> axis_dims(const MeshSpec& spec, const std::vector<std::string>& axes, const char* call) {
  TESSERA_CHECK(!axes.empty(), ValueError, call, "name one axis or more of ", spec.to_string());
  std::vector<int64_t> dims;
  for (const std::string& axis : axes) {
    const int64_t d = spec.dim_of(axis, call);
    TESSERA_CHECK(std::find(dims.begin(), dims.end(), d) == dims.end(), ValueError, call, "axis '", axis, "' of ",
                  spec.to_string(), " is named twice");
    dims.push_back(d);
  }
  return dims;
}

}  // namespace

RemoteTensor WorkerMesh::rank(const std::vector<std::string>& axes) const {
  std::vector<int64_t> dims = axis_dims(spec_, axes, "WorkerMesh::rank");
  return detail::issue_op(detail::require_mesh("WorkerMesh::rank"), "mesh_rank", {}, detail::DimArgs{std::move(dims)},
                          *this);
}

RemoteTensor WorkerMesh::rank(const std::string& axis) const { return rank(std::vector<std::string>{axis}); }

std::map<std::string, RemoteTensor> WorkerMesh::ranks() const {
  std::map<std::string, RemoteTensor> out;
  for (const std::string& axis : spec_.names()) out.emplace(axis, rank(axis));
  return out;
}

const WorkerMesh& RemoteTensor::mesh() const {
  TESSERA_CHECK(handle_ != nullptr, ValueError, "RemoteTensor::mesh", "undefined RemoteTensor");
  return handle_->mesh;
}

uint64_t RemoteTensor::id() const { return handle_ ? handle_->id : 0; }

void RemoteTensor::drop() const {
  detail::ControllerState& state = detail::require("RemoteTensor::drop");
  TESSERA_CHECK(handle_ != nullptr, ValueError, "RemoteTensor::drop", "undefined RemoteTensor");
  TESSERA_CHECK(!handle_->dropped, ValueError, "RemoteTensor::drop", "tensor ", handle_->id, " was dropped already");
  for (const auto& [borrower, is_mutable] : handle_->borrows)
    TESSERA_CHECK(false, ValueError, "RemoteTensor::drop", "tensor ", handle_->id, " is borrowed by stream ",
                  stream_name(state, borrower), " until drop() of the Borrow");
  handle_->dropped = true;
  handle_->drop_on_workers(state);
}

bool RemoteTensor::dropped() const { return handle_ && handle_->dropped; }

Layout RemoteTensor::layout() const {
  TESSERA_CHECK(handle_ != nullptr, ValueError, "RemoteTensor::layout", "undefined RemoteTensor");
  check_not_dropped(*this, "RemoteTensor::layout");
  detail::ControllerState* state = detail::current();
  const auto& future = handle_->layout;
  if (state && !state->transport->reports_layouts() && !future->done && !future->pull) {
    // The workers report a layout when asked: the mesh's first worker answers, on the stream
    // that wrote the tensor last (after the op that made the layout).
    const int worker = handle_->mesh.spec().ranks().front();
    const uint64_t request = state->transport->expect(future, worker, handle_->mesh.spec());
    state->send({worker}, detail::QueryLayout{handle_->mesh.id(), handle_->writer, handle_->id, request});
  }
  return Future<Layout>(future).get();
}

Shape RemoteTensor::shape() const { return layout().global_shape(); }

RemoteTensor call(const std::string& op, const std::vector<RemoteTensor>& inputs, const std::vector<double>& scalars,
                  const std::vector<int64_t>& ints, const WorkerMesh* mesh, const Shape& shape,
                  const Placements& placements, DType dtype, const std::string& text) {
  detail::ControllerState& state = detail::require_mesh(op.c_str());
  const detail::OpRow& row = detail::row_of(op, inputs.size(), "controller::call");
  detail::OpArgs args = row.parse(detail::CallArgs{scalars, ints, shape, placements, dtype, text}, op);
  const WorkerMesh* on = mesh;
  if (!on && !inputs.empty()) {
    TESSERA_CHECK(inputs.front().defined(), ValueError, op, "an input is an undefined RemoteTensor");
    on = &inputs.front().mesh();
  }
  TESSERA_CHECK(on != nullptr, ShardingError, op, "no mesh: a factory needs one, an op an input");
  check_inputs(state, op, inputs, *on);
  return detail::issue_op(state, op, inputs, std::move(args), *on);
}

std::vector<std::string> op_names() { return detail::op_row_names(); }

namespace {

// An op of a typed function below: its inputs checked as call() checks them, its arguments typed
// already.
RemoteTensor typed(const std::string& op, const std::vector<RemoteTensor>& inputs, detail::OpArgs args) {
  detail::ControllerState& state = detail::require_mesh(op.c_str());
  TESSERA_CHECK(inputs.front().defined(), ValueError, op, "an input is an undefined RemoteTensor");
  check_inputs(state, op, inputs, inputs.front().mesh());  // the others
  return detail::issue_op(state, op, inputs, std::move(args), inputs.front().mesh());
}

RemoteTensor factory(const std::string& op, const WorkerMesh& mesh, detail::FactoryArgs args) {
  return detail::issue_op(detail::require_mesh(op.c_str()), op, {}, std::move(args), mesh);
}

}  // namespace

RemoteTensor zeros(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return factory("zeros", mesh, {shape, std::move(placements), dtype});
}
RemoteTensor ones(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return factory("ones", mesh, {shape, std::move(placements), dtype});
}
RemoteTensor full(const Shape& shape, double value, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return factory("full", mesh, {shape, std::move(placements), dtype, value});
}
RemoteTensor randn(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return factory("randn", mesh, {shape, std::move(placements), dtype});
}
RemoteTensor rand(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype) {
  return factory("rand", mesh, {shape, std::move(placements), dtype});
}

void manual_seed(uint64_t seed, const WorkerMesh& mesh) {
  detail::ControllerState& state = detail::require_mesh("controller::manual_seed");
  // Each stream draws from its own generator.
  state.send(mesh.spec().ranks(), detail::Seed{mesh.id(), state.active_stream, seed, {}});
}

void manual_seed(uint64_t seed, const WorkerMesh& mesh, const std::vector<std::string>& per_worker) {
  std::vector<int64_t> dims = axis_dims(mesh.spec(), per_worker, "controller::manual_seed");
  detail::ControllerState& state = detail::require_mesh("controller::manual_seed");
  state.send(mesh.spec().ranks(), detail::Seed{mesh.id(), state.active_stream, seed, std::move(dims)});
}

RemoteTensor add(const RemoteTensor& a, const RemoteTensor& b) { return typed("add", {a, b}, detail::NoArgs{}); }
RemoteTensor sub(const RemoteTensor& a, const RemoteTensor& b) { return typed("sub", {a, b}, detail::NoArgs{}); }
RemoteTensor mul(const RemoteTensor& a, const RemoteTensor& b) { return typed("mul", {a, b}, detail::NoArgs{}); }
RemoteTensor div(const RemoteTensor& a, const RemoteTensor& b) { return typed("div", {a, b}, detail::NoArgs{}); }
RemoteTensor matmul(const RemoteTensor& a, const RemoteTensor& b) { return typed("matmul", {a, b}, detail::NoArgs{}); }
RemoteTensor scale(const RemoteTensor& a, double factor) {
  return typed("mul_scalar", {a}, detail::ScalarArgs{factor});
}
RemoteTensor neg(const RemoteTensor& a) { return typed("neg", {a}, detail::NoArgs{}); }
RemoteTensor exp(const RemoteTensor& a) { return typed("exp", {a}, detail::NoArgs{}); }
RemoteTensor tanh(const RemoteTensor& a) { return typed("tanh", {a}, detail::NoArgs{}); }
RemoteTensor relu(const RemoteTensor& a) { return typed("relu", {a}, detail::NoArgs{}); }
RemoteTensor gelu(const RemoteTensor& a) { return typed("gelu", {a}, detail::NoArgs{}); }
RemoteTensor softmax(const RemoteTensor& a, int64_t dim) { return typed("softmax", {a}, detail::DimArgs{{dim}}); }
RemoteTensor sum(const RemoteTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return typed("sum", {a}, detail::ReduceArgs{dims, keepdim});
}
RemoteTensor mean(const RemoteTensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return typed("mean", {a}, detail::ReduceArgs{dims, keepdim});
}
RemoteTensor transpose(const RemoteTensor& a, int64_t dim0, int64_t dim1) {
  return typed("transpose", {a}, detail::DimArgs{{dim0, dim1}});
}
RemoteTensor reshape(const RemoteTensor& a, const Shape& shape) {
  return typed("reshape", {a}, detail::ShapeArgs{shape});
}
RemoteTensor redistribute(const RemoteTensor& a, const Placements& placements) {
  return typed("redistribute", {a}, detail::PlacementArgs{placements});
}

void register_remote(const std::string& name, RemoteFunction fn) {
  TESSERA_CHECK(!name.empty() && fn, ValueError, "register_remote", "needs a name and a function");
  TESSERA_CHECK(detail::add_remote(name, std::move(fn)), ValueError, "register_remote", "'", name,
                "' is registered already");
}

std::vector<RemoteTensor> call_remote(const std::string& name, const WorkerMesh& mesh,
                                      const std::vector<RemoteTensor>& inputs, int64_t outputs) {
  return detail::issue_remote("call_remote", name, mesh, inputs, outputs, nullptr);
}

namespace detail {

uint64_t layout_request(ControllerState& state, const std::shared_ptr<FutureState<Layout>>& layout,
                        const WorkerMesh& mesh) {
  if (!state.transport->reports_layouts()) return 0;
  return state.transport->expect(layout, mesh.spec().ranks().front(), mesh.spec());
}

void check_readable(const ControllerState& state, const RemoteTensor& t, const std::string& call) {
  check_read(state, t, call);
}

std::string describe_mesh(const WorkerMesh& mesh) { return describe(mesh); }

std::vector<RemoteTensor> issue_remote(const char* call, const std::string& name, const WorkerMesh& mesh,
                                       const std::vector<RemoteTensor>& inputs, int64_t outputs,
                                       const std::vector<Layout>* expected) {
  ControllerState& state = require_mesh(call);
  TESSERA_CHECK(find_remote(name) != nullptr, ValueError, call, "no remote function '", name,
                "' (register_remote it before controller::run)");
  TESSERA_CHECK(outputs >= 0, ValueError, call, "outputs = ", outputs);
  for (const RemoteTensor& t : inputs) {
    TESSERA_CHECK(t.defined(), ValueError, call, "an input of '", name, "' is an undefined RemoteTensor");
    TESSERA_CHECK(t.mesh().id() == mesh.id(), ShardingError, call, "'", name, "' runs on ", describe(mesh),
                  "; an input lives on ", describe(t.mesh()));
    check_read(state, t, call);
  }
  CallRemote command;
  command.mesh = mesh.id();
  command.stream = state.active_stream;
  command.function = name;
  for (const RemoteTensor& t : inputs) command.inputs.push_back(t.id());
  std::vector<RemoteTensor> results;
  for (int64_t i = 0; i < outputs; ++i) {
    command.outputs.push_back(state.next_tensor++);
    auto layout = state.future<Layout>();
    if (expected) {
      // Known now: the workers check their results against it instead of reporting theirs.
      const Layout& given = (*expected)[static_cast<size_t>(i)];
      command.expected_layouts.push_back(layout_words(given));
      layout->set(given);
    } else if (const uint64_t request = layout_request(state, layout, mesh)) {
      command.layout_requests.push_back(request);
    }
    results.push_back(TensorHandle::make(command.outputs.back(), mesh, layout, state.active_stream));
  }
  state.send(mesh.spec().ranks(), std::move(command));
  return results;
}

}  // namespace detail

Stream::Stream(std::string name) : name_(std::move(name)), id_(0) {
  detail::ControllerState& state = detail::require("Stream");
  id_ = static_cast<int64_t>(state.streams.size());
  state.streams.push_back(name_);
  // Every worker starts the stream's thread, with its own copy of every mesh.
  state.send(state.all_workers(), detail::MakeStream{id_});
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
  check_not_dropped(t, "Stream::borrow");
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

namespace {

// Op `op` with typed arguments writing `target`: target = op(target, inputs...).
void issue_inplace(detail::ControllerState& state, const std::string& op, const RemoteTensor& target,
                   const std::vector<RemoteTensor>& inputs, detail::OpArgs args) {
  TESSERA_CHECK(target.defined(), ValueError, op, "the target is an undefined RemoteTensor");
  check_inputs(state, op, inputs, target.mesh());
  check_write(state, target, op);
  detail::RunOp command;
  command.mesh = target.mesh().id();
  command.stream = state.active_stream;
  command.op = op;
  command.inputs.push_back(target.id());
  for (const RemoteTensor& t : inputs) command.inputs.push_back(t.id());
  command.args = std::move(args);
  command.output = target.id();  // the result replaces the target's value
  auto layout = state.future<Layout>();
  detail::HandleAccess::of(target).written(layout, state.active_stream);
  command.layout_request = detail::layout_request(state, layout, target.mesh());
  state.send(target.mesh().spec().ranks(), std::move(command));
}

// A mesh reduce's arguments: the mesh dims of `axes` on t's mesh.
detail::MeshReduceArgs mesh_reduce_args(const RemoteTensor& t, const std::vector<std::string>& axes,
                                        MeshReduction reduction, bool scatter, const char* call) {
  TESSERA_CHECK(!axes.empty(), ShardingError, call, "no mesh axes to reduce over");
  detail::MeshReduceArgs args{reduction, scatter, {}};
  for (const std::string& axis : axes) args.mesh_dims.push_back(t.mesh().spec().dim_of(axis, call));
  return args;
}

}  // namespace

void call_inplace(const std::string& op, const RemoteTensor& target, const std::vector<RemoteTensor>& inputs,
                  const std::vector<double>& scalars, const std::vector<int64_t>& ints) {
  detail::ControllerState& state = detail::require_mesh(op.c_str());
  const detail::OpRow& row = detail::row_of(op, inputs.size() + 1, "controller::call_inplace");
  issue_inplace(state, op, target, inputs, row.parse(detail::CallArgs{scalars, ints, {}, {}, DType::f32, {}}, op));
}

namespace {

// The inputs of an op with optional trailing tensors.
std::vector<RemoteTensor> with_optional(std::vector<RemoteTensor> inputs,
                                        std::initializer_list<const std::optional<RemoteTensor>*> optional) {
  for (const auto* t : optional) {
    if (!t->has_value()) break;
    inputs.push_back(**t);
  }
  return inputs;
}

detail::ListArgs list_args(std::vector<double> scalars, std::vector<int64_t> ints = {}, Shape shape = {},
                           std::string text = {}) {
  return detail::ListArgs{std::move(scalars), std::move(ints), std::move(shape), std::move(text)};
}

}  // namespace

RemoteTensor linear(const RemoteTensor& x, const RemoteTensor& weight, const std::optional<RemoteTensor>& bias) {
  return typed("linear", with_optional({x, weight}, {&bias}), list_args({}));
}

RemoteTensor log_softmax(const RemoteTensor& x, int64_t dim) { return typed("log_softmax", {x}, list_args({}, {dim})); }

RemoteTensor layer_norm(const RemoteTensor& x, const Shape& normalized_shape, const std::optional<RemoteTensor>& weight,
                        const std::optional<RemoteTensor>& bias, double eps) {
  TESSERA_CHECK(weight || !bias, ValueError, "layer_norm", "a bias without a weight; pass a weight of ones");
  TESSERA_CHECK(!normalized_shape.empty(), ValueError, "layer_norm", "an empty normalized_shape");
  return typed("layer_norm", with_optional({x}, {&weight, &bias}), list_args({eps}, {}, normalized_shape));
}

RemoteTensor embedding(const RemoteTensor& weight, const RemoteTensor& indices) {
  return typed("embedding", {weight, indices}, list_args({}));
}

RemoteTensor cross_entropy(const RemoteTensor& logits, const RemoteTensor& target, int64_t ignore_index,
                           Reduction reduction) {
  return typed("cross_entropy", {logits, target}, list_args({}, {ignore_index, static_cast<int64_t>(reduction)}));
}

RemoteTensor scaled_dot_product_attention(const RemoteTensor& q, const RemoteTensor& k, const RemoteTensor& v,
                                          const std::optional<RemoteTensor>& attn_mask, double dropout_p,
                                          bool is_causal) {
  return typed("scaled_dot_product_attention", with_optional({q, k, v}, {&attn_mask}),
               list_args({dropout_p}, {is_causal ? 1 : 0}));
}

RemoteTensor conv2d(const RemoteTensor& x, const RemoteTensor& weight, const std::optional<RemoteTensor>& bias,
                    std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                    int64_t groups) {
  for (const auto* pair : {&stride, &padding, &dilation})
    TESSERA_CHECK(pair->size() == 2, ValueError, "conv2d", "stride, padding and dilation take two values each; got ",
                  Shape(stride).to_string(), ", ", Shape(padding).to_string(), ", ", Shape(dilation).to_string());
  return typed("conv2d", with_optional({x, weight}, {&bias}),
               list_args({}, {stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], groups}));
}

RemoteTensor einsum(const std::string& equation, const std::vector<RemoteTensor>& operands) {
  TESSERA_CHECK(!operands.empty(), ValueError, "einsum", "no operands for '", equation, "'");
  return typed("einsum", operands, list_args({}, {}, {}, equation));
}

const RemoteTensor& requires_grad_(const RemoteTensor& t, bool on) {
  issue_inplace(detail::require_mesh("requires_grad_"), "requires_grad_", t, {}, list_args({}, {on ? 1 : 0}));
  return t;
}

void backward(const RemoteTensor& loss) {
  issue_inplace(detail::require_mesh("backward"), "backward", loss, {}, list_args({}));
}

void backward(const RemoteTensor& loss, const RemoteTensor& grad) {
  issue_inplace(detail::require_mesh("backward"), "backward", loss, {grad}, list_args({}));
}

RemoteTensor grad(const RemoteTensor& t) { return typed("grad", {t}, list_args({})); }

SGD::SGD(std::vector<RemoteTensor> params, double lr, double weight_decay)
    : params_(std::move(params)), lr_(lr), weight_decay_(weight_decay) {
  TESSERA_CHECK(lr > 0, ValueError, "SGD", "lr = ", lr, "; it must be positive");
  TESSERA_CHECK(weight_decay >= 0, ValueError, "SGD", "weight_decay = ", weight_decay);
  for (const RemoteTensor& p : params_) TESSERA_CHECK(p.defined(), ValueError, "SGD", "an undefined parameter");
}

void SGD::step() const {
  for (const RemoteTensor& p : params_)
    issue_inplace(detail::require_mesh("SGD::step"), "sgd_step_", p, {}, list_args({lr_, weight_decay_}));
}

void SGD::zero_grad() const {
  for (const RemoteTensor& p : params_)
    issue_inplace(detail::require_mesh("SGD::zero_grad"), "zero_grad_", p, {}, list_args({}));
}

void add_(const RemoteTensor& target, const RemoteTensor& other) {
  issue_inplace(detail::require_mesh("add"), "add", target, {other}, detail::NoArgs{});
}
void mul_(const RemoteTensor& target, const RemoteTensor& other) {
  issue_inplace(detail::require_mesh("mul"), "mul", target, {other}, detail::NoArgs{});
}

NoMesh::NoMesh() { ++detail::require("NoMesh").no_mesh; }

NoMesh::~NoMesh() {
  if (detail::ControllerState* state = detail::current()) --state->no_mesh;
}

namespace {

// The ReduceOps are the mesh reductions but stack, in the same order.
MeshReduction mesh_reduction(ReduceOp op) {
  static_assert(static_cast<int>(MeshReduction::sum) == static_cast<int>(ReduceOp::sum) &&
                static_cast<int>(MeshReduction::avg) == static_cast<int>(ReduceOp::avg) &&
                static_cast<int>(MeshReduction::product) == static_cast<int>(ReduceOp::product) &&
                static_cast<int>(MeshReduction::max) == static_cast<int>(ReduceOp::max) &&
                static_cast<int>(MeshReduction::min) == static_cast<int>(ReduceOp::min));
  return static_cast<MeshReduction>(op);
}

}  // namespace

RemoteTensor reduce(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op, bool scatter,
                    const WorkerMesh* onto, const RemoteTensor* out) {
  return reduce(t, axes, mesh_reduction(op), scatter, onto, out);
}

RemoteTensor reduce(const RemoteTensor& t, const std::vector<std::string>& axes, MeshReduction reduction, bool scatter,
                    const WorkerMesh* onto, const RemoteTensor* out) {
  detail::ControllerState& state = detail::require_mesh("reduce");
  TESSERA_CHECK(t.defined(), ValueError, "reduce", "undefined RemoteTensor");
  detail::MeshReduceArgs args = mesh_reduce_args(t, axes, reduction, scatter, "reduce");
  check_read(state, t, "reduce");
  const MeshSpec& from = t.mesh().spec();
  if (onto) {
    // A slice of t's mesh without the reduced axes: its ranks are t's, its axes the others.
    std::vector<std::string> rest;
    for (const std::string& name : from.names())
      if (std::find(axes.begin(), axes.end(), name) == axes.end()) rest.push_back(name);
    TESSERA_CHECK(is_slice_keeping(from, onto->spec(), rest) && !scatter, ShardingError, "reduce", "the target ",
                  describe(*onto), " must be a slice of ", describe(t.mesh()), " over its other axes",
                  scatter ? ", without scatter" : "");
  }
  const WorkerMesh& result_mesh = onto ? *onto : t.mesh();
  if (out) {
    TESSERA_CHECK(out->defined(), ValueError, "reduce", "out is an undefined RemoteTensor");
    TESSERA_CHECK(out->mesh().id() == result_mesh.id(), ShardingError, "reduce", "out lives on ", describe(out->mesh()),
                  "; the result lives on ", describe(result_mesh));
    check_write(state, *out, "reduce");
  }
  detail::RunOp command;
  command.mesh = t.mesh().id();
  command.stream = state.active_stream;
  command.op = "mesh_reduce";
  command.inputs = {t.id()};
  command.args = std::move(args);
  command.onto = onto ? onto->id() : -1;
  command.output = out ? out->id() : state.next_tensor++;
  auto layout = state.future<Layout>();
  command.layout_request = detail::layout_request(state, layout, result_mesh);
  RemoteTensor result =
      out ? *out : detail::TensorHandle::make(command.output, result_mesh, layout, state.active_stream);
  if (out) detail::HandleAccess::of(*out).written(layout, state.active_stream);
  state.send(from.ranks(), std::move(command));
  return result;
}

namespace {

// The mesh dims of t's mesh that `slice` fixes: a slice of that mesh (its ranks inside it, its
// axes the others in order), else ShardingError naming both.
std::vector<int64_t> sliced_dims(const RemoteTensor& t, const WorkerMesh& slice, const char* call) {
  const MeshSpec& from = t.mesh().spec();
  std::vector<int64_t> fixed;
  std::vector<std::string> rest;
  for (int64_t d = 0; d < from.ndim(); ++d) {
    const std::string& name = from.names()[static_cast<size_t>(d)];
    const auto& kept = slice.spec().names();
    if (std::find(kept.begin(), kept.end(), name) == kept.end())
      fixed.push_back(d);
    else
      rest.push_back(name);
  }
  TESSERA_CHECK(!fixed.empty() && is_slice_keeping(from, slice.spec(), rest), ShardingError, call, describe(slice),
                " is not a slice of ", describe(t.mesh()), " (WorkerMesh::slice at some of its axes)");
  return fixed;
}

// t onto `slice` of its mesh: the identity row 'mesh_slice' run by t's workers, its result kept
// by the slice's, as reduce onto a slice keeps its result (run_op reads the fixed dims from the
// MeshReduceArgs; the reduction is unused).
RemoteTensor slice_onto(detail::ControllerState& state, const RemoteTensor& t, const WorkerMesh& slice,
                        std::vector<int64_t> fixed) {
  return detail::issue_op(state, "mesh_slice", {t}, detail::MeshReduceArgs{MeshReduction::sum, false, std::move(fixed)},
                          t.mesh(), &slice);
}

// The slice of `mesh` at `at`, its coordinates checked first so that errors name `call`.
WorkerMesh slice_at(const WorkerMesh& mesh, const std::map<std::string, int64_t>& at, const char* call) {
  TESSERA_CHECK(!at.empty(), ValueError, call, "name one axis or more of ", describe(mesh), " to slice at");
  fixed_indices(mesh.spec(), at, call, [&] { return describe(mesh); });
  return mesh.slice(at);
}

void check_sliceable(const detail::ControllerState& state, const RemoteTensor& t, const char* call) {
  TESSERA_CHECK(t.defined(), ValueError, call, "undefined RemoteTensor");
  check_read(state, t, call);
}

}  // namespace

RemoteTensor RemoteTensor::slice_mesh(const std::map<std::string, int64_t>& at) const {
  detail::ControllerState& state = detail::require_mesh("RemoteTensor::slice_mesh");
  check_sliceable(state, *this, "RemoteTensor::slice_mesh");
  const WorkerMesh slice = slice_at(mesh(), at, "RemoteTensor::slice_mesh");
  return slice_onto(state, *this, slice, sliced_dims(*this, slice, "RemoteTensor::slice_mesh"));
}

RemoteTensor RemoteTensor::slice_mesh(const WorkerMesh& slice) const {
  detail::ControllerState& state = detail::require_mesh("RemoteTensor::slice_mesh");
  check_sliceable(state, *this, "RemoteTensor::slice_mesh");
  return slice_onto(state, *this, slice, sliced_dims(*this, slice, "RemoteTensor::slice_mesh"));
}

std::vector<RemoteTensor> slice_mesh(const std::vector<RemoteTensor>& tensors,
                                     const std::map<std::string, int64_t>& at) {
  detail::ControllerState& state = detail::require_mesh("slice_mesh");
  for (const RemoteTensor& t : tensors) check_sliceable(state, t, "slice_mesh");
  std::map<int64_t, WorkerMesh> slices;  // by the id of the mesh sliced: one slice per mesh
  std::vector<RemoteTensor> out;
  for (const RemoteTensor& t : tensors) {
    auto it = slices.find(t.mesh().id());
    if (it == slices.end()) it = slices.emplace(t.mesh().id(), slice_at(t.mesh(), at, "slice_mesh")).first;
    out.push_back(slice_onto(state, t, it->second, sliced_dims(t, it->second, "slice_mesh")));
  }
  return out;
}

void reduce_(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op, bool scatter) {
  reduce_(t, axes, mesh_reduction(op), scatter);
}

void reduce_(const RemoteTensor& t, const std::vector<std::string>& axes, MeshReduction reduction, bool scatter) {
  detail::ControllerState& state = detail::require_mesh("reduce_");
  TESSERA_CHECK(t.defined(), ValueError, "reduce_", "undefined RemoteTensor");
  TESSERA_CHECK(reduction != MeshReduction::stack, ValueError, "reduce_", "a stack adds a leading dim to tensor ",
                t.id(), ", so its shape changes: it cannot replace the value in place (use reduce)");
  issue_inplace(state, "mesh_reduce", t, {}, mesh_reduce_args(t, axes, reduction, scatter, "reduce_"));
}

namespace {

// A fetch of t (a block, or `whole`): sent to `to`, answered by world rank `replier`.
Future<Tensor> fetch(detail::ControllerState& state, bool whole, const RemoteTensor& t, const std::vector<int>& to,
                     int replier) {
  check_read(state, t, whole ? "fetch_full" : "fetch_shard");
  auto reply = state.future<Tensor>();
  const uint64_t request = state.transport->expect(reply, replier, t.mesh().spec());
  state.send(to, detail::Fetch{t.mesh().id(), state.active_stream, t.id(), whole, request});
  return Future<Tensor>(reply);
}

}  // namespace

Future<Tensor> fetch_shard(const RemoteTensor& t, const std::vector<int64_t>& coordinate) {
  detail::ControllerState& state = detail::require("fetch_shard");
  TESSERA_CHECK(t.defined(), ValueError, "fetch_shard", "undefined RemoteTensor");
  const MeshSpec& spec = t.mesh().spec();
  // None: coordinate 0 on every axis (Monarch's shard=None).
  if (coordinate.empty() && spec.ndim() > 0)
    return fetch_shard(t, std::vector<int64_t>(static_cast<size_t>(spec.ndim()), 0));
  TESSERA_CHECK(static_cast<int64_t>(coordinate.size()) == spec.ndim(), ShardingError, "fetch_shard", "coordinate of ",
                coordinate.size(), " dims on ", spec.to_string());
  for (size_t d = 0; d < coordinate.size(); ++d)
    TESSERA_CHECK(coordinate[d] >= 0 && coordinate[d] < spec.size(static_cast<int64_t>(d)), ShardingError,
                  "fetch_shard", "coordinate ", Shape(coordinate).to_string(), " is outside ", describe(t.mesh()));
  const int worker = spec.rank_at(coordinate);
  return fetch(state, false, t, {worker}, worker);
}

Future<Tensor> fetch_shard(const RemoteTensor& t, const std::map<std::string, int64_t>& at) {
  TESSERA_CHECK(t.defined(), ValueError, "fetch_shard", "undefined RemoteTensor");
  const MeshSpec& spec = t.mesh().spec();
  std::vector<int64_t> coordinate(static_cast<size_t>(spec.ndim()), 0);
  for (const auto& [axis, index] : at) coordinate[static_cast<size_t>(spec.dim_of(axis, "fetch_shard"))] = index;
  return fetch_shard(t, coordinate);
}

Future<Tensor> fetch_full(const RemoteTensor& t) {
  detail::ControllerState& state = detail::require("fetch_full");
  TESSERA_CHECK(t.defined(), ValueError, "fetch_full", "undefined RemoteTensor");
  const std::vector<int>& workers = t.mesh().spec().ranks();
  return fetch(state, true, t, workers, workers.front());  // collective over the mesh
}

}  // namespace tessera::controller
