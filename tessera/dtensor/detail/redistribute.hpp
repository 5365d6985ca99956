#pragma once
// Runs redistribute plans (sharding/plan.hpp) on local blocks. Internal to the dtensor layer.
#include <functional>
#include <string_view>
#include <vector>

#include <tessera/comm/work.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera::detail {

/// This rank's block of plan.dst from its block of plan.src (`local`; an empty tensor on a rank
/// outside src's mesh). `src_mesh`/`dst_mesh` are the handles of the plan's meshes. Every rank
/// of both meshes calls it with the same plan.
Tensor run_plan(const Plan& plan, const Tensor& local, const DeviceMesh& src_mesh, const DeviceMesh& dst_mesh);

/// A run_plan in flight: `work` completes the last collective; `finish` (after work.wait())
/// unpacks and returns the block. The buffers live in `finish`'s captures.
struct PendingLocal {
  Work work;
  std::function<Tensor()> finish;
};

/// run_plan with its last step issued asynchronously (the steps before it run at the call, each
/// needing the previous one's result, as PyTorch's async_op): the last collective overlaps with
/// whatever the caller does before waiting. Same arguments and result as run_plan.
PendingLocal run_plan_async(const Plan& plan, const Tensor& local, const DeviceMesh& src_mesh,
                            const DeviceMesh& dst_mesh);

/// Moves the pieces of `transfers`: this rank holds `held` (its block, as `local`; may be empty)
/// and ends with `want` (returned). One all_to_all_v over `group` when it covers every rank
/// involved (group ranks are looked up by world rank), else point-to-point over the world.
Tensor run_exchange(const std::vector<Transfer>& transfers, const Tensor& local, const Block& held, const Block& want,
                    DType dtype, const std::shared_ptr<Communicator>& group);

/// The view of `tensor` (holding block `whole`) covering `piece` (inside `whole`).
Tensor view_of(const Tensor& tensor, const Block& whole, const Block& piece);

/// Throws ShardingError naming `op` and its input index when an ExplicitRedistributionContext
/// refuses `plan` (it moves data, or any plan under a strict scope); returns otherwise. Every
/// rank runs the same ops, so every rank throws alike, before communicating.
void check_implicit_redistribution(std::string_view op, size_t input, const Plan& plan);

/// x with `placements` (shard orders kept where they apply), moved on behalf of `op`: the library
/// moving an op's input the user did not ask to move, so checked against an
/// ExplicitRedistributionContext first.
DTensor implicit_redistribute(const DTensor& x, Placements placements, std::string_view op);

}  // namespace tessera::detail
