#include <tessera/comm/mpi/detail/p2p.hpp>

#include <algorithm>
#include <utility>

#include <tessera/comm/detail/async_queue.hpp>
#include <tessera/comm/mpi/detail/tuning.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>

namespace tessera::mpi::detail {

using tessera::detail::concat;

namespace {

// The three tags of user tag t (see the header): t < 2^28 keeps 3t + 2 below 2^31.
int header_tag(int tag) { return 3 * tag; }
int data_tag(int tag) { return 3 * tag + 1; }
int answer_tag(int tag) { return 3 * tag + 2; }

std::string_view dtype_name(int64_t index) {
  return index >= 0 && index < kNumDTypes ? name(static_cast<DType>(index)) : std::string_view("?");
}

}  // namespace

struct P2pEngine::Request {
  Request(bool is_send_, void* data_, int64_t count_, DType dtype_, int peer_, int tag_, const CollectiveCall& call,
          MPI_Comm comm, int rank, const std::vector<int>& world_ranks, GroupState& group)
      : is_send(is_send_), data(data_), count(count_), dtype(dtype_), peer(peer_), tag(tag_),
        op(comm, rank, world_ranks, call, group), state(std::make_shared<tessera::detail::WorkState>()) {}

  bool is_send;
  void* data;
  int64_t count;
  DType dtype;
  int peer, tag;
  Op op;
  std::shared_ptr<tessera::detail::WorkState> state;
  int64_t header[2] = {-1, -1};       // send: ours; recv: the sender's (count, dtype)
  int64_t answer[3] = {-1, -1, -1};   // the receiver's (mismatch, count, dtype)
  MPI_Request header_request = MPI_REQUEST_NULL;
  bool header_in = false;             // recv: the header arrived and the data receives are posted
  std::vector<MPI_Request> requests;  // everything else in flight
  std::vector<std::byte> discard;     // recv on a mismatch: the sender's data lands here
  std::string mismatch;               // recv: set when the header disagrees
  bool finished = false;

