#pragma once
// multimesh.jax's tasks: a function that runs on one submesh only. Every rank of the world calls
// a task in program order (SPMD); the ranks of its mesh run it, the others skip it and get
// handles of its outputs (layouts, no data). DTensor inputs living on another mesh move onto the
// task's mesh through the planner first; outputs stay on the task's mesh until a consumer moves
// them.
#include <functional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mpmd/logical_axes.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

using TaskFn = std::function<std::vector<DTensor>(const std::vector<DTensor>&)>;

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
  /// `rules`: the logical axis rules in force while fn runs (LogicalAxes), so the same model code
  /// shards differently per task.
  Task(std::string name, DeviceMesh mesh, TaskFn fn, LogicalRules rules = {});

  /// Runs the task: inputs on another mesh are moved onto the task's (their placements kept
  /// where the meshes have as many dims, a Partial reduced on its own mesh first; Replicate
  /// otherwise), the task's ranks run fn, and the first of them tells every other rank the
  /// outputs' layouts. Called by every rank of the world, in the same order. Throws
  /// ShardingError naming the task when fn returns a DTensor on another mesh; an error inside fn
  /// fails the call on the task's ranks (and, through the missing layouts, on the others).
  std::vector<DTensor> operator()(const std::vector<DTensor>& inputs) const;
  /// operator() without waiting on ranks outside the task: they return at once with a future, so
  /// tasks on disjoint meshes launched one after another run at the same time (the leader's
  /// layout messages never block it). Inputs still move in at the call (every rank of the world
  /// calls launch, in the same order).
  TaskFuture launch(const std::vector<DTensor>& inputs) const;

  const std::string& name() const { return name_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const LogicalRules& rules() const { return rules_; }

 private:
  std::string name_;
  DeviceMesh mesh_;
  TaskFn fn_;
  LogicalRules rules_;
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
