#pragma once
// Convolutions, pooling and resampling on NCHW-style tensors, as torch.nn.functional's. Floating
// inputs only; f16/bf16 compute in f32 and return their own dtype. Every op records its derivative
// with respect to the input, the weight and the bias.
//
// Shapes: N batch, C input channels, O output channels, then 1 (L), 2 (H, W) or 3 (D, H, W)
// spatial dims. A spatial argument (stride, padding, dilation, kernel, size) takes one value for
// every spatial dim or one value per spatial dim. Output size per spatial dim of a convolution:
// floor((in + 2 * padding - dilation * (k - 1) - 1) / stride) + 1.
#include <cstdint>
#include <optional>
#include <string_view>
#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <vector>

namespace tessera TESSERA_API {

/// 1-d convolution (cross-correlation, as torch.nn.functional.conv1d): x [N, C, L] (or unbatched
/// [C, L]), weight [O, C / groups, K], bias [O] -> [N, O, L_out] (or [O, L_out]). Input channels
/// [g * C / groups, (g + 1) * C / groups) meet output channels [g * O / groups, ...) of group g;
/// zero padding. Throws ValueError for an undefined or non-floating operand, operands of different
/// dtypes, a wrong ndim, an empty kernel dim, groups < 1 or not dividing C and O, a channel
/// mismatch (weight.shape[1] * groups != C), a bias that is not [O], a stride/padding/dilation of
/// the wrong length or value (stride, dilation >= 1, padding >= 0), a dilated kernel larger than
/// the padded input, or sizes beyond BLAS's 32-bit index range.
Tensor conv1d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt,
              std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
              std::vector<int64_t> dilation = {1}, int64_t groups = 1);
/// 2-d convolution (torch.nn.functional.conv2d): x [N, C, H, W] (or [C, H, W]), weight
/// [O, C / groups, KH, KW], bias [O] -> [N, O, H_out, W_out]; stride/padding/dilation of 1 or 2
/// values. Throws ValueError as conv1d.
Tensor conv2d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt,
              std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
              std::vector<int64_t> dilation = {1}, int64_t groups = 1);
/// 3-d convolution (torch.nn.functional.conv3d): x [N, C, D, H, W] (or [C, D, H, W]), weight
/// [O, C / groups, KD, KH, KW], bias [O] -> [N, O, D_out, H_out, W_out]; stride/padding/dilation
/// of 1 or 3 values. Throws ValueError as conv1d.
Tensor conv3d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt,
              std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
              std::vector<int64_t> dilation = {1}, int64_t groups = 1);

/// 2-d transposed convolution (torch.nn.functional.conv_transpose2d), the adjoint of conv2d with
/// the same weight: x [N, C, H, W] (or [C, H, W]), weight [C, O / groups, KH, KW], bias [O] ->
/// [N, O, H_out, W_out] with H_out = (H - 1) * stride - 2 * padding + dilation * (KH - 1) +
/// output_padding + 1. Throws ValueError as conv1d (with C = weight.shape[0] and O =
/// weight.shape[1] * groups), and if output_padding is negative, not smaller than stride or
/// dilation, or the output would be empty.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias = std::nullopt,
                        std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
                        std::vector<int64_t> output_padding = {0}, int64_t groups = 1,
                        std::vector<int64_t> dilation = {1});

/// 2-d max pooling (torch.nn.functional.max_pool2d, dilation 1, floor mode): x [N, C, H, W] (or
/// [C, H, W]) -> [N, C, H_out, W_out], H_out = floor((H + 2 * padding - KH) / stride) + 1; padding
/// counts as -inf, a NaN in a window wins, ties go to the first maximum (which gets the gradient).
/// stride defaults ({}) to kernel. Throws ValueError for a non-floating or undefined x, a wrong
/// ndim, an empty H or W, kernel/stride/padding of the wrong length, kernel or stride < 1,
/// padding < 0 or above half the kernel, or a kernel larger than the padded input (empty output).
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0});
/// 2-d average pooling (torch.nn.functional.avg_pool2d with count_include_pad=True, floor mode):
/// each window's sum over the input (padding counts as 0) divided by KH * KW. Shapes and errors
/// as max_pool2d.
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0});
/// 2-d adaptive average pooling (torch.nn.functional.adaptive_avg_pool2d): x [N, C, H, W] (or
/// [C, H, W]) -> [N, C, OH, OW]; output cell i averages input rows [floor(i * H / OH),
/// ceil((i + 1) * H / OH)), and likewise for columns. output_size has 1 or 2 values. Throws
/// ValueError for a non-floating or undefined x, a wrong ndim, an empty H or W, or an output_size
/// of the wrong length or < 1.
Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size);

/// Resamples x [N, C, L], [N, C, H, W] or [N, C, D, H, W] to the spatial `size` (1 value for every
/// spatial dim, or one per spatial dim), as torch.nn.functional.interpolate(x, size, mode):
/// "nearest" (torch's legacy nearest, any of the three ranks: source index
/// floor(dst * in / out) in f32, as torch computes it) or "bilinear" (4-d only, align_corners=False:
/// source coordinate (dst + 0.5) * in / out - 0.5 clamped at 0). Throws ValueError for a
/// non-floating or undefined x, a wrong ndim, an unknown mode, bilinear on a non-4-d x, or a size
/// of the wrong length or < 1.
Tensor interpolate(const Tensor& x, std::vector<int64_t> size, std::string_view mode = "nearest");
/// interpolate by scale factors (1 value, or one per spatial dim): output size floor(in * scale),
/// and, as torch with recompute_scale_factor unset, the source coordinates use 1 / scale instead
/// of in / out. Throws ValueError as interpolate, and for a scale <= 0 or one that gives an
/// empty output.
Tensor interpolate_scale(const Tensor& x, std::vector<double> scale, std::string_view mode = "nearest");

}  // namespace tessera
