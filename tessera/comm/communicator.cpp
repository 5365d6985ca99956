// The choke point every communication call passes, argument validation, async calls.
#include <tessera/comm/communicator.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <sstream>

#include <tessera/comm/detail/async_queue.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/internal/thread_observers.hpp>

namespace tessera {

// --- Work and the async queue --------------------------------------------------------------------

void Work::wait() const {
  if (!state_) return;
  if (state_->wait) state_->wait();
  std::unique_lock lock(state_->mutex);
  state_->done_cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::is_completed() const {
  if (!state_) return true;
  if (state_->poll) state_->poll();
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

const Work& Work::keep_alive(std::shared_ptr<const void> owner) const {
  if (!state_) return *this;
  std::lock_guard lock(state_->mutex);
  state_->keep_alive = std::move(owner);
  return *this;
}

namespace detail {

AsyncQueue::~AsyncQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<WorkState> AsyncQueue::push(std::function<void()> body) {
  auto state = std::make_shared<WorkState>();
  {
    std::lock_guard lock(mutex_);
    tasks_.emplace_back(std::move(body), state);
    ++pending_;
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
  return state;
}

void AsyncQueue::drain() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return pending_ == 0; });
}

void AsyncQueue::loop() {
  while (true) {
    std::pair<std::function<void()>, std::shared_ptr<WorkState>> task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping with nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::exception_ptr error;
    try {
      task.first();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(task.second->mutex);
      task.second->done = true;
      task.second->error = error;
    }
    task.second->done_cv.notify_all();
    {
      std::lock_guard lock(mutex_);
      --pending_;
    }
    cv_.notify_all();
  }
}

}  // namespace detail

// --- observers, timeout ----------------------------------------------------------------------------

namespace {

thread_local std::vector<CommObserver*> observers;

std::atomic<double>& timeout_storage() {
  static std::atomic<double> seconds = [] {
    if (const char* env = std::getenv("TESSERA_TIMEOUT_S")) {
      const double v = std::atof(env);
      if (v > 0) return v;
    }
    return 300.0;
  }();
  return seconds;
}

bool tracing() {
  static const bool on = [] {
    const char* env = std::getenv("TESSERA_TRACE_COMM");
    return env && *env && std::string_view(env) != "0";
  }();
  return on;
}

int64_t total(const std::vector<int64_t>& counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

}  // namespace

void add_comm_observer(CommObserver* observer) { observers.push_back(observer); }

void remove_comm_observer(CommObserver* observer) {
  detail::remove_observer(observers, observer, "remove_comm_observer");
}

double comm_timeout_seconds() { return timeout_storage().load(); }

void set_comm_timeout_seconds(double seconds) {
  TESSERA_CHECK(seconds > 0, ValueError, "set_comm_timeout_seconds", "timeout ", seconds, " s must be positive");
  timeout_storage().store(seconds);
}

// --- Communicator ----------------------------------------------------------------------------------

Communicator::Communicator(int rank, std::vector<int> world_ranks)
    : rank_(rank), world_ranks_(std::move(world_ranks)), async_(std::make_unique<detail::AsyncQueue>()) {}

Communicator::~Communicator() = default;

std::string Communicator::to_string() const {
  std::ostringstream out;
  out << "group[";
  for (size_t i = 0; i < world_ranks_.size(); ++i) out << (i ? ", " : "") << world_ranks_[i];
  out << "] (" << backend() << ")";
  return out.str();
}

namespace {

// Reports a blocking call's wall time to the observers when it returns (or throws).
class TimedCall {
 public:
  TimedCall(const Communicator& comm, const CollectiveCall& call) : comm_(comm), call_(call), timed_(!observers.empty()) {
    if (timed_) start_ = std::chrono::steady_clock::now();
  }
  ~TimedCall() {
    if (!timed_) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    for (auto it = observers.rbegin(); it != observers.rend(); ++it) (*it)->on_done(comm_, call_, seconds);
  }
  TimedCall(const TimedCall&) = delete;
  TimedCall& operator=(const TimedCall&) = delete;

