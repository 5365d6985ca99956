// einsum's diagonals (a letter repeated in one operand) and "..." (the dims no letter names,
// broadcast) on Tensor, as torch.einsum: values against a brute-force sum over every assignment
// of the letters, gradients against finite differences, one test per documented error.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Distinct f64 values (no two equal, so a wrong diagonal or order shows).
Tensor values(const Shape& shape, int seed) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = 0.25 * static_cast<double>((i * 7 + static_cast<size_t>(seed) * 5) % 23) - 2.5 + 0.001 * static_cast<double>(i);
  return from_vector(v, shape);
}

// The definition of einsum, written out: every assignment of the letters (letters only, explicit
// "->"), the product of the operands' entries there, summed into the output's entry. A dim of
// size 1 broadcasts (it is read at 0 whatever its letter's size).
Tensor brute_force(const std::string& equation, const std::vector<Tensor>& operands) {
  const auto arrow = equation.find("->");
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const auto comma = equation.find(',', start);
    terms.push_back(equation.substr(start, std::min(comma, arrow) - start));
    if (comma == std::string::npos || comma > arrow) break;
    start = comma + 1;
  }
  const std::string out = equation.substr(arrow + 2);
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t d = 0; d < terms[i].size(); ++d)
      size[terms[i][d]] = std::max(size[terms[i][d]], operands[i].shape()[static_cast<int64_t>(d)]);
  std::vector<char> letters;
  for (const auto& [c, n] : size) letters.push_back(c);
  std::vector<std::vector<double>> data;
  for (const Tensor& t : operands) data.push_back(t.to(DType::f64).contiguous().to_vector<double>());
  Shape out_shape;
  for (char c : out) out_shape.push_back(size[c]);
  std::vector<double> result(static_cast<size_t>(out_shape.numel()), 0.0);
  std::map<char, int64_t> at;
  for (char c : letters) at[c] = 0;
  int64_t assignments = 1;
  for (char c : letters) assignments *= size[c];
  for (int64_t k = 0; k < assignments; ++k) {
    int64_t rest = k;
    for (auto it = letters.rbegin(); it != letters.rend(); ++it) {
      at[*it] = rest % size[*it];
      rest /= size[*it];
    }
    double product = 1;
    for (size_t i = 0; i < terms.size(); ++i) {
      int64_t offset = 0;
      for (size_t d = 0; d < terms[i].size(); ++d) {
        const int64_t n = operands[i].shape()[static_cast<int64_t>(d)];
        offset = offset * n + (n == 1 ? 0 : at[terms[i][d]]);
      }
      product *= data[i][static_cast<size_t>(offset)];
    }
    int64_t target = 0;
    for (char c : out) target = target * size[c] + at[c];
    result[static_cast<size_t>(target)] += product;
  }
  return from_vector(result, out_shape);
}

// einsum(equation) against the brute-force sum of `written_out` (letters only, explicit "->"; a
// letter may repeat in a term there: its dims are read at one index, the definition of a diagonal).
::testing::AssertionResult matches(const std::string& equation, const std::vector<Tensor>& operands,
                                   const std::string& written_out) {
  const Tensor got = einsum(equation, operands), expected = brute_force(written_out, operands);
  if (got.shape() != expected.shape())
    return ::testing::AssertionFailure() << equation << ": shape " << got.shape().to_string() << ", expected "
                                         << expected.shape().to_string();
  if (!allclose(got, expected, 1e-12, 1e-12))
    return ::testing::AssertionFailure() << equation << ": " << got << "\nexpected " << expected;
  return ::testing::AssertionSuccess();
}

#define EXPECT_GRADCHECK(fn, ...)                                 \
  do {                                                            \
    const auto result = autograd::gradcheck(fn, {__VA_ARGS__});   \
    EXPECT_TRUE(result.ok) << #fn << ": " << result.message;      \
  } while (0)

using Inputs = const std::vector<Tensor>&;

}  // namespace

TEST(EinsumDiagonal, ARepeatedLetterTakesTheDiagonal) {
  const Tensor square = values({4, 4}, 1);
  std::vector<double> diagonal;
  double trace = 0;
  for (int64_t i = 0; i < 4; ++i) {
    diagonal.push_back(square.to_vector<double>()[static_cast<size_t>(i * 5)]);
    trace += diagonal.back();
  }
  // torch: einsum('ii->i', x) is x.diagonal(), 'ii->' and the implicit 'ii' the trace.
  EXPECT_TRUE(allclose(einsum("ii->i", {square}), from_vector(diagonal, {4}), 1e-15, 0));
  EXPECT_NEAR(einsum("ii->", {square}).item(), trace, 1e-12);
  EXPECT_EQ(einsum("ii", {square}).shape(), Shape{});
  EXPECT_NEAR(einsum("ii", {square}).item(), trace, 1e-12);
  EXPECT_TRUE(matches("ii->i", {square}, "ii->i"));
  EXPECT_TRUE(matches("bii->bi", {values({3, 4, 4}, 2)}, "bii->bi"));
  EXPECT_TRUE(matches("bii->b", {values({3, 4, 4}, 2)}, "bii->b"));
  EXPECT_TRUE(matches("bii->ib", {values({3, 4, 4}, 2)}, "bii->ib"));
  EXPECT_TRUE(matches("iii->i", {values({3, 3, 3}, 3)}, "iii->i"));
  EXPECT_TRUE(matches("iji->j", {values({3, 2, 3}, 4)}, "iji->j"));
  EXPECT_TRUE(matches("iijj->ij", {values({2, 2, 3, 3}, 5)}, "iijj->ij"));
  EXPECT_TRUE(matches("ij,jj->i", {values({2, 3}, 6), values({3, 3}, 7)}, "ij,jj->i"));
  EXPECT_TRUE(matches("ii,ij->j", {values({3, 3}, 8), values({3, 4}, 9)}, "ii,ij->j"));
  EXPECT_TRUE(matches("bii,bij->bj", {values({2, 3, 3}, 10), values({2, 3, 4}, 11)}, "bii,bij->bj"));
  EXPECT_TRUE(matches("ii,jj", {values({3, 3}, 12), values({2, 2}, 13)}, "ii,jj->"));
  // Empty diagonals: a 0 x 0 operand.
  EXPECT_EQ(einsum("ii->i", {zeros({0, 0}, DType::f64)}).shape(), (Shape{0}));
  EXPECT_EQ(einsum("ii->", {zeros({0, 0}, DType::f64)}).item(), 0.0);
}

