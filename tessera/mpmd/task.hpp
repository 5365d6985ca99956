#pragma once
// multimesh.jax's tasks: a function that runs on one submesh only. Every rank of the world calls
// a task in program order (SPMD); the ranks of its mesh run it, the others skip it and get
// handles of its outputs (layouts, no data). DTensor inputs living on another mesh move onto the
// task's mesh through the planner first; outputs stay on the task's mesh until a consumer moves
// them.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mpmd/logical_axes.hpp>
#include <tessera/mpmd/multimesh.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

/// The outputs of a launched task. On the task's ranks they are ready at launch; elsewhere get()
/// receives their layouts from the task's first rank (waiting until its function returned).
/// get() may be called more than once; every rank should call it before the program ends.
class TaskFuture {
 public:
  std::vector<DTensor> get();
  bool ready() const { return resolved_; }

 private:
  friend class Task;
  DeviceMesh mesh_;
  int leader_ = 0, tag_ = 0;
  bool resolved_ = false;
  std::vector<DTensor> outputs_;
};

class Task {
 public:
  /// multimesh.jax's Task dataclass: a value holding a task's options and no function. Set them
  /// with the methods named as its fields (each returns the Task, so they chain):
  /// `Task().name("stage").mesh_slice({{"pp", 1}}).extra_axes({{"heads", {"tp"}}})`; then
  /// MultiMesh::task(fn, name, options) or a MultiMesh::register_task callback makes it runnable.
  Task() = default;
  /// `rules`: the logical axis rules in force while fn runs (LogicalAxes), so the same model code
  /// shards differently per task.
  Task(std::string name, DeviceMesh mesh, TaskFn fn, LogicalRules rules = {});

  Task& name(std::string name);
  /// The submesh the task runs on (a TaskMesh converts); or, instead, mesh_slice.
  Task& mesh(DeviceMesh mesh);
  /// Logical -> mesh axis rules in priority order. Unset: each axis of the task's mesh names
  /// itself (a logical name equal to an axis shards over it), as in multimesh.jax.
  Task& logical_axes(LogicalRules rules);
  /// The task's mesh as a slice of the MultiMesh that runs it (axes fixed at these indices).
  Task& mesh_slice(MeshSlice slice);
  /// Rules in force after logical_axes (or their default), for axes the task adds.
  Task& extra_axes(LogicalRules rules);
  /// The slice for loop iteration i (iteration(i)), as pipeline stages follow a loop index.
  Task& loop_dependent_mesh_slice(std::function<MeshSlice(int64_t)> slice_of);

  const std::string& name() const { return name_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const LogicalRules& logical_axes() const { return rules_; }
  const MeshSlice& mesh_slice() const { return mesh_slice_; }
  const LogicalRules& extra_axes() const { return extra_axes_; }
  /// The rules in force while fn runs: logical_axes, then extra_axes.
  LogicalRules rules() const;
  /// Whether it has a function to run (a Task value has none).
  bool runnable() const { return static_cast<bool>(fn_); }
  /// Whether mesh() was given (an empty mesh has no ranks).
  bool has_mesh() const { return mesh_.size() > 0; }

  /// The task of loop iteration i: the same function on loop_dependent_mesh_slice(i) of the
  /// MultiMesh that built it; itself without a loop-dependent slice. Throws ShardingError naming
  /// the task and iteration when that slice holds another number of devices than its mesh, or
  /// when no MultiMesh built it. Collective as MultiMesh::slice.
  Task iteration(int64_t i) const;

  /// Runs the task: inputs on another mesh are moved onto the task's (their placements kept
  /// where the meshes have as many dims, a Partial reduced on its own mesh first; Replicate
  /// otherwise), the task's ranks run fn, and the first of them tells every other rank the
  /// outputs' layouts. Called by every rank of the world, in the same order. Throws
  /// ShardingError naming the task when fn returns a DTensor on another mesh, or when it has no
  /// function; an error inside fn fails the call on the task's ranks (and, through the missing
  /// layouts, on the others).
  std::vector<DTensor> operator()(const std::vector<DTensor>& inputs) const;
  /// operator() without waiting on ranks outside the task: they return at once with a future, so
  /// tasks on disjoint meshes launched one after another run at the same time (the leader's
  /// layout messages never block it). Inputs still move in at the call (every rank of the world
  /// calls launch, in the same order).
  TaskFuture launch(const std::vector<DTensor>& inputs) const;

 private:
  friend class MultiMesh;
  std::string name_;
  DeviceMesh mesh_;  // a Task value's is empty (no ranks) until mesh() sets one
  TaskFn fn_;
  LogicalRules rules_;
  bool has_rules_ = false;
  MeshSlice mesh_slice_;
  LogicalRules extra_axes_;
  std::function<MeshSlice(int64_t)> loop_slice_;
  DeviceMesh global_;  // the MultiMesh's global mesh, where one built it (for iteration); else empty
};

/// task(name, mesh, fn): a Task.
Task task(std::string name, DeviceMesh mesh, TaskFn fn, LogicalRules rules = {});
/// Tasks named by a glob pattern ('*' any run, '?' one character) run on `mesh` under `rules` (a
/// later registration wins). Per rank: every rank registers the same patterns.
void register_task(std::string pattern, DeviceMesh mesh, LogicalRules rules = {});
/// A task on the mesh (and rules) of the latest registered pattern matching `name`;
/// ShardingError naming the patterns when none matches.
Task task(std::string name, TaskFn fn);
/// Moves x onto `mesh` as a task input does (every rank of the world calls it).
DTensor to_mesh(const DTensor& x, const DeviceMesh& mesh);

}  // namespace mpmd
}  // namespace tessera
