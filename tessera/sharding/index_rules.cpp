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

// Per dim of the inputs at `which` (all of one rank): a shared factor when every shape agrees
// and the dim is not `dim`, else none.
Factors shared_factors(FactorRuleBuilder& b, const std::vector<const Layout*>& in, const std::vector<size_t>& which,
                       int64_t dim) {
  const int64_t nd = in[which.front()]->ndim();
  Factors factors;
  for (int64_t k = 0; k < nd; ++k) {
    bool agree = k != dim;
    for (size_t i : which) agree = agree && in[i]->global_shape()[k] == in[which.front()]->global_shape()[k];
    factors.push_back(agree ? b.shardable() : Factor::none());
  }
  return factors;
}

// x's dims with `dim` replaced by `f`.
Factors with_dim(Factors dims, int64_t dim, Factor f) {
  dims[static_cast<size_t>(dim)] = f;
  return dims;
}

}  // namespace

void register_index_rules(RuleRegistry& registry) {
  // gather(x, index) -> index-shaped: x's dim whole; index's dim (and a dim where the sizes
  // differ) its own factor passing to the output. Selecting: x's Partial passes.
  registry.set(OpId::gather, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim;
    FactorRuleBuilder b;
    const Factors x = shared_factors(b, in, {0, 1}, dim);  // x's dim stays whole
    const Factors index = with_dim(x, dim, b.shardable());
    return factor_proposals(b.input(x).input(index).output(index).keep_partial({0}, kSelecting).build(), in, "gather");
  });
  // scatter / scatter_add(x, index, src) -> x-shaped: the dim whole everywhere; other dims shared
  // where x, index and src agree. scatter selects (any Partial of x and src together passes),
  // scatter_add adds (sum/avg pass).
  for (OpId op : {OpId::scatter, OpId::scatter_add}) {
    registry.set(op, [op](const std::vector<const Layout*>& in, const OpArgs& args) {
      FactorRuleBuilder b;
      const Factors dims = shared_factors(b, in, {0, 1, 2}, std::get<DimArgs>(args).dim);
      b.input(dims).input(dims).input(dims).output(dims);
      if (op == OpId::scatter) b.keep_partial({0, 2}, kSelecting);
      else b.keep_partial({0, 2}, kAdding);
      // x-shaped: the whole dims are not size-1 broadcasts, which the factor shape would assume.
      return factor_proposals(b.build(), in, in[0]->global_shape());
    });
  }
  // index_select(x, index) -> x's shape with dim sized like index: x's dim whole, index's one dim
  // passes to the output's dim (a sharded index gives a sharded result).
  registry.set(OpId::index_select, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim;
    FactorRuleBuilder b;
    const Factors x = with_dim(b.shardable(in[0]->ndim()), dim, Factor::none());
    const Factor i = b.shardable();
    b.input(x).input({i}).output(with_dim(x, dim, i)).keep_partial({0}, kSelecting);
    return factor_proposals(b.build(), in, "index_select");
  });
  // index_add(x, index, src) -> x-shaped: the dim whole in x and the output; index's dim and src's
  // dim are one factor missing from the output, a contraction: each rank adds the rows it holds
  // (P(sum)), and x joins that Partial once (additive, like linear's bias).
  registry.set(OpId::index_add, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim;
    FactorRuleBuilder b;
    const Factors x = with_dim(b.shardable(in[0]->ndim()), dim, Factor::none());
    const Factor i = b.shardable();
    b.input(x, /*additive=*/true).input({i}).input(with_dim(x, dim, i)).output(x).keep_partial({0, 2}, kAdding);
    return factor_proposals(b.build(), in, in[0]->global_shape());
  });
}

}  // namespace tessera