TEST(EinsumEllipsis, CoversTheUnnamedDimsAndBroadcastsThem) {
  const Tensor x = values({2, 3, 4, 5}, 1);
  EXPECT_TRUE(matches("...ij->...ji", {x}, "abij->abji"));
  EXPECT_TRUE(matches("...ij", {x}, "abij->abij"));  // implicit: "..." first, then the letters used once
  EXPECT_TRUE(matches("...ji", {x}, "abji->abij"));
  EXPECT_TRUE(matches("i...->...", {x}, "iabc->abc"));
  EXPECT_TRUE(matches("i...j->j...i", {x}, "iabj->jabi"));
  EXPECT_TRUE(matches("...->", {x}, "abcd->"));
  EXPECT_TRUE(matches("...ij->ij", {x}, "abij->ij"));  // "..." not in the output: its dims are summed
  EXPECT_TRUE(matches("...ij->...ij", {values({3, 4}, 2)}, "ij->ij"));  // "..." covering no dim
  // Broadcasting, aligned from the right: [2, 1] against [5] gives [2, 5].
  const Tensor a = values({2, 1, 3, 4}, 3), b = values({5, 4, 6}, 4);
  EXPECT_TRUE(matches("...ij,...jk->...ik", {a, b}, "abij,bjk->abik"));
  EXPECT_TRUE(matches("...ij,...jk", {a, b}, "abij,bjk->abik"));
  EXPECT_TRUE(matches("...ij,...jk->ik", {a, b}, "abij,bjk->ik"));
  EXPECT_TRUE(matches("...,...->...", {values({2, 3}, 5), values({3}, 6)}, "ab,b->ab"));
  EXPECT_TRUE(matches("...,...->...", {values({}, 7), values({3}, 8)}, ",b->b"));
  EXPECT_TRUE(matches("...i,...i->...", {values({3, 1, 4}, 9), values({1, 2, 4}, 10)}, "abi,abi->ab"));
  // Diagonals and "..." together.
  EXPECT_TRUE(matches("...ii->...i", {values({2, 3, 3}, 11)}, "aii->ai"));
  EXPECT_TRUE(matches("i...i", {values({3, 2, 3}, 12)}, "iai->a"));
  // The normalised equation names the covered dims with unused letters; a size-1 dim broadcast
  // against a larger one gets a letter of its own (summed out).
  EXPECT_EQ(parse_einsum("...ij,...jk", {{2, 1, 3, 4}, {5, 4, 6}}).equation, "ACij,Bjk->ABik");
  EXPECT_EQ(parse_einsum("bii", {{2, 3, 3}}).equation, "bii->b");
}

TEST(EinsumDiagonalEllipsis, GradientsMatchFiniteDifferences) {
  EXPECT_GRADCHECK([](Inputs t) { return einsum("ii->i", t); }, values({3, 3}, 1));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("ii->", t); }, values({3, 3}, 2));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("bii->bi", t); }, values({2, 3, 3}, 3));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("iii->i", t); }, values({2, 2, 2}, 4));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("ij,jj->i", t); }, values({2, 3}, 5), values({3, 3}, 6));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("...ij,...jk->...ik", t); }, values({2, 1, 3, 2}, 7),
                   values({3, 2, 2}, 8));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("i...->...", t); }, values({3, 2, 2}, 9));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("...ii->...i", t); }, values({2, 3, 3}, 10));
  EXPECT_GRADCHECK([](Inputs t) { return einsum("...ij->ij", t); }, values({2, 2, 3}, 11));
}

TEST(EinsumDiagonalEllipsis, Errors) {
  const Tensor a = ones({2, 3});
  EXPECT_TRUE(value_error([&] { (void)einsum("ii->i", {a}); }, {"[einsum]", "'ii->i'", "letter 'i' has sizes 2 and 3"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("...i...->i", {a}); },
                          {"[einsum]", "term '...i...' has a '.' outside one '...'"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("i.j->i", {a}); }, {"[einsum]", "term 'i.j' has a '.' outside one '...'"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ij->..i.", {a}); }, {"[einsum]", "has a '.' outside one '...'"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("...ijk->i", {a}); },
                          {"[einsum]", "term '...ijk' has 3 letters for an operand with 2 dims"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("...ij,...jk", {ones({2, 3, 4}), ones({5, 4, 6})}); },
                          {"[einsum]", "'...' covers dims [2] of operand 0 and [5] of operand 1, which do not broadcast"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ij->i->j", {a}); }, {"[einsum]", "at most one '->'"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("ii->ii", {ones({2, 2})}); }, {"[einsum]", "output letter 'i' repeats"}));
  EXPECT_TRUE(value_error([&] { (void)einsum("i?->i", {a}); }, {"[einsum]", "'?' is not a letter, ',', '->' or '...'"}));
}
