#include <tessera/comm/mpi/detail/mpi_impl.hpp>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mpi/detail/tuning.hpp>
#include <tessera/core/error.hpp>

namespace tessera::mpi::detail {

std::atomic<bool> serialize_calls{false};
std::atomic<bool> oversubscribed{false};
std::atomic<int> tag_upper_bound{32767};

std::mutex& call_mutex() {
  static std::mutex mutex;
  return mutex;
}

MPI_Datatype transfer_type(DType dtype) {
  return visit(dtype, []<class T>(TypeTag<T>) -> MPI_Datatype {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else if constexpr (std::is_same_v<T, int32_t>) return MPI_INT32_T;
    else if constexpr (std::is_same_v<T, int64_t>) return MPI_INT64_T;
    else if constexpr (std::is_same_v<T, uint8_t>) return MPI_UINT8_T;
    else if constexpr (std::is_same_v<T, bool>) return MPI_C_BOOL;
    else {
      static_assert(sizeof(T) == 2, "the 16-bit floats travel as 16-bit integers");
      return MPI_UINT16_T;
    }
  });
}

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

// --- the side channel ------------------------------------------------------------------------------

namespace {

constexpr int kReportTag = 1;

int error_class(int code) {
  int c = code;
  MPI_Error_class(code, &c);
  return c;
}

}  // namespace

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out.append(i ? ", " : "").append(std::to_string(ranks[i]));
  return out + "]";
}

Report Report::waiting(const CollectiveCall& call, uint64_t counts_hash) {
  Report r;
  r.counts_hash = counts_hash;
  r.p2p = call.kind == CollectiveKind::send || call.kind == CollectiveKind::recv;
  r.kind = static_cast<int64_t>(call.kind);
  r.dtype = static_cast<int64_t>(call.dtype);
  r.count = call.count;
  r.op = static_cast<int64_t>(call.op);
  r.root = call.root;
  r.sequence = static_cast<int64_t>(call.sequence);
  return r;
}

Report Report::failure(const CollectiveCall& call, const std::string& why) {
  Report r = waiting(call);
  r.failed = 1;
  const size_t n = std::min(why.size(), sizeof(r.reason) - 1);
  std::memcpy(r.reason, why.data(), n);
  r.reason[n] = '\0';
  return r;
}

Report Report::end_of_program() {
  Report r;
  r.ended = 1;
  return r;
}

CollectiveCall Report::call() const {
  // Clamped: a report is only read for messages, never trusted to index anything.
  CollectiveCall c;
  c.kind = static_cast<CollectiveKind>(std::clamp<int64_t>(kind, 0, kNumCollectiveKinds - 1));
  c.dtype = static_cast<DType>(std::clamp<int64_t>(dtype, 0, kNumDTypes - 1));
  c.count = count;
  c.op = static_cast<ReduceOp>(std::clamp<int64_t>(op, 0, static_cast<int64_t>(ReduceOp::min)));
  c.root = static_cast<int>(root);
  c.sequence = static_cast<uint64_t>(sequence);
  return c;
}

void SideChannel::open(MPI_Comm comm, int rank, int size) {
  comm_ = comm;
  rank_ = rank;
  latest_.resize(static_cast<size_t>(size));
}

void SideChannel::close() {
  std::lock_guard lock(mutex_);
  if (comm_ == MPI_COMM_NULL) return;
  for (InFlight& f : in_flight_) {
    for (MPI_Request& r : f.requests)
      if (r != MPI_REQUEST_NULL) locked([&] { return MPI_Request_free(&r); });
    (void)f.report.release();  // the sends may still read it
  }
  in_flight_.clear();
  locked([&] { return MPI_Comm_free(&comm_); });
  comm_ = MPI_COMM_NULL;
}