  bool in_flight() const {
    if (header_request != MPI_REQUEST_NULL) return true;
    return std::any_of(requests.begin(), requests.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  }
};

P2pEngine::P2pEngine(MPI_Comm comm, int rank, std::vector<int> world_ranks, GroupState& group)
    : comm_(comm), rank_(rank), world_ranks_(std::move(world_ranks)), group_(group),
      max_message_(tuning().max_message_elements) {}

P2pEngine::~P2pEngine() {
  std::lock_guard lock(mutex_);
  if (pending_.empty()) return;
  fail_all_locked(std::make_exception_ptr(
      CommError(concat("[recv] ", group_.description, " was destroyed with its transfer pending"))));
  // MPI may still write their headers and answers: their memory stays.
  new std::vector<std::shared_ptr<Request>>(std::move(leaked_));
}

int P2pEngine::max_tag() { return std::min(kMaxP2pTag, (tag_upper_bound.load() - 2) / 3 + 1) - 1; }

namespace {

// Posts a transfer of count elements in pieces MPI's int counts can carry.
void post_pieces(Op& op, bool send, void* base, int64_t count, DType dtype, int peer, int tag, int64_t max_message,
                 std::vector<MPI_Request>& out) {
  const MPI_Datatype type = transfer_type(dtype);
  auto* bytes = static_cast<std::byte*>(base);
  for (int64_t offset = 0; offset < count; offset += max_message) {
    const int64_t n = std::min(max_message, count - offset);
    out.push_back(MPI_REQUEST_NULL);
    void* piece = bytes + offset * itemsize(dtype);
    if (send) op.isend(piece, n, type, peer, tag, out.back());
    else op.irecv(piece, n, type, peer, tag, out.back());
  }
}

}  // namespace

std::shared_ptr<tessera::detail::WorkState> P2pEngine::post(bool is_send, void* data, int64_t count, DType dtype,
                                                             int peer, int tag, const CollectiveCall& call) {
  group_.check_usable(call);
  auto request = std::make_shared<Request>(is_send, data, count, dtype, peer, tag, call, comm_, rank_, world_ranks_,
                                           group_);
  Request& r = *request;
  std::weak_ptr<P2pEngine> engine = weak_from_this();
  std::weak_ptr<Request> weak = request;
  r.state->wait = [engine, weak] {
    const auto e = engine.lock();
    const auto req = weak.lock();
    if (e && req) e->wait(*req);
  };
  r.state->poll = [engine, weak] {
    const auto e = engine.lock();
    const auto req = weak.lock();
    if (e && req) e->poll(*req);
  };
  std::lock_guard lock(mutex_);
  if (is_send) {
    r.header[0] = count;
    r.header[1] = static_cast<int64_t>(dtype);
    r.op.irecv(r.answer, 3, MPI_INT64_T, peer, answer_tag(tag), r.requests.emplace_back(MPI_REQUEST_NULL));
    r.op.isend(r.header, 2, MPI_INT64_T, peer, header_tag(tag), r.header_request);
    post_pieces(r.op, true, data, count, dtype, peer, data_tag(tag), max_message_, r.requests);
  } else {
    r.op.irecv(r.header, 2, MPI_INT64_T, peer, header_tag(tag), r.header_request);
  }
  pending_.push_back(std::move(request));
  return pending_.back()->state;
}

bool P2pEngine::progress_locked() {
  bool moved = false;
  // (peer, tag) of receives still waiting for their header: a later receive on the same pair
  // must not post its data receives first (they would take the earlier transfer's data).
  std::vector<std::pair<int, int>> waiting_header;
  for (const auto& request : pending_) {
    Request& r = *request;
    if (!r.is_send && !r.header_in) {
      const std::pair key{r.peer, r.tag};
      if (std::find(waiting_header.begin(), waiting_header.end(), key) != waiting_header.end()) continue;
      if (!r.op.test(r.header_request)) {
        waiting_header.push_back(key);
        continue;
      }
      r.header_in = moved = true;
      const int64_t sent_count = r.header[0], sent_dtype = r.header[1];
      const bool match = sent_count == r.count && sent_dtype == static_cast<int64_t>(r.dtype);
      r.answer[0] = match ? 0 : 1;
      r.answer[1] = r.count;
      r.answer[2] = static_cast<int64_t>(r.dtype);
      r.op.isend(r.answer, 3, MPI_INT64_T, r.peer, answer_tag(r.tag), r.requests.emplace_back(MPI_REQUEST_NULL));
      void* target = r.data;
      DType wire = r.dtype;
      if (!match) {
        wire = sent_dtype >= 0 && sent_dtype < kNumDTypes ? static_cast<DType>(sent_dtype) : DType::u8;
        r.discard.resize(static_cast<size_t>(std::max<int64_t>(sent_count, 0) * itemsize(wire)));
        target = r.discard.data();
        r.mismatch = concat("send/recv mismatch on ", group_.description, ": rank ", r.peer, " sent ", sent_count, " ",
                            dtype_name(sent_dtype), ", rank ", rank_, " expects ", r.count, " ", name(r.dtype),
                            " (tag ", r.tag, ")");
      }
      post_pieces(r.op, false, target, match ? r.count : std::max<int64_t>(sent_count, 0), wire, r.peer,
                  data_tag(r.tag), max_message_, r.requests);
    }
    if (r.header_request != MPI_REQUEST_NULL && r.op.test(r.header_request)) moved = true;
    for (MPI_Request& q : r.requests)
      if (q != MPI_REQUEST_NULL && r.op.test(q)) moved = true;
    if (r.in_flight()) continue;
    r.finished = moved = true;
    std::string error = r.mismatch;
    if (r.is_send && r.answer[0] != 0)
      error = concat("send/recv mismatch on ", group_.description, ": rank ", rank_, " sent ", r.count, " ",
                     name(r.dtype), ", rank ", r.peer, " expects ", r.answer[1], " ", dtype_name(r.answer[2]),
                     " (tag ", r.tag, ")");
    r.state->finish(error.empty() ? nullptr
                                  : std::make_exception_ptr(CommError(concat(r.is_send ? "[send] " : "[recv] ", error))));
  }
  std::erase_if(pending_, [](const std::shared_ptr<Request>& r) { return r->finished; });
  return moved;
}

void P2pEngine::wait(Request& r) {
  PollBackoff backoff;
  std::unique_lock lock(mutex_);
  while (!r.finished) {
    bool moved = false;
    try {
      moved = progress_locked();
      if (r.finished) return;
      if (!moved && backoff.spun_out())
        r.op.check_idle(backoff.idle(), [&] {
          return concat(r.is_send ? "no matching recv on rank " : "no matching send from rank ", r.peer);
        });
    } catch (...) {  // the group failed: every pending transfer fails with it
      fail_all_locked(std::current_exception());
      throw;
    }
    if (moved) {
      backoff.progressed();
    } else if (!backoff.spin()) {
      // Let other threads post (or wait) meanwhile.
      lock.unlock();
      backoff.rest();
      lock.lock();
    }
  }
}

void P2pEngine::poll(Request& r) {
  std::lock_guard lock(mutex_);
  if (r.finished) return;
  try {
    progress_locked();
  } catch (...) {  // the states carry the error; is_completed never throws
    fail_all_locked(std::current_exception());
  }
}

void P2pEngine::fail_all_locked(std::exception_ptr error) {
  for (const auto& r : pending_) {
    if (r->finished) continue;
    r->finished = true;
    r->state->finish(error);
    leaked_.push_back(r);
  }
  pending_.clear();
}

}  // namespace tessera::mpi::detail
