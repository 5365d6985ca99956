// A remote function on a worker: the user's SPMD code on this worker's DTensors, then the
// agreement of the mesh's workers on how the call went.
//
// User code may throw on every worker alike, or on some while the others wait for them in one
// of its collectives. What one worker sees is not enough to tell which, and the workers of a mesh
// must decide alike whether they go on using the stream's communicators of the mesh (otherwise
// the next collective desyncs). So after every call they agree, on the stream's agreement copy
// of the mesh (no user code runs on it): one small all_reduce; after a failure a few more. Then:
// - a call that failed on any worker has failed results on every worker (the worker's own
//   error, or the first failing worker's), so ops reading them fail alike without running and
//   no worker waits in a collective for one that skips it; values not computed from them are
//   untouched (Monarch's failure propagation);
// - the communicators are aborted only when a collective was cut short: a failure came out of a
//   communication call, the workers' calls on a line of the mesh do not pair up (counted while
//   the user's code ran: collectives per communicator, messages per peer), or a failed worker
//   still misses peers at the agreement after the desync grace period (TESSERA_DESYNC_GRACE_S,
//   default 1 s): they wait in a collective for it, and only the abort releases them (a peer
//   merely that much slower is released too, as if it had been waiting).
#include <tessera/controller/detail/worker.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include <tessera/comm/communicator.hpp>
#include <tessera/controller/detail/op_rows.hpp>
#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller::detail {

namespace {

// The calls of this thread on one communicator.
struct CommCalls {
  int64_t collectives = 0;
  std::map<int, int64_t> sent, received;  // point-to-point messages, by the peer's world rank
};

// Communicators by their sorted world ranks: the mesh's line of those ranks, whichever of its
// communicators was used (a dim's, a span's, a flatten()'s).
using CallsByRanks = std::map<std::vector<int>, CommCalls>;

// Counts the calling thread's communication calls while it lives.
class CallCounter final : public CommObserver {
 public:
  CallCounter() { add_comm_observer(this); }
  ~CallCounter() override { remove_comm_observer(this); }
  CallCounter(const CallCounter&) = delete;
  CallCounter& operator=(const CallCounter&) = delete;

  void on_call(const Communicator& comm, const CollectiveCall& call) override {
    std::vector<int> ranks = comm.world_ranks();
    std::sort(ranks.begin(), ranks.end());
    CommCalls& calls = calls_[std::move(ranks)];
    if (call.kind == CollectiveKind::send) ++calls.sent[comm.world_ranks().at(static_cast<size_t>(call.root))];
    else if (call.kind == CollectiveKind::recv) ++calls.received[comm.world_ranks().at(static_cast<size_t>(call.root))];
    else ++calls.collectives;
  }
  CallsByRanks take() { return std::move(calls_); }

 private:
  CallsByRanks calls_;
};

double grace_seconds() {
  double grace = 1.0;
  if (const char* text = std::getenv("TESSERA_DESYNC_GRACE_S")) {
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end != text && value > 0) grace = value;
  }
  return std::min(grace, comm_timeout_seconds() / 2);
}

// 40 bits of a mix of (a, b, c): summed over up to 2^23 workers without overflowing an int64.
int64_t digest(int64_t a, int64_t b, int64_t c) {
  uint64_t x = static_cast<uint64_t>(a) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(b) * 0xc2b2ae3d27d4eb4full ^
               static_cast<uint64_t>(c) * 0x165667b19e3779f9ull;
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 27, x *= 0x94d049bb133111ebull, x ^= x >> 31;
  return static_cast<int64_t>(x >> 24);
}

// The sets of mesh dims whose lines (the ranks that differ from a worker only there) a worker
// communicates on: every set of dims of size above 1 (a dim of size 1 adds no rank).
std::vector<std::vector<int64_t>> line_dims(const MeshSpec& spec) {
  std::vector<int64_t> wide;
  for (int64_t d = 0; d < spec.ndim(); ++d)
    if (spec.size(d) > 1) wide.push_back(d);
  std::vector<std::vector<int64_t>> sets;
  for (uint64_t mask = 1; mask < (uint64_t{1} << wide.size()); ++mask) {
    sets.emplace_back();
    for (size_t k = 0; k < wide.size(); ++k)
      if (mask >> k & 1) sets.back().push_back(wide[k]);
  }
  return sets;
}

