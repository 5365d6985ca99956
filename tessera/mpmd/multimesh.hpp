#pragma once
// multimesh.jax's meshes: one global mesh whose slices are the submeshes tasks run on
// (MultiMesh), and a mesh over an explicit list of devices that can be placed elsewhere with the
// same axes (TaskMesh). Both are DeviceMeshes underneath, so DTensors live on them as on any mesh.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/mesh/device_mesh.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

/// The global mesh over the whole world (row-major ranks) and its submeshes.
/// Example: `MultiMesh mm({2, 2, 2}, {"pp", "dp", "tp"}); DeviceMesh stage0 = mm.slice({{"pp", 0}});`
/// gives the dp x tp mesh of ranks 0-3. Construction is collective over the world.
class MultiMesh {
 public:
  /// Throws ShardingError as DeviceMesh(shape, names) (the shape must cover the world).
  MultiMesh(std::vector<int64_t> shape, std::vector<std::string> names);
  /// The submesh at fixed coordinates of some axes: a mesh of the remaining axes over the ranks
  /// there. No communication, except the first time a set of two or more remaining axes (not
  /// all) is kept: then, as DeviceMesh::slice, collective over the global mesh's ranks (every
  /// rank slices, each at its own coordinates). Throws ShardingError for an unknown axis or index
  /// out of range.
  DeviceMesh slice(const std::map<std::string, int64_t>& at) const;
  /// slice({axis: i}) for every i: the submeshes along one axis (e.g. the pipeline's stages).
  std::vector<DeviceMesh> split(std::string_view axis) const;
  const DeviceMesh& global() const { return global_; }

 private:
  DeviceMesh global_;
};

/// A mesh over an explicit list of world ranks ("devices"), row-major over `shape`, and the same
/// axes placed on other ranks. Construction and place() are collective over the world.
class TaskMesh {
 public:
  /// Throws ShardingError for a device count that is not the shape's size, a rank outside the
  /// world or repeated, or bad names.
  TaskMesh(std::vector<int> devices, std::vector<int64_t> shape, std::vector<std::string> names);
  /// The same shape and axis names over `devices`.
  TaskMesh place(std::vector<int> devices) const;
  const std::vector<int>& devices() const { return devices_; }
  const DeviceMesh& mesh() const { return mesh_; }
  operator const DeviceMesh&() const { return mesh_; }  // NOLINT: a TaskMesh is used as its mesh

 private:
  std::vector<int> devices_;
  DeviceMesh mesh_;
};

}  // namespace mpmd
}  // namespace tessera
