#pragma once
// layer_norm and rms_norm with a normalised dim sharded (ops_norm_sharded.cpp). Internal to the
// dtensor layer.
#include <cstdint>
#include <optional>

#include <tessera/dtensor/dtensor.hpp>

namespace tessera::detail {

/// True when a mesh dim of more than one rank shards one of x's trailing `count` dims and no mesh
/// dim holds a Partial: the case norm_over_sharded_dims computes in place. Pure.
bool shards_normalized_dim(const DTensor& x, int64_t count);

/// layer_norm (`centred`) or rms_norm of x over its trailing `count` dims, each rank normalising
/// its block of the rows where it lies: one all_gather of two numbers per row and piece in the
/// forward, one all_reduce in the backward (the two per-row sums of the formula, packed with the
/// affine gradients when those are replicated). The result keeps x's layout. Collective over the
/// mesh dims that shard the normalised dims. Throws ValueError naming `op` for an affine operand
/// of another shape than the normalised dims or of another dtype than x.
DTensor norm_over_sharded_dims(const char* op, const DTensor& x, int64_t count, const std::optional<DTensor>& weight,
                               const std::optional<DTensor>& bias, double eps, bool centred);

}  // namespace tessera::detail