void SideChannel::post(const Report& report) {
  std::lock_guard lock(mutex_);
  if (comm_ == MPI_COMM_NULL) return;
  InFlight f{std::make_unique<Report>(report), {}};
  for (int p = 0; p < static_cast<int>(latest_.size()); ++p) {
    if (p == rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    // A failed send is not worth another error: the report only improves a message.
    if (locked([&] { return MPI_Isend(f.report.get(), sizeof(Report), MPI_BYTE, p, kReportTag, comm_, &request); }) ==
        MPI_SUCCESS)
      f.requests.push_back(request);
  }
  in_flight_.push_back(std::move(f));
}

void SideChannel::drain() {
  std::lock_guard lock(mutex_);
  if (comm_ == MPI_COMM_NULL) return;
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (locked([&] { return MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, comm_, &arrived, &status); }) != MPI_SUCCESS ||
        !arrived)
      break;
    auto report = std::make_unique<Report>();
    if (locked([&] {
          return MPI_Recv(report.get(), sizeof(Report), MPI_BYTE, status.MPI_SOURCE, kReportTag, comm_,
                          MPI_STATUS_IGNORE);
        }) != MPI_SUCCESS)
      break;
    auto& slot = latest_[static_cast<size_t>(status.MPI_SOURCE)];
    report->reason[sizeof(report->reason) - 1] = '\0';
    if (!slot || (!slot->failed && !slot->ended)) slot = std::move(report);  // a failure or an end sticks
  }
  // Let go of the sends that completed.
  std::erase_if(in_flight_, [](InFlight& f) {
    int done = 0;
    locked([&] {
      return MPI_Testall(static_cast<int>(f.requests.size()), f.requests.data(), &done, MPI_STATUSES_IGNORE);
    });
    return done != 0;
  });
}

const Report* SideChannel::latest(int group_rank) const {
  std::lock_guard lock(mutex_);
  return latest_.empty() ? nullptr : latest_[static_cast<size_t>(group_rank)].get();
}

// --- group state -------------------------------------------------------------------------------------

void GroupState::fail(const std::string& why, const CollectiveCall& call, bool tell_peers) {
  bool first = false;
  {
    std::lock_guard lock(mutex);
    first = !broken.load();
    if (first) reason = why;
    broken.store(true, std::memory_order_release);
  }
  if (first && tell_peers) side.post(Report::failure(call, why));
}

void GroupState::check_usable(const CollectiveCall& call) {
  if (!broken.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex);
  throw CommError(tessera::detail::concat("[", name(call.kind), "] ", description,
                                          " failed earlier and cannot be used: ", reason));
}

Op::Op(MPI_Comm comm, int rank, const std::vector<int>& world_ranks, const CollectiveCall& call, GroupState& group,
       uint64_t counts_hash)
    : comm_(comm), rank_(rank), world_ranks_(world_ranks), call_(call), group_(group), counts_hash_(counts_hash) {
  constexpr int kSequenceBits = 12, kSignatureBits = 18;
  const auto sequence = static_cast<int>(call.sequence % (uint64_t{1} << kSequenceBits));
  if (tag_upper_bound.load(std::memory_order_relaxed) >= (1 << (kSequenceBits + kSignatureBits)) - 1) {
    const uint64_t signature = (call.signature_hash() ^ (counts_hash * 0x9e3779b97f4a7c15ull)) >> 20;
    tag_ = static_cast<int>(signature % (uint64_t{1} << kSignatureBits)) << kSequenceBits | sequence;
  } else {
    tag_ = static_cast<int>(call.sequence % 32768);
  }
}

void Op::check(int rc, const char* function) const {
  if (rc != MPI_SUCCESS) [[unlikely]]
    fail(tessera::detail::concat(function, " failed in ", call_.to_string(), " #", call_.sequence, ": ",
                                 error_string(rc)));
}

void Op::fail(const std::string& what) const {
  const std::string reason = tessera::detail::concat(what, " on ", group_.description);
  group_.fail(reason, call_);
  throw CommError(tessera::detail::concat("[", name(call_.kind), "] ", reason));
}

bool Op::test(MPI_Request& request) {
  int done = 0;
  check(locked([&] { return MPI_Test(&request, &done, MPI_STATUS_IGNORE); }), "MPI_Test");
  return done != 0;
}

PollBackoff::PollBackoff() : spin_limit_(oversubscribed.load(std::memory_order_relaxed) ? 0 : 2000) {}

bool PollBackoff::spin() {
  if (spun_out()) return false;
  ++spins_;
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
  return true;
}

