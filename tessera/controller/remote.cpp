// Monarch's remote(fn, propagate=): a remote function's handle, and how the controller knows its
// results' layouts at the call (a propagation function, or the layouts kept from a first call
// with the same inputs' layouts) instead of asking a worker.
#include <tessera/controller/controller.hpp>

#include <map>
#include <mutex>
#include <optional>

#include <tessera/controller/detail/state.hpp>
#include <tessera/core/error.hpp>
#include <tessera/sharding/layout.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller {

// Results' layouts by (mesh, result count, the inputs' layouts), as Monarch's cache is keyed by
// the inputs' shapes and pattern.
struct Remote::Cache {
  std::mutex mutex;
  std::map<std::vector<int64_t>, std::vector<Layout>> layouts;
  int64_t hits = 0, misses = 0;
};

namespace {

std::vector<Layout> layouts_of(const std::vector<RemoteTensor>& inputs) {
  std::vector<Layout> out;
  out.reserve(inputs.size());
  for (const RemoteTensor& t : inputs) out.push_back(t.layout());
  return out;
}

std::vector<int64_t> cache_key(const WorkerMesh& mesh, int64_t outputs, const std::vector<Layout>& inputs) {
  std::vector<int64_t> key{mesh.id(), outputs, static_cast<int64_t>(inputs.size())};
  for (const Layout& l : inputs) {
    const std::vector<int64_t> words = layout_words(l);
    key.push_back(static_cast<int64_t>(words.size()));
    key.insert(key.end(), words.begin(), words.end());
  }
  return key;
}

}  // namespace

std::vector<RemoteTensor> Remote::call(const WorkerMesh& mesh, const std::vector<RemoteTensor>& inputs,
                                       int64_t outputs) const {
  const std::string what = "remote " + name_;
  if (propagate_) {
    const std::vector<Layout> given = propagate_(layouts_of(inputs));
    TESSERA_CHECK(static_cast<int64_t>(given.size()) == outputs, ValueError, what, "the propagation function gave ",
                  given.size(), " layouts; the call expects ", outputs, " results");
    for (size_t i = 0; i < given.size(); ++i)
      TESSERA_CHECK(given[i].mesh() == mesh.spec(), ShardingError, what, "the propagation function gave result ", i,
                    " the layout ", given[i].to_string(), ", not one on the call's mesh ", mesh.to_string());
    return detail::issue_remote(what.c_str(), name_, mesh, inputs, outputs, &given);
  }
  if (!cache_) return detail::issue_remote(what.c_str(), name_, mesh, inputs, outputs, nullptr);
  const std::vector<int64_t> key = cache_key(mesh, outputs, layouts_of(inputs));
  std::optional<std::vector<Layout>> kept;
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    const auto it = cache_->layouts.find(key);
    if (it != cache_->layouts.end()) kept = it->second;
    ++(kept ? cache_->hits : cache_->misses);
  }
  if (kept) return detail::issue_remote(what.c_str(), name_, mesh, inputs, outputs, &*kept);
  // The first call with these inputs: the workers report the layouts, which are kept. A failed
  // call keeps nothing (its results carry the error); the next call asks again.
  std::vector<RemoteTensor> results = detail::issue_remote(what.c_str(), name_, mesh, inputs, outputs, nullptr);
  std::vector<Layout> reported;
  try {
    for (const RemoteTensor& r : results) reported.push_back(r.layout());
  } catch (const Error&) {
    return results;
  }
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->layouts.emplace(key, std::move(reported));
  return results;
}

const char* Remote::propagation() const { return propagate_ ? "function" : cache_ ? "cached" : "none"; }

int64_t Remote::cache_hits() const {
  if (!cache_) return 0;
  std::lock_guard<std::mutex> lock(cache_->mutex);
  return cache_->hits;
}

int64_t Remote::cache_misses() const {
  if (!cache_) return 0;
  std::lock_guard<std::mutex> lock(cache_->mutex);
  return cache_->misses;
}

Remote remote(const std::string& name, RemoteFunction fn) {
  register_remote(name, std::move(fn));
  return Remote(name);
}

Remote remote(const std::string& name, RemoteFunction fn, Propagator propagate) {
  TESSERA_CHECK(static_cast<bool>(propagate), ValueError, "remote", "'", name, "': an empty propagation function");
  register_remote(name, std::move(fn));
  Remote out(name);
  out.propagate_ = std::move(propagate);
  return out;
}

Remote remote(const std::string& name, RemoteFunction fn, const std::string& propagate) {
  TESSERA_CHECK(propagate == "cached", ValueError, "remote", "'", name, "': propagate = '", propagate,
                "'; Tessera's controller takes \"cached\" or a propagation function (Monarch's \"mocked\" and "
                "\"inspect\" run the function on the controller, which holds no data here)");
  register_remote(name, std::move(fn));
  Remote out(name);
  out.cache_ = std::make_shared<Remote::Cache>();
  return out;
}

}  // namespace tessera::controller
