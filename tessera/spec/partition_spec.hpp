#pragma once
// PartitionSpec: torch_xla's and JAX's way to say how a tensor is sharded, one entry per tensor
// dim naming the mesh axes that split it, and its lossless translation to and from a Layout.
// Pure: metadata only (depends on the sharding layer, not on DTensor).
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/export.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/mesh/mesh_spec.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

/// One mesh axis, by name ("dp", JAX and torch_xla) or by index (1, torch_xla). Value type.
class AxisRef {
 public:
  AxisRef(const char* name) : name_(name) {}
  AxisRef(std::string name) : name_(std::move(name)) {}
  AxisRef(std::string_view name) : name_(name) {}
  /// An axis index; a template so that the literal 0 means the index, not a null name.
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  AxisRef(I index) : index_(static_cast<int64_t>(index)) {}

  bool is_index() const { return !name_.has_value(); }
  const std::string& name() const { return *name_; }
  int64_t index() const { return index_; }
  /// "'dp'" or "1", as Python prints them.
  std::string to_string() const;
  /// This axis's mesh dim. Throws ShardingError naming `call`, the spec and the mesh's axes when
  /// the mesh has no such axis.
  int64_t resolve(const MeshSpec& mesh, std::string_view call, std::string_view spec) const;
  friend bool operator==(const AxisRef&, const AxisRef&) = default;

 private:
  std::optional<std::string> name_;
  int64_t index_ = 0;
};

/// One PartitionSpec entry: unsharded (std::nullopt, Python's None), one axis ("dp", 0), or an
/// ordered tuple of axes, major to minor ({"dp", "tp"}: the dim splits into size(dp) * size(tp)
/// pieces, piece index = dp_index * size(tp) + tp_index). A tuple of one axis is that axis.
class SpecEntry {
 public:
  SpecEntry(std::nullopt_t) {}
  SpecEntry(const char* axis) : axes_{AxisRef(axis)} {}
  SpecEntry(std::string axis) : axes_{AxisRef(std::move(axis))} {}
  SpecEntry(std::string_view axis) : axes_{AxisRef(axis)} {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  SpecEntry(I axis_index) : axes_{AxisRef(axis_index)} {}
  SpecEntry(std::initializer_list<AxisRef> axes) : axes_(axes) {}
  explicit SpecEntry(std::vector<AxisRef> axes) : axes_(std::move(axes)) {}

  /// The axes, major to minor; empty when the dim is not sharded.
  const std::vector<AxisRef>& axes() const { return axes_; }
  bool is_unsharded() const { return axes_.empty(); }
  /// "None", "'dp'", "('dp', 'tp')".
  std::string to_string() const;
  friend bool operator==(const SpecEntry&, const SpecEntry&) = default;

 private:
  std::vector<AxisRef> axes_;
};

/// How a tensor lies on a mesh, one entry per tensor dim (trailing unsharded entries may be
/// omitted). An axis appears at most once. Partial values have no spec. Value type.
/// Example: `PartitionSpec{"dp", std::nullopt, {"tp", "ep"}}` prints `P('dp', None, ('tp', 'ep'))`.
class PartitionSpec {
 public:
  /// No entries: every dim unsharded (fully replicated).
  PartitionSpec() = default;
  PartitionSpec(std::initializer_list<SpecEntry> entries) : entries_(entries) {}
  /// P("data", None), P({"dp", "tp"}, None): Python's parentheses, for up to 8 tensor dims.
  explicit PartitionSpec(SpecEntry a) : entries_{std::move(a)} {}
  PartitionSpec(SpecEntry a, SpecEntry b) : entries_{std::move(a), std::move(b)} {}
  PartitionSpec(SpecEntry a, SpecEntry b, SpecEntry c) : entries_{std::move(a), std::move(b), std::move(c)} {}
  PartitionSpec(SpecEntry a, SpecEntry b, SpecEntry c, SpecEntry d)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d)} {}
  PartitionSpec(SpecEntry a, SpecEntry b, SpecEntry c, SpecEntry d, SpecEntry e)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d), std::move(e)} {}
  PartitionSpec(SpecEntry a, SpecEntry b, SpecEntry c, SpecEntry d, SpecEntry e, SpecEntry f)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d), std::move(e), std::move(f)} {}
  PartitionSpec(SpecEntry a, SpecEntry b, SpecEntry c, SpecEntry d, SpecEntry e, SpecEntry f, SpecEntry g)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d), std::move(e), std::move(f), std::move(g)} {}
  PartitionSpec(SpecEntry a, SpecEntry b, SpecEntry c, SpecEntry d, SpecEntry e, SpecEntry f, SpecEntry g, SpecEntry h)
      : entries_{std::move(a), std::move(b), std::move(c), std::move(d),
                 std::move(e), std::move(f), std::move(g), std::move(h)} {}
  explicit PartitionSpec(std::vector<SpecEntry> entries) : entries_(std::move(entries)) {}

  const std::vector<SpecEntry>& entries() const { return entries_; }
  /// Number of entries given (not counting omitted trailing ones).
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  /// Entry of tensor dim `dim`: unsharded beyond the entries given.
  const SpecEntry& entry(int64_t dim) const;
  /// "P('dp', None, ('tp', 'ep'))"; "P()" when empty.
  std::string to_string() const;
  /// Per tensor dim of a rank-`ndim` tensor, the mesh dims that shard it, major to minor.
  /// Throws ShardingError naming `call`, the spec and the mesh when an axis is unknown or used
  /// twice, or there are more entries than tensor dims.
  std::vector<std::vector<int64_t>> resolve(const MeshSpec& mesh, int64_t ndim, std::string_view call) const;

 private:
  std::vector<SpecEntry> entries_;
};