 private:
  const Communicator& comm_;
  const CollectiveCall& call_;
  bool timed_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

void Communicator::enter(CollectiveCall& call) {
  // Point-to-point calls are numbered apart: only the collectives must agree across the group.
  const bool p2p = call.kind == CollectiveKind::send || call.kind == CollectiveKind::recv;
  call.sequence = p2p ? p2p_sequence_++ : sequence_++;
  for (auto it = observers.rbegin(); it != observers.rend(); ++it) (*it)->on_call(*this, call);
  if (tracing())
    std::cerr << "[tessera] world rank " << world_ranks_[static_cast<size_t>(rank_)] << " " << to_string() << " #"
              << call.sequence << " " << call.to_string() << "\n";
}

Work Communicator::enqueue(CollectiveCall call, std::function<void(const CollectiveCall&)> body) {
  enter(call);
  // The body gets the call as numbered by enter(): a copy taken before would carry sequence 0.
  return Work(async_->push([call, body = std::move(body)] { body(call); }));
}

void Communicator::synchronize() { async_->drain(); }

namespace {

// Shared argument checks; `op` is the public name for messages.
struct Check {
  const Communicator& comm;
  const char* op;

  void count(int64_t n, const char* what = "count") const {
    TESSERA_CHECK(n >= 0, ValueError, op, "negative ", what, " ", n, " on ", comm.to_string());
  }
  void buffer(const void* p, int64_t n, const char* what) const {
    TESSERA_CHECK(p != nullptr || n == 0, ValueError, op, what, " buffer is null for ", n, " elements on ",
                  comm.to_string());
  }
  void rank_arg(int r, const char* what) const {
    TESSERA_CHECK(r >= 0 && r < comm.size(), ValueError, op, what, " ", r, " out of range for ", comm.to_string(),
                  "; expected [0, ", comm.size(), ")");
  }
  void counts(const std::vector<int64_t>& c, const char* what) const {
    TESSERA_CHECK(static_cast<int>(c.size()) == comm.size(), ValueError, op, what, " has ", c.size(),
                  " entries for ", comm.to_string(), "; expected ", comm.size());
    for (int64_t n : c) count(n, what);
  }
  void reduction(DType dtype, ReduceOp rop) const {
    TESSERA_CHECK(!(dtype == DType::b8 && rop == ReduceOp::avg), ValueError, op,
                  "avg is not defined for b8 on ", comm.to_string());
  }
};


// Validation and signature of the calls that have an async form, shared by both forms.
CollectiveCall all_reduce_call(const Communicator& comm, const char* op, const void* buf, int64_t count, DType dtype,
                               ReduceOp reduce_op) {
  const Check check{comm, op};
  check.count(count);
  check.buffer(buf, count, "data");
  check.reduction(dtype, reduce_op);
  const int64_t bytes = count * itemsize(dtype);
  const int64_t moved = comm.size() > 1 ? bytes * 2 * (comm.size() - 1) / comm.size() : 0;  // ring lower bound
  return CollectiveCall{CollectiveKind::all_reduce, dtype, count, reduce_op, -1, moved, moved};
}

CollectiveCall all_gather_call(const Communicator& comm, const char* op, const void* send, const void* recv,
                               int64_t count, DType dtype) {
  const Check check{comm, op};
  check.count(count);
  check.buffer(send, count, "send");
  check.buffer(recv, count * comm.size(), "recv");
  const int64_t bytes = count * itemsize(dtype) * (comm.size() - 1);
  return CollectiveCall{CollectiveKind::all_gather, dtype, count, ReduceOp::sum, -1, bytes, bytes};
}

CollectiveCall reduce_scatter_call(const Communicator& comm, const char* op, const void* send, const void* recv,
                                   int64_t recv_count, DType dtype, ReduceOp reduce_op) {
  const Check check{comm, op};
  check.count(recv_count, "recv_count");
  check.buffer(send, recv_count * comm.size(), "send");
  check.buffer(recv, recv_count, "recv");
  check.reduction(dtype, reduce_op);
  const int64_t bytes = recv_count * itemsize(dtype) * (comm.size() - 1);
  return CollectiveCall{CollectiveKind::reduce_scatter, dtype, recv_count * comm.size(), reduce_op, -1, bytes, bytes};
}

CollectiveCall all_to_all_v_call(const Communicator& comm, const char* op, const void* send,
                                 const std::vector<int64_t>& send_counts, const void* recv,
                                 const std::vector<int64_t>& recv_counts, DType dtype) {
  const Check check{comm, op};
  check.counts(send_counts, "send_counts");
  check.counts(recv_counts, "recv_counts");
  const int64_t sent = total(send_counts), received = total(recv_counts);
  check.buffer(send, sent, "send");
  check.buffer(recv, received, "recv");
  const auto self = static_cast<size_t>(comm.rank());
  return CollectiveCall{CollectiveKind::all_to_all_v, dtype, sent, ReduceOp::sum, -1,
                        (sent - send_counts[self]) * itemsize(dtype), (received - recv_counts[self]) * itemsize(dtype)};
}

}  // namespace

void Communicator::all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  CollectiveCall call = all_reduce_call(*this, "all_reduce", buf, count, dtype, op);
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_all_reduce(buf, count, dtype, op, call);
}

void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  CollectiveCall call = all_gather_call(*this, "all_gather", send, recv, count, dtype);
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_all_gather(send, recv, count, dtype, call);
}

void Communicator::all_gather_v(const void* send, void* recv, const std::vector<int64_t>& recv_counts, DType dtype) {
  const Check check{*this, "all_gather_v"};
  check.counts(recv_counts, "recv_counts");
  const int64_t own = recv_counts[static_cast<size_t>(rank_)], all = total(recv_counts);
  check.buffer(send, own, "send");
  check.buffer(recv, all, "recv");
  CollectiveCall call{CollectiveKind::all_gather_v, dtype, own, ReduceOp::sum, -1,
                      own * itemsize(dtype) * (size() - 1), (all - own) * itemsize(dtype)};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_all_gather_v(send, recv, recv_counts, dtype, call);
}

void Communicator::reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) {
  CollectiveCall call = reduce_scatter_call(*this, "reduce_scatter", send, recv, recv_count, dtype, op);
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_reduce_scatter(send, recv, recv_count, dtype, op, call);
}

void Communicator::reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype,
                                    ReduceOp op) {
  const Check check{*this, "reduce_scatter_v"};
  check.counts(counts, "counts");
  check.reduction(dtype, op);
  const int64_t own = counts[static_cast<size_t>(rank_)], all = total(counts);
  check.buffer(send, all, "send");
  check.buffer(recv, own, "recv");
  CollectiveCall call{CollectiveKind::reduce_scatter_v, dtype, all, op, -1, (all - own) * itemsize(dtype),
                      own * itemsize(dtype) * (size() - 1)};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_reduce_scatter_v(send, recv, counts, dtype, op, call);
}