// The line through `rank` along `dims`, sorted.
std::vector<int> line(const MeshSpec& spec, int rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> c = spec.coordinate_of(rank);
  int64_t points = 1;
  for (int64_t d : dims) points *= spec.size(d);
  std::vector<int> ranks;
  for (int64_t flat = 0; flat < points; ++flat) {
    int64_t rest = flat;
    for (size_t k = dims.size(); k-- > 0;) {
      c[static_cast<size_t>(dims[k])] = rest % spec.size(dims[k]);
      rest /= spec.size(dims[k]);
    }
    ranks.push_back(spec.rank_at(c));
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

// Whether this worker's calls pair up with its peers' on every line: collectives as many as
// each peer's, and messages as many as each peer took. One all_reduce per line, on the
// agreement copy's communicator of that line (every worker joins its lines in the same order):
// the line's members sum digests of their collective counts (equal to size times this worker's
// digest when all counts are equal) and of their (sender, receiver, count) messages, once as
// sent and once as received (equal when every message sent was received).
bool calls_pair_up(const DeviceMesh& agreement, const CallsByRanks& calls) {
  const MeshSpec& spec = agreement.spec();
  const int me = rank();
  bool paired = true;
  for (const std::vector<int64_t>& dims : line_dims(spec)) {
    const std::vector<int> members = line(spec, me, dims);
    const auto it = calls.find(members);
    std::array<int64_t, 3> sums{digest(0, 0, it == calls.end() ? 0 : it->second.collectives), 0, 0};
    if (it != calls.end()) {
      for (const auto& [peer, count] : it->second.sent) sums[1] += digest(me, peer, count);
      for (const auto& [peer, count] : it->second.received) sums[2] += digest(peer, me, count);
    }
    const int64_t mine = sums[0];
    agreement.comm_ptr(dims)->all_reduce(sums.data(), 3, DType::i64, ReduceOp::sum);
    paired = paired && sums[0] == static_cast<int64_t>(members.size()) * mine && sums[1] == sums[2];
  }
  return paired;
}

// The agreement after a remote call on `copies` (see the top of the file). Returns the error of
// this worker's results: its own, the first failing worker's, or "" when the call failed nowhere.
std::string agree(const CallRemote& c, const StreamMesh& copies, const std::string& own_error, bool comm_failed,
                  const CallsByRanks& calls) {
  const DeviceMesh& mesh = copies.working;
  const bool failed = !own_error.empty();
  bool aborted = false;
  const auto abort_once = [&](const std::string& reason) {
    if (!aborted) mesh.abort(reason);
    aborted = true;
  };
  if (comm_failed) abort_once(own_error);  // cut short already: peers still waiting are released now
  if (mesh.spec().size() == 1) return own_error;
  std::vector<int64_t> all_dims(static_cast<size_t>(mesh.spec().ndim()));
  for (size_t d = 0; d < all_dims.size(); ++d) all_dims[d] = static_cast<int64_t>(d);
  Communicator& comm = *copies.agreement.comm_ptr(all_dims);  // over the mesh's workers
  try {
    // Whether the call failed anywhere, and where first (as n - group rank, under max).
    std::array<int64_t, 3> round{failed, comm_failed || aborted, failed ? comm.size() - comm.rank() : 0};
    const Work reduced = comm.all_reduce_async(round.data(), 3, DType::i64, ReduceOp::max);
    if (failed && !aborted) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds());
      while (!reduced.is_completed() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!reduced.is_completed()) abort_once(own_error);
    }
    reduced.wait();
    if (round[0] == 0) return {};
    const bool paired = calls_pair_up(copies.agreement, calls);
    // Whether anything was cut short (an abort since, calls that do not pair up), and the first
    // failing worker's message, cut to a record.
    std::array<int64_t, 1> verdict{round[1] != 0 || aborted || !paired};
    comm.all_reduce(verdict.data(), 1, DType::i64, ReduceOp::max);
    constexpr size_t kRecord = 1024;
    std::vector<uint8_t> record(kRecord, 0);
    std::memcpy(record.data(), own_error.data(), std::min(own_error.size(), kRecord - 1));
    comm.broadcast(record.data(), static_cast<int64_t>(kRecord), DType::u8, static_cast<int>(comm.size() - round[2]));
    const std::string error = failed ? own_error : std::string(reinterpret_cast<const char*>(record.data()));
    if (verdict[0] != 0) abort_once(error);
    return error;
  } catch (const std::exception& e) {
    // A worker never reached the agreement: nothing is known of the mesh's communicators.
    const std::string error =
        failed ? own_error
               : worker_error("[remote " + c.function + "] the workers' agreement after the call failed: " + e.what());
    abort_once(error);
    return error;
  }
}

