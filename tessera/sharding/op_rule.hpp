#pragma once
// Sharding rules of ops as data (docs/architecture.md: the life of one DTensor op). Pure: metadata only.
//
// A rule lists candidate strategies: the placements every input must have and the placements of
// the output they give. Most ops are written in factor (einsum-like) notation: every operand dim
// carries a factor; a factor in the output passes through as Shard, a factor missing from the
// output is a contraction and yields Partial, and some factors must stay replicated. A rule is
// expanded per mesh dim into rows (always including the all-Replicate row) and the rows into
// strategies (their product over mesh dims); the dispatcher picks the cheapest one.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera TESSERA_API {

/// A factor id in a FactorRule that means "no factor": the dim stays unsharded (a broadcast dim
/// of size 1, a new dim, a dim the op needs whole).
inline constexpr int kNoFactor = -1;

/// The choice on one mesh dim: the placement of every input and of the output.
/// Example: `(S(1), S(0)) -> P(sum)` (a matmul contraction).
struct ShardingRow {
  Placements inputs;
  Placement output;
  std::string to_string() const;
  friend bool operator==(const ShardingRow&, const ShardingRow&) = default;
};

/// A rule in factor notation. Value type.
/// Constraints: factor ids in [0, num_factors) or kNoFactor; per-factor and per-input vectors
/// sized to num_factors and the input count (shorter ones are padded with the defaults).
/// Example: `mk,kn->mn` (matmul); `vd,i->id` (embedding: the vocabulary v is contracted).
struct FactorRule {
  std::vector<std::vector<int>> inputs;  ///< per input, per dim: its factor
  std::vector<int> output;               ///< per output dim: its factor
  int num_factors = 0;
  std::vector<bool> replicated;          ///< per factor: must never be sharded (default false)
  std::vector<ReduceOp> contraction;     ///< per factor missing from the output: the Partial it gives (default sum)
  std::vector<bool> additive;            ///< per input: added into the output (a bias), so it must be
                                         ///< Partial exactly when the output is (default false)
  std::vector<ShardingRow> linear;       ///< extra rows that keep Partial inputs Partial (linearity)

  /// Parses "mk,kn->mn": one letter per dim, '1' for kNoFactor, inputs separated by commas.
  /// Throws ValueError naming the equation if it is malformed (a letter repeated in one operand,
  /// an output letter missing from every input).
  static FactorRule parse(std::string_view equation);
  /// The equation form ("mk,kn->mn"); factors are lettered a, b, c, ... in id order.
  std::string to_string() const;
};

/// A factor of a rule under construction (FactorRuleBuilder). Factor::none() is a dim without
/// one: a size-1 broadcast, a new dim, or a dim the op needs whole but that ties to no other dim.
class Factor {
 public:
  static Factor none() { return Factor(); }
  bool is_none() const { return id_ == kNoFactor; }
  friend bool operator==(Factor, Factor) = default;

 private:
  friend class FactorRuleBuilder;
  explicit Factor(int id = kNoFactor) : id_(id) {}
  int id_;
};
using Factors = std::vector<Factor>;

/// Builds a FactorRule from factors named in code rather than numbered: make the factors, then
/// give every operand its dims. Built-in rules use it (sharding/op_rules.cpp).
/// Example, matmul "mk,kn->mn":
///   FactorRuleBuilder b; Factor m = b.shardable(), k = b.shardable(), n = b.shardable();
///   FactorRule rule = b.input({m, k}).input({k, n}).output({m, n}).build();
class FactorRuleBuilder {
 public:
  /// A factor that may be sharded: it passes through as Shard where the output has it, and where
  /// it does not it is contracted, giving Partial(contraction).
  Factor shardable(ReduceOp contraction = ReduceOp::sum);
  /// `count` shardable factors (the dims of an operand, in order).
  Factors shardable(int64_t count, ReduceOp contraction = ReduceOp::sum);
  /// A factor that must stay whole (replicated) on every operand carrying it.
  Factor whole();

