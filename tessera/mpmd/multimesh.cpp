#include <tessera/mpmd/multimesh.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::mpmd {

MultiMesh::MultiMesh(std::vector<int64_t> shape, std::vector<std::string> names)
    : global_(std::move(shape), std::move(names)) {}

DeviceMesh MultiMesh::slice(const std::map<std::string, int64_t>& at) const { return global_.slice(at); }

std::vector<DeviceMesh> MultiMesh::split(std::string_view axis) const {
  const int64_t n = global_.size(axis);
  std::vector<DeviceMesh> parts;
  for (int64_t i = 0; i < n; ++i) parts.push_back(global_.slice({{std::string(axis), i}}));
  return parts;
}

namespace {

DeviceMesh mesh_over(const std::vector<int>& devices, std::vector<int64_t> shape, std::vector<std::string> names,
                     const char* call) {
  const int world = world_size();
  for (size_t i = 0; i < devices.size(); ++i) {
    TESSERA_CHECK(devices[i] >= 0 && devices[i] < world, ShardingError, call, "device ", devices[i],
                  " is not a rank of the world of ", world);
    TESSERA_CHECK(std::count(devices.begin(), devices.end(), devices[i]) == 1, ShardingError, call, "device ",
                  devices[i], " is listed twice");
  }
  return DeviceMesh(std::move(shape), std::move(names), devices);
}

}  // namespace

TaskMesh::TaskMesh(std::vector<int> devices, std::vector<int64_t> shape, std::vector<std::string> names)
    : devices_(std::move(devices)), mesh_(mesh_over(devices_, std::move(shape), std::move(names), "TaskMesh")) {}

TaskMesh TaskMesh::place(std::vector<int> devices) const {
  const MeshSpec& spec = mesh_.spec();
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < spec.ndim(); ++d) shape.push_back(spec.size(d));
  return TaskMesh(std::move(devices), std::move(shape), spec.names());
}

}  // namespace tessera::mpmd
