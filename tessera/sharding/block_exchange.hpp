#pragma once
// Direct block exchange (the planner's second family of plans): every destination block is assembled from
// the source blocks that overlap it, each piece taken from one rank that holds it. Pure. The
// redistribute planner costs it against per-mesh-dim collective plans; the dtensor layer runs
// it as one all_to_all_v.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

/// One box of the global tensor moving from the rank that holds it to a rank that needs it
/// (src_rank == dst_rank: a local copy). Ranks are world ranks. Value type.
/// Example: `rank 1 -> rank 2: [0:4, 3:6]`.
struct Transfer {
  int src_rank = 0;
  int dst_rank = 0;
  Block block;
  std::string to_string() const;
  friend bool operator==(const Transfer&, const Transfer&) = default;
};

/// The pieces `world_rank` sends and receives to turn `src` into `dst` (same global shape;
/// meshes may differ but ranks are world ranks of one world), self copies included. Each
/// destination rank takes what it already holds locally and every other overlapping piece from
/// exactly one holder: among the replicas of a block, the one at index (destination rank mod
/// replicas), so the sends spread and both sides compute the same pieces on their own. Costs
/// what the rank moves (the pieces overlapping its blocks), not the rank count. Throws
/// ShardingError if the shapes differ, if src holds Partial values (they need a reduction, not a
/// copy) or if dst is Partial.
std::vector<Transfer> exchange_transfers(const Layout& src, const Layout& dst, int world_rank);

/// Every rank's transfers: what each destination rank receives (exchange_transfers), for tests
/// and plan explanations. O(ranks).
std::vector<Transfer> direct_exchange(const Layout& src, const Layout& dst);

/// Bytes `world_rank` must receive to hold its block of dst: the part of its destination block
/// that its source block does not already contain (0 for a rank outside dst's mesh). The lower
/// bound of every plan for non-Partial sources.
int64_t receive_lower_bound(const Layout& src, const Layout& dst, int world_rank);

}  // namespace tessera
