#pragma once
// Placements: how a tensor lies along one mesh dim. Pure values.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera TESSERA_API {

/// Tensor dim `dim` is split over the mesh dim (chunk semantics, or explicit sizes in a Layout).
/// Example: `S(0)`.
struct Shard {
  int64_t dim = 0;
  friend bool operator==(const Shard&, const Shard&) = default;
};
/// Every rank along the mesh dim holds the same values. Example: `R`.
struct Replicate {
  friend bool operator==(const Replicate&, const Replicate&) = default;
};
/// Every rank along the mesh dim holds a value whose reduction by `op` is the true value.
/// Example: `P(sum)`.
struct Partial {
  ReduceOp op = ReduceOp::sum;
  friend bool operator==(const Partial&, const Partial&) = default;
};

/// One per mesh dim. Printable: S(0) R P(sum).
using Placement = std::variant<Shard, Replicate, Partial>;
using Placements = std::vector<Placement>;

inline bool is_shard(const Placement& p) { return std::holds_alternative<Shard>(p); }
inline bool is_shard(const Placement& p, int64_t dim) { return is_shard(p) && std::get<Shard>(p).dim == dim; }
inline bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
inline bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

/// "S(0)", "R", "P(sum)".
std::string to_string(const Placement& placement);
/// "(S(0), R)".
std::string to_string(const Placements& placements);
/// Write to_string(): "S(0)" and "(S(0), R)". Found by argument-dependent lookup (the variant's
/// and the vector's element types live in tessera).
std::ostream& operator<<(std::ostream& out, const Placement& placement);
std::ostream& operator<<(std::ostream& out, const Placements& placements);
/// Parses "S(0)", "S(-1)", "R", "P", "P(max)". Throws ShardingError naming the text if malformed.
Placement parse_placement(std::string_view text);
/// Parses "(S(0), R)" or "S(0),R" (parentheses and spaces optional).
Placements parse_placements(std::string_view text);

}  // namespace tessera

template <>
struct std::hash<tessera::Placement> {
  size_t operator()(const tessera::Placement& p) const noexcept;
};
