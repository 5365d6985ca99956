// Sharding rules of the indexing ops (TESSERA_INDEX_OPS in ops/op_table.hpp). Pure.
//
// The indexed dim is needed whole wherever it holds positions (x's dim, and the output's when it
// is x-shaped): index values are global positions along it. Other dims are shared factors where
// x, index and src agree in size, so they stay sharded together; a dim where the sizes differ
// (torch lets index be smaller than x) is needed whole everywhere, since a piece of index would
// not line up with the same piece of x. Index tensors are never Partial.
#include <tessera/sharding/op_rules.hpp>

#include <span>

namespace tessera {

namespace {

constexpr ReduceOp kSelecting[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
constexpr ReduceOp kAdding[] = {ReduceOp::sum, ReduceOp::avg};

// Per dim of `shapes.front()` (all of one rank): a factor id when every shape agrees and the dim is
// not `dim`, else kNoFactor.
std::vector<int> shared_factors(const std::vector<const Layout*>& in, const std::vector<size_t>& which, int64_t dim) {
  const int64_t nd = in[which.front()]->ndim();
  std::vector<int> factors;
  for (int64_t k = 0; k < nd; ++k) {
    bool agree = k != dim;
    for (size_t i : which) agree = agree && in[i]->global_shape()[k] == in[which.front()]->global_shape()[k];
    factors.push_back(agree ? static_cast<int>(k) : kNoFactor);
  }
  return factors;
}

// Rows in which the value operands (the inputs at `values`) are one Partial and the index is R.
void partial_rows(FactorRule& rule, size_t inputs, const std::vector<size_t>& values, std::span<const ReduceOp> ops) {
  for (ReduceOp op : ops) {
    Placements row(inputs, Replicate{});
    for (size_t i : values) row[i] = Partial{op};
    rule.linear.push_back({row, Partial{op}});
  }
}

// The proposals of `rule` with an output of x's shape (its whole dims are not size-1 broadcasts,
// which factor_proposals would assume).
std::vector<OpProposal> x_shaped(const FactorRule& rule, const std::vector<const Layout*>& in) {
  std::vector<OpProposal> proposals;
  for (const auto& strategy : expand_rows(factor_rows(rule), in.front()->mesh().ndim()))
    proposals.push_back(factor_proposal(rule, in, strategy, in.front()->global_shape()));
  return proposals;
}

}  // namespace

void register_index_rules(RuleRegistry& registry) {
  // gather(x, index) -> index-shaped: x's dim whole; index's dim (and a dim where the sizes
  // differ) its own factor passing to the output. Selecting: x's Partial passes.
  registry.set(OpId::gather, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim, nd = in[0]->ndim();
    FactorRule rule;
    rule.num_factors = static_cast<int>(2 * nd);
    rule.inputs.push_back(shared_factors(in, {0, 1}, dim));
    std::vector<int> index = rule.inputs[0];
    index[static_cast<size_t>(dim)] = static_cast<int>(nd + dim);  // x's dim stays whole
    rule.inputs.push_back(index);
    rule.output = index;
    partial_rows(rule, 2, {0}, kSelecting);
    return factor_proposals(rule, in, "gather");
  });
  // scatter / scatter_add(x, index, src) -> x-shaped: the dim whole everywhere; other dims shared
  // where x, index and src agree. scatter selects (any Partial of x and src together passes),
  // scatter_add adds (sum/avg pass).
  for (OpId op : {OpId::scatter, OpId::scatter_add}) {
    registry.set(op, [op](const std::vector<const Layout*>& in, const OpArgs& args) {
      const int64_t dim = std::get<DimArgs>(args).dim;
      FactorRule rule;
      rule.num_factors = static_cast<int>(in[0]->ndim());
      const std::vector<int> factors = shared_factors(in, {0, 1, 2}, dim);
      rule.inputs = {factors, factors, factors};
      rule.output = factors;
      if (op == OpId::scatter)
        partial_rows(rule, 3, {0, 2}, kSelecting);
      else
        partial_rows(rule, 3, {0, 2}, kAdding);
      return x_shaped(rule, in);
    });
  }
  // index_select(x, index) -> x's shape with dim sized like index: x's dim whole, index's one dim
  // passes to the output's dim (a sharded index gives a sharded result).
  registry.set(OpId::index_select, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim, nd = in[0]->ndim();
    FactorRule rule;
    rule.num_factors = static_cast<int>(nd + 1);
    std::vector<int> x;
    for (int64_t k = 0; k < nd; ++k) x.push_back(k == dim ? kNoFactor : static_cast<int>(k));
    std::vector<int> out = x;
    out[static_cast<size_t>(dim)] = static_cast<int>(nd);
    rule.inputs = {x, {static_cast<int>(nd)}};
    rule.output = out;
    partial_rows(rule, 2, {0}, kSelecting);
    return factor_proposals(rule, in, "index_select");
  });
  // index_add(x, index, src) -> x-shaped: the dim whole in x and the output; index's dim and src's
  // dim are one factor missing from the output, a contraction: each rank adds the rows it holds
  // (P(sum)), and x joins that Partial once (additive, like linear's bias).
  registry.set(OpId::index_add, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim, nd = in[0]->ndim();
    FactorRule rule;
    rule.num_factors = static_cast<int>(nd + 1);
    std::vector<int> x;
    for (int64_t k = 0; k < nd; ++k) x.push_back(k == dim ? kNoFactor : static_cast<int>(k));
    std::vector<int> src = x;
    src[static_cast<size_t>(dim)] = static_cast<int>(nd);
    rule.inputs = {x, {static_cast<int>(nd)}, src};
    rule.output = x;
    rule.additive = {true, false, false};
    partial_rows(rule, 3, {0, 2}, kAdding);
    return x_shaped(rule, in);
  });
}

}  // namespace tessera
