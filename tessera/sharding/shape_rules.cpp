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

// One input whose dims are `in` and output dims `out`, the Partials of `partials` kept.
FactorRule copying_rule(FactorRuleBuilder& b, const Factors& in, const Factors& out, std::span<const ReduceOp> partials) {
  return b.input(in).output(out).keep_partial({0}, partials).build();
}

// flip (ShapeArgs: the flipped dims) and roll (ShapeArgs: a shift per dim): the touched dims are
// gathered. A sharded flipped dim could instead stay sharded with the shards exchanged in reverse
// order (rank i's block goes to rank k-1-i); a Replicate requirement is simpler and acceptable
// for now.
ShardingRuleFn permuting(OpId op, bool by_shift) {
  return [op, by_shift](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    FactorRuleBuilder b;
    const Factors x = b.shardable(inputs.front()->ndim());
    const DimVector& values = std::get<ShapeArgs>(args).shape;
    if (by_shift) {
      for (int64_t d = 0; d < values.size(); ++d)
        if (values[d] != 0) b.make_whole(x[static_cast<size_t>(d)]);
    } else {
      for (int64_t d : values) b.make_whole(x[static_cast<size_t>(d)]);
    }
    return factor_proposals(copying_rule(b, x, x, kCopyingOps), inputs, op_name(op));
  };
}

// tril, triu: elementwise given the global row and column, which the kernel takes from its block
// offsets; so every dim stays sharded and nothing moves, Partials included (zeros are the identity
// of every reduce op here, and a kept element is a copy).
ShardingRuleFn triangle(OpId op) {
  return [op](const std::vector<const Layout*>& inputs, const OpArgs&) {
    FactorRuleBuilder b;
    const Factors x = b.shardable(inputs.front()->ndim());
    return factor_proposals(copying_rule(b, x, x, kCopyingOps), inputs, op_name(op));
  };
}

// repeat (ShapeArgs: the repeats, at least one per dim): new leading dims and repeated dims are
// whole; a dim repeated once passes through.
std::vector<OpProposal> repeat_rule(const std::vector<const Layout*>& inputs, const OpArgs& args) {
  const Layout& x = *inputs.front();
  const DimVector& repeats = std::get<ShapeArgs>(args).shape;
  const int64_t nd = x.ndim(), lead = repeats.size() - nd;
  FactorRuleBuilder b;
  Factors in, out_dims(static_cast<size_t>(lead), Factor::none());
  Shape out;
  for (int64_t i = 0; i < lead; ++i) out.push_back(repeats[i]);
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t r = repeats[lead + d];
    const Factor f = r == 1 ? b.shardable() : Factor::none();
    in.push_back(f);
    out_dims.push_back(f);
    out.push_back(r * x.global_shape()[d]);
  }
  return factor_proposals(copying_rule(b, in, out_dims, kCopyingOps), inputs, out);
}

// pad (PadArgs): padded or cropped dims are whole. Constant fill under P(avg), P(max), P(min)
// gives the fill again; under P(sum) only a zero fill does.
std::vector<OpProposal> pad_rule(const std::vector<const Layout*>& inputs, const OpArgs& args) {
  const Layout& x = *inputs.front();
  const auto& a = std::get<PadArgs>(args);
  const bool keeps_sum = a.mode != 0 || a.value.to_double() == 0;
  std::vector<ReduceOp> partials(std::begin(kCopyingOps) + (keeps_sum ? 0 : 1), std::end(kCopyingOps));
  FactorRuleBuilder b;
  Factors dims;
  Shape out = x.global_shape();
  for (int64_t d = 0; d < x.ndim(); ++d) {
    const bool padded = a.before[d] != 0 || a.after[d] != 0;
    dims.push_back(padded ? Factor::none() : b.shardable());
    out[d] += a.before[d] + a.after[d];
  }
  return factor_proposals(copying_rule(b, dims, dims, partials), inputs, out);
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