void PollBackoff::rest() const {
  if (idle() < kYieldPhase)
    sched_yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void Op::wait(MPI_Request* requests, int n, PendingText pending, MPI_Status* statuses) {
  // Polls, paced by a PollBackoff. Past the grace period (no progress for that long) the rank
  // reports the call it waits in on the side channel and reads the others' reports every few
  // milliseconds (diagnose).
  int remaining = 0;
  for (int i = 0; i < n; ++i) remaining += requests[i] != MPI_REQUEST_NULL;
  std::vector<int> indices;
  std::vector<MPI_Status> completed_statuses;
  PollBackoff backoff;
  while (remaining > 0) {
    int completed = 0;
    if (n == 1) {
      int done = 0;
      const int rc = locked([&] { return MPI_Test(requests, &done, statuses ? statuses : MPI_STATUS_IGNORE); });
      if (rc != MPI_SUCCESS && statuses && error_class(rc) == MPI_ERR_TRUNCATE) truncated(statuses[0]);
      check(rc, "MPI_Test");
      completed = done;
    } else {
      indices.resize(static_cast<size_t>(n));
      if (statuses) {
        completed_statuses.resize(static_cast<size_t>(n));
        const int rc =
            locked([&] { return MPI_Testsome(n, requests, &completed, indices.data(), completed_statuses.data()); });
        if (rc == MPI_ERR_IN_STATUS)
          for (int k = 0; k < completed; ++k)
            if (error_class(completed_statuses[static_cast<size_t>(k)].MPI_ERROR) == MPI_ERR_TRUNCATE)
              truncated(completed_statuses[static_cast<size_t>(k)]);
        check(rc, "MPI_Testsome");
        if (completed != MPI_UNDEFINED)
          for (int k = 0; k < completed; ++k)
            statuses[indices[static_cast<size_t>(k)]] = completed_statuses[static_cast<size_t>(k)];
      } else {
        check(locked([&] { return MPI_Testsome(n, requests, &completed, indices.data(), MPI_STATUSES_IGNORE); }),
              "MPI_Testsome");
      }
      if (completed == MPI_UNDEFINED) completed = remaining;
    }
    if (completed > 0) {
      remaining -= completed;
      backoff.progressed();
      continue;
    }
    if (backoff.spin()) continue;
    check_idle(backoff.idle(), [&] {
      std::vector<int> unfinished;
      for (int i = 0; i < n; ++i)
        if (requests[i] != MPI_REQUEST_NULL) unfinished.push_back(i);
      return pending(unfinished);
    });
    backoff.rest();
  }
}

void Op::check_idle(std::chrono::steady_clock::duration idle, const std::function<std::string()>& missing_text) {
  using Clock = std::chrono::steady_clock;
  const auto timeout = std::chrono::duration<double>(comm_timeout_seconds());
  if (idle >= timeout) {
    std::string missing = missing_text();
    if (missing.empty()) missing = arrivals();
    // Left posted: MPI cannot cancel a collective, and the group is unusable from here on.
    const std::string reason = tessera::detail::concat("timeout after ", comm_timeout_seconds(), " s in ",
                                                       call_.to_string(), " #", call_.sequence, " on ",
                                                       group_.description, ": ", missing);
    group_.fail(reason, call_);
    throw CommError(tessera::detail::concat("[", name(call_.kind), "] ", reason));
  }
  if (idle < PollBackoff::kYieldPhase || !group_.side.is_open()) return;
  if (grace_.count() < 0) grace_ = std::chrono::duration<double>(std::min(tuning().desync_grace_seconds, timeout.count() / 2));
  if (idle < grace_) return;
  if (!reported_) group_.side.post(Report::waiting(call_, counts_hash_)), reported_ = true;
  const auto now = Clock::now();
  if (now - last_look_ >= std::chrono::milliseconds(10)) last_look_ = now, diagnose();
}

void Op::truncated(const MPI_Status& status) const {
  fail(tessera::detail::concat("world rank ", world_rank(status.MPI_SOURCE), " sent more than world rank ",
                               world_rank(rank_), " expects in ", call_.to_string(), " #", call_.sequence,
                               " (the ranks disagree on the counts)"));
}

void Op::diagnose() {
  group_.side.drain();
  using tessera::detail::concat;
  // A peer in a collective of this sequence number that cannot meet this one: a desync, named
  // as the threads backend names it (the lower group rank's call first), on both ranks alike.
  if (!is_p2p()) {
    for (int p = 0; p < size(); ++p) {
      const Report* r = group_.side.latest(p);
      if (p == rank_ || !r || r->failed || r->ended || r->p2p || r->sequence != static_cast<int64_t>(call_.sequence))
        continue;
      const CollectiveCall theirs = r->call();
      const bool same_counts = r->counts_hash == counts_hash_;
      if (theirs.matches(call_) && same_counts) continue;
      const bool mine_first = rank_ < p;
      const CollectiveCall& first = mine_first ? call_ : theirs;
      const CollectiveCall& second = mine_first ? theirs : call_;
      const std::string reason =
          concat("collective mismatch on ", group_.description, ": world rank ", world_rank(std::min(rank_, p)),
                 " called ", first.to_string(), " #", first.sequence, ", world rank ", world_rank(std::max(rank_, p)),
                 " called ", second.to_string(), " #", second.sequence,
                 theirs.matches(call_) ? " (the ranks pass different counts)" : "");
      group_.fail(reason, call_);
      throw CommError(concat("[", name(call_.kind), "] ", reason));
    }
  }
  // A peer that ended its program, or whose call on this group failed: this call cannot complete.
  for (int p = 0; p < size(); ++p) {
    const Report* r = group_.side.latest(p);
    if (p == rank_ || !r || !(r->failed || r->ended)) continue;
    if (r->ended) {
      const std::string reason = concat("world rank ", world_rank(p), " ended its program while world rank ",
                                        world_rank(rank_), " waits in ", call_.to_string(), " #", call_.sequence,
                                        " on ", group_.description);
      group_.fail(reason, call_);
      throw CommError(concat("[", name(call_.kind), "] ", reason));
    }
    const std::string reason = concat(call_.to_string(), " #", call_.sequence, " on ", group_.description,
                                      " cannot complete: world rank ", world_rank(p), " failed: ", r->reason);
    group_.fail(reason, call_, /*tell_peers=*/false);
    throw CommError(concat("[", name(call_.kind), "] ", reason));
  }
}

std::string Op::arrivals() {
  group_.side.drain();
  std::vector<int> waiting, absent;
  std::string last_heard;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    const Report* r = group_.side.latest(p);
    if (r && !r->failed && !r->ended && (r->p2p != 0) == is_p2p() &&
        r->sequence == static_cast<int64_t>(call_.sequence)) {
      waiting.push_back(world_rank(p));
      continue;
    }
    absent.push_back(world_rank(p));
    if (r && r->ended)
      last_heard += tessera::detail::concat("; world rank ", world_rank(p), " ended its program");
    else if (r && !r->failed)
      last_heard += tessera::detail::concat("; world rank ", world_rank(p), " was last seen waiting in ",
                                            r->call().to_string(), " #", r->sequence);
  }
  if (absent.empty()) return "every rank of the group waited in this call";
  std::string text = tessera::detail::concat("world ranks ", join_ranks(absent), " did not arrive");
  if (!waiting.empty()) text += tessera::detail::concat(" (world ranks ", join_ranks(waiting), " waited in it)");
  return text + last_heard;
}

void Op::isend(const void* buf, int64_t count, MPI_Datatype type, int peer, int tag, MPI_Request& request) {
  TESSERA_ASSERT(count >= 0 && count <= INT_MAX, "message of ", count, " elements");
  check(locked([&] { return MPI_Isend(buf, static_cast<int>(count), type, peer, tag, comm_, &request); }), "MPI_Isend");
}

void Op::irecv(void* buf, int64_t count, MPI_Datatype type, int peer, int tag, MPI_Request& request) {
  TESSERA_ASSERT(count >= 0 && count <= INT_MAX, "message of ", count, " elements");
  check(locked([&] { return MPI_Irecv(buf, static_cast<int>(count), type, peer, tag, comm_, &request); }), "MPI_Irecv");
}

}  // namespace tessera::mpi::detail
