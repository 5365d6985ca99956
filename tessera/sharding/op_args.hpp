#pragma once
// The non-tensor arguments of an op, typed: what its sharding rule reads and what the dispatch
// cache keys on beside the input layouts. Pure values with ==, hash and a canonical text form.
#include <cstdint>
#include <string>
#include <variant>

#include <tessera/core/export.hpp>
#include <tessera/core/scalar.hpp>
#include <tessera/core/shape.hpp>

namespace tessera TESSERA_API {

/// Where an elementwise op's Scalar operand sits: `x op s` (right) or `s op x` (left).
enum class ScalarSlot : uint8_t { none, right, left };

/// Elementwise ops: the scalar operand's slot and the kinds of up to two scalars (clamp's
/// bounds): a kind changes the result dtype, so it is part of the key.
/// Example: `scalar right f` (x * 2.5).
struct ElementwiseArgs {
  ScalarSlot slot = ScalarSlot::none;
  int8_t kinds[2] = {-1, -1};  ///< Scalar::Kind of each scalar, -1 when absent

  static ElementwiseArgs scalar(ScalarSlot slot, Scalar s) { return {slot, {static_cast<int8_t>(s.kind()), -1}}; }
  friend bool operator==(const ElementwiseArgs& a, const ElementwiseArgs& b) {
    return a.slot == b.slot && a.kinds[0] == b.kinds[0] && a.kinds[1] == b.kinds[1];
  }
};

/// Reductions: the reduced dims (non-negative, ascending; every dim for a full reduction),
/// keepdim, and var's correction. Example: `dims [0, 2] keepdim`.
struct ReduceArgs {
  DimVector dims;
  bool keepdim = false;
  int64_t correction = 0;
  friend bool operator==(const ReduceArgs&, const ReduceArgs&) = default;
};

/// Ops along one dim (softmax, cat, stack, class_pick): the dim, non-negative.
struct DimArgs {
  int64_t dim = 0;
  friend bool operator==(const DimArgs&, const DimArgs&) = default;
};

/// layer_norm and rms_norm: how many trailing dims are normalised.
struct NormArgs {
  int64_t normalized_ndim = 0;
  friend bool operator==(const NormArgs&, const NormArgs&) = default;
};

/// reshape and expand: the result shape (no -1 left); permute: the dim order.
struct ShapeArgs {
  DimVector shape;
  friend bool operator==(const ShapeArgs&, const ShapeArgs&) = default;
};

/// narrow: dim (non-negative), start, length.
struct NarrowArgs {
  int64_t dim = 0, start = 0, length = 0;
  friend bool operator==(const NarrowArgs&, const NarrowArgs&) = default;
};

/// tril and triu: the diagonal (0 the main one, > 0 above it, < 0 below it). Example: `(diagonal -1)`.
struct DiagonalArgs {
  int64_t diagonal = 0;
  friend bool operator==(const DiagonalArgs&, const DiagonalArgs&) = default;
};

/// pad: per dim of the input, the elements added before and after it (negative: cropped), the
/// mode (PadMode of ops/shape_ops.hpp: 0 constant, 1 reflect, 2 replicate, 3 circular) and the
/// fill value of constant padding (0 for the other modes).
/// Constraints: before and after sized to the input's ndim. Example: `(pads [0, 1], [0, 2], constant 0)`.
struct PadArgs {
  DimVector before, after;
  uint8_t mode = 0;
  Scalar value = 0;
  friend bool operator==(const PadArgs& a, const PadArgs& b) {
    return a.before == b.before && a.after == b.after && a.mode == b.mode && a.value.kind() == b.value.kind() &&
           a.value.to_int() == b.value.to_int() &&
           (a.value.to_double() == b.value.to_double() || (a.value.to_double() != a.value.to_double() &&
                                                           b.value.to_double() != b.value.to_double()));
  }
};

/// einsum: the normalised equation ("ij,jk->ik"), which is also its sharding rule.
struct EquationArgs {
  std::string equation;
  friend bool operator==(const EquationArgs&, const EquationArgs&) = default;
};

/// The arguments of one op call; std::monostate for ops that take none (matmul, embedding).
using OpArgs = std::variant<std::monostate, ElementwiseArgs, ReduceArgs, DimArgs, NormArgs, ShapeArgs, NarrowArgs,
                            DiagonalArgs, PadArgs, EquationArgs>;

/// A hash mixing the alternative and its values.
size_t hash_value(const OpArgs& args);
/// Canonical text form, e.g. `()`, `(scalar right f)`, `(dims [0, 2], keepdim)`, `(dim 1)`.
std::string to_string(const OpArgs& args);

}  // namespace tessera