void Communicator::all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
  const Check check{*this, "all_to_all"};
  check.count(count);
  check.buffer(send, count * size(), "send");
  check.buffer(recv, count * size(), "recv");
  const int64_t bytes = count * itemsize(dtype) * (size() - 1);
  CollectiveCall call{CollectiveKind::all_to_all, dtype, count * size(), ReduceOp::sum, -1, bytes, bytes};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_all_to_all(send, recv, count, dtype, call);
}

void Communicator::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                const std::vector<int64_t>& recv_counts, DType dtype) {
  CollectiveCall call = all_to_all_v_call(*this, "all_to_all_v", send, send_counts, recv, recv_counts, dtype);
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_all_to_all_v(send, send_counts, recv, recv_counts, dtype, call);
}

void Communicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
  const Check check{*this, "broadcast"};
  check.count(count);
  check.rank_arg(root, "root");
  check.buffer(buf, count, "data");
  const int64_t bytes = count * itemsize(dtype);
  CollectiveCall call{CollectiveKind::broadcast, dtype, count, ReduceOp::sum, root,
                      rank_ == root ? bytes * (size() - 1) : 0, rank_ == root ? 0 : bytes};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_broadcast(buf, count, dtype, root, call);
}

void Communicator::reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) {
  const Check check{*this, "reduce"};
  check.count(count);
  check.rank_arg(root, "root");
  check.reduction(dtype, op);
  check.buffer(send, count, "send");
  if (rank_ == root) check.buffer(recv, count, "recv");
  const int64_t bytes = count * itemsize(dtype);
  CollectiveCall call{CollectiveKind::reduce, dtype, count, op, root, rank_ == root ? 0 : bytes,
                      rank_ == root ? bytes * (size() - 1) : 0};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_reduce(send, recv, count, dtype, op, root, call);
}

