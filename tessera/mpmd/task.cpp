#include <tessera/comm/tags.hpp>
#include <tessera/mpmd/task.hpp>

#include <fnmatch.h>

#include <algorithm>
#include <memory>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/word_messages.hpp>
#include <tessera/core/error.hpp>
#include <tessera/mpmd/contexts.hpp>
#include <tessera/mpmd/multimesh.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>
#include <tessera/sharding/mesh_move.hpp>

namespace tessera::mpmd {

namespace {

// Launch k's layout messages use tags kTaskTag + 2 (k mod kTaskTags) and the next one.
constexpr int kTaskTags = tessera::kTaskTags.size() / 2;
constexpr int kTaskTag = tessera::kTaskTags.first;

// Per rank: launches so far, and the leader's layout messages still in flight (each keeping the
// buffer it reads alive). Completed ones are dropped at each launch; the rest are waited for when
// the rank's state goes, at the end of its body.
struct TaskState {
  uint64_t launches = 0;
  std::vector<Work> pending;

  void drain_completed() {
    std::erase_if(pending, [](const Work& w) { return w.is_completed(); });
  }
  ~TaskState() {
    for (const Work& w : pending) {
      try {
        w.wait();
      } catch (...) {  // a failed world: nothing more to deliver
      }
    }
  }
};

TaskState& task_state() {
  return rank_local<TaskState>("tessera.mpmd.task_state");
}

struct Registered {
  std::string pattern;
  DeviceMesh mesh;
  LogicalRules rules;
};
struct Registry {
  std::vector<Registered> patterns;
};

Registry& registry() {
  return rank_local<Registry>("tessera.mpmd.tasks");
}

}  // namespace

DTensor to_mesh(const DTensor& x, const DeviceMesh& mesh) {
  if (x.layout().mesh() == mesh.spec()) return x;
  // A Partial is reduced where its partial values are (a no-op without one), then moved as values.
  const DTensor values = x.redistribute(x.device_mesh(), gradient_layout(x.layout()));
  return values.redistribute(mesh, layout_on_mesh(values.layout(), mesh.spec()));
}

Task::Task(std::string name, DeviceMesh mesh, TaskFn fn, LogicalRules rules)
    : name_(std::move(name)), mesh_(std::move(mesh)), fn_(std::move(fn)), rules_(std::move(rules)), has_rules_(true) {
  TESSERA_CHECK(static_cast<bool>(fn_), ShardingError, "task", "task '", name_, "' has no function");
}

Task& Task::name(std::string name) {
  name_ = std::move(name);
  return *this;
}

Task& Task::mesh(DeviceMesh mesh) {
  mesh_ = std::move(mesh);
  return *this;
}

Task& Task::logical_axes(LogicalRules rules) {
  rules_ = std::move(rules);
  has_rules_ = true;
  return *this;
}

Task& Task::mesh_slice(MeshSlice slice) {
  mesh_slice_ = std::move(slice);
  return *this;
}

Task& Task::extra_axes(LogicalRules rules) {
  extra_axes_ = std::move(rules);
  return *this;
}

Task& Task::loop_dependent_mesh_slice(std::function<MeshSlice(int64_t)> slice_of) {
  loop_slice_ = std::move(slice_of);
  return *this;
}

LogicalRules Task::rules() const {
  LogicalRules all = rules_;
  all.insert(all.end(), extra_axes_.begin(), extra_axes_.end());
  return all;
}

Task Task::iteration(int64_t i) const {
  if (!loop_slice_) return *this;
  TESSERA_CHECK(global_.size() > 0, ShardingError, "task", "task '", name_,
                "' has a loop_dependent_mesh_slice but no MultiMesh built it; use MultiMesh::task");
  const MeshSlice at = loop_slice_(i);
  DeviceMesh mesh = MultiMesh(global_).slice(at);
  TESSERA_CHECK(mesh.size() == mesh_.size(), ShardingError, "task", "task '", name_, "' iteration ", i,
                ": the loop-dependent slice ", to_string(at), " holds ", mesh.size(), " devices, its mesh ",
                mesh_.to_string(), " holds ", mesh_.size());
  Task out = *this;
  out.mesh_ = std::move(mesh);
  return out;
}

std::vector<DTensor> Task::operator()(const std::vector<DTensor>& inputs) const { return launch(inputs).get(); }

TaskFuture Task::launch(const std::vector<DTensor>& inputs) const {
  TESSERA_CHECK(runnable(), ShardingError, "task", "task '", name_,
                "' is a Task value without a function; pass it to MultiMesh::task(fn, name, task)");
  if (transforms_ignored()) {
    // Plain SPMD code: the function where its inputs are, on every rank; nothing to tell anyone.
    TaskFuture future;
    future.outputs_ = fn_(inputs);
    future.resolved_ = true;
    return future;
  }
  std::vector<DTensor> moved;
  for (const DTensor& x : inputs) moved.push_back(to_mesh(x, mesh_));
  TaskState& state = task_state();
  state.drain_completed();
  TaskFuture future;
  future.mesh_ = mesh_;
  future.leader_ = mesh_.spec().ranks().front();
  // Every rank numbers its launches alike: each launch's layout messages have their own tags, so
  // futures may be resolved in any order.
  future.tag_ = kTaskTag + 2 * static_cast<int>(state.launches++ % kTaskTags);
  if (!mesh_.is_member()) return future;
  {
    const LogicalAxes scope(rules());
    future.outputs_ = fn_(moved);
  }
  future.resolved_ = true;
  for (const DTensor& y : future.outputs_)
    TESSERA_CHECK(y.defined() && y.layout().mesh() == mesh_.spec(), ShardingError, "task", "task '", name_,
                  "' returned ", y.defined() ? y.layout().to_string() : "(undefined)", ", not a DTensor on its mesh ",
                  mesh_.to_string());
  if (rank() != future.leader_) return future;
  // Every other rank learns the outputs' layouts: a length, then the count and each layout's
  // length and words. The sends stay in flight (never waited here), so the leader goes on.
  auto message = std::make_shared<std::vector<int64_t>>(1, static_cast<int64_t>(future.outputs_.size()));
  for (const DTensor& y : future.outputs_) {
    const std::vector<int64_t> words = layout_words(y.layout());
    message->push_back(static_cast<int64_t>(words.size()));
    message->insert(message->end(), words.begin(), words.end());
  }
  Communicator& comm = world();
  const auto& members = mesh_.spec().ranks();
  for (int r = 0; r < world_size(); ++r) {
    if (std::count(members.begin(), members.end(), r)) continue;
    for (Work& w : isend_words(comm, message, r, future.tag_, future.tag_ + 1)) state.pending.push_back(std::move(w));
  }
  return future;
}

std::vector<DTensor> TaskFuture::get() {
  if (resolved_) return outputs_;
  const std::vector<int64_t> message = recv_words(world(), leader_, tag_, tag_ + 1);
  size_t at = 1;
  for (int64_t k = 0; k < message.front(); ++k) {
    const auto words_length = static_cast<size_t>(message[at++]);
    const std::vector<int64_t> words(message.begin() + static_cast<std::ptrdiff_t>(at),
                                     message.begin() + static_cast<std::ptrdiff_t>(at + words_length));
    at += words_length;
    outputs_.push_back(DTensor(Tensor(), mesh_, WordReader(words, "task").layout(mesh_.spec())));
  }
  resolved_ = true;
  return outputs_;
}

Task task(std::string name, DeviceMesh mesh, TaskFn fn, LogicalRules rules) {
  return Task(std::move(name), std::move(mesh), std::move(fn), std::move(rules));
}

void register_task(std::string pattern, DeviceMesh mesh, LogicalRules rules) {
  registry().patterns.push_back({std::move(pattern), std::move(mesh), std::move(rules)});
}

Task task(std::string name, TaskFn fn) {
  const auto& patterns = registry().patterns;
  for (auto it = patterns.rbegin(); it != patterns.rend(); ++it)
    if (fnmatch(it->pattern.c_str(), name.c_str(), 0) == 0) return Task(std::move(name), it->mesh, std::move(fn), it->rules);
  std::string known;
  for (const Registered& r : patterns) known.append(known.empty() ? "" : ", ").append(r.pattern);
  TESSERA_CHECK(false, ShardingError, "task", "no registered pattern matches task '", name, "' (patterns: ",
                known.empty() ? "none" : known, "); call register_task(pattern, mesh) first");
  return Task(std::move(name), DeviceMesh(), std::move(fn));  // not reached
}

}  // namespace tessera::mpmd
