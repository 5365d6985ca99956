#pragma once
// Convolution on DTensors whose spatial dims are sharded (PhysicsNeMo ShardTensor's domain
// parallelism): each rank convolves its block widened by exactly the halo rows its outputs
// need, so no rank ever holds the whole grid.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {

/// torch's conv1d / conv2d / conv3d on a DTensor x [N, C, spatial...] with weight
/// [O, C/groups, kernel...] and bias [O]. Any mesh dim may shard the batch or a spatial dim (one
/// mesh dim or several, uneven and empty pieces). Channels shard as DTensor's linear: a mesh dim
/// splitting x's input channels (the weight's dim 1 split alike, or Replicate and cut locally)
/// gives each rank its share of every output, a Partial(sum), with no communication (the bias
/// counted once); a mesh dim splitting the weight's output channels (dim 0, the bias alike)
/// while x is whole on it gives the output's channels sharded. Any other sharding of the weight,
/// channel sharding of a grouped convolution, and Partial inputs are made Replicate first
/// (planned redistributions). Each sharded spatial dim's
/// outputs go to the piece holding their window's centre, so "same" convolutions keep the
/// pieces; the output keeps x's sharding with explicit sizes where strides make pieces uneven.
/// Halos come from halo_exchange (zeros beyond the edges: the convolution's zero padding), one
/// dim after another, so corners travel too. Differentiable; the weight's and bias's gradients
/// sum over the pieces. Communicates. Throws ValueError as the local convolution does, naming the
/// global layouts (not a rank's block), and ShardingError naming the layouts for a mesh mismatch.
DTensor conv1d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt,
               std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
               std::vector<int64_t> dilation = {1}, int64_t groups = 1);
DTensor conv2d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt,
               std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
               std::vector<int64_t> dilation = {1}, int64_t groups = 1);
DTensor conv3d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt,
               std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
               std::vector<int64_t> dilation = {1}, int64_t groups = 1);

/// torch's max_pool2d / avg_pool2d (count_include_pad, as torch's default) on a DTensor x
/// [N, C, H, W] whose batch, channels, H and W may be sharded (a Partial is reduced first).
/// Outputs are placed and halos fetched as for conv2d; max pooling sees -inf beyond the edges,
/// average pooling zeros. Differentiable. Communicates. Throws ValueError as the local pooling
/// does.
DTensor max_pool2d(const DTensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                   std::vector<int64_t> padding = {0});
DTensor avg_pool2d(const DTensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                   std::vector<int64_t> padding = {0});

/// torch's conv_transpose2d on a DTensor x [N, C, H, W] with weight [C, O / groups, KH, KW] and
/// bias [O]; shardings as conv2d. Output row o of input row r lies in [r stride - padding,
/// r stride - padding + extent): each sharded dim's outputs are split where the footprint of a
/// piece's first row is centred (an upsampling by 2 with kernel 2 or 4 keeps twice the rows per
/// piece), and each piece fetches the input rows its outputs read (a halo) from the pieces
/// holding them. Explicit sizes where the split is not chunk's. Differentiable; the weight's and
/// bias's gradients sum over the pieces. Communicates. Throws ValueError for arguments that give
/// no output, as the local op.
DTensor conv_transpose2d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt,
                         std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
                         std::vector<int64_t> output_padding = {0}, int64_t groups = 1,
                         std::vector<int64_t> dilation = {1});

/// torch's adaptive_avg_pool2d on a DTensor x [N, C, H, W] (a Partial is reduced first): output
/// cell o of a sharded dim of L rows and n outputs averages rows [floor(o L / n),
/// ceil((o + 1) L / n)) and belongs to the piece holding the first of them; the rows of a window
/// that crosses into the next piece come by a row exchange. Explicit output sizes. One output
/// along a sharded dim (global pooling) is the mean over it: a Partial, nothing moves.
/// Differentiable. Communicates.
DTensor adaptive_avg_pool2d(const DTensor& x, std::vector<int64_t> output_size);

/// torch's interpolate (nearest, as torch's legacy "nearest"; bilinear with align_corners=False)
/// to `size` (one value per spatial dim) on a DTensor x [N, C, spatial...]. Along a sharded
/// spatial dim the size must be a whole multiple s of the dim's length, so each piece grows s
/// times: nearest moves nothing, bilinear fetches one halo row on each side (the edge row
/// repeated beyond the domain, as the unsharded op clamps). Differentiable. Communicates for
/// bilinear. Throws ShardingError naming the dim when a sharded dim's size is not a multiple,
/// ValueError for an unknown mode or a size of the wrong length.
DTensor interpolate(const DTensor& x, std::vector<int64_t> size, std::string_view mode = "nearest");

}  // namespace tessera