void Communicator::gather(const void* send, void* recv, int64_t count, DType dtype, int root) {
  const Check check{*this, "gather"};
  check.count(count);
  check.rank_arg(root, "root");
  check.buffer(send, count, "send");
  if (rank_ == root) check.buffer(recv, count * size(), "recv");
  const int64_t bytes = count * itemsize(dtype);
  CollectiveCall call{CollectiveKind::gather, dtype, count, ReduceOp::sum, root, rank_ == root ? 0 : bytes,
                      rank_ == root ? bytes * (size() - 1) : 0};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_gather(send, recv, count, dtype, root, call);
}

void Communicator::scatter(const void* send, void* recv, int64_t count, DType dtype, int root) {
  const Check check{*this, "scatter"};
  check.count(count);
  check.rank_arg(root, "root");
  if (rank_ == root) check.buffer(send, count * size(), "send");
  check.buffer(recv, count, "recv");
  const int64_t bytes = count * itemsize(dtype);
  CollectiveCall call{CollectiveKind::scatter, dtype, count, ReduceOp::sum, root,
                      rank_ == root ? bytes * (size() - 1) : 0, rank_ == root ? 0 : bytes};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_scatter(send, recv, count, dtype, root, call);
}

Work Communicator::post_p2p(const char* op, bool is_send, void* buf, int64_t count, DType dtype, int peer, int tag,
                            CollectiveCall* numbered) {
  const Check check{*this, op};
  check.count(count);
  check.rank_arg(peer, "peer");
  check.buffer(buf, count, "data");
  TESSERA_CHECK(peer != rank_, ValueError, op, "rank ", rank_, is_send ? " sends to itself" : " receives from itself",
                " on ", to_string());
  TESSERA_CHECK(tag >= 0 && tag < kMaxP2pTag, ValueError, op, "tag ", tag, " out of range on ", to_string(),
                "; expected [0, ", kMaxP2pTag, ")");
  const int64_t bytes = count * itemsize(dtype);
  CollectiveCall call{is_send ? CollectiveKind::send : CollectiveKind::recv, dtype, count, ReduceOp::sum, peer,
                      is_send ? bytes : 0, is_send ? 0 : bytes};
  enter(call);
  if (numbered) *numbered = call;
  return Work(is_send ? do_isend(buf, count, dtype, peer, tag, call) : do_irecv(buf, count, dtype, peer, tag, call));
}

Work Communicator::isend(const void* buf, int64_t count, DType dtype, int peer, int tag) {
  return post_p2p("isend", true, const_cast<void*>(buf), count, dtype, peer, tag);
}

Work Communicator::irecv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  return post_p2p("irecv", false, buf, count, dtype, peer, tag);
}

void Communicator::send(const void* buf, int64_t count, DType dtype, int peer, int tag) {
  synchronize();
  CollectiveCall call;
  const Work work = post_p2p("send", true, const_cast<void*>(buf), count, dtype, peer, tag, &call);
  const TimedCall timed(*this, call);
  work.wait();
}

