#pragma once
// Einstein summation over letters, as torch.einsum: "ij,jk->ik" (matmul), "bij,bjk->bik", a
// letter repeated in one operand takes the diagonal ("ii->i", "ii->" the trace, "bii->bi"), and
// "..." stands for the dims no letter names, broadcast across operands (numpy rules, aligned from
// the right) and kept in the output where it writes "..." (summed where it does not). Without
// "->" the output is "..." followed by every letter that appears once, in alphabetical order
// (numpy's implicit mode).
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// A checked einsum in letters only: the dims "..." covers get letters the equation does not
/// use (a size-1 dim broadcast against a larger one gets a letter of its own, summed out).
/// Constraints: one letter per operand dim; output letters distinct and present in an input.
/// Example: "...ij,...jk" on [2, 1, 3, 4] and [5, 4, 6] -> "ACij,Bjk->ABik" (C: the size-1 dim).
struct EinsumSpec {
  std::vector<std::string> inputs;  ///< per operand its letters (a letter may repeat: a diagonal)
  std::string output;
  std::string equation;  ///< normalised: letters only, explicit "->", no spaces, e.g. "ij,jk->ik"
};

/// Parses and checks `equation` against the operand shapes. Pure. Throws ValueError naming
/// "einsum", the equation and the shapes for a malformed equation, a letter count that differs
/// from an operand's ndim, "..." dims that do not broadcast, a letter repeated in the output, an
/// output letter in no operand, or one letter with two sizes (also within one operand).
EinsumSpec parse_einsum(std::string_view equation, const std::vector<Shape>& shapes);

/// The einsum of the operands (one or more), contracted pairwise left to right through bmm;
/// diagonals first, each as the contraction with identity matrices ("bii" -> "bij,ij->bi").
/// Differentiable. Throws ValueError as parse_einsum, or for operands of different dtypes.
Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands);

}  // namespace tessera
