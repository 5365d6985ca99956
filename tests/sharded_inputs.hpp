#pragma once
// Inputs and comparisons shared by the DTensor test files: deterministic globals, the calling
// rank's block of one, DTensors of any placements (Partial ones included) whose full tensor is a
// given global, and exact comparison.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::testing {

/// A 1-d mesh, axis "x", over the whole world.
inline DeviceMesh line_mesh() { return DeviceMesh({world_size()}, {"x"}); }

/// Integer-valued data in [-11, 11] (sums of parts stay exact); `positive` shifts it to [1, 23].
inline Tensor data(const Shape& shape, int seed, bool positive = false) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<int64_t>((i + static_cast<size_t>(seed) * 5) * 7 % 23) - 11 + (positive ? 12 : 0));
  return from_vector(v, shape);
}

/// A copy of the part of `global` that `block` covers.
inline Tensor block_of(const Tensor& global, const Block& block) {
  Tensor piece = global;
  for (int64_t d = 0; d < block.begin.size(); ++d) piece = piece.narrow(d, block.begin[d], block.end[d] - block.begin[d]);
  return piece.clone();
}

/// The calling rank's block of `global` in d's layout.
inline Tensor my_block(const Tensor& global, const DTensor& d) {
  return block_of(global, d.layout().block(d.device_mesh().coordinate()));
}

/// The DTensor of `global` with `placements`; a P(sum) mesh dim holds parts that sum to the block
/// (rank 0 of the dim: block - k(k-1)/2, rank c: the constant c).
inline DTensor make_input(const Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  const Layout layout(global.shape(), global.dtype(), mesh.spec(), placements);
  const auto coordinate = mesh.coordinate();
  Tensor local = block_of(global, layout.block(coordinate));
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!is_partial(placements[static_cast<size_t>(m)])) continue;
    const int64_t k = mesh.size(m), c = coordinate[static_cast<size_t>(m)];
    local = c == 0 ? add(local, Scalar(static_cast<double>(-(k * (k - 1) / 2)))) : full(local.shape(), static_cast<double>(c), local.dtype());
  }
  return DTensor(local, mesh, layout);
}

/// Same dtype, shape and exactly equal values.
inline ::testing::AssertionResult same(const Tensor& actual, const Tensor& expected) {
  if (!actual.defined()) return ::testing::AssertionFailure() << "result is undefined";
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << "dtype " << name(actual.dtype()) << ", expected " << name(expected.dtype());
  if (!equal(actual, expected))
    return ::testing::AssertionFailure() << actual.to_string() << "\n  expected " << expected.to_string();
  return ::testing::AssertionSuccess();
}

}  // namespace tessera::testing
