#pragma once
// The convolution forward by a chosen algorithm, without autograd recording: for the conv
// bench and the tests of each algorithm (the ops in conv.hpp choose automatically).
#include <cstdint>
#include <optional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// How the convolution forward computes: im2col + one GEMM per group, or a direct blocked loop;
/// automatic picks per shape class (the measurement is in convolution.cpp, the bench in
/// bench/conv_bench.cpp).
enum class ConvAlgorithm { automatic, im2col, direct };

namespace detail {
/// The forward of conv1d/2d/3d (spatial dims from weight.ndim() - 2) computed by `algorithm`, with
/// no autograd recording: for benches and for tests of each algorithm. Throws ValueError as conv1d.
Tensor conv_forward(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                    const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                    const std::vector<int64_t>& dilation, int64_t groups, ConvAlgorithm algorithm);
/// The algorithm `automatic` uses for a conv weight shape [O, C / groups, k...] under stride (1 value
/// or one per spatial dim) and groups: direct for one output channel per group (depthwise) with 25+
/// kernel taps or a stride > 1, else im2col (measurements in convolution.cpp). Pure.
ConvAlgorithm chosen_conv_algorithm(const Shape& weight, const std::vector<int64_t>& stride, int64_t groups);
}  // namespace detail

}  // namespace tessera
