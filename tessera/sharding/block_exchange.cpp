#include <tessera/sharding/block_exchange.hpp>

#include <algorithm>
#include <map>

#include <tessera/core/error.hpp>

namespace tessera {

std::string Transfer::to_string() const {
  return "rank " + std::to_string(src_rank) + " -> rank " + std::to_string(dst_rank) + ": " + block.to_string();
}

namespace {

void check_exchangeable(const Layout& src, const Layout& dst, const char* op) {
  TESSERA_CHECK(src.global_shape() == dst.global_shape(), ShardingError, op, "global shapes differ: ",
                src.to_string(), " -> ", dst.to_string());
  TESSERA_CHECK(!src.has_partial(), ShardingError, op, "source ", src.to_string(),
                " holds Partial values, which need a reduction, not a block exchange");
  TESSERA_CHECK(!dst.has_partial(), ShardingError, op, "destination ", dst.to_string(),
                " is Partial; a redistribution cannot produce Partial values");
}

// Ranks of src grouped by the block they hold (replicas share one group), in mesh order.
std::vector<std::pair<Block, std::vector<int>>> holder_groups(const Layout& src) {
  std::vector<std::pair<Block, std::vector<int>>> groups;
  for (int r : src.mesh().ranks()) {
    const Block b = src.block_of_rank(r);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == b; });
    if (it == groups.end()) groups.push_back({b, {r}});
    else it->second.push_back(r);
  }
  return groups;
}

}  // namespace

std::vector<Transfer> direct_exchange(const Layout& src, const Layout& dst) {
  check_exchangeable(src, dst, "direct_exchange");
  const auto groups = holder_groups(src);
  std::map<int, int64_t> load;  // elements each rank sends so far
  std::vector<Transfer> transfers;
  for (int d : dst.mesh().ranks()) {
    const Block want = dst.block_of_rank(d);
    if (want.numel() == 0) continue;
    for (const auto& [held, holders] : groups) {
      const Block piece = held.intersect(want);
      if (piece.numel() == 0) continue;
      // The destination itself if it holds the piece, else the least loaded replica (ties
      // rotate with the destination rank), which keeps every rank's sends near the average.
      int from = d;
      if (std::find(holders.begin(), holders.end(), d) == holders.end()) {
        const size_t n = holders.size();
        from = holders[static_cast<size_t>(d) % n];
        for (size_t i = 0; i < n; ++i) {
          const int candidate = holders[(static_cast<size_t>(d) + i) % n];
          if (load[candidate] < load[from]) from = candidate;
        }
        load[from] += piece.numel();
      }
      transfers.push_back(Transfer{from, d, piece});
    }
  }
  return transfers;
}

int64_t receive_lower_bound(const Layout& src, const Layout& dst, int world_rank) {
  check_exchangeable(src, dst, "receive_lower_bound");
  if (!dst.mesh().contains(world_rank)) return 0;
  const Block want = dst.block_of_rank(world_rank);
  int64_t held = 0;
  if (src.mesh().contains(world_rank)) held = src.block_of_rank(world_rank).intersect(want).numel();
  return (want.numel() - held) * itemsize(dst.dtype());
}

}  // namespace tessera
