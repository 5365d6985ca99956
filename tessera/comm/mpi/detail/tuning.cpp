#include <tessera/comm/mpi/detail/tuning.hpp>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>

#include <tessera/core/error.hpp>

namespace tessera::mpi::detail {

namespace {

// Where Tessera's ring beats OpenMPI 4.1's own non-blocking collectives (ob1 + vader with CMA
// single copy), measured on the 2-vCPU development VM with 2 and 4 (oversubscribed) ranks, f32,
// 16 KiB .. 64 MiB, medians of 5-15 interleaved repetitions (the VM is shared and noisy: runs
// differ by up to 2x, ratios within a run are stable). Milliseconds, np=2 / np=4:
//   all_reduce      64K: MPI_Iallreduce 0.030/0.18  ring 0.039/0.37   256K: 0.20/0.37 vs 0.12/0.49
//                   1M: 0.68/0.94 vs 0.41/1.11   16M: 10.4/17.7 vs 4.9/12.4   64M: 68/89 vs 21/50
//   reduce_scatter  16K: MPI_Ireduce_scatter 0.009/0.048 ring 0.005/0.071   64K: 0.033/0.13 vs 0.019/0.14
//                   1M: 0.38/0.87 vs 0.25/0.93   16M: 13.8/31.7 vs 2.8/12.3   64M: 55/99 vs 15/36
//   all_gather      MPI_Iallgatherv is as fast as the ring or faster at every size (it is a
//                   ring itself, with one message per step): the ring only serves counts beyond
//                   one MPI call (and all_reduce's second half)
//   all_to_all      MPI_Ialltoall vs pairwise: 256K 0.048/0.19 vs 0.092/0.22; from 1M on within
//                   noise of each other (MPI's is pairwise too): pairwise only beyond one MPI call
// The all_reduce / reduce_scatter thresholds sit where the ring starts winning on 2 ranks; on 4
// oversubscribed ranks the library is up to ~20% faster between them and 4 MiB.
constexpr int64_t kRingMinBytesAllReduce = 256 * 1024;
constexpr int64_t kRingMinBytesReduceScatter = 64 * 1024;
constexpr int64_t kRingMinBytesAllGather = std::numeric_limits<int64_t>::max();
constexpr int64_t kRingMinBytesAllToAll = std::numeric_limits<int64_t>::max();

std::mutex& tuning_mutex() {
  static std::mutex mutex;
  return mutex;
}

Tuning& current() {
  static Tuning tuning = default_tuning();
  return tuning;
}

std::atomic<Algorithm>& last() {
  static std::atomic<Algorithm> algorithm{Algorithm::local};
  return algorithm;
}

// A positive integer from the environment, or `fallback`. Throws ValueError on junk: a typo
// in a tuning variable should not silently fall back.
int64_t env_bytes(const char* variable, int64_t fallback) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  TESSERA_CHECK(end && *end == '\0' && value > 0, ValueError, "mpi", variable, "='", text,
                "' is not a positive integer");
  return value;
}

double env_seconds(const char* variable, double fallback) {
  const char* text = std::getenv(variable);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  TESSERA_CHECK(end && *end == '\0' && value > 0, ValueError, "mpi", variable, "='", text,
                "' is not a positive number of seconds");
  return value;
}

bool env_flag(const char* variable) {
  const char* text = std::getenv(variable);
  return text && *text && std::string(text) != "0";
}

}  // namespace

std::string_view name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::local:
      return "local";
    case Algorithm::library:
      return "library";
    case Algorithm::ring:
      return "ring";
    case Algorithm::pairwise:
      return "pairwise";
    case Algorithm::tree:
      return "tree";
  }
  return "?";
}

