#pragma once
// The diagonals of einsum operands, written once for Tensor and DTensor (T): a letter repeated in
// one operand becomes the contraction of that operand with identity matrices, an einsum without
// repeats ("bii" -> "bij,ij->bi"). The equation of a plain einsum is its sharding rule and its
// gradient is einsums again, so a diagonal needs neither a rule nor a derivative of its own: a
// diagonal dim sharded on one side only contracts into a Partial, and the identity's block is a
// local slice of a replicated one. It costs an identity of n * n and a pass over the operand,
// the order of reading the operand anyway.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/core/shape.hpp>
#include <tessera/ops/einsum.hpp>

namespace tessera::detail {

/// How one operand's diagonals are taken: `equation` contracts it with one identity per extra
/// occurrence of a letter, `identities` are their sizes and `letters` the operand's letters after.
/// Example: "bii" -> {"bij,ij->bi", {n}, "bi"}.
struct DiagonalStep {
  std::string equation;
  std::vector<int64_t> identities;
  std::string letters;
};

/// True when a letter occurs twice in `letters`. Pure.
bool has_repeated_letter(const std::string& letters);

/// The step for an operand with these letters and shape (sizes of a repeated letter equal, as
/// parse_einsum checks). Pure.
DiagonalStep diagonal_step(const std::string& letters, const Shape& shape);

/// `spec` with every operand's diagonals taken: each operand with a repeated letter is replaced
/// by its diagonal (an einsum of T, so recorded for autograd like any other) and its letters by
/// the step's. `identity(n, operand)` makes the n x n identity to contract `operand` with.
template <class T, class Identity>
EinsumSpec take_diagonals(const EinsumSpec& spec, std::vector<T>& operands, const Identity& identity) {
  EinsumSpec flat = spec;
  flat.equation.clear();
  for (size_t i = 0; i < operands.size(); ++i) {
    if (has_repeated_letter(spec.inputs[i])) {
      const DiagonalStep step = diagonal_step(spec.inputs[i], operands[i].shape());
      std::vector<T> args{operands[i]};
      for (int64_t n : step.identities) args.push_back(identity(n, operands[i]));
      operands[i] = einsum(step.equation, args);
      flat.inputs[i] = step.letters;
    }
    flat.equation.append(i ? "," : "").append(flat.inputs[i]);
  }
  flat.equation += "->" + flat.output;
  return flat;
}

}  // namespace tessera::detail
