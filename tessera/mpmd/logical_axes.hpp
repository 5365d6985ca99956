#pragma once
// Logical axis names (multimesh.jax / Flax's axis rules): a model names its tensor dims ("batch",
// "embed", "heads", "mlp", "vocab") and a rule table, per task, maps those names to mesh axes.
// The same model code then runs under any parallel plan: only the rules change.
#include <string>
#include <utility>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/spec/partition_spec.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

/// Rules in priority order: logical name -> mesh axes (major to minor; empty: unsharded).
/// Example: `{{"batch", {"dp"}}, {"mlp", {"tp"}}, {"heads", {"tp"}}, {"embed", {}}}`.
using LogicalRules = std::vector<std::pair<std::string, std::vector<std::string>>>;

/// The PartitionSpec of tensor dims named `logical` on `mesh`: per dim, the first rule for its
/// name whose axes all exist in the mesh and are not taken by an earlier dim (Flax's
/// logical_to_mesh_axes); unsharded when none applies (an empty name: unsharded). Pure.
PartitionSpec logical_to_spec(const std::vector<std::string>& logical, const LogicalRules& rules, const MeshSpec& mesh);

/// The rules in force on this rank until the scope ends (scopes nest; a task's rules are in force
/// while its function runs).
class LogicalAxes {
 public:
  explicit LogicalAxes(LogicalRules rules);
  ~LogicalAxes();
  LogicalAxes(const LogicalAxes&) = delete;
  LogicalAxes& operator=(const LogicalAxes&) = delete;
};

/// The rules of the innermost LogicalAxes scope (empty outside any).
const LogicalRules& current_logical_rules();

/// with_sharding_constraint by logical dim names under the rules in force: x redistributed (the
/// planner moves only what must move) to logical_to_spec's spec on x's mesh. Throws ShardingError
/// naming the names and x's layout when their count is not x's rank.
DTensor with_sharding_constraint(const DTensor& x, const std::vector<std::string>& logical);

}  // namespace mpmd
}  // namespace tessera
