#include <tessera/mpmd/logical_axes.hpp>

#include <algorithm>
#include <memory>

#include <tessera/core/error.hpp>
#include <tessera/mpmd/contexts.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/spec/mark_sharding.hpp>

namespace tessera::mpmd {

namespace {

std::vector<LogicalRules>& scopes() {
  return rank_local<std::vector<LogicalRules>>("tessera.mpmd.logical_axes");
}

}  // namespace

PartitionSpec logical_to_spec(const std::vector<std::string>& logical, const LogicalRules& rules, const MeshSpec& mesh) {
  std::vector<std::string> taken;
  std::vector<SpecEntry> entries;
  const auto& names = mesh.names();
  for (const std::string& name : logical) {
    SpecEntry entry(std::nullopt);
    for (const auto& [rule_name, axes] : rules) {
      if (name.empty() || rule_name != name) continue;
      const bool usable = std::all_of(axes.begin(), axes.end(), [&](const std::string& a) {
        return std::count(names.begin(), names.end(), a) && !std::count(taken.begin(), taken.end(), a);
      });
      if (!usable) continue;
      std::vector<AxisRef> refs(axes.begin(), axes.end());
      if (!refs.empty()) entry = SpecEntry(std::move(refs));
      taken.insert(taken.end(), axes.begin(), axes.end());
      break;
    }
    entries.push_back(std::move(entry));
  }
  return PartitionSpec(std::move(entries));
}

LogicalAxes::LogicalAxes(LogicalRules rules) { scopes().push_back(std::move(rules)); }
LogicalAxes::~LogicalAxes() { scopes().pop_back(); }

const LogicalRules& current_logical_rules() {
  static const LogicalRules none;
  const auto& stack = scopes();
  return stack.empty() ? none : stack.back();
}

DTensor with_sharding_constraint(const DTensor& x, const std::vector<std::string>& logical) {
  TESSERA_CHECK(x.defined() && static_cast<int64_t>(logical.size()) == x.ndim(), ShardingError,
                "with_sharding_constraint", logical.size(), " logical dim names for ",
                x.defined() ? x.layout().to_string() : "an undefined DTensor", "; give one per dim");
  if (transforms_ignored()) return x;
  return tessera::with_sharding_constraint(x, logical_to_spec(logical, current_logical_rules(), x.layout().mesh()));
}

}  // namespace tessera::mpmd
