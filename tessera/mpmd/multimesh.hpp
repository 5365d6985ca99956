#pragma once
// multimesh.jax's meshes: one global mesh whose slices are the submeshes tasks run on
// (MultiMesh), and a mesh over an explicit list of devices that can be placed elsewhere with the
// same axes (TaskMesh). Both are DeviceMeshes underneath, so DTensors live on them as on any mesh.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

class Task;  // task.hpp, included at the end
using TaskFn = std::function<std::vector<DTensor>(const std::vector<DTensor>&)>;

/// multimesh.jax's mesh_slice: fixed coordinates of some axes of the global mesh.
using MeshSlice = std::map<std::string, int64_t>;
/// "{pp=1, dp=0}".
std::string to_string(const MeshSlice& slice);

/// register_task's callback: the Task for the name's matched group (multimesh.jax's callback).
/// `backprop` is false: a task's backward runs with its forward, on its mesh, through autograd.
using TaskCallback = std::function<Task(const std::string& matched, bool backprop)>;

/// The global mesh over the whole world (row-major ranks) and its submeshes.
/// Example: `MultiMesh mm({2, 2, 2}, {"pp", "dp", "tp"}); DeviceMesh stage0 = mm.slice({{"pp", 0}});`
/// gives the dp x tp mesh of ranks 0-3. Construction is collective over the world.
class MultiMesh {
 public:
  /// Without `devices`, the mesh covers the world in rank order (the shape must hold every
  /// rank); with them (multimesh.jax's `devices` array, row-major over `shape`), it is the mesh
  /// of those ranks, which may be part of the world. Throws ShardingError as DeviceMesh(shape,
  /// names, ranks), naming MultiMesh.
  MultiMesh(std::vector<int64_t> shape, std::vector<std::string> names, std::vector<int> devices = {});
  /// Wraps an existing mesh as the global one (multimesh.jax's `global_mesh`): its axes, sizes
  /// and ranks. No communication.
  explicit MultiMesh(DeviceMesh global_mesh);
  /// The submesh at fixed coordinates of some axes: a mesh of the remaining axes over the ranks
  /// there. No communication, except the first time a set of two or more remaining axes (not
  /// all) is kept: then, as DeviceMesh::slice, collective over the global mesh's ranks (every
  /// rank slices, each at its own coordinates). Throws ShardingError for an unknown axis or index
  /// out of range.
  DeviceMesh slice(const std::map<std::string, int64_t>& at) const;
  /// slice({axis: i}) for every i: the submeshes along one axis (e.g. the pipeline's stages).
  std::vector<DeviceMesh> split(std::string_view axis) const;
  const DeviceMesh& global() const { return global_; }

  /// multimesh.jax's register_task: a task whose name `matcher` matches runs as the Task that
  /// `callback` builds from the matched text (or as `task`). `matcher` is a regular expression
  /// (ECMAScript) searched anywhere in the name; its first group is the matched text, the whole
  /// match when it has none. The first registration that matches wins. Copies of this MultiMesh
  /// share its registrations; every rank registers the same ones. Throws ShardingError naming
  /// the matcher when it is not a valid expression.
  void register_task(std::string matcher, TaskCallback callback);
  void register_task(std::string matcher, Task task);
  /// multimesh.jax's task(fn, name, task): fn as a task named `name` (or the options' name) with
  /// the options of `options`: on its mesh, or on its mesh_slice of this global mesh (exactly one
  /// of them), under its logical_axes (by default each axis of that mesh naming itself) and then
  /// its extra_axes. Throws ShardingError naming the task when both or neither mesh is given, or
  /// when the slice names an unknown axis or index.
  Task task(TaskFn fn, std::string name, const Task& options) const;
  /// fn as the task of the first registration whose matcher matches `name` (its callback called
  /// with the matched text; the name is the Task's, else the matcher). Throws ShardingError
  /// naming the task and the matchers when none matches, and as above.
  Task task(TaskFn fn, std::string name) const;

 private:
  struct Registrations;
  DeviceMesh global_;
  std::shared_ptr<Registrations> registrations_;
};

/// Axis names and sizes without ranks (JAX's AbstractMesh): a TaskMesh's shape before it is
/// placed on devices. Pure. Throws ShardingError naming AbstractMesh for a name count that is not
/// the dim count, an empty or repeated name, or a size below 1.
/// Example: `AbstractMesh stage({2, 2}, {"dp", "tp"}); TaskMesh first({0, 1, 2, 3}, stage), second({4, 5, 6, 7},
/// stage);`
class AbstractMesh {
 public:
  AbstractMesh(std::vector<int64_t> shape, std::vector<std::string> names);
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }
  /// The product of the axis sizes: how many devices placing it takes.
  int64_t size() const;
  /// "AbstractMesh[dp=2, tp=2]".
  std::string to_string() const;
  friend bool operator==(const AbstractMesh&, const AbstractMesh&) = default;

 private:
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
};

/// A mesh over an explicit list of world ranks ("devices"), row-major over `shape`, and the same
/// axes placed on other ranks. Construction and place() are collective over the world.
class TaskMesh {
 public:
  /// Throws ShardingError for a device count that is not the shape's size, a rank outside the
  /// world or repeated, or bad names.
  TaskMesh(std::vector<int> devices, std::vector<int64_t> shape, std::vector<std::string> names);
  /// The abstract mesh's axes over `devices` (multimesh.jax's TaskMesh(devices, abstract=...)).
  TaskMesh(std::vector<int> devices, const AbstractMesh& abstract);
  /// The same shape and axis names over `devices`.
  TaskMesh place(std::vector<int> devices) const;
  /// Its axes without its devices.
  AbstractMesh abstract() const;
  const std::vector<int>& devices() const { return devices_; }
  const DeviceMesh& mesh() const { return mesh_; }
  operator const DeviceMesh&() const { return mesh_; }  // NOLINT: a TaskMesh is used as its mesh

 private:
  std::vector<int> devices_;
  DeviceMesh mesh_;
};

}  // namespace mpmd
}  // namespace tessera

// MultiMesh's task methods take and return Tasks: users of this header get the whole class.
#include <tessera/mpmd/task.hpp>  // IWYU pragma: export
