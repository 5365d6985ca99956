#pragma once
// The engine's gradient arithmetic on Tensor (grad/engine.hpp, GradOps), defined by the ops layer
// (ops/elementwise.cpp, ops/reduce.cpp). Include it wherever a Tensor node is recorded.
#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/grad/engine.hpp>

namespace tessera TESSERA_API {
namespace autograd {

template <>
struct GradOps<Tensor> {
  static Tensor add(const Tensor& a, const Tensor& b);
  /// Sums a broadcast gradient back to `shape` (the adjoint of expand).
  static Tensor sum_to(const Tensor& grad, const Shape& shape);
};

}  // namespace autograd
}  // namespace tessera
