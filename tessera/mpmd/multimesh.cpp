#include <tessera/mpmd/multimesh.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::mpmd {

namespace {

// The checks DeviceMesh's constructor makes, named after the user's call instead (DeviceMesh's
// own name the internal call): a mesh of `shape` and `names` over `ranks` ranks. Run before the
// collective construction, with the same arguments on every rank, so every rank throws alike.
void check_mesh(const char* call, const std::vector<int64_t>& shape, const std::vector<std::string>& names,
                size_t ranks, const char* ranks_are) {
  const std::string text = Shape(shape).to_string();
  TESSERA_CHECK(names.size() == shape.size(), ShardingError, call, "shape ", text, " has ", shape.size(), " dims but ",
                names.size(), " axis names were given; expected one name per dim");
  for (size_t i = 0; i < names.size(); ++i) {
    TESSERA_CHECK(!names[i].empty(), ShardingError, call, "axis ", i, " of shape ", text, " has an empty name");
    TESSERA_CHECK(std::count(names.begin(), names.end(), names[i]) == 1, ShardingError, call, "axis name '", names[i],
                  "' appears twice for shape ", text, "; expected distinct names");
    TESSERA_CHECK(shape[i] >= 1, ShardingError, call, "axis '", names[i], "' of shape ", text, " has size ", shape[i],
                  "; expected >= 1");
  }
  const int64_t points = Shape(shape).numel();
  TESSERA_CHECK(points == static_cast<int64_t>(ranks), ShardingError, call, "shape ", text, " holds ", points,
                " ranks but ", ranks, " ", ranks_are, "; expected one per grid point");
}

// TaskMesh's arguments, checked under the user's call (the constructor or place()).
void check_task_mesh(const char* call, const std::vector<int>& devices, const std::vector<int64_t>& shape,
                     const std::vector<std::string>& names) {
  check_mesh(call, shape, names, devices.size(), "devices were given");
  const int world = world_size();
  for (int device : devices) {
    TESSERA_CHECK(device >= 0 && device < world, ShardingError, call, "device ", device,
                  " is not a rank of the world of ", world);
    TESSERA_CHECK(std::count(devices.begin(), devices.end(), device) == 1, ShardingError, call, "device ", device,
                  " is listed twice");
  }
}

DeviceMesh world_mesh(std::vector<int64_t> shape, std::vector<std::string> names) {
  check_mesh("MultiMesh", shape, names, static_cast<size_t>(world_size()), "ranks are in the world");
  return DeviceMesh(std::move(shape), std::move(names));
}

// A MultiMesh's global mesh: over the world, or over the given devices.
DeviceMesh global_mesh(std::vector<int64_t> shape, std::vector<std::string> names, std::vector<int> devices) {
  if (devices.empty()) return world_mesh(std::move(shape), std::move(names));
  check_task_mesh("MultiMesh", devices, shape, names);
  return DeviceMesh(std::move(shape), std::move(names), std::move(devices));
}

DeviceMesh task_mesh(const std::vector<int>& devices, std::vector<int64_t> shape, std::vector<std::string> names) {
  check_task_mesh("TaskMesh", devices, shape, names);
  return DeviceMesh(std::move(shape), std::move(names), devices);
}

int64_t axis_size(const DeviceMesh& mesh, std::string_view axis, const char* call) {
  return mesh.spec().size(mesh.spec().dim_of(axis, call));
}

}  // namespace

MultiMesh::MultiMesh(std::vector<int64_t> shape, std::vector<std::string> names, std::vector<int> devices)
    : global_(global_mesh(std::move(shape), std::move(names), std::move(devices))) {}

MultiMesh::MultiMesh(DeviceMesh global_mesh) : global_(std::move(global_mesh)) {}

DeviceMesh MultiMesh::slice(const std::map<std::string, int64_t>& at) const {
  for (const auto& [axis, index] : at) {
    const int64_t size = axis_size(global_, axis, "MultiMesh::slice");
    TESSERA_CHECK(index >= 0 && index < size, ShardingError, "MultiMesh::slice", "index ", index,
                  " out of range for axis '", axis, "' of ", global_.to_string(), "; expected 0 <= index < ", size);
  }
  return global_.slice(at);
}

std::vector<DeviceMesh> MultiMesh::split(std::string_view axis) const {
  const int64_t n = axis_size(global_, axis, "MultiMesh::split");
  std::vector<DeviceMesh> parts;
  for (int64_t i = 0; i < n; ++i) parts.push_back(global_.slice({{std::string(axis), i}}));
  return parts;
}

TaskMesh::TaskMesh(std::vector<int> devices, std::vector<int64_t> shape, std::vector<std::string> names)
    : devices_(std::move(devices)), mesh_(task_mesh(devices_, std::move(shape), std::move(names))) {}

TaskMesh::TaskMesh(std::vector<int> devices, const AbstractMesh& abstract)
    : TaskMesh(std::move(devices), abstract.shape(), abstract.names()) {}

TaskMesh TaskMesh::place(std::vector<int> devices) const {
  const AbstractMesh axes = abstract();
  check_task_mesh("TaskMesh::place", devices, axes.shape(), axes.names());
  return TaskMesh(std::move(devices), axes);
}

AbstractMesh TaskMesh::abstract() const {
  const MeshSpec& spec = mesh_.spec();
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < spec.ndim(); ++d) shape.push_back(spec.size(d));
  return AbstractMesh(std::move(shape), spec.names());
}

AbstractMesh::AbstractMesh(std::vector<int64_t> shape, std::vector<std::string> names)
    : shape_(std::move(shape)), names_(std::move(names)) {
  check_mesh("AbstractMesh", shape_, names_, static_cast<size_t>(size()), "");
}

int64_t AbstractMesh::size() const { return Shape(shape_).numel(); }

std::string AbstractMesh::to_string() const {
  std::string text = "AbstractMesh[";
  for (size_t i = 0; i < shape_.size(); ++i) text += (i ? ", " : "") + names_[i] + "=" + std::to_string(shape_[i]);
  return text + "]";
}

}  // namespace tessera::mpmd
