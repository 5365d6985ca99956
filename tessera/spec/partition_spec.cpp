// PartitionSpec and its translation to and from Layout: a spec entry's tuple of axes is the
// layout's shard order of that tensor dim, so the two carry the same information.
#include <tessera/spec/partition_spec.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>

namespace tessera {

std::string AxisRef::to_string() const { return is_index() ? std::to_string(index_) : "'" + *name_ + "'"; }

int64_t AxisRef::resolve(const MeshSpec& mesh, std::string_view call, std::string_view spec) const {
  std::string axes;
  for (const auto& n : mesh.names()) axes.append(axes.empty() ? "'" : ", '").append(n + "'");
  if (is_index()) {
    TESSERA_CHECK(index_ >= 0 && index_ < mesh.ndim(), ShardingError, call, spec, " names mesh axis ", index_,
                  ", but ", mesh.to_string(), " has ", mesh.ndim(), " axes (", axes, ")");
    return index_;
  }
  const auto& names = mesh.names();
  const auto it = std::find(names.begin(), names.end(), *name_);
  TESSERA_CHECK(it != names.end(), ShardingError, call, spec, " names mesh axis '", *name_, "', which ",
                mesh.to_string(), " does not have (its axes: ", axes, ")");
  return it - names.begin();
}

std::string SpecEntry::to_string() const {
  if (axes_.empty()) return "None";
  if (axes_.size() == 1) return axes_.front().to_string();
  std::string text = "(";
  for (size_t i = 0; i < axes_.size(); ++i) text.append(i ? ", " : "").append(axes_[i].to_string());
  return text + ")";
}

const SpecEntry& PartitionSpec::entry(int64_t dim) const {
  static const SpecEntry unsharded(std::nullopt);
  return dim >= 0 && dim < size() ? entries_[static_cast<size_t>(dim)] : unsharded;
}

std::string PartitionSpec::to_string() const {
  std::string text = "P(";
  for (size_t i = 0; i < entries_.size(); ++i) text.append(i ? ", " : "").append(entries_[i].to_string());
  return text + ")";
}

bool operator==(const PartitionSpec& a, const PartitionSpec& b) {
  const int64_t n = std::max(a.size(), b.size());
  for (int64_t d = 0; d < n; ++d)
    if (!(a.entry(d) == b.entry(d))) return false;
  return true;
}

std::vector<std::vector<int64_t>> PartitionSpec::resolve(const MeshSpec& mesh, int64_t ndim,
                                                         std::string_view call) const {
  const std::string text = to_string();
  TESSERA_CHECK(size() <= ndim, ShardingError, call, text, " has ", size(), " entries for a tensor of ", ndim,
                " dims; give at most one per dim");
  std::vector<std::vector<int64_t>> dims(static_cast<size_t>(ndim));
  std::vector<int64_t> user(static_cast<size_t>(mesh.ndim()), -1);  // mesh dim -> tensor dim naming it
  for (int64_t d = 0; d < size(); ++d)
    for (const AxisRef& axis : entries_[static_cast<size_t>(d)].axes()) {
      const int64_t m = axis.resolve(mesh, call, text);
      const int64_t earlier = user[static_cast<size_t>(m)];
      TESSERA_CHECK(earlier < 0, ShardingError, call, text, " uses mesh axis '", mesh.names()[static_cast<size_t>(m)],
                    "' twice (", earlier == d ? "within dim " + std::to_string(d)
                                               : "for dims " + std::to_string(earlier) + " and " + std::to_string(d),
                    "); an axis splits at most one dim once, on ", mesh.to_string());
      user[static_cast<size_t>(m)] = d;
      dims[static_cast<size_t>(d)].push_back(m);
    }
  return dims;
}

Layout layout_from_spec(const Shape& shape, DType dtype, const MeshSpec& mesh, const PartitionSpec& spec) {
  const auto dims = spec.resolve(mesh, shape.size(), "layout_from_spec");
  Placements placements(static_cast<size_t>(mesh.ndim()), Replicate{});
  ShardOrder order;
  for (int64_t d = 0; d < shape.size(); ++d) {
    const auto& by = dims[static_cast<size_t>(d)];
    for (int64_t m : by) placements[static_cast<size_t>(m)] = Shard{d};
    if (!by.empty()) order[d] = by;
  }
  return Layout(shape, dtype, mesh, std::move(placements), std::move(order));
}

PartitionSpec spec_from_layout(const Layout& layout) {
  TESSERA_CHECK(!layout.has_partial(), ShardingError, "spec_from_layout", layout.to_string(),
                " holds a Partial: a PartitionSpec names only sharded and replicated dims; reduce it first ",
                "(redistribute the Partial mesh dims to Replicate or Shard)");
  std::vector<SpecEntry> entries;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    std::vector<AxisRef> axes;
    for (int64_t m : layout.shard_order(d)) axes.emplace_back(layout.mesh().names()[static_cast<size_t>(m)]);
    entries.emplace_back(std::move(axes));
  }
  return PartitionSpec(std::move(entries));
}

}  // namespace tessera