// "mesh[dp=2] on workers [1, 2]": the workers tell two slices of one shape apart.
std::string on_workers(const MeshSpec& spec) {
  std::string text = spec.to_string();
  text = text.substr(0, text.find(" ranks")) + " on workers [";
  for (size_t i = 0; i < spec.ranks().size(); ++i) text.append(i ? ", " : "").append(std::to_string(spec.ranks()[i]));
  return text + "]";
}

// The results' checks: as many as the call expects, each on the call's mesh (as mpmd::task's).
void check_results(const CallRemote& c, const DeviceMesh& mesh, const std::vector<DTensor>& results) {
  const std::string call = "remote " + c.function;
  TESSERA_CHECK(results.size() == c.outputs.size(), ValueError, call, "returned ", results.size(),
                " tensors; the call expects ", c.outputs.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const DTensor& y = results[i];
    TESSERA_CHECK(y.defined(), ValueError, call, "result ", i, " is an undefined DTensor");
    TESSERA_CHECK(y.layout().mesh() == mesh.spec(), ShardingError, call, "result ", i, " (",
                  y.layout().global_shape().to_string(), ") lives on ", on_workers(y.layout().mesh()),
                  ", not on the call's mesh ", on_workers(mesh.spec()),
                  "; return DTensors on the mesh the function runs on (redistribute or to_mesh them there)");
    // The controller told everyone the layout its propagation gave: a result must have it.
    if (i < c.expected_layouts.size() && layout_words(y.layout()) != c.expected_layouts[i])
      TESSERA_CHECK(false, ShardingError, call, "result ", i, " is ", y.layout().to_string(),
                    " but the propagation function said ",
                    WordReader(c.expected_layouts[i], call).layout(mesh.spec()).to_string(),
                    "; the controller already handed out that layout, so the call fails");
  }
}

}  // namespace

void run_remote(const CallRemote& c, WorkerShared& shared, const StreamMeshes& meshes) {
  const StreamMesh& copies = meshes.at(c.mesh);
  const DeviceMesh& mesh = copies.working;
  std::vector<DTensor> inputs;
  std::string error = shared.gather(c.inputs, c.stream, "remote " + c.function, meshes, inputs);
  std::vector<DTensor> results;
  bool comm_failed = false;
  CallsByRanks calls;
  if (error.empty()) {
    CallCounter counter;
    try {
      const RemoteFn* function = find_remote(c.function);
      TESSERA_CHECK(function != nullptr, ValueError, "remote " + c.function, "not registered in this worker's process",
                    " (register_remote it before controller::run, in every process)");
      results = (*function)(mesh, inputs);
      check_results(c, mesh, results);
    } catch (const CommError& e) {
      error = worker_error(e.what());
      comm_failed = true;
    } catch (const std::exception& e) {
      error = worker_error(e.what());
    } catch (...) {
      error = worker_error("[remote " + c.function + "] threw a non-standard exception");
    }
    calls = counter.take();
  }
  error = agree(c, copies, error, comm_failed, calls);
  const bool reporter = mesh.spec().ranks().front() == rank();
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    shared.store(c.outputs[i], error.empty() ? Value{results[i], {}, c.stream, c.mesh} : Value{{}, error, c.stream, c.mesh});
    if (!reporter || i >= c.layout_requests.size()) continue;  // workers in other processes report when asked
    if (error.empty())
      shared.replies.layout(c.layout_requests[i], results[i].layout());
    else
      shared.replies.error(c.layout_requests[i], error);
  }
}

}  // namespace tessera::controller::detail
