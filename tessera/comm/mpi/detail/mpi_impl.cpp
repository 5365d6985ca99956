#include <tessera/comm/mpi/detail/mpi_impl.hpp>

#include <sched.h>

#include <chrono>
#include <climits>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>

namespace tessera::mpi::detail {

std::atomic<bool> serialize_calls{false};
std::atomic<bool> oversubscribed{false};

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

void GroupState::fail(const std::string& why) {
  std::lock_guard lock(mutex);
  if (!broken.load()) reason = why;
  broken.store(true, std::memory_order_release);
}

void GroupState::check_usable(const CollectiveCall& call) {
  if (!broken.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex);
  throw CommError(tessera::detail::concat("[", name(call.kind), "] ", description,
                                          " failed earlier and cannot be used: ", reason));
}

Op::Op(MPI_Comm comm, int rank, const std::vector<int>& world_ranks, const CollectiveCall& call, GroupState& group)
    : comm_(comm), rank_(rank), world_ranks_(world_ranks), call_(call), group_(group) {}

void Op::check(int rc, const char* function) const {
  if (rc != MPI_SUCCESS) [[unlikely]]
    fail(tessera::detail::concat(function, " failed in ", call_.to_string(), " #", call_.sequence, ": ",
                                 error_string(rc)));
}

void Op::fail(const std::string& what) const {
  const std::string reason = tessera::detail::concat(what, " on ", group_.description);
  group_.fail(reason);
  throw CommError(tessera::detail::concat("[", name(call_.kind), "] ", reason));
}

bool Op::test(MPI_Request& request) {
  int done = 0;
  check(locked([&] { return MPI_Test(&request, &done, MPI_STATUS_IGNORE); }), "MPI_Test");
  return done != 0;
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

void Op::wait(MPI_Request* requests, int n, PendingText pending) {
  using Clock = std::chrono::steady_clock;
  // MPI progresses only inside MPI calls (the receiver of a large shared-memory message copies
  // it in MPI_Test), so polling is the wait. Spin while a message is likely imminent, then
  // yield the core (ranks may outnumber cores), then sleep briefly so a rank that waits
  // seconds for a slow peer does not burn a core.
  const int spin_limit = oversubscribed.load(std::memory_order_relaxed) ? 0 : 2000;
  constexpr auto yield_phase = std::chrono::milliseconds(20);
  const auto timeout = std::chrono::duration<double>(comm_timeout_seconds());
  int remaining = 0;
  for (int i = 0; i < n; ++i) remaining += requests[i] != MPI_REQUEST_NULL;
  std::vector<int> indices;
  auto last_progress = Clock::now();
  int spins = 0;
  while (remaining > 0) {
    int completed = 0;
    if (n == 1) {
      int done = 0;
      check(locked([&] { return MPI_Test(requests, &done, MPI_STATUS_IGNORE); }), "MPI_Test");
      completed = done;
    } else {
      indices.resize(static_cast<size_t>(n));
      check(locked([&] { return MPI_Testsome(n, requests, &completed, indices.data(), MPI_STATUSES_IGNORE); }),
            "MPI_Testsome");
      if (completed == MPI_UNDEFINED) completed = remaining;
    }
    if (completed > 0) {
      remaining -= completed;
      spins = 0;
      last_progress = Clock::now();
      continue;
    }
    if (spins < spin_limit) {
      ++spins;
      cpu_relax();
      continue;
    }
    const auto now = Clock::now();
    const auto idle = now - last_progress;
    if (idle >= timeout) {
      std::vector<int> unfinished;
      for (int i = 0; i < n; ++i)
        if (requests[i] != MPI_REQUEST_NULL) unfinished.push_back(i);
      // Left posted: MPI cannot cancel a collective, and the group is unusable from here on.
      const std::string reason =
          tessera::detail::concat("timeout after ", comm_timeout_seconds(), " s in ", call_.to_string(), " #",
                                  call_.sequence, " on ", group_.description, ": ", pending(unfinished));
      group_.fail(reason);
      throw CommError(tessera::detail::concat("[", name(call_.kind), "] ", reason));
    }
    if (idle < yield_phase) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
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
