#pragma once
// Class targets of the losses over logits (cross_entropy and its backward), checked once.
#include <cstdint>

#include <tessera/core/tensor.hpp>

namespace tessera::detail {

/// target as contiguous i64 class indices, each in [0, classes) or equal to ignore_index. Throws
/// ValueError naming op, the target and the logits' shape otherwise.
Tensor checked_class_targets(const Tensor& target, int64_t classes, int64_t ignore_index, const Shape& logits,
                             const char* op);

}  // namespace tessera::detail
