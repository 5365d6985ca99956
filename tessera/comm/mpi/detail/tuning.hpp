#pragma once
// Knobs of the MPI backend and its choice of algorithm per call: MPI's own collective or
// Tessera's point-to-point algorithms. Pure (no MPI): built with and without MPI, so the tests
// of the choice link in every configuration. Internal: not installed; exported (TESSERA_API)
// only so the backend's tests and the tuning benchmark can set and observe the choice.
#include <cstdint>
#include <string_view>

#include <tessera/comm/collective.hpp>
#include <tessera/core/export.hpp>

namespace tessera::mpi::detail {

/// How the MPI backend runs one collective.
enum class Algorithm : uint8_t {
  local,     ///< group of one: nothing moves between ranks
  library,   ///< MPI's own (non-blocking) collective
  ring,      ///< Tessera's pipelined ring over point-to-point (reduce-scatter, all-gather)
  pairwise,  ///< Tessera's direct point-to-point exchange (all_to_all_v, gather/scatter, reduce)
  tree,      ///< Tessera's log-depth point-to-point algorithm (recursive-doubling all_reduce,
             ///< binomial broadcast, dissemination barrier): small messages
};

/// "local", "library", "ring", "pairwise".
TESSERA_API std::string_view name(Algorithm algorithm);

/// The knobs, read once from the environment; tests override them with set_tuning (on every
/// rank alike: the choice must agree across the group).
struct Tuning {
  /// Largest element count of one MPI message or library call (MPI counts are int). Larger
  /// buffers are split; buffers whose counts or displacements exceed it leave the library
  /// collectives for Tessera's point-to-point algorithms. TESSERA_MPI_MAX_MESSAGE_ELEMENTS.
  int64_t max_message_elements = int64_t{1} << 30;
  /// Bytes per pipelined chunk of the ring algorithms. TESSERA_MPI_PIPELINE_BYTES. (Measured:
  /// 1 MiB; at 64 KiB per-message costs of MPI's rendezvous protocol halve the bandwidth.)
  int64_t pipeline_bytes = 1024 * 1024;
  /// Smallest message (bytes of the whole buffer) that uses Tessera's ring / pairwise
  /// algorithm instead of MPI's collective. TESSERA_MPI_RING_MIN_BYTES sets all four;
  /// TESSERA_MPI_RING_MIN_BYTES_ALL_REDUCE etc. set one.
  int64_t ring_min_bytes_all_reduce = 0;
  int64_t ring_min_bytes_reduce_scatter = 0;
  int64_t ring_min_bytes_all_gather = 0;
  int64_t ring_min_bytes_all_to_all = 0;
  /// Use MPI's own collectives where they are faster (the thresholds above; topology-aware
  /// or offloaded collectives on a cluster). Off by default: MPI's collectives match calls by
  /// order alone, so a rank calling another kind, dtype, count or op can complete with wrong
  /// data; Tessera's own algorithms carry the call's signature in every message's tag, so such
  /// a rank waits and the side channel names the mismatch. TESSERA_MPI_LIBRARY_COLLECTIVES=1.
  bool library_collectives = false;
  /// Without library collectives: below this many bytes (the whole buffer) all_gather(_v) and
  /// reduce_scatter(_v) send every block straight to its rank (one round of messages) instead
  /// of the ring's n-1 steps. TESSERA_MPI_PAIRWISE_MAX_BYTES.
  int64_t pairwise_max_bytes = 64 * 1024;
  /// One extra small collective per call compares every rank's signature (desync detection).
  /// TESSERA_DEBUG_COLLECTIVES=1.
  bool debug_collectives = false;
  /// Seconds a wait may see no progress before this rank reports the call it waits in on the
  /// group's side channel and reads the others' reports (desync diagnosis; at most half the
  /// timeout). TESSERA_DESYNC_GRACE_S.
  double desync_grace_seconds = 1.0;
};

/// The defaults (measured, see tuning.cpp) with the environment's overrides applied.
TESSERA_API Tuning default_tuning();
/// The knobs in force (a copy; thread-safe).
TESSERA_API Tuning tuning();
/// Replaces the knobs. Throws ValueError if a size is not positive.
TESSERA_API void set_tuning(const Tuning& tuning);

/// Pure: the algorithm for a call of `kind` on a group of `group_size` ranks moving `bytes`
/// (the whole buffer: all_reduce's buffer, reduce_scatter's send, all_gather's recv,
/// all_to_all's send) whose MPI library call would need counts or displacements up to
/// `library_elements`. Every rank of a group computes the same choice from the same inputs.
TESSERA_API Algorithm choose_algorithm(CollectiveKind kind, int64_t bytes, int64_t library_elements, int group_size,
                           const Tuning& tuning);

/// Testing aid: the algorithm of the most recent collective of this process.
TESSERA_API Algorithm last_algorithm();
TESSERA_API void note_algorithm(Algorithm algorithm);

}  // namespace tessera::mpi::detail