  /// The next input's dims. `additive`: added into the output (a bias), so it must be Partial
  /// exactly when the output is.
  FactorRuleBuilder& input(Factors dims, bool additive = false);
  FactorRuleBuilder& output(Factors dims);
  /// A row keeping Partial inputs Partial (the op's linearity), e.g. `(P(sum), R) -> P(sum)`.
  FactorRuleBuilder& keep_partial(Placements inputs, Placement output);
  /// The row with the inputs at `partial_inputs` P(op), the others R, and the output P(op); the
  /// second form adds one such row per op of `ops`. Call after the last input().
  FactorRuleBuilder& keep_partial(const std::vector<size_t>& partial_inputs, ReduceOp op);
  FactorRuleBuilder& keep_partial(const std::vector<size_t>& partial_inputs, std::span<const ReduceOp> ops);

  /// Marks an existing factor whole after all (a dim the op's arguments say it needs whole).
  FactorRuleBuilder& make_whole(Factor factor);

  FactorRule build() const { return rule_; }

 private:
  FactorRule rule_;
};

/// One candidate of an op: the placements of every input and of the output.
/// Example: `(S(0), R) -> S(0)`.
struct OpStrategy {
  std::vector<Placements> inputs;
  Placements output;
  std::string to_string() const;
  friend bool operator==(const OpStrategy&, const OpStrategy&) = default;
};

/// The rows of one mesh dim: all-Replicate first, then one per shardable factor (Shard on every
/// operand dim carrying it; Partial(contraction) output when the output lacks it), then the
/// linear rows. Pure.
std::vector<ShardingRow> factor_rows(const FactorRule& rule);

/// Every combination of one row per mesh dim, the all-Replicate strategy first. Pure.
std::vector<OpStrategy> expand_rows(const std::vector<ShardingRow>& rows, int64_t mesh_ndim);
/// The same with each mesh dim's own rows (rows_per_dim[m] for mesh dim m). Pure.
std::vector<OpStrategy> expand_rows(const std::vector<std::vector<ShardingRow>>& rows_per_dim);

/// A candidate in layouts: the layout every input must have and the layout of the output (with
/// the first input's dtype as a stand-in; the dispatcher sets the kernel's).
struct OpProposal {
  std::vector<Layout> inputs;
  Layout output;
};

/// The output shape a factor rule gives: each output factor takes the size of the input dims
/// carrying it; kNoFactor output dims have size 1. Throws ValueError naming `op` and the shapes
/// if two input dims of one factor differ in size.
Shape factor_output_shape(const FactorRule& rule, const std::vector<const Layout*>& inputs, std::string_view op);

/// The layouts of `strategy`: every operand dim carrying one factor gets the same shard order
/// and piece sizes (taken from the first input already sharded that way, so explicit sizes
/// survive; else the default order and chunk sizes). Pure.
OpProposal factor_proposal(const FactorRule& rule, const std::vector<const Layout*>& inputs, const OpStrategy& strategy,
                           const Shape& output_shape);

/// Every strategy of a factor rule on the inputs' mesh, as layouts. Pure.
std::vector<OpProposal> factor_proposals(const FactorRule& rule, const std::vector<const Layout*>& inputs,
                                         std::string_view op);
/// The same with the output shape given (ops that resize a dim without a factor: pad, repeat,
/// cat; or whose whole output dims are not size-1 broadcasts: scatter).
std::vector<OpProposal> factor_proposals(const FactorRule& rule, const std::vector<const Layout*>& inputs,
                                         const Shape& output_shape);

/// Cost of moving a tensor from one layout to another; throws when no plan exists.
using RedistributionCost = std::function<double(const Layout& from, const Layout& to)>;

/// The planner's cost (plan() with Partial destinations allowed, as ops need for a bias). Pure.
double planned_cost(const Layout& from, const Layout& to);

/// A lower bound on a RedistributionCost, cheap to compute (plan_cost_lower_bound).
using RedistributionBound = std::function<double(const Layout& from, const Layout& to)>;

/// Index of the proposal whose input redistributions cost least in total (the first on ties).
/// Proposals the planner cannot reach are skipped. With `bound`, proposals are visited in order
/// of their bounded total and `cost` is asked only for those that could still win: the same
/// answer with far fewer plans. Throws ShardingError naming `op` and the inputs when none is
/// reachable.
size_t cheapest_proposal(const std::vector<OpProposal>& proposals, const std::vector<const Layout*>& inputs,
                         const RedistributionCost& cost, std::string_view op, const RedistributionBound& bound = {});

}  // namespace tessera
