#pragma once
// JAX's shard_map: a function on local blocks, with collectives over mesh axes by name.
//
//   DTensor y = shard_map([](const std::vector<Tensor>& t) { return psum(matmul(t[0], t[1]), "tp"); },
//                         mesh, {P{std::nullopt, "tp"}, P{"tp"}}, P{}, {x, w});
//
// Inside fn the collectives below act on plain Tensors over the region's mesh; outside a
// shard_map they throw ShardingError. Every rank of the mesh runs fn (SPMD) and must make the
// same collective calls. All are differentiable: each backward is the true adjoint over the
// ranks' blocks (psum <-> psum of the cotangents, all_gather <-> psum_scatter, all_to_all <->
// the reverse all_to_all, ppermute <-> the inverse permutation). A replicated input's cotangent
// is the sum over its copies, and a replicated output hands each copy an equal share of its
// cotangent, so the gradients equal JAX's (where psum's transpose is a pbroadcast because JAX
// types psum's result invariant) in every program, including those where JAX would insert the
// pvary itself.
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/spec/partition_spec.hpp>

namespace tessera TESSERA_API {

/// Options of shard_map (trailing, defaulted: the contract signature stays callable without).
struct ShardMapOptions {
  /// JAX's check_vma: refuse an out_spec that claims the output replicated over an axis it is
  /// known to vary over. Known: the blocks of inputs sharded over it, and the results of this
  /// file's collectives (psum over an axis ends variation over it; psum_scatter, all_to_all and
  /// ppermute begin it). Values other ops compute are not tracked, so their claims pass.
  bool check_vma = true;
};

/// Runs `fn` on each rank's blocks of `args` laid out by `in_specs` (redistributed first when
/// they are not), and makes its result the DTensor laid out by `out_spec`: sharded dims
/// concatenate the ranks' results (uneven pieces allowed; their sizes are gathered), axes the
/// spec does not name take any one rank's result, which must be replicated over them.
/// Communicates. Throws ShardingError naming shard_map and the argument for a spec count that
/// does not match the arguments, an argument on another mesh, a calling rank outside the mesh,
/// or (check_vma) an output claimed replicated over an axis it varies over.
DTensor shard_map(std::function<Tensor(const std::vector<Tensor>&)> fn, const DeviceMesh& mesh,
                  std::vector<PartitionSpec> in_specs, PartitionSpec out_spec, const std::vector<DTensor>& args,
                  ShardMapOptions options = {});

/// Sum (max, mean) of x over the ranks along `axis`: every rank gets the result.
Tensor psum(const Tensor& x, std::string_view axis);
Tensor pmax(const Tensor& x, std::string_view axis);
Tensor pmean(const Tensor& x, std::string_view axis);
/// The blocks of the ranks along `axis` concatenated along `dim` in axis order (JAX's tiled
/// all_gather). Every rank's x must have the same shape.
Tensor all_gather(const Tensor& x, std::string_view axis, int64_t dim);
/// psum, then rank i along `axis` keeps the i-th of equal pieces along `dim` (tiled). Throws
/// ShardingError when x.size(dim) is not divisible by the axis size.
Tensor psum_scatter(const Tensor& x, std::string_view axis, int64_t dim);
/// x split into equal pieces along `split_dim`, piece i sent to rank i along `axis`, the pieces
/// received concatenated along `concat_dim` in axis order. Throws ShardingError when
/// x.size(split_dim) is not divisible by the axis size.
Tensor all_to_all(const Tensor& x, std::string_view axis, int64_t split_dim, int64_t concat_dim);
/// Sends x from axis index `src` to `dst` for each (src, dst) pair; a rank no pair sends to gets
/// zeros. Throws ShardingError when an index is out of range or repeats as a source or a
/// destination.
Tensor ppermute(const Tensor& x, std::string_view axis, std::vector<std::pair<int64_t, int64_t>> perm);
/// This rank's index along `axis`.
int64_t axis_index(std::string_view axis);

}  // namespace tessera
