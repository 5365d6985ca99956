// Sharding rules of the shape ops that copy (TESSERA_SHAPE_OPS in ops/op_table.hpp). Pure.
//
// Each is a factor rule over the input's dims: a dim the op does not touch keeps its factor and
// passes through sharded; a touched dim is needed whole (flip, roll: a replicated factor; pad,
// repeat, whose touched dims change size: no factor). Every op here copies elements (or zeros
// them, tril/triu), so each Partial passes through unchanged, except a constant pad with a
// non-zero fill under P(sum) (every rank would add the fill).
#include <tessera/sharding/op_rules.hpp>

#include <iterator>
#include <span>

namespace tessera {

namespace {

constexpr ReduceOp kCopyingOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

std::vector<int> identity_factors(int64_t nd) {
  std::vector<int> dims;
  for (int64_t d = 0; d < nd; ++d) dims.push_back(static_cast<int>(d));
  return dims;
}

// One input, its dims as factors 0..nd-1, the Partials of `partials` kept.
FactorRule copying_rule(int64_t nd, std::span<const ReduceOp> partials) {
  FactorRule rule;
  rule.num_factors = static_cast<int>(nd);
  rule.inputs.push_back(identity_factors(nd));
  rule.output = identity_factors(nd);
  rule.replicated.assign(static_cast<size_t>(nd), false);
  for (ReduceOp op : partials) rule.linear.push_back({{Partial{op}}, Partial{op}});
  return rule;
}

// Proposals of a rule whose output shape is not the factors' (pad and repeat resize dims).
std::vector<OpProposal> proposals_with_shape(const FactorRule& rule, const std::vector<const Layout*>& inputs,
                                             const Shape& output_shape) {
  std::vector<OpProposal> proposals;
  for (const auto& strategy : expand_rows(factor_rows(rule), inputs.front()->mesh().ndim()))
    proposals.push_back(factor_proposal(rule, inputs, strategy, output_shape));
  return proposals;
}

// flip (ShapeArgs: the flipped dims) and roll (ShapeArgs: a shift per dim): the touched dims are
// gathered. A sharded flipped dim could instead stay sharded with the shards exchanged in reverse
// order (rank i's block goes to rank k-1-i); a Replicate requirement is simpler and acceptable
// for now.
ShardingRuleFn permuting(OpId op, bool by_shift) {
  return [op, by_shift](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    const int64_t nd = inputs.front()->ndim();
    FactorRule rule = copying_rule(nd, kCopyingOps);
    const DimVector& values = std::get<ShapeArgs>(args).shape;
    if (by_shift) {
      for (int64_t d = 0; d < values.size(); ++d)
        if (values[d] != 0) rule.replicated[static_cast<size_t>(d)] = true;
    } else {
      for (int64_t d : values) rule.replicated[static_cast<size_t>(d)] = true;
    }
    return factor_proposals(rule, inputs, op_name(op));
  };
}

// tril, triu: elementwise given the global row and column, which the kernel takes from its block
// offsets; so every dim stays sharded and nothing moves, Partials included (zeros are the identity
// of every reduce op here, and a kept element is a copy).
ShardingRuleFn triangle(OpId op) {
  return [op](const std::vector<const Layout*>& inputs, const OpArgs&) {
    return factor_proposals(copying_rule(inputs.front()->ndim(), kCopyingOps), inputs, op_name(op));
  };
}

// repeat (ShapeArgs: the repeats, at least one per dim): new leading dims and repeated dims are
// whole; a dim repeated once passes through.
std::vector<OpProposal> repeat_rule(const std::vector<const Layout*>& inputs, const OpArgs& args) {
  const Layout& x = *inputs.front();
  const DimVector& repeats = std::get<ShapeArgs>(args).shape;
  const int64_t nd = x.ndim(), lead = repeats.size() - nd;
  FactorRule rule = copying_rule(nd, kCopyingOps);
  rule.output.assign(static_cast<size_t>(lead), kNoFactor);
  Shape out;
  for (int64_t i = 0; i < lead; ++i) out.push_back(repeats[i]);
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t r = repeats[lead + d];
    if (r != 1) rule.inputs[0][static_cast<size_t>(d)] = kNoFactor;
    rule.output.push_back(r != 1 ? kNoFactor : static_cast<int>(d));
    out.push_back(r * x.global_shape()[d]);
  }
  return proposals_with_shape(rule, inputs, out);
}

// pad (PadArgs): padded or cropped dims are whole. Constant fill under P(avg), P(max), P(min)
// gives the fill again; under P(sum) only a zero fill does.
std::vector<OpProposal> pad_rule(const std::vector<const Layout*>& inputs, const OpArgs& args) {
  const Layout& x = *inputs.front();
  const auto& a = std::get<PadArgs>(args);
  const bool keeps_sum = a.mode != 0 || a.value.to_double() == 0;
  std::vector<ReduceOp> partials(std::begin(kCopyingOps) + (keeps_sum ? 0 : 1), std::end(kCopyingOps));
  FactorRule rule = copying_rule(x.ndim(), partials);
  Shape out = x.global_shape();
  for (int64_t d = 0; d < x.ndim(); ++d) {
    if (a.before[d] == 0 && a.after[d] == 0) continue;
    rule.inputs[0][static_cast<size_t>(d)] = kNoFactor;
    rule.output[static_cast<size_t>(d)] = kNoFactor;
    out[d] += a.before[d] + a.after[d];
  }
  return proposals_with_shape(rule, inputs, out);
}

}  // namespace

void register_shape_rules(RuleRegistry& registry) {
  registry.set(OpId::flip, permuting(OpId::flip, false));
  registry.set(OpId::roll, permuting(OpId::roll, true));
  registry.set(OpId::tril, triangle(OpId::tril));
  registry.set(OpId::triu, triangle(OpId::triu));
  registry.set(OpId::repeat, repeat_rule);
  registry.set(OpId::pad, pad_rule);
}

}  // namespace tessera
