#pragma once
// Pricing the steps of a redistribute plan (plan.hpp) on classes of ranks (rank_classes.hpp):
// what the busiest rank receives, what all ranks receive, the messages, and whether a single
// collective does the step at all, at a cost that does not grow with the rank count. Pure.
#include <cstdint>
#include <optional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera TESSERA_API {
namespace detail {

/// Rounds of a latency-optimal collective over k ranks (recursive halving or doubling):
/// ceil(log2 k).
int64_t rounds(int64_t k);

/// The step changing `before` into `after` (one mesh; the placements differ at one mesh dim, or
/// at several with the same kind of change, done by one call over their flattened group),
/// priced; nullopt when no single collective does it (the blocks do not line up, or the change
/// is not one of the step kinds).
std::optional<PlanStep> mesh_dim_step(const Layout& before, const Layout& after);

/// The direct block exchange from `before` to `after` (neither Partial; the meshes may differ),
/// priced: each rank receives the part of its block it does not hold, one message per source
/// block it takes pieces of.
PlanStep exchange_step(const Layout& before, const Layout& after);

/// Elements of its block of `dst` that a rank of dst's mesh does not hold in `at` (a Partial
/// counts as holding its block; a rank outside at's mesh holds nothing): the busiest rank's and
/// the sum over ranks; and the most blocks of `at` (replicas one) other than its own that a rank
/// needs pieces of.
struct Lacking {
  int64_t most = 0;
  int64_t total = 0;
  int64_t sources = 0;
};
/// With `bound_only`, lower bounds found on some ranks of each class that crossing shard orders
/// would otherwise list one by one (rank_classes' sample): what a search bound needs, cheaply.
Lacking lacking(const Layout& at, const Layout& dst, bool bound_only = false);

/// Bytes the rank at `coordinate` of the step's mesh receives from other ranks in `step` (a
/// step on one mesh: every kind but an exchange between two meshes).
int64_t received_at(const PlanStep& step, const std::vector<int64_t>& coordinate);

}  // namespace detail
}  // namespace tessera
