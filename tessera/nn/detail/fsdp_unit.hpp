#pragma once
// An FSDP unit (what one fully_shard call groups, FSDP2's FSDPParamGroup): parameters stored
// sharded, all-gathered together in one collective when forward first uses one of them
// (foreach_all_gather), their gradients reduce-scattered together in backward. A unit gathered
// after another on the same mesh in one forward is prefetched by it in the next forward
// (foreach_all_gather_async): its all_gather runs while the earlier unit computes.
#include <cstdint>
#include <memory>
#include <vector>

#include <tessera/dtensor/ops.hpp>

namespace tessera::nn::detail {

class FsdpUnit : public std::enable_shared_from_this<FsdpUnit> {
 public:
  /// Adds a parameter: `storage` is the module's slot (stable address), `compute` its layout in forward.
  size_t add(DTensor* storage, Layout compute);
  /// Parameter `index` in its compute layout. The first use gathers the whole unit; each gathered
  /// value serves one use, so a unit is gathered again for every forward (and for a second use of
  /// one parameter within a forward), and never serves values older than a parameter write.
  DTensor take(size_t index);
  /// Drops the gathered values (FSDP2's reshard): the next use gathers again.
  void reshard();

 private:
  std::vector<DTensor> storage_values() const;
  void gather();
  void prefetch();

  std::vector<DTensor*> storage_;
  std::vector<Layout> compute_;
  std::vector<DTensor> gathered_;  // empty: nothing gathered
  std::vector<bool> taken_;
  uint64_t generation_ = 0;
  bool recorded_ = false;  // gathered with autograd recording
  // The unit gathered next in the last forward (same mesh), and this unit's prefetch in flight.
  std::weak_ptr<FsdpUnit> next_;
  PendingGather prefetched_;
  uint64_t prefetched_generation_ = 0;
  bool prefetched_recorded_ = false;
};

/// A number that changes whenever this rank's parameters are written by nn (optimizer steps,
/// load_state_dict, layout changes): gathered values from before are stale.
uint64_t parameter_generation();
void parameters_written();

}  // namespace tessera::nn::detail
