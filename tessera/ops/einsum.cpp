// einsum: letters are checked once (parse_einsum, shared with the DTensor op; "..." becomes
// letters there), diagonals are taken (internal/einsum_diagonals.hpp), then operands are contracted
// pairwise: each pair becomes one bmm of [batch, kept-left, contracted] by
// [batch, contracted, kept-right], with letters nobody needs later summed out first.
#include <tessera/ops/einsum.hpp>

#include <algorithm>
#include <map>

#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/internal/einsum_diagonals.hpp>
#include <tessera/ops/linalg.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string text;
  for (const Shape& s : shapes) text.append(text.empty() ? "" : ", ").append(s.to_string());
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

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// The letters an equation may use, in the order fresh ones are handed out.
const std::string& all_letters() {
  static const std::string letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  return letters;
}

// A term as written: the letters before and after its "..." (if any).
struct WrittenTerm {
  std::string before, after;
  bool ellipsis = false;
};

}  // namespace

EinsumSpec parse_einsum(std::string_view equation, const std::vector<Shape>& shapes) {
  const auto fail_text = [&] { return "equation '" + std::string(equation) + "' with operands " + shapes_text(shapes); };
  std::string text;
  for (char c : equation)
    if (c != ' ') text += c;
  for (char c : text)
    TESSERA_CHECK(is_letter(c) || c == ',' || c == '-' || c == '>' || c == '.', ValueError, "einsum", fail_text(), ": '",
                  std::string(1, c), "' is not a letter, ',', '->' or '...'");
  const auto arrow = text.find("->");
  const std::string lhs = text.substr(0, arrow);
  const std::string rhs = arrow == std::string::npos ? std::string() : text.substr(arrow + 2);
  TESSERA_CHECK(lhs.find_first_of("->") == std::string::npos && rhs.find_first_of("->,") == std::string::npos, ValueError,
                "einsum", fail_text(), ": expected operand terms separated by ',', then at most one '->' and the output");
  const auto written = [&](const std::string& term) {
    WrittenTerm t;
    const auto dots = term.find("...");
    t.ellipsis = dots != std::string::npos;
    t.before = term.substr(0, dots);
    t.after = t.ellipsis ? term.substr(dots + 3) : std::string();
    TESSERA_CHECK(t.before.find('.') == std::string::npos && t.after.find('.') == std::string::npos, ValueError,
                  "einsum", fail_text(), ": term '", term, "' has a '.' outside one '...'");
    return t;
  };
  std::vector<WrittenTerm> terms;
  for (size_t start = 0;;) {
    const auto comma = lhs.find(',', start);
    terms.push_back(written(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  TESSERA_CHECK(terms.size() == shapes.size(), ValueError, "einsum", fail_text(), ": ", terms.size(),
                " operand terms for ", shapes.size(), " operands");

  // The dims "..." covers, per operand, aligned from the right as numpy broadcasting aligns them.
  std::vector<int64_t> covered(terms.size(), 0);
  int64_t span = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const WrittenTerm& t = terms[i];
    const int64_t named = static_cast<int64_t>(t.before.size() + t.after.size());
    const std::string term = t.ellipsis ? t.before + "..." + t.after : t.before;
    TESSERA_CHECK(t.ellipsis ? named <= shapes[i].size() : named == shapes[i].size(), ValueError, "einsum", fail_text(),
                  ": term '", term, "' has ", named, " letters for an operand with ", shapes[i].size(), " dims");
    covered[i] = shapes[i].size() - named;
    span = std::max(span, covered[i]);
  }
  const auto covered_shape = [&](size_t i) {
    Shape s;
    for (int64_t j = 0; j < covered[i]; ++j) s.push_back(shapes[i][static_cast<int64_t>(terms[i].before.size()) + j]);
    return s;
  };
  Shape broadcast = Shape::filled(span, 1);
  std::vector<size_t> sized_by(static_cast<size_t>(span), 0);  // the operand that set each broadcast size
  for (size_t i = 0; i < terms.size(); ++i)
    for (int64_t j = 0; j < covered[i]; ++j) {
      const int64_t p = span - covered[i] + j, n = covered_shape(i)[j];
      if (n == 1) continue;
      TESSERA_CHECK(broadcast[p] == 1 || broadcast[p] == n, ValueError, "einsum", fail_text(), ": '...' covers dims ",
                    covered_shape(sized_by[static_cast<size_t>(p)]).to_string(), " of operand ",
                    sized_by[static_cast<size_t>(p)], " and ", covered_shape(i).to_string(), " of operand ", i,
                    ", which do not broadcast");
      broadcast[p] = n;
      sized_by[static_cast<size_t>(p)] = i;
    }

  // Letters for the covered dims: one per broadcast position, and one of its own (summed out) for
  // a size-1 dim broadcast against a larger one.
  std::string unused;
  for (char c : all_letters())
    if (text.find(c) == std::string::npos) unused += c;
  size_t handed_out = 0;
  const auto fresh = [&] {
    TESSERA_CHECK(handed_out < unused.size(), ValueError, "einsum", fail_text(), ": the dims '...' covers need more than the ",
                  unused.size(), " letters the equation leaves unused");
    return unused[handed_out++];
  };
  std::string positions;
  for (int64_t p = 0; p < span; ++p) positions += fresh();
  std::string own_letters;  // of broadcast size-1 dims: in no output, implicit or not
  EinsumSpec spec;
  for (size_t i = 0; i < terms.size(); ++i) {
    std::string letters = terms[i].before;
    for (int64_t j = 0; j < covered[i]; ++j) {
      const int64_t p = span - covered[i] + j;
      if (covered_shape(i)[j] == broadcast[p]) {
        letters += positions[static_cast<size_t>(p)];
      } else {
        own_letters += fresh();
        letters += own_letters.back();
      }
    }
    spec.inputs.push_back(letters + terms[i].after);
  }

  std::map<char, int64_t> size;
  std::map<char, int> count;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string& letters = spec.inputs[i];
    for (size_t d = 0; d < letters.size(); ++d) {
      const char c = letters[d];
      const auto [it, inserted] = size.emplace(c, shapes[i][static_cast<int64_t>(d)]);
      TESSERA_CHECK(it->second == shapes[i][static_cast<int64_t>(d)], ValueError, "einsum", fail_text(), ": letter '",
                    std::string(1, c), "' has sizes ", it->second, " and ", shapes[i][static_cast<int64_t>(d)]);
      ++count[c];
    }
  }
  if (arrow == std::string::npos) {
    spec.output = positions;
    for (const auto& [c, n] : count)
      if (n == 1 && !has(positions, c) && !has(own_letters, c)) spec.output += c;
  } else {
    const WrittenTerm out = written(rhs);
    spec.output = out.before + (out.ellipsis ? positions : std::string()) + out.after;
    for (const std::string& part : {out.before, out.after})
      for (size_t d = 0; d < part.size(); ++d)
        TESSERA_CHECK(size.count(part[d]) > 0, ValueError, "einsum", fail_text(), ": output letter '",
                      std::string(1, part[d]), "' appears in no operand");
    for (size_t d = 0; d < spec.output.size(); ++d)
      TESSERA_CHECK(spec.output.find(spec.output[d]) == d, ValueError, "einsum", fail_text(), ": output letter '",
                    std::string(1, spec.output[d]), "' repeats");
  }
  for (size_t i = 0; i < spec.inputs.size(); ++i) spec.equation.append(i ? "," : "").append(spec.inputs[i]);
  spec.equation += "->" + spec.output;
  return spec;
}

namespace detail {

bool has_repeated_letter(const std::string& letters) {
  for (size_t d = 0; d < letters.size(); ++d)
    if (letters.find(letters[d]) != d) return true;
  return false;
}

DiagonalStep diagonal_step(const std::string& letters, const Shape& shape) {
  std::string unused;
  for (char c : all_letters())
    if (!has(letters, c)) unused += c;
  DiagonalStep step;
  std::string operand, identities;
  size_t handed_out = 0;
  for (size_t d = 0; d < letters.size(); ++d) {
    const char c = letters[d];
    if (letters.find(c) == d) {
      operand += c;
      step.letters += c;
      continue;
    }
    // Each later occurrence gets a letter of its own, tied to the first by an identity.
    TESSERA_CHECK(handed_out < unused.size(), ValueError, "einsum", "term '", letters, "' repeats letters in more dims (",
                  letters.size(), ") than einsum has letters for");
    const char other = unused[handed_out++];
    operand += other;
    identities += std::string(",") + c + other;
    step.identities.push_back(shape[static_cast<int64_t>(d)]);
  }
  step.equation = operand + identities + "->" + step.letters;
  return step;
}

}  // namespace detail

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
  if (std::any_of(spec.inputs.begin(), spec.inputs.end(), detail::has_repeated_letter)) {
    std::vector<Tensor> diagonals = operands;
    const EinsumSpec flat = detail::take_diagonals(
        spec, diagonals, [](int64_t n, const Tensor& operand) { return eye(n, n, operand.dtype()); });
    return einsum(flat.equation, diagonals);
  }
  Tensor out = evaluate(spec, detached);
  derivatives::record_einsum(out, operands, spec);
  return out;
}

}  // namespace tessera
