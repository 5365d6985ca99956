#pragma once
// PhysicsNeMo ShardTensor's scatter_tensor: a tensor that exists on one rank only, laid out on a
// mesh, each rank receiving just its block.
#include <optional>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {

/// The DTensor of `on_src`, which only world rank `src_rank` needs to hold (the others pass an
/// undefined Tensor, or anything: it is not read), laid out by `placements` on `mesh`. The
/// source broadcasts the shape and dtype first (a small metadata message), then sends every rank
/// its block. Every rank of the mesh calls it. Communicates. Throws ShardingError naming
/// scatter_tensor when src_rank is not in the mesh, the source's tensor is undefined, or the
/// placements do not fit the mesh or the tensor.
DTensor scatter_tensor(const Tensor& on_src, int src_rank, const DeviceMesh& mesh, Placements placements);

}  // namespace tessera