/// JAX's and torch_xla's spellings, opted into as Python code imports them (`from
/// jax.sharding import PartitionSpec as P`): after `using namespace tessera::spec_names;` a spec
/// reads as in Python, `P("data", None)`, `P({"dp", "tp"}, None)`, `P()`. Not in namespace
/// tessera itself, where P would collide with the `P` that DTensor code often names a Partial
/// placement. X11's headers define a macro None (0L): where it is defined, spec_names has no
/// None (write std::nullopt); where X11 comes after this header, #undef None after it, or `None`
/// would read as axis index 0.
namespace spec_names {
using P = PartitionSpec;
#ifndef None
inline constexpr std::nullopt_t None = std::nullopt;
#endif
}  // namespace spec_names

/// Equal entries once trailing unsharded ones are dropped: P('dp') == P('dp', None).
bool operator==(const PartitionSpec& a, const PartitionSpec& b);

/// The layout of a tensor of `shape` and `dtype` sharded by `spec` over `mesh`: Shard(d) on every
/// mesh dim the spec names for tensor dim d, in the spec's order (its shard order), Replicate on
/// the others. Uneven dims follow chunk semantics, and a tuple nests (docs/reference.md,
/// tessera/sharding): the first axis chunks the dim, the next chunks each piece again. That is
/// not a flat split: 4 rows over ('dp', 'tp') with dp=2, tp=3 are [1, 1, 0, 1, 1, 0], where JAX
/// refuses the spec and torch_xla pads to [1, 1, 1, 1, 0, 0]; they agree whenever the sizes
/// divide.
/// Throws ShardingError as PartitionSpec::resolve does.
Layout layout_from_spec(const Shape& shape, DType dtype, const MeshSpec& mesh, const PartitionSpec& spec);

/// The spec of a layout: per tensor dim the names of the mesh dims that shard it, in its shard
/// order, one entry per tensor dim. layout_from_spec(spec_from_layout(l)) == l for every layout
/// without Partial and without explicit piece sizes (a spec names axes, not sizes: explicit
/// sizes are dropped). Throws ShardingError naming the layout when it holds a Partial.
PartitionSpec spec_from_layout(const Layout& layout);

}  // namespace tessera
