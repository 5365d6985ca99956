#include <tessera/mpmd/task.hpp>

#include <fnmatch.h>

#include <algorithm>
#include <memory>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/mpmd/detail/layout_wire.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::mpmd {

namespace {

constexpr int kTaskTag = (1 << 20) - 64;  // below the pipeline's tags

struct Registered {
  std::string pattern;
  DeviceMesh mesh;
  LogicalRules rules;
};
struct Registry {
  std::vector<Registered> patterns;
};

Registry& registry() {
  std::shared_ptr<void>& slot = rank_state("tessera.mpmd.tasks");
  if (!slot) slot = std::make_shared<Registry>();
  return *std::static_pointer_cast<Registry>(slot);
}

}  // namespace

DTensor to_mesh(const DTensor& x, const DeviceMesh& mesh) {
  if (x.layout().mesh() == mesh.spec()) return x;
  Placements placements = x.placements();
  bool partial = false;
  for (auto& p : placements)
    if (is_partial(p)) p = Replicate{}, partial = true;
  // A Partial is reduced where its partial values are, then moved as values.
  const DTensor values = partial ? x.redistribute(x.device_mesh(), placements) : x;
  if (static_cast<int64_t>(placements.size()) != mesh.ndim()) placements.assign(static_cast<size_t>(mesh.ndim()), Replicate{});
  return values.redistribute(mesh, placements);
}

Task::Task(std::string name, DeviceMesh mesh, TaskFn fn, LogicalRules rules)
    : name_(std::move(name)), mesh_(std::move(mesh)), fn_(std::move(fn)), rules_(std::move(rules)) {
  TESSERA_CHECK(static_cast<bool>(fn_), ShardingError, "task", "task '", name_, "' has no function");
}

std::vector<DTensor> Task::operator()(const std::vector<DTensor>& inputs) const {
  std::vector<DTensor> moved;
  for (const DTensor& x : inputs) moved.push_back(to_mesh(x, mesh_));
  Communicator& comm = world();
  const int leader = mesh_.spec().ranks().front();
  std::vector<DTensor> outputs;
  if (mesh_.is_member()) {
    {
      const LogicalAxes scope(rules_);
      outputs = fn_(moved);
    }
    for (const DTensor& y : outputs)
      TESSERA_CHECK(y.defined() && y.layout().mesh() == mesh_.spec(), ShardingError, "task", "task '", name_,
                    "' returned ", y.defined() ? y.layout().to_string() : "(undefined)", ", not a DTensor on its mesh ",
                    mesh_.to_string());
    if (rank() == leader) {
      // Every other rank learns the outputs' layouts: a count, then each layout's length and words.
      std::vector<int64_t> message{static_cast<int64_t>(outputs.size())};
      for (const DTensor& y : outputs) {
        const std::vector<int64_t> words = detail::encode_layout(y.layout());
        message.push_back(static_cast<int64_t>(words.size()));
        message.insert(message.end(), words.begin(), words.end());
      }
      const int64_t length = static_cast<int64_t>(message.size());
      std::vector<Work> sends;
      for (int r = 0; r < world_size(); ++r) {
        if (std::count(mesh_.spec().ranks().begin(), mesh_.spec().ranks().end(), r)) continue;
        sends.push_back(comm.isend(&length, 1, DType::i64, r, kTaskTag));
        sends.push_back(comm.isend(message.data(), length, DType::i64, r, kTaskTag + 1));
      }
      for (const Work& w : sends) w.wait();
    }
    return outputs;
  }
  int64_t length = 0;
  comm.recv(&length, 1, DType::i64, leader, kTaskTag);
  std::vector<int64_t> message(static_cast<size_t>(length));
  comm.recv(message.data(), length, DType::i64, leader, kTaskTag + 1);
  size_t at = 1;
  for (int64_t k = 0; k < message.front(); ++k) {
    const auto words_length = static_cast<size_t>(message[at++]);
    const std::vector<int64_t> words(message.begin() + static_cast<std::ptrdiff_t>(at),
                                     message.begin() + static_cast<std::ptrdiff_t>(at + words_length));
    at += words_length;
    outputs.push_back(DTensor(Tensor(), mesh_, detail::decode_layout(words, mesh_.spec())));
  }
  return outputs;
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
  for (const Registered& r : patterns) known += (known.empty() ? "" : ", ") + r.pattern;
  TESSERA_CHECK(false, ShardingError, "task", "no registered pattern matches task '", name, "' (patterns: ",
                known.empty() ? "none" : known, "); call register_task(pattern, mesh) first");
  return Task(std::move(name), DeviceMesh(), std::move(fn));  // not reached
}

}  // namespace tessera::mpmd
