// A worker's commands: the execution of one stream's command on DTensor (the ops by name come
// from op_rows). Each value lives in the worker's table by id; an op that throws leaves its
// output failed with the worker's message, and ops reading a failed value fail alike (without
// running), so the error surfaces at whatever the controller fetches.
#include <tessera/controller/detail/worker.hpp>

#include <algorithm>
#include <chrono>
#include <type_traits>

#include <tessera/comm/communicator.hpp>
#include <tessera/controller/detail/op_rows.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::controller::detail {

std::string worker_error(const std::string& what) { return "worker rank " + std::to_string(rank()) + ": " + what; }

std::string WorkerShared::unreadable(uint64_t id, const std::string& call, const char* what) {
  std::lock_guard<std::mutex> lock(values_mutex_);
  const auto it = values_.find(id);
  if (it == values_.end()) return worker_error("[" + call + "] " + what + " " + std::to_string(id) + " was dropped");
  return it->second.error;
}

std::string WorkerShared::gather(const std::vector<uint64_t>& ids, int64_t stream, const std::string& call,
                                 const StreamMeshes& meshes, std::vector<DTensor>& inputs) {
  for (uint64_t id : ids) {
    if (std::string error = unreadable(id, call, "input tensor"); !error.empty()) return error;
    inputs.push_back(tensor(id, stream, meshes));
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

void run_op(const RunOp& c, WorkerShared& shared, StreamMeshes& meshes) {
  const DeviceMesh& mesh = meshes.at(c.mesh).working;
  // In place (the output among the inputs), a failed target fails the op like any input.
  Value out{{}, {}, c.stream, c.onto >= 0 ? c.onto : c.mesh};
  std::vector<DTensor> inputs;
  out.error = shared.gather(c.inputs, c.stream, c.op, meshes, inputs);
  if (out.error.empty()) {
    try {
      const OpRow* row = find_op(c.op);
      TESSERA_CHECK(row != nullptr, ValueError, "controller worker", "no op '", c.op, "' in the op table");
      out.tensor = row->run(inputs, c.args, mesh);
    } catch (const std::exception& e) {
      out.error = worker_error(e.what());
    }
  }
  if (c.onto < 0) {
    if (mesh.spec().ranks().front() == rank()) report(shared, c.layout_request, out);
    return shared.store(c.output, std::move(out));
  }
  // Reduced onto a slice: its workers keep their (replicated) block on the slice's mesh, the
  // others nothing; the slice's first worker reports.
  const DeviceMesh& onto = meshes.at(c.onto).working;
  if (out.error.empty() && onto.is_member()) {
    const std::vector<int64_t>& reduced = std::get<MeshReduceArgs>(c.args).mesh_dims;
    Placements kept;
    for (int64_t d = 0; d < mesh.ndim(); ++d)
      if (std::find(reduced.begin(), reduced.end(), d) == reduced.end())
        kept.push_back(out.tensor.placements()[static_cast<size_t>(d)]);
    FromLocalOptions global;
    global.shape = out.tensor.shape();
    out.tensor = DTensor::from_local(out.tensor.to_local(), onto, kept, global);
  }
  if (onto.spec().ranks().front() == rank()) report(shared, c.layout_request, out);
  if (onto.is_member()) shared.store(c.output, std::move(out));
  else shared.erase(c.output);
}

void fetch(const Fetch& c, WorkerShared& shared, StreamMeshes& meshes) {
  const char* call = c.whole ? "fetch_full" : "fetch_shard";
  std::string error = shared.unreadable(c.tensor, call, "tensor");
  Tensor value;
  if (error.empty()) {
    try {
      // Values only, in storage of their own: in process, a fetched tensor's backward would
      // otherwise reach the workers' leaves, and a later in-place op on the workers (an optimizer
      // step) would write under the controller's reads (full_tensor of a replicated tensor is
      // its local block itself).
      const DTensor t = shared.tensor(c.tensor, c.stream, meshes).detach();
      const autograd::NoGradGuard no_grad;
      value = (c.whole ? t.full_tensor() : t.to_local()).clone();  // full_tensor: collective over the mesh
    } catch (const std::exception& e) {
      error = worker_error(e.what());
    }
  }
  // The whole tensor is answered once, by the mesh's first worker; a shard by the worker asked.
  if (c.whole && meshes.at(c.mesh).working.spec().ranks().front() != rank()) return;
  if (error.empty())
    shared.replies.tensor(c.request, value);
  else
    shared.replies.error(c.request, error);
}

void query_layout(const QueryLayout& c, WorkerShared& shared, StreamMeshes& meshes) {
  if (std::string error = shared.unreadable(c.tensor, "layout", "tensor"); !error.empty())
    shared.replies.error(c.request, error);
  else
    shared.replies.layout(c.request, shared.tensor(c.tensor, c.stream, meshes).layout());
}

}  // namespace

void report(WorkerShared& shared, uint64_t request, const Value& out) {
  if (request == 0) return;
  if (out.error.empty())
    shared.replies.layout(request, out.tensor.layout());
  else
    shared.replies.error(request, out.error);
}

void reply_error(WorkerShared& shared, const Command& c, const std::string& error) {
  if (const uint64_t request = request_of(c)) shared.replies.error(request, error);
}

bool execute(const Command& command, WorkerShared& shared, StreamMeshes& meshes) {
  return std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, Stop>) {
          return false;
        } else if constexpr (std::is_same_v<T, SliceMesh>) {
          meshes.emplace(c.mesh, meshes.at(c.parent).slice(c.at));
        } else if constexpr (std::is_same_v<T, Seed>) {
          tessera::manual_seed(c.seed + rank_along(meshes.at(c.mesh).working, c.per_worker));  // this stream's
        } else if constexpr (std::is_same_v<T, Drop>) {
          shared.erase(c.tensor);
        } else if constexpr (std::is_same_v<T, Signal>) {
          shared.signal(c.event);
        } else if constexpr (std::is_same_v<T, Wait>) {
          shared.wait(c.event, c.stream);
        } else if constexpr (std::is_same_v<T, RunOp>) {
          run_op(c, shared, meshes);
        } else if constexpr (std::is_same_v<T, CallRemote>) {
          run_remote(c, shared, meshes);
        } else if constexpr (std::is_same_v<T, ToMesh>) {
          to_mesh(c, shared, meshes);
        } else if constexpr (std::is_same_v<T, QueryLayout>) {
          query_layout(c, shared, meshes);
        } else if constexpr (std::is_same_v<T, Fetch>) {
          fetch(c, shared, meshes);
        } else {
          static_assert(std::is_same_v<T, MakeMesh> || std::is_same_v<T, MakeStream>, "a command kind is not run");
          throw InternalError(std::string("[controller worker] a ") + kind_name(command) +
                              " command reached a stream; the worker's dispatcher runs those");
        }
        return true;
      },
      command);
}

}  // namespace tessera::controller::detail
