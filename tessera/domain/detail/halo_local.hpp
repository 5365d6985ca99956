#pragma once
// halo_exchange on a rank's local tensor of a layout, differentiable with respect to that Tensor:
// what the sharded spatial ops chain (a halo along H, then one along W of the widened block, so
// the corners come along).
#include <cstdint>

#include <tessera/core/tensor.hpp>
#include <tessera/domain/halo.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera::detail {

/// halo_exchange of `local`, this rank's tensor whose extent along `dim` is its block's in
/// `layout` (its other dims may differ from the block's, e.g. widened by an earlier exchange
/// along another dim, as long as the ranks exchanging along `dim` agree on them). Throws
/// ShardingError as halo_exchange does.
Tensor halo_exchange_local(const Tensor& local, const Layout& layout, const DeviceMesh& mesh, int64_t dim, int64_t left,
                           int64_t right, HaloPadding pad);
/// The first half of halo_exchange_local (`op` names the user's call in errors).
HaloExchange halo_exchange_start_local(const Tensor& local, const Layout& layout, const DeviceMesh& mesh, int64_t dim,
                                       int64_t left, int64_t right, HaloPadding pad,
                                       const char* op = "halo_exchange_start");

}  // namespace tessera::detail