Tuning default_tuning() {
  Tuning t;
  t.max_message_elements = env_bytes("TESSERA_MPI_MAX_MESSAGE_ELEMENTS", t.max_message_elements);
  t.pipeline_bytes = env_bytes("TESSERA_MPI_PIPELINE_BYTES", t.pipeline_bytes);
  const int64_t all = env_bytes("TESSERA_MPI_RING_MIN_BYTES", -1);
  const auto pick = [&](const char* variable, int64_t measured) {
    return env_bytes(variable, all > 0 ? all : measured);
  };
  t.ring_min_bytes_all_reduce = pick("TESSERA_MPI_RING_MIN_BYTES_ALL_REDUCE", kRingMinBytesAllReduce);
  t.ring_min_bytes_reduce_scatter = pick("TESSERA_MPI_RING_MIN_BYTES_REDUCE_SCATTER", kRingMinBytesReduceScatter);
  t.ring_min_bytes_all_gather = pick("TESSERA_MPI_RING_MIN_BYTES_ALL_GATHER", kRingMinBytesAllGather);
  t.ring_min_bytes_all_to_all = pick("TESSERA_MPI_RING_MIN_BYTES_ALL_TO_ALL", kRingMinBytesAllToAll);
  t.debug_collectives = env_flag("TESSERA_DEBUG_COLLECTIVES");
  t.library_collectives = env_flag("TESSERA_MPI_LIBRARY_COLLECTIVES");
  t.pairwise_max_bytes = env_bytes("TESSERA_MPI_PAIRWISE_MAX_BYTES", t.pairwise_max_bytes);
  t.desync_grace_seconds = env_seconds("TESSERA_DESYNC_GRACE_S", t.desync_grace_seconds);
  return t;
}

Tuning tuning() {
  std::lock_guard lock(tuning_mutex());
  return current();
}

void set_tuning(const Tuning& tuning) {
  TESSERA_CHECK(tuning.max_message_elements > 0 && tuning.max_message_elements <= (int64_t{1} << 30), ValueError,
                "mpi::set_tuning", "max_message_elements ", tuning.max_message_elements, " out of range; expected [1, 2^30]");
  TESSERA_CHECK(tuning.pipeline_bytes > 0, ValueError, "mpi::set_tuning", "pipeline_bytes ", tuning.pipeline_bytes,
                " must be positive");
  TESSERA_CHECK(tuning.desync_grace_seconds > 0, ValueError, "mpi::set_tuning", "desync_grace_seconds ",
                tuning.desync_grace_seconds, " must be positive");
  std::lock_guard lock(tuning_mutex());
  current() = tuning;
}

Algorithm choose_algorithm(CollectiveKind kind, int64_t bytes, int64_t library_elements, int group_size,
                           const Tuning& t) {
  if (group_size <= 1) return Algorithm::local;
  if (!t.library_collectives) {  // Tessera's own algorithms only: every message carries the signature
    switch (kind) {
      case CollectiveKind::all_reduce:
        return bytes >= t.ring_min_bytes_all_reduce ? Algorithm::ring : Algorithm::tree;
      case CollectiveKind::reduce_scatter:
      case CollectiveKind::reduce_scatter_v:
      case CollectiveKind::all_gather:
      case CollectiveKind::all_gather_v:
        return bytes < t.pairwise_max_bytes ? Algorithm::pairwise : Algorithm::ring;
      case CollectiveKind::broadcast:
      case CollectiveKind::barrier:
        return Algorithm::tree;
      case CollectiveKind::split:  // MPI_Comm_split itself: only the (color, key) table moves first
        return Algorithm::library;
      default:  // all_to_all(_v), gather, scatter, reduce, send, recv
        return Algorithm::pairwise;
    }
  }
  const bool fits = library_elements <= t.max_message_elements;  // MPI's int counts and displacements
  switch (kind) {
    case CollectiveKind::all_reduce:  // the library path splits the buffer, so it always fits
      return bytes >= t.ring_min_bytes_all_reduce ? Algorithm::ring : Algorithm::library;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::reduce_scatter_v:
      return fits && bytes < t.ring_min_bytes_reduce_scatter ? Algorithm::library : Algorithm::ring;
    case CollectiveKind::all_gather:
    case CollectiveKind::all_gather_v:
      return fits && bytes < t.ring_min_bytes_all_gather ? Algorithm::library : Algorithm::ring;
    case CollectiveKind::all_to_all:
      return fits && bytes < t.ring_min_bytes_all_to_all ? Algorithm::library : Algorithm::pairwise;
    case CollectiveKind::all_to_all_v:  // each rank knows only its own counts: one algorithm for all
    case CollectiveKind::send:
    case CollectiveKind::recv:
      return Algorithm::pairwise;
    case CollectiveKind::gather:
    case CollectiveKind::scatter:
      return fits ? Algorithm::library : Algorithm::pairwise;
    case CollectiveKind::broadcast:  // split into chunks that fit
    case CollectiveKind::reduce:
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      return Algorithm::library;
  }
  return Algorithm::library;
}

Algorithm last_algorithm() { return last().load(); }
void note_algorithm(Algorithm algorithm) { last().store(algorithm); }

}  // namespace tessera::mpi::detail
