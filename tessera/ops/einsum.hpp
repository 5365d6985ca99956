#pragma once
// Einstein summation over letters: "ij,jk->ik" (matmul), "bij,bjk->bik", "ii->"-style repeats in
// one operand (diagonals) and "..." are not supported. Without "->" the output is every letter
// that appears once, in alphabetical order (numpy's implicit mode).
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// A checked einsum: per operand its letters, the output's letters, the size of every letter.
struct EinsumSpec {
  std::vector<std::string> inputs;
  std::string output;
  std::string equation;  ///< normalised: explicit "->", no spaces, e.g. "ij,jk->ik"
};

/// Parses and checks `equation` against the operand shapes. Pure. Throws ValueError naming
/// "einsum", the equation and the shapes for a malformed equation, a letter count that differs
/// from an operand's ndim, a letter repeated in one operand or in the output, an output letter in
/// no operand, or one letter with two sizes.
EinsumSpec parse_einsum(std::string_view equation, const std::vector<Shape>& shapes);

/// The einsum of the operands (one or more), contracted pairwise left to right through bmm.
/// Differentiable. Throws ValueError as parse_einsum, or for operands of different dtypes.
Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands);

}  // namespace tessera
