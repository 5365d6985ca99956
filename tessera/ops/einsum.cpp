// einsum: letters are checked once (parse_einsum, shared with the DTensor op), then operands are
// contracted pairwise: each pair becomes one bmm of [batch, kept-left, contracted] by
// [batch, contracted, kept-right], with letters nobody needs later summed out first.
#include <tessera/ops/einsum.hpp>

#include <algorithm>
#include <map>

#include <tessera/ops/detail/derivatives.hpp>
#include <tessera/ops/linalg.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string text;
  for (const Shape& s : shapes) text += (text.empty() ? "" : ", ") + s.to_string();
  return text;
}

bool has(const std::string& letters, char c) { return letters.find(c) != std::string::npos; }

// A tensor with its letters; sizes by letter.
struct Term {
  Tensor value;
  std::string letters;
};

// Sums out the letters of t that `needed` lacks.
Term drop_unneeded(Term t, const std::string& needed) {
  std::vector<int64_t> dims;
  std::string kept;
  for (size_t i = 0; i < t.letters.size(); ++i) {
    if (has(needed, t.letters[i])) kept += t.letters[i];
    else dims.push_back(static_cast<int64_t>(i));
  }
  if (!dims.empty()) t.value = sum(t.value, dims);
  t.letters = kept;
  return t;
}

// Permutes t's dims into the order of `letters` (a permutation of t.letters).
Tensor in_order(const Term& t, const std::string& letters) {
  std::vector<int64_t> order;
  for (char c : letters) order.push_back(static_cast<int64_t>(t.letters.find(c)));
  return t.value.permute(order);
}

int64_t product(const std::string& letters, const std::map<char, int64_t>& size) {
  int64_t n = 1;
  for (char c : letters) n *= size.at(c);
  return n;
}

Term contract(const Term& a, const Term& b, const std::string& needed, const std::map<char, int64_t>& size) {
  std::string batch, left, right, summed;
  for (char c : a.letters) {
    if (has(b.letters, c)) (has(needed, c) ? batch : summed) += c;
    else left += c;
  }
  for (char c : b.letters)
    if (!has(a.letters, c)) right += c;
  const int64_t nb = product(batch, size), nl = product(left, size), nr = product(right, size), ns = product(summed, size);
  const Tensor lhs = in_order(a, batch + left + summed).reshape({nb, nl, ns});
  const Tensor rhs = in_order(b, batch + summed + right).reshape({nb, ns, nr});
  Shape shape;
  for (char c : batch + left + right) shape.push_back(size.at(c));
  return {bmm(lhs, rhs).reshape(shape), batch + left + right};
}

}  // namespace

EinsumSpec parse_einsum(std::string_view equation, const std::vector<Shape>& shapes) {
  const auto fail_text = [&] { return "equation '" + std::string(equation) + "' with operands " + shapes_text(shapes); };
  EinsumSpec spec;
  std::string text;
  for (char c : equation)
    if (c != ' ') text += c;
  for (char c : text)
    TESSERA_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ',' || c == '-' || c == '>', ValueError,
                  "einsum", fail_text(), ": '", std::string(1, c), "' is not a letter (\"...\" is not supported)");
  const auto arrow = text.find("->");
  std::string lhs = text.substr(0, arrow);
  for (size_t start = 0;;) {
    const auto comma = lhs.find(',', start);
    spec.inputs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  TESSERA_CHECK(spec.inputs.size() == shapes.size(), ValueError, "einsum", fail_text(), ": ", spec.inputs.size(),
                " operand terms for ", shapes.size(), " operands");
  std::map<char, int64_t> size;
  std::map<char, int> count;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string& letters = spec.inputs[i];
    TESSERA_CHECK(static_cast<int64_t>(letters.size()) == shapes[i].size(), ValueError, "einsum", fail_text(), ": term '",
                  letters, "' has ", letters.size(), " letters for an operand with ", shapes[i].size(), " dims");
    for (size_t d = 0; d < letters.size(); ++d) {
      const char c = letters[d];
      TESSERA_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'), ValueError, "einsum", fail_text(), ": '",
                    std::string(1, c), "' in term '", letters, "' is not a letter");
      TESSERA_CHECK(letters.find(c) == d, ValueError, "einsum", fail_text(), ": letter '", std::string(1, c),
                    "' repeats in term '", letters, "' (diagonals are not supported)");
      const auto [it, inserted] = size.emplace(c, shapes[i][static_cast<int64_t>(d)]);
      TESSERA_CHECK(it->second == shapes[i][static_cast<int64_t>(d)], ValueError, "einsum", fail_text(), ": letter '",
                    std::string(1, c), "' has sizes ", it->second, " and ", shapes[i][static_cast<int64_t>(d)]);
      ++count[c];
    }
  }
  if (arrow == std::string::npos) {
    for (const auto& [c, n] : count)
      if (n == 1) spec.output += c;
  } else {
    spec.output = text.substr(arrow + 2);
    for (size_t d = 0; d < spec.output.size(); ++d) {
      const char c = spec.output[d];
      TESSERA_CHECK(size.count(c) > 0, ValueError, "einsum", fail_text(), ": output letter '", std::string(1, c),
                    "' appears in no operand");
      TESSERA_CHECK(spec.output.find(c) == d, ValueError, "einsum", fail_text(), ": output letter '", std::string(1, c),
                    "' repeats");
    }
  }
  for (size_t i = 0; i < spec.inputs.size(); ++i) spec.equation += (i ? "," : "") + spec.inputs[i];
  spec.equation += "->" + spec.output;
  return spec;
}

namespace {

// The contraction itself, on operands that record nothing.
Tensor evaluate(const EinsumSpec& spec, const std::vector<Tensor>& operands) {
  std::map<char, int64_t> size;
  for (size_t i = 0; i < operands.size(); ++i)
    for (size_t d = 0; d < spec.inputs[i].size(); ++d) size[spec.inputs[i][d]] = operands[i].shape()[static_cast<int64_t>(d)];
  // What the terms after operand i and the output still need.
  std::vector<std::string> needed_after(operands.size());
  std::string needed = spec.output;
  for (size_t i = operands.size(); i-- > 0;) {
    needed_after[i] = needed;
    needed += spec.inputs[i];
  }
  Term acc = drop_unneeded({operands[0], spec.inputs[0]}, needed_after[0] + (operands.size() > 1 ? spec.inputs[1] : ""));
  for (size_t i = 1; i < operands.size(); ++i) {
    const Term next = drop_unneeded({operands[i], spec.inputs[i]}, needed_after[i] + acc.letters);
    acc = contract(acc, next, needed_after[i], size);
  }
  acc = drop_unneeded(acc, spec.output);
  return in_order(acc, spec.output).contiguous();
}

}  // namespace

Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands) {
  TESSERA_CHECK(!operands.empty(), ValueError, "einsum", "expects at least one operand");
  std::vector<Shape> shapes;
  std::vector<Tensor> detached;
  for (const Tensor& t : operands) {
    TESSERA_CHECK(t.defined(), ValueError, "einsum", "an operand is undefined (default-constructed)");
    TESSERA_CHECK(t.dtype() == operands.front().dtype(), ValueError, "einsum", "operands of dtypes ",
                  name(operands.front().dtype()), " and ", name(t.dtype()), "; convert them to one dtype");
    shapes.push_back(t.shape());
    detached.push_back(t.detach());
  }
  const EinsumSpec spec = parse_einsum(equation, shapes);
  Tensor out = evaluate(spec, detached);
  derivatives::record_einsum(out, operands, spec);
  return out;
}

}  // namespace tessera
