// multimesh.jax's task contexts on a MultiMesh: Task values turned into runnable tasks (their
// mesh or mesh slice, logical axes and extra axes resolved against the global mesh), and tasks
// found by name through registered matchers whose callbacks build the Task per match.
#include <tessera/mpmd/multimesh.hpp>

#include <mutex>
#include <regex>

#include <tessera/core/error.hpp>

namespace tessera::mpmd {

struct MultiMesh::Registrations {
  struct Entry {
    std::string matcher;
    std::regex pattern;
    TaskCallback callback;
  };
  std::vector<Entry> entries;
};

std::string to_string(const MeshSlice& slice) {
  std::string out = "{";
  for (const auto& [axis, index] : slice)
    out.append(out.size() > 1 ? ", " : "").append(axis + "=" + std::to_string(index));
  return out + "}";
}

void MultiMesh::register_task(std::string matcher, TaskCallback callback) {
  TESSERA_CHECK(static_cast<bool>(callback), ShardingError, "register_task", "matcher '", matcher,
                "' was given no callback");
  std::regex pattern;
  try {
    // std::regex's compiler narrows characters through the locale's ctype<char>, whose cache
    // libstdc++ fills without synchronisation (TSan reports it): ranks that are threads of one
    // process compile their matchers one at a time.
    static std::mutex compiling;
    const std::lock_guard<std::mutex> one_at_a_time(compiling);
    pattern = std::regex(matcher, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    TESSERA_CHECK(false, ShardingError, "register_task", "matcher '", matcher,
                  "' is not a regular expression: ", e.what());
  }
  if (!registrations_) registrations_ = std::make_shared<Registrations>();
  registrations_->entries.push_back({std::move(matcher), std::move(pattern), std::move(callback)});
}

void MultiMesh::register_task(std::string matcher, Task task) {
  register_task(std::move(matcher), [task = std::move(task)](const std::string&, bool) { return task; });
}

Task MultiMesh::task(TaskFn fn, std::string name, const Task& options) const {
  if (!options.name().empty()) name = options.name();
  TESSERA_CHECK(static_cast<bool>(fn), ShardingError, "task", "task '", name, "' has no function");
  const bool sliced = !options.mesh_slice().empty();
  TESSERA_CHECK(!(sliced && options.has_mesh()), ShardingError, "task", "task '", name,
                "' gives both a mesh and a mesh_slice ", to_string(options.mesh_slice()), "; give one");
  TESSERA_CHECK(sliced || options.has_mesh(), ShardingError, "task", "task '", name,
                "' gives neither a mesh nor a mesh_slice; give one");
  DeviceMesh mesh = sliced ? slice(options.mesh_slice()) : options.mesh();
  LogicalRules rules = options.logical_axes();
  if (!options.has_rules_)  // multimesh.jax's default: each axis of the task's mesh names itself
    for (const std::string& axis : mesh.spec().names()) rules.push_back({axis, {axis}});
  Task out(std::move(name), std::move(mesh), std::move(fn), std::move(rules));
  out.mesh_slice_ = options.mesh_slice();
  out.extra_axes_ = options.extra_axes();
  out.loop_slice_ = options.loop_slice_;
  out.global_ = global_;
  return out;
}

Task MultiMesh::task(TaskFn fn, std::string name) const {
  const std::vector<Registrations::Entry> none;
  const auto& entries = registrations_ ? registrations_->entries : none;
  for (const Registrations::Entry& entry : entries) {
    std::smatch match;
    if (!std::regex_search(name, match, entry.pattern)) continue;
    const std::string matched = match.size() > 1 ? match[1].str() : match[0].str();
    // Unnamed, the task takes the matcher's name, as in multimesh.jax.
    return task(std::move(fn), entry.matcher, entry.callback(matched, /*backprop=*/false));
  }
  std::string known;
  for (const Registrations::Entry& entry : entries) known.append(known.empty() ? "" : ", ").append(entry.matcher);
  TESSERA_CHECK(false, ShardingError, "task", "no registered matcher matches task '", name,
                "' (matchers: ", known.empty() ? "none" : known,
                "); call MultiMesh::register_task(matcher, callback) first");
  return Task();  // not reached
}

}  // namespace tessera::mpmd
