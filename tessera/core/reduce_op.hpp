#pragma once
// ReduceOp: how values held on several ranks combine (collectives, Partial placements).
#include <cstdint>
#include <string>
#include <string_view>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

#define TESSERA_FORALL_REDUCE_OPS(_) \
  _(sum)                             \
  _(avg)                             \
  _(product)                         \
  _(max)                             \
  _(min)

/// A reduction across ranks. avg of integers truncates toward zero; on b8, sum and max are
/// logical or, product and min logical and, avg is rejected.
enum class ReduceOp : uint8_t {
#define TESSERA_REDUCE_OP_ENUM(name) name,
  TESSERA_FORALL_REDUCE_OPS(TESSERA_REDUCE_OP_ENUM)
#undef TESSERA_REDUCE_OP_ENUM
};

/// "sum", "avg", "product", "max", "min".
std::string_view name(ReduceOp op);
std::string to_string(ReduceOp op);
/// Parses a name. Throws ValueError if unknown.
ReduceOp reduce_op_from_string(std::string_view text);

/// Monarch's mesh reductions (DTensor::reduce, controller::reduce): the ReduceOps, in their
/// order, and stack (an all_gather into a new leading dim).
enum class MeshReduction : uint8_t { sum, avg, product, max, min, stack };
inline constexpr int kMeshReductionCount = 6;

}  // namespace tessera
