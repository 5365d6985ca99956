#include <tessera/sharding/placement.hpp>

#include <cctype>
#include <charconv>
#include <ostream>

#include <tessera/core/error.hpp>

namespace tessera {

std::string to_string(const Placement& placement) {
  return std::visit(
      [](const auto& p) -> std::string {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<P, Shard>) return "S(" + std::to_string(p.dim) + ")";
        else if constexpr (std::is_same_v<P, Replicate>) return "R";
        else return "P(" + tessera::to_string(p.op) + ")";
      },
      placement);
}

std::string to_string(const Placements& placements) {
  std::string text = "(";
  for (size_t i = 0; i < placements.size(); ++i) text.append(i ? ", " : "").append(to_string(placements[i]));
  return text + ")";
}

std::ostream& operator<<(std::ostream& out, const Placement& placement) { return out << to_string(placement); }
std::ostream& operator<<(std::ostream& out, const Placements& placements) { return out << to_string(placements); }

namespace {
std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}
}  // namespace

Placement parse_placement(std::string_view original) {
  const std::string_view text = trim(original);
  const auto bad = [&] {
    return ShardingError(detail::concat("[parse_placement] cannot parse '", original,
                                        "'; expected S(<dim>), R or P(<op>)"));
  };
  if (text == "R") return Replicate{};
  if (text == "P") return Partial{};
  if (text.size() >= 4 && text.back() == ')' && text[1] == '(') {
    const std::string_view inner = trim(text.substr(2, text.size() - 3));
    if (text[0] == 'S') {
      int64_t dim = 0;
      const auto [end, error] = std::from_chars(inner.data(), inner.data() + inner.size(), dim);
      if (error != std::errc() || end != inner.data() + inner.size()) throw bad();
      return Shard{dim};
    }
    if (text[0] == 'P') {
      try {
        return Partial{reduce_op_from_string(inner)};
      } catch (const ValueError&) {
        throw bad();
      }
    }
  }
  throw bad();
}

Placements parse_placements(std::string_view original) {
  std::string_view text = trim(original);
  if (!text.empty() && text.front() == '(' && text.back() == ')') text = trim(text.substr(1, text.size() - 2));
  Placements out;
  if (text.empty()) return out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '(') ++depth;
    if (i < text.size() && text[i] == ')') --depth;
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      out.push_back(parse_placement(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace tessera

size_t std::hash<tessera::Placement>::operator()(const tessera::Placement& p) const noexcept {
  const size_t kind = p.index();
  size_t value = 0;
  if (const auto* s = std::get_if<tessera::Shard>(&p)) value = static_cast<size_t>(s->dim);
  if (const auto* q = std::get_if<tessera::Partial>(&p)) value = static_cast<size_t>(q->op);
  return kind * 1000003u ^ value;
}
