#pragma once
// The closed set of communication calls and the signature each call carries, used for
// counting (CommDebugMode), tracing and the desync check.
#include <cstdint>
#include <string>
#include <string_view>

#include <tessera/core/export.hpp>
#include <tessera/core/dtype.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera TESSERA_API {

#define TESSERA_FORALL_COLLECTIVES(_) \
  _(all_reduce)                       \
  _(all_gather)                       \
  _(all_gather_v)                     \
  _(reduce_scatter)                   \
  _(reduce_scatter_v)                 \
  _(all_to_all)                       \
  _(all_to_all_v)                     \
  _(broadcast)                        \
  _(reduce)                           \
  _(gather)                           \
  _(scatter)                          \
  _(send)                             \
  _(recv)                             \
  _(barrier)                          \
  _(split)

/// Kind of a communication call.
enum class CollectiveKind : uint8_t {
#define TESSERA_COLLECTIVE_ENUM(name) name,
  TESSERA_FORALL_COLLECTIVES(TESSERA_COLLECTIVE_ENUM)
#undef TESSERA_COLLECTIVE_ENUM
};
inline constexpr int kNumCollectiveKinds = 15;

std::string_view name(CollectiveKind kind);

/// What one rank passes to one call: every rank of the group must pass an equal signature
/// (for the _v forms `count` is this rank's total and is not compared). Value type.
/// Example: `all_reduce(f32, count=1024, op=sum)`.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::barrier;
  DType dtype = DType::u8;
  int64_t count = 0;         ///< elements this rank contributes (send side)
  ReduceOp op = ReduceOp::sum;
  int root = -1;             ///< root rank (broadcast/reduce/gather/scatter) or peer (send/recv), else -1
  int64_t bytes_sent = 0;    ///< bytes this rank sends to other ranks (the algorithm-independent minimum)
  int64_t bytes_received = 0;  ///< bytes this rank receives from other ranks
  uint64_t sequence = 0;     ///< per-communicator number of the collective (send/recv counted apart), from 0

  /// True when two ranks' calls can meet in one collective.
  bool matches(const CollectiveCall& other) const;
  /// A hash of exactly what matches() compares: equal for calls that match (the MPI backend
  /// carries it in its messages' tags, so calls that cannot meet never exchange data).
  uint64_t signature_hash() const;
  std::string to_string() const;
};

}  // namespace tessera