void Communicator::recv(void* buf, int64_t count, DType dtype, int peer, int tag) {
  synchronize();
  CollectiveCall call;
  const Work work = post_p2p("recv", false, buf, count, dtype, peer, tag, &call);
  const TimedCall timed(*this, call);
  work.wait();
}

void Communicator::sendrecv(const void* send, int64_t send_count, int dest, void* recv, int64_t recv_count,
                            int source, DType dtype, int tag) {
  TESSERA_CHECK(dest >= -1 && source >= -1, ValueError, "sendrecv", "dest ", dest, " / source ", source,
                " out of range for ", to_string(), "; -1 means none");
  synchronize();
  // Both sides posted before either waits: a ring of sendrecv calls never deadlocks.
  const Work receiving = source >= 0 ? post_p2p("sendrecv", false, recv, recv_count, dtype, source, tag) : Work();
  const Work sending =
      dest >= 0 ? post_p2p("sendrecv", true, const_cast<void*>(send), send_count, dtype, dest, tag) : Work();
  // Wait for both even if one fails, so no buffer is left in use; the first error wins.
  std::exception_ptr failure;
  for (const Work* w : {&receiving, &sending}) {
    try {
      w->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void Communicator::abort(const std::string& reason) { do_abort(reason); }

void Communicator::barrier() {
  CollectiveCall call{CollectiveKind::barrier};
  synchronize();
  enter(call);
  const TimedCall timed(*this, call);
  do_barrier(call);
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  CollectiveCall call{CollectiveKind::split};
  synchronize();
  enter(call);
  return do_split(color, key, call);
}

Work Communicator::all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  const CollectiveCall call = all_reduce_call(*this, "all_reduce_async", buf, count, dtype, op);
  return enqueue(call, [=, this](const CollectiveCall& numbered) { do_all_reduce(buf, count, dtype, op, numbered); });
}

Work Communicator::all_gather_async(const void* send, void* recv, int64_t count, DType dtype) {
  const CollectiveCall call = all_gather_call(*this, "all_gather_async", send, recv, count, dtype);
  return enqueue(call, [=, this](const CollectiveCall& numbered) { do_all_gather(send, recv, count, dtype, numbered); });
}

Work Communicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) {
  const CollectiveCall call = reduce_scatter_call(*this, "reduce_scatter_async", send, recv, recv_count, dtype, op);
  return enqueue(call, [=, this](const CollectiveCall& numbered) {
    do_reduce_scatter(send, recv, recv_count, dtype, op, numbered);
  });
}

Work Communicator::all_to_all_v_async(const void* send, std::vector<int64_t> send_counts, void* recv,
                                      std::vector<int64_t> recv_counts, DType dtype) {
  const CollectiveCall call =
      all_to_all_v_call(*this, "all_to_all_v_async", send, send_counts, recv, recv_counts, dtype);
  return enqueue(call, [=, this, sc = std::move(send_counts),
                        rc = std::move(recv_counts)](const CollectiveCall& numbered) {
    do_all_to_all_v(send, sc, recv, rc, dtype, numbered);
  });
}

// --- even forms through the uneven ones ----------------------------------------------------------

void Communicator::do_all_gather(const void* send, void* recv, int64_t count, DType dtype, const CollectiveCall& call) {
  do_all_gather_v(send, recv, std::vector<int64_t>(static_cast<size_t>(size()), count), dtype, call);
}

void Communicator::do_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                     const CollectiveCall& call) {
  do_reduce_scatter_v(send, recv, std::vector<int64_t>(static_cast<size_t>(size()), count), dtype, op, call);
}

void Communicator::do_all_to_all(const void* send, void* recv, int64_t count, DType dtype, const CollectiveCall& call) {
  const std::vector<int64_t> counts(static_cast<size_t>(size()), count);
  do_all_to_all_v(send, counts, recv, counts, dtype, call);
}

}  // namespace tessera
