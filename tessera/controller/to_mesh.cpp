// Monarch's to_mesh on the controller: the checks of the two meshes' axes, then one command to
// the workers of both meshes (detail/to_mesh.cpp runs it). The blocks travel over a 1-d mesh
// of every worker, made once by the first to_mesh, whose stream copies carry nothing else.
#include <tessera/controller/controller.hpp>

#include <algorithm>

#include <tessera/controller/detail/state.hpp>
#include <tessera/core/error.hpp>

namespace tessera::controller {

namespace {

// ShardingError naming `call` unless every axis of `from` is an axis of `to` of the same size,
// or has one worker.
void check_axes(const WorkerMesh& from, const WorkerMesh& to, const char* call) {
  const MeshSpec& f = from.spec();
  const MeshSpec& t = to.spec();
  for (int64_t d = 0; d < f.ndim(); ++d) {
    const std::string& axis = f.names()[static_cast<size_t>(d)];
    const auto it = std::find(t.names().begin(), t.names().end(), axis);
    if (it == t.names().end()) {
      TESSERA_CHECK(f.size(d) == 1, ShardingError, call, "the tensor's mesh ", detail::describe_mesh(from),
                    " has axis '", axis, "' of ", f.size(d), " workers, which ", detail::describe_mesh(to),
                    " lacks: whose block each worker takes would be ambiguous; slice_mesh or reduce over '", axis,
                    "' first");
      continue;
    }
    const int64_t size = t.size(it - t.names().begin());
    TESSERA_CHECK(size == f.size(d), ShardingError, call, "axis '", axis, "' has ", f.size(d), " workers on ",
                  detail::describe_mesh(from), " and ", size, " on ", detail::describe_mesh(to),
                  "; the sizes of the axes both meshes name must match");
  }
}

int64_t all_workers_mesh(detail::ControllerState& state) {
  if (state.all_workers_mesh < 0) state.all_workers_mesh = WorkerMesh({state.workers}, {"workers"}).id();
  return state.all_workers_mesh;
}

RemoteTensor move(detail::ControllerState& state, const RemoteTensor& t, const WorkerMesh& mesh, const char* call) {
  TESSERA_CHECK(t.defined(), ValueError, call, "undefined RemoteTensor");
  detail::check_readable(state, t, call);
  if (t.mesh().id() == mesh.id()) return t;
  check_axes(t.mesh(), mesh, call);
  detail::ToMesh command;
  command.from = t.mesh().id();
  command.to = mesh.id();
  command.all = all_workers_mesh(state);
  command.stream = state.active_stream;
  command.tensor = t.id();
  command.output = state.next_tensor++;
  auto layout = state.future<Layout>();
  command.layout_request = detail::layout_request(state, layout, mesh);
  RemoteTensor result = detail::TensorHandle::make(command.output, mesh, layout, state.active_stream);
  std::vector<int> workers = t.mesh().spec().ranks();
  for (int r : mesh.spec().ranks())
    if (std::find(workers.begin(), workers.end(), r) == workers.end()) workers.push_back(r);
  std::sort(workers.begin(), workers.end());
  state.send(workers, std::move(command));
  return result;
}

}  // namespace

RemoteTensor RemoteTensor::to_mesh(const WorkerMesh& mesh) const {
  return move(detail::require_mesh("RemoteTensor::to_mesh"), *this, mesh, "RemoteTensor::to_mesh");
}

std::vector<RemoteTensor> to_mesh(const std::vector<RemoteTensor>& tensors, const WorkerMesh& mesh) {
  detail::ControllerState& state = detail::require_mesh("to_mesh");
  for (const RemoteTensor& t : tensors) {
    TESSERA_CHECK(t.defined(), ValueError, "to_mesh", "undefined RemoteTensor");
    detail::check_readable(state, t, "to_mesh");
    if (t.mesh().id() != mesh.id()) check_axes(t.mesh(), mesh, "to_mesh");
  }
  std::vector<RemoteTensor> out;
  for (const RemoteTensor& t : tensors) out.push_back(move(state, t, mesh, "to_mesh"));
  return out;
}

}  // namespace tessera::controller
