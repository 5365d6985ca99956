// A worker's commands: the op table (every op runs on DTensor) and the execution of one
// stream's command. Each value lives in the worker's table by id; an op that throws leaves its
// output failed with the worker's message, and ops reading a failed value fail alike (without
// running), so the error surfaces at whatever the controller fetches.
#include <tessera/controller/detail/worker.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <unordered_map>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller::detail {

namespace {

using OpFn = std::function<DTensor(const std::vector<DTensor>&, const OpArgs&, const DeviceMesh&)>;

int64_t int_at(const OpArgs& args, size_t i, int64_t otherwise) { return i < args.ints.size() ? args.ints[i] : otherwise; }

std::vector<int64_t> dims_of(const OpArgs& args) {
  // ints: [keepdim, dims...]
  return std::vector<int64_t>(args.ints.begin() + (args.ints.empty() ? 0 : 1), args.ints.end());
}

// Monarch's mesh reduce: each worker's block is its own value along the mesh dims ints[2..]
// (Partial(op) there), combined onto every worker (Replicate) or, with scatter, split along
// dim 0 over them. ints: [op, scatter, mesh dims...].
DTensor mesh_reduce(const DTensor& x, const OpArgs& args, const DeviceMesh& mesh) {
  const auto op = static_cast<ReduceOp>(args.ints.at(0));
  const bool scatter = args.ints.at(1) != 0;
  const Layout& layout = x.layout();
  Placements partial = layout.placements(), reduced = layout.placements();
  for (size_t i = 2; i < args.ints.size(); ++i) {
    const auto d = static_cast<size_t>(args.ints[i]);
    TESSERA_CHECK(is_replicate(partial[d]), ShardingError, "reduce", "the tensor ", layout.to_string(),
                  " is not Replicate over mesh axis '", mesh.axis_names()[d],
                  "'; a mesh reduce takes each worker's whole block as its value");
    partial[d] = Partial{op};
    reduced[d] = scatter ? Placement(Shard{0}) : Placement(Replicate{});
  }
  const Layout as_partial(layout.global_shape(), layout.dtype(), layout.mesh(), partial, layout.shard_orders(),
                          layout.explicit_sizes());
  return DTensor(x.to_local(), mesh, as_partial).redistribute(mesh, reduced);
}

// The op table: every unary, binary and comparison op of DTensor's elementwise table, and the
// others by hand.
const std::unordered_map<std::string, OpFn>& op_table() {
  static const std::unordered_map<std::string, OpFn> table = [] {
    std::unordered_map<std::string, OpFn> t;
#define TESSERA_CONTROLLER_UNARY(name, ...) \
  t[#name] = [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) { return tessera::name(in.at(0)); };
    TESSERA_UNARY_OPS(TESSERA_CONTROLLER_UNARY)
#undef TESSERA_CONTROLLER_UNARY
#define TESSERA_CONTROLLER_BINARY(name, ...)                                                                    \
  t[#name] = [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) {                             \
    return tessera::name(in.at(0), in.at(1));                                                                   \
  };                                                                                                            \
  t[#name "_scalar"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {                 \
    return tessera::name(in.at(0), Scalar(a.scalars.at(0)));                                                    \
  };
    TESSERA_BINARY_OPS(TESSERA_CONTROLLER_BINARY)
    TESSERA_COMPARISON_OPS(TESSERA_CONTROLLER_BINARY)
#undef TESSERA_CONTROLLER_BINARY
    t["matmul"] = [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) { return matmul(in.at(0), in.at(1)); };
    t["softmax"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return softmax(in.at(0), a.ints.at(0));
    };
    t["sum"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return sum(in.at(0), dims_of(a), int_at(a, 0, 0) != 0);
    };
    t["mean"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return mean(in.at(0), dims_of(a), int_at(a, 0, 0) != 0);
    };
    t["transpose"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {
      return transpose(in.at(0), a.ints.at(0), a.ints.at(1));
    };
    t["reshape"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) { return reshape(in.at(0), a.shape); };
    t["redistribute"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh& mesh) {
      return in.at(0).redistribute(mesh, a.placements);
    };
    t["mesh_reduce"] = [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh& mesh) {
      return mesh_reduce(in.at(0), a, mesh);
    };
    t["zeros"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return zeros(a.shape, mesh, a.placements, a.dtype);
    };
    t["ones"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return ones(a.shape, mesh, a.placements, a.dtype);
    };
    t["full"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return full(a.shape, a.scalars.at(0), mesh, a.placements, a.dtype);
    };
    t["randn"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return randn(a.shape, mesh, a.placements, a.dtype);
    };
    t["rand"] = [](const std::vector<DTensor>&, const OpArgs& a, const DeviceMesh& mesh) {
      return rand(a.shape, mesh, a.placements, a.dtype);
    };
    return t;
  }();
  return table;
}

}  // namespace

std::string worker_error(const std::string& what) { return "worker rank " + std::to_string(rank()) + ": " + what; }

std::string WorkerShared::unreadable(uint64_t id, const std::string& call, const char* what) {
  std::lock_guard<std::mutex> lock(values_mutex_);
  const auto it = values_.find(id);
  if (it == values_.end()) return worker_error("[" + call + "] " + what + " " + std::to_string(id) + " was dropped");
  return it->second.error;
}

std::string WorkerShared::gather(const Command& c, const std::string& call, const StreamMeshes& meshes,
                                 std::vector<DTensor>& inputs) {
  for (uint64_t id : c.inputs) {
    if (std::string error = unreadable(id, call, "input tensor"); !error.empty()) return error;
    inputs.push_back(tensor(id, c.stream, meshes));
  }
  return {};
}

DTensor WorkerShared::tensor(uint64_t id, int64_t stream, const StreamMeshes& meshes) {
  Value value;
  {
    std::lock_guard<std::mutex> lock(values_mutex_);
    value = values_.at(id);
  }
  if (value.stream == stream) return value.tensor;
  return DTensor(value.tensor.to_local(), meshes.at(value.mesh).working, value.tensor.layout());
}

void WorkerShared::store(uint64_t id, Value value) {
  std::lock_guard<std::mutex> lock(values_mutex_);
  values_[id] = std::move(value);
}

void WorkerShared::erase(uint64_t id) {
  std::lock_guard<std::mutex> lock(values_mutex_);
  values_.erase(id);
}

void WorkerShared::signal(uint64_t event) {
  {
    std::lock_guard<std::mutex> lock(events_mutex_);
    signaled_.insert(event);
  }
  events_cv_.notify_all();
}

void WorkerShared::wait(uint64_t event, int64_t stream) {
  std::unique_lock<std::mutex> lock(events_mutex_);
  const auto timeout = std::chrono::duration<double>(comm_timeout_seconds());
  TESSERA_CHECK(events_cv_.wait_for(lock, timeout, [&] { return signaled_.count(event) > 0; }), CommError, "Stream",
                "stream ", stream, " waited ", comm_timeout_seconds(), " s for another stream's work on tensor ",
                "it borrows (event ", event, "); the other stream is stuck");
  signaled_.erase(event);
}

namespace {

void reply_tensor(WorkerShared& shared, const Command& c, const Tensor& t) {
  if (c.reply) return c.reply->set(t);
  if (c.request && shared.outbox) shared.outbox->push(c.request, Reply{true, {}, true, t.dtype(), t.shape(), {}}, &t);
}

void reply_layout(WorkerShared& shared, const Command& c, const Layout& layout) {
  if (c.request && shared.outbox)
    shared.outbox->push(c.request, Reply{true, {}, false, DType::f32, {}, layout_words(layout)}, nullptr);
}

// Reports the layout of an op's result (or its error) to the controller's future, if it holds one.
void report(const Command& c, const Value& out) {
  if (!c.layout) return;
  if (out.error.empty()) c.layout->set(out.tensor.layout());
  else c.layout->fail(out.error);
}

void run_op(const Command& c, WorkerShared& shared, StreamMeshes& meshes) {
  if (c.remote) return run_remote(c, shared, meshes);
  const DeviceMesh& mesh = meshes.at(c.mesh).working;
  // In place (the output among the inputs), a failed target fails the op like any input.
  Value out{{}, {}, c.stream, c.target >= 0 ? c.target : c.mesh};
  std::vector<DTensor> inputs;
  out.error = shared.gather(c, c.op, meshes, inputs);
  if (out.error.empty()) {
    try {
      out.tensor = op_table().at(c.op)(inputs, c.args, mesh);
    } catch (const std::exception& e) {
      out.error = worker_error(e.what());
    }
  }
  if (c.target < 0) {
    if (mesh.spec().ranks().front() == rank()) report(c, out);
    return shared.store(c.output, std::move(out));
  }
  // Reduced onto a slice: its workers keep their (replicated) block on the slice's mesh, the
  // others nothing; the slice's first worker reports.
  const DeviceMesh& onto = meshes.at(c.target).working;
  if (out.error.empty() && onto.is_member()) {
    Placements kept;
    for (int64_t d = 0; d < mesh.ndim(); ++d)
      if (std::find(c.args.ints.begin() + 2, c.args.ints.end(), d) == c.args.ints.end())
        kept.push_back(out.tensor.placements()[static_cast<size_t>(d)]);
    FromLocalOptions global;
    global.shape = out.tensor.shape();
    out.tensor = DTensor::from_local(out.tensor.to_local(), onto, kept, global);
  }
  if (onto.spec().ranks().front() == rank()) report(c, out);
  if (onto.is_member()) shared.store(c.output, std::move(out));
  else shared.erase(c.output);
}

void fetch_full(const Command& c, WorkerShared& shared, StreamMeshes& meshes) {
  const DeviceMesh& mesh = meshes.at(c.mesh).working;
  std::string error = shared.unreadable(c.output, "fetch_full", "tensor");
  Tensor whole;
  if (error.empty()) {
    try {
      whole = shared.tensor(c.output, c.stream, meshes).full_tensor();  // collective over the mesh
    } catch (const std::exception& e) {
      error = worker_error(e.what());
    }
  }
  if (mesh.spec().ranks().front() != rank()) return;
  if (error.empty()) reply_tensor(shared, c, whole);
  else reply_error(shared, c, error);
}

}  // namespace

bool has_op(const std::string& name) { return op_table().count(name) > 0; }

std::vector<std::string> table_op_names() {
  std::vector<std::string> names;
  for (const auto& [name, fn] : op_table()) names.push_back(name);
  return names;
}

void reply_error(WorkerShared& shared, const Command& c, const std::string& error) {
  if (c.reply) return c.reply->fail(error);
  if (c.request && shared.outbox) shared.outbox->push(c.request, Reply{false, error, true, DType::f32, {}, {}}, nullptr);
}

bool execute(const Command& c, WorkerShared& shared, StreamMeshes& meshes) {
  switch (c.kind) {
    case Command::Kind::stop:
      return false;
    case Command::Kind::slice_mesh:
      meshes.emplace(c.mesh, meshes.at(c.parent).slice(c.at));
      break;
    case Command::Kind::seed:
      tessera::manual_seed(static_cast<uint64_t>(c.args.ints.at(0)));  // this stream's generator
      break;
    case Command::Kind::drop:
      shared.erase(c.output);
      break;
    case Command::Kind::signal:
      shared.signal(c.event);
      break;
    case Command::Kind::wait:
      shared.wait(c.event, c.stream);
      break;
    case Command::Kind::run_op:
      run_op(c, shared, meshes);
      break;
    case Command::Kind::query_layout:
      if (std::string error = shared.unreadable(c.output, "layout", "tensor"); !error.empty())
        reply_error(shared, c, error);
      else
        reply_layout(shared, c, shared.tensor(c.output, c.stream, meshes).layout());
      break;
    case Command::Kind::fetch_shard:
      if (std::string error = shared.unreadable(c.output, "fetch_shard", "tensor"); !error.empty())
        reply_error(shared, c, error);
      else
        reply_tensor(shared, c, shared.tensor(c.output, c.stream, meshes).to_local().clone());
      break;
    case Command::Kind::fetch_full:
      fetch_full(c, shared, meshes);
      break;
    case Command::Kind::make_mesh:
    case Command::Kind::make_stream:
      throw InternalError("[controller worker] a " + std::string(c.kind == Command::Kind::make_mesh ? "make_mesh" : "make_stream") +
                          " command reached a stream; the worker's dispatcher runs those");
  }
  return true;
}

}  // namespace tessera::controller::detail
