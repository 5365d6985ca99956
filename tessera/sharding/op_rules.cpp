// Built-in sharding rules, one per row of the op table (ops/op_table.hpp). Each rule reads its
// op's typed arguments (sharding/op_args.hpp): elementwise ops ElementwiseArgs, reductions
// ReduceArgs, softmax/log_softmax/class_pick*/cat/stack DimArgs, norms NormArgs, reshape/expand/
// permute ShapeArgs, narrow NarrowArgs, the rest none.
#include <tessera/sharding/op_rules.hpp>

#include <algorithm>
#include <mutex>

#include <tessera/core/error.hpp>
#include <tessera/sharding/view_rules.hpp>

namespace tessera {

RuleRegistry::RuleRegistry() {
  for (int i = 0; i < kBuiltinOpCount; ++i) {
    names_.emplace_back(op_name(static_cast<OpId>(i)));
    ids_.emplace(names_.back(), i);
  }
  rules_.resize(static_cast<size_t>(kBuiltinOpCount));
}

int RuleRegistry::id(std::string_view op) {
  {
    std::shared_lock lock(mutex_);
    if (auto it = ids_.find(std::string(op)); it != ids_.end()) return it->second;
  }
  std::unique_lock lock(mutex_);
  auto [it, inserted] = ids_.emplace(std::string(op), static_cast<int>(names_.size()));
  if (inserted) {
    names_.emplace_back(op);
    rules_.emplace_back();
  }
  return it->second;
}

void RuleRegistry::set(int i, ShardingRuleFn rule) {
  std::unique_lock lock(mutex_);
  TESSERA_ASSERT(i >= 0 && static_cast<size_t>(i) < rules_.size(), "rule for unknown op id ", i);
  rules_[static_cast<size_t>(i)] = std::make_shared<const ShardingRuleFn>(std::move(rule));
  version_.fetch_add(1, std::memory_order_acq_rel);
}

std::shared_ptr<const ShardingRuleFn> RuleRegistry::rule(int id) const {
  std::shared_lock lock(mutex_);
  return id >= 0 && static_cast<size_t>(id) < rules_.size() ? rules_[static_cast<size_t>(id)] : nullptr;
}

std::string RuleRegistry::name(int id) const {
  std::shared_lock lock(mutex_);
  return id >= 0 && static_cast<size_t>(id) < names_.size() ? names_[static_cast<size_t>(id)] : "?";
}

namespace {

constexpr ReduceOp kLinearOps[] = {ReduceOp::sum, ReduceOp::avg};
constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string text;
  for (const auto& s : shapes) text += (text.empty() ? "" : ", ") + s.to_string();
  return text;
}

std::vector<ShardingRow> linear_rows(Linearity linearity, size_t n, ScalarSlot slot) {
  std::vector<ShardingRow> rows;
  const auto row = [&](std::vector<Placement> in, Placement out) { rows.push_back({std::move(in), out}); };
  const Placement R = Replicate{};
  switch (linearity) {
    case Linearity::none:
      break;
    case Linearity::additive:
      if (n == 2)
        for (ReduceOp op : kLinearOps) row({Partial{op}, Partial{op}}, Partial{op});
      break;
    case Linearity::scaling:
      for (ReduceOp op : kLinearOps) {
        if (n == 2) {
          row({Partial{op}, R}, Partial{op});
          row({R, Partial{op}}, Partial{op});
        } else if (n == 1 && slot != ScalarSlot::none) {
          row({Partial{op}}, Partial{op});
        }
      }
      break;
    case Linearity::dividing:
      for (ReduceOp op : kLinearOps) {
        if (n == 2) row({Partial{op}, R}, Partial{op});
        else if (n == 1 && slot == ScalarSlot::right) row({Partial{op}}, Partial{op});
      }
      break;
    case Linearity::negating:
      for (ReduceOp op : kLinearOps) row({Partial{op}}, Partial{op});
      row({Partial{ReduceOp::max}}, Partial{ReduceOp::min});
      row({Partial{ReduceOp::min}}, Partial{ReduceOp::max});
      break;
    case Linearity::monotone:
      for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) row({Partial{op}}, Partial{op});
      break;
    case Linearity::max_like:
    case Linearity::min_like: {
      const Placement P = Partial{linearity == Linearity::max_like ? ReduceOp::max : ReduceOp::min};
      if (n == 2) {
        row({P, P}, P);
        row({P, R}, P);
        row({R, P}, P);
      } else if (n == 1) {
        row({P}, P);
      }
      break;
    }
    case Linearity::selecting:
      if (n == 3)
        for (ReduceOp op : kAllOps) row({R, Partial{op}, Partial{op}}, Partial{op});
      break;
  }
  return rows;
}

ShardingRuleFn elementwise(OpId op, Linearity linearity) {
  return [op, linearity](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    std::vector<Shape> shapes;
    for (const auto* in : inputs) shapes.push_back(in->global_shape());
    const auto* elementwise_args = std::get_if<ElementwiseArgs>(&args);
    const ScalarSlot slot = elementwise_args ? elementwise_args->slot : ScalarSlot::none;
    return factor_proposals(elementwise_factor_rule(shapes, linearity, slot, op_name(op)), inputs, op_name(op));
  };
}

// Mean over unevenly sharded dims cannot be Partial(avg) (ranks average different counts): those
// contractions become Partial(sum) of local sums divided by the global count (the kernel's part).
void fix_uneven_mean(std::vector<OpProposal>& proposals, const DimVector& reduced) {
  for (auto& p : proposals) {
    const Layout& in = p.inputs.front();
    const MeshSpec& mesh = in.mesh();
    int64_t first = -1;
    bool even = true;
    for (int r : mesh.ranks()) {
      const Shape local = in.local_shape(mesh.coordinate_of(r));
      int64_t count = 1;
      for (int64_t d : reduced) count *= local[d];
      if (first < 0) first = count;
      even &= count == first && count > 0;
    }
    if (even) continue;
    Placements out = p.output.placements();
    bool changed = false;
    for (size_t m = 0; m < out.size(); ++m) {
      if (out[m] == Placement{Partial{ReduceOp::avg}} && in.placements()[m] != Placement{Partial{ReduceOp::avg}}) {
        out[m] = Partial{ReduceOp::sum};
        changed = true;
      }
    }
    if (changed) p.output = p.output.with_placements(out);
  }
}

enum class ReductionKind { sum, mean, prod, amax, amin, var, arg };

ShardingRuleFn reduction(OpId op_id, ReductionKind kind) {
  return [op_id, kind](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    const Layout& x = *inputs.front();
    const int64_t nd = x.ndim();
    const auto& reduce_args = std::get<ReduceArgs>(args);
    const bool keepdim = reduce_args.keepdim;
    const DimVector& reduced = reduce_args.dims;
    FactorRule rule;
    rule.num_factors = static_cast<int>(nd);
    rule.inputs.emplace_back();
    for (int64_t d = 0; d < nd; ++d) {
      rule.inputs[0].push_back(static_cast<int>(d));
      const bool is_reduced = std::find(reduced.begin(), reduced.end(), d) != reduced.end();
      if (!is_reduced) rule.output.push_back(static_cast<int>(d));
      else if (keepdim) rule.output.push_back(kNoFactor);
    }
    ReduceOp op = ReduceOp::sum;
    switch (kind) {
      case ReductionKind::mean: op = ReduceOp::avg; break;
      case ReductionKind::prod: op = ReduceOp::product; break;
      case ReductionKind::amax: op = ReduceOp::max; break;
      case ReductionKind::amin: op = ReduceOp::min; break;
      default: break;
    }
    rule.contraction.assign(static_cast<size_t>(nd), op);
    rule.replicated.assign(static_cast<size_t>(nd), false);
    if (kind == ReductionKind::var || kind == ReductionKind::arg)
      for (int64_t d : reduced) rule.replicated[static_cast<size_t>(d)] = true;
    if (kind == ReductionKind::sum || kind == ReductionKind::mean) {
      for (ReduceOp p : kLinearOps) rule.linear.push_back({{Partial{p}}, Partial{p}});
    } else if (kind != ReductionKind::var && kind != ReductionKind::arg) {
      rule.linear.push_back({{Partial{op}}, Partial{op}});
    }
    auto proposals = factor_proposals(rule, inputs, op_name(op_id));
    if (kind == ReductionKind::mean) fix_uneven_mean(proposals, reduced);
    return proposals;
  };
}

ShardingRuleFn factor_rule_of(OpId op, std::function<FactorRule(const std::vector<const Layout*>&, const OpArgs&)> make) {
  return [make = std::move(make), op](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    return factor_proposals(make(inputs, args), inputs, op_name(op));
  };
}

// All dims of an operand as factors 0..nd-1.
std::vector<int> identity_factors(int64_t nd) {
  std::vector<int> dims;
  for (int64_t d = 0; d < nd; ++d) dims.push_back(static_cast<int>(d));
  return dims;
}

FactorRule normalization_rule(const std::vector<const Layout*>& inputs, int64_t normalized, size_t extra_inputs) {
  const int64_t nd = inputs.front()->ndim();
  FactorRule rule;
  rule.num_factors = static_cast<int>(nd);
  rule.inputs.push_back(identity_factors(nd));
  rule.output = identity_factors(nd);
  rule.replicated.assign(static_cast<size_t>(nd), false);
  for (int64_t d = nd - normalized; d < nd; ++d) rule.replicated[static_cast<size_t>(d)] = true;
  for (size_t i = 0; i < extra_inputs; ++i) {
    std::vector<int> dims;
    for (int64_t d = nd - normalized; d < nd; ++d) dims.push_back(static_cast<int>(d));
    rule.inputs.push_back(dims);
  }
  return rule;
}

// cat and stack: every non-joined dim is shared; the joined dim stays whole; Partials of one op
// join into that Partial.
ShardingRuleFn joining(bool stacking) {
  return [stacking](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim;
    const int64_t nd = inputs.front()->ndim();
    FactorRule rule;
    rule.num_factors = static_cast<int>(nd);
    std::vector<int> dims = identity_factors(nd);
    if (!stacking) dims[static_cast<size_t>(dim)] = kNoFactor;
    rule.inputs.assign(inputs.size(), dims);
    rule.output = dims;
    if (stacking) rule.output.insert(rule.output.begin() + dim, kNoFactor);
    for (ReduceOp op : kAllOps) rule.linear.push_back({Placements(inputs.size(), Partial{op}), Partial{op}});
    std::vector<Shape> shapes;
    for (const auto* in : inputs) shapes.push_back(in->global_shape());
    const Shape out = joined_shape(shapes, dim, stacking).shape;
    std::vector<OpProposal> proposals;
    for (const auto& s : expand_rows(factor_rows(rule), inputs.front()->mesh().ndim()))
      proposals.push_back(factor_proposal(rule, inputs, s, out));
    return proposals;
  };
}

}  // namespace

FactorRule elementwise_factor_rule(const std::vector<Shape>& shapes, Linearity linearity, ScalarSlot scalar_slot,
                                   std::string_view op) {
  int64_t nd = 0;
  for (const auto& s : shapes) nd = std::max(nd, s.size());
  Shape out = Shape::filled(nd, 1);
  for (const auto& s : shapes) {
    for (int64_t d = 0; d < s.size(); ++d) {
      int64_t& o = out[d + nd - s.size()];
      TESSERA_CHECK(s[d] == o || s[d] == 1 || o == 1, ValueError, op, "shapes ", shapes_text(shapes),
                    " do not broadcast");
      if (o == 1) o = s[d];
    }
  }
  FactorRule rule;
  rule.num_factors = static_cast<int>(nd);
  rule.output = identity_factors(nd);
  for (const auto& s : shapes) {
    std::vector<int> dims;
    for (int64_t d = 0; d < s.size(); ++d) {
      const int64_t j = d + nd - s.size();
      dims.push_back(s[d] == out[j] ? static_cast<int>(j) : kNoFactor);
    }
    rule.inputs.push_back(std::move(dims));
  }
  rule.linear = linear_rows(linearity, shapes.size(), scalar_slot);
  return rule;
}

FactorRule matmul_factor_rule(const Shape& a, const Shape& b, std::string_view op) {
  TESSERA_CHECK(a.size() >= 1 && b.size() >= 1, ValueError, op, "operands of shapes ", a.to_string(), " and ",
                b.to_string(), " must have at least one dim");
  const int64_t ka = a[a.size() - 1], kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  TESSERA_CHECK(ka == kb, ValueError, op, "inner dims of ", a.to_string(), " and ", b.to_string(), " differ (", ka,
                " vs ", kb, ")");
  const int64_t a_batch = std::max<int64_t>(a.size() - 2, 0), b_batch = std::max<int64_t>(b.size() - 2, 0);
  const int64_t nb = std::max(a_batch, b_batch);
  Shape batch = Shape::filled(nb, 1);
  const auto fold = [&](const Shape& s, int64_t count) {
    for (int64_t d = 0; d < count; ++d) {
      int64_t& o = batch[d + nb - count];
      TESSERA_CHECK(s[d] == o || s[d] == 1 || o == 1, ValueError, op, "batch dims of ", a.to_string(), " and ",
                    b.to_string(), " do not broadcast");
      if (o == 1) o = s[d];
    }
  };
  fold(a, a_batch);
  fold(b, b_batch);
  const int M = static_cast<int>(nb), K = M + 1, N = M + 2;
  FactorRule rule;
  rule.num_factors = N + 1;
  const auto batch_dims = [&](const Shape& s, int64_t count) {
    std::vector<int> dims;
    for (int64_t d = 0; d < count; ++d) {
      const int64_t j = d + nb - count;
      dims.push_back(s[d] == batch[j] ? static_cast<int>(j) : kNoFactor);
    }
    return dims;
  };
  auto ad = batch_dims(a, a_batch), bd = batch_dims(b, b_batch);
  rule.output = identity_factors(nb);
  if (a.size() >= 2) {
    ad.push_back(M);
    rule.output.push_back(M);
  }
  ad.push_back(K);
  bd.push_back(K);
  if (b.size() >= 2) {
    bd.push_back(N);
    rule.output.push_back(N);
  }
  rule.inputs = {ad, bd};
  for (ReduceOp op : kLinearOps) {
    rule.linear.push_back({{Partial{op}, Replicate{}}, Partial{op}});
    rule.linear.push_back({{Replicate{}, Partial{op}}, Partial{op}});
  }
  return rule;
}

void register_builtin_rules(RuleRegistry& registry) {
  // Every elementwise row of the op table, by its linearity column.
#define TESSERA_REGISTER_ELEMENTWISE(name, dtype, linearity, ...) \
  registry.set(OpId::name, elementwise(OpId::name, Linearity::linearity));
  TESSERA_UNARY_OPS(TESSERA_REGISTER_ELEMENTWISE)
  TESSERA_BINARY_OPS(TESSERA_REGISTER_ELEMENTWISE)
  TESSERA_COMPARISON_OPS(TESSERA_REGISTER_ELEMENTWISE)
#undef TESSERA_REGISTER_ELEMENTWISE
  registry.set(OpId::logical_not, elementwise(OpId::logical_not, Linearity::none));
  registry.set(OpId::masked_fill, elementwise(OpId::masked_fill, Linearity::none));
  registry.set(OpId::where, elementwise(OpId::where, Linearity::selecting));
  registry.set(OpId::clamp, elementwise(OpId::clamp, Linearity::monotone));

  registry.set(OpId::sum, reduction(OpId::sum, ReductionKind::sum));
  registry.set(OpId::mean, reduction(OpId::mean, ReductionKind::mean));
  registry.set(OpId::prod, reduction(OpId::prod, ReductionKind::prod));
  registry.set(OpId::amax, reduction(OpId::amax, ReductionKind::amax));
  registry.set(OpId::amin, reduction(OpId::amin, ReductionKind::amin));
  registry.set(OpId::var, reduction(OpId::var, ReductionKind::var));
  registry.set(OpId::argmax, reduction(OpId::argmax, ReductionKind::arg));
  registry.set(OpId::argmin, reduction(OpId::argmin, ReductionKind::arg));

  for (OpId op : {OpId::matmul, OpId::bmm})
    registry.set(op, factor_rule_of(op, [op](const std::vector<const Layout*>& in, const OpArgs&) {
                   return matmul_factor_rule(in[0]->global_shape(), in[1]->global_shape(), op_name(op));
                 }));
  // linear: x "...i", weight "oi", bias "o" (added into the output, so Partial with it).
  registry.set(OpId::linear, factor_rule_of(OpId::linear,
                             [](const std::vector<const Layout*>& in, const OpArgs&) {
                               const int64_t nd = in[0]->ndim();
                               const int I = static_cast<int>(nd - 1), O = static_cast<int>(nd);
                               FactorRule rule;
                               rule.num_factors = O + 1;
                               rule.inputs.push_back(identity_factors(nd));
                               rule.inputs.push_back({O, I});
                               rule.output = identity_factors(nd - 1);
                               rule.output.push_back(O);
                               const bool bias = in.size() == 3;
                               if (bias) rule.inputs.push_back({O});
                               rule.additive = {false, false, bias};
                               for (ReduceOp op : kLinearOps) {
                                 const Placement P = Partial{op}, R = Replicate{};
                                 rule.linear.push_back({bias ? Placements{P, R, P} : Placements{P, R}, P});
                                 rule.linear.push_back({bias ? Placements{R, P, P} : Placements{R, P}, P});
                               }
                               return rule;
                             }));

  // einsum: its equation is its rule; multilinear, so one Partial operand among replicated ones
  // gives a Partial result.
  registry.set(OpId::einsum, factor_rule_of(OpId::einsum, [](const std::vector<const Layout*>& in, const OpArgs& args) {
                 FactorRule rule = FactorRule::parse(std::get<EquationArgs>(args).equation);
                 for (size_t i = 0; i < in.size(); ++i)
                   for (ReduceOp op : kLinearOps) {
                     Placements row(in.size(), Replicate{});
                     row[i] = Partial{op};
                     rule.linear.push_back({row, Partial{op}});
                   }
                 return rule;
               }));
  // softmax, log_softmax: the dim they normalise stays whole (a 0-d input has none).
  const auto along_dim = [](const std::vector<const Layout*>& in, const OpArgs& args) {
    FactorRule rule = normalization_rule(in, 0, 0);
    const int64_t dim = std::get<DimArgs>(args).dim;
    if (dim >= 0 && dim < static_cast<int64_t>(rule.replicated.size())) rule.replicated[static_cast<size_t>(dim)] = true;
    return rule;
  };
  registry.set(OpId::softmax, factor_rule_of(OpId::softmax, along_dim));
  registry.set(OpId::log_softmax, factor_rule_of(OpId::log_softmax, along_dim));
  const auto normalizing = [](const std::vector<const Layout*>& in, const OpArgs& args) {
    return normalization_rule(in, std::get<NormArgs>(args).normalized_ndim, in.size() - 1);
  };
  registry.set(OpId::layer_norm, factor_rule_of(OpId::layer_norm, normalizing));
  registry.set(OpId::rms_norm, factor_rule_of(OpId::rms_norm, normalizing));
  // embedding: weight "vd", indices "i..." -> "i...d"; a sharded vocabulary v is contracted: each
  // rank looks up the rows it holds and zeros the rest, a Partial(sum).
  registry.set(OpId::embedding, factor_rule_of(OpId::embedding,
                                [](const std::vector<const Layout*>& in, const OpArgs&) {
                                  const int64_t ni = in[1]->ndim();
                                  const int V = static_cast<int>(ni), D = V + 1;
                                  FactorRule rule;
                                  rule.num_factors = D + 1;
                                  rule.inputs = {{V, D}, identity_factors(ni)};
                                  rule.output = identity_factors(ni);
                                  rule.output.push_back(D);
                                  rule.linear.push_back({{Partial{ReduceOp::sum}, Replicate{}}, Partial{ReduceOp::sum}});
                                  return rule;
                                }));
  // class_pick (cross_entropy's target logit): logits [N, C, d...] and target [N, d...] -> the
  // logit of each target class; a sharded class dim gives a Partial(sum) (ranks pick what they hold).
  registry.set(OpId::class_pick, factor_rule_of(OpId::class_pick,
                                 [](const std::vector<const Layout*>& in, const OpArgs& args) {
                                   const int64_t nd = in[0]->ndim(), c = std::get<DimArgs>(args).dim;
                                   FactorRule rule;
                                   rule.num_factors = static_cast<int>(nd);
                                   rule.inputs.push_back(identity_factors(nd));
                                   std::vector<int> rest;
                                   for (int64_t d = 0; d < nd; ++d)
                                     if (d != c) rest.push_back(static_cast<int>(d));
                                   rule.inputs.push_back(rest);
                                   rule.output = rest;
                                   rule.linear.push_back(
                                       {{Partial{ReduceOp::sum}, Replicate{}}, Partial{ReduceOp::sum}});
                                   return rule;
                                 }));

  // Backward ops (autograd). embedding_backward: weight "vd" (its layout only), grad "i...d",
  // indices "i..." -> "vd": a sharded i is contracted (Partial(sum)), a sharded vocabulary keeps
  // the weight's sharding (each rank adds the rows it holds). Linear in the gradient.
  registry.set(
      OpId::embedding_backward,
      factor_rule_of(OpId::embedding_backward,
          [](const std::vector<const Layout*>& in, const OpArgs&) {
            const int64_t ni = in[2]->ndim();
            const int V = 0, D = 1;
            FactorRule rule;
            rule.num_factors = static_cast<int>(ni) + 2;
            std::vector<int> batch;
            for (int64_t d = 0; d < ni; ++d) batch.push_back(static_cast<int>(d) + 2);
            std::vector<int> grad = batch;
            grad.push_back(D);
            rule.inputs = {{V, D}, grad, batch};
            rule.output = {V, D};
            rule.linear.push_back({{Replicate{}, Partial{ReduceOp::sum}, Replicate{}}, Partial{ReduceOp::sum}});
            return rule;
          }));
  // class_pick_backward: logits "nc..." (its layout only), grad and target "n..." -> "nc...": the
  // gradient placed at each target class; a sharded class dim keeps the logits' sharding.
  registry.set(
      OpId::class_pick_backward,
      factor_rule_of(OpId::class_pick_backward,
          [](const std::vector<const Layout*>& in, const OpArgs& args) {
            const int64_t nd = in[0]->ndim(), c = std::get<DimArgs>(args).dim;
            FactorRule rule;
            rule.num_factors = static_cast<int>(nd);
            std::vector<int> rest;
            for (int64_t d = 0; d < nd; ++d)
              if (d != c) rest.push_back(static_cast<int>(d));
            rule.inputs = {identity_factors(nd), rest, rest};
            rule.output = identity_factors(nd);
            rule.linear.push_back({{Replicate{}, Partial{ReduceOp::sum}, Replicate{}}, Partial{ReduceOp::sum}});
            return rule;
          }));

  registry.set(OpId::reshape, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    return std::vector<OpProposal>{reshape_proposal(*in[0], std::get<ShapeArgs>(args).shape)};
  });
  registry.set(OpId::expand, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    return std::vector<OpProposal>{expand_proposal(*in[0], std::get<ShapeArgs>(args).shape)};
  });
  registry.set(OpId::permute, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    return std::vector<OpProposal>{permute_proposal(*in[0], std::get<ShapeArgs>(args).shape.vec())};
  });
  registry.set(OpId::narrow, [](const std::vector<const Layout*>& in, const OpArgs& args) {
    const auto& a = std::get<NarrowArgs>(args);
    return std::vector<OpProposal>{narrow_proposal(*in[0], a.dim, a.start, a.length)};
  });
  registry.set(OpId::cat, joining(false));
  registry.set(OpId::stack, joining(true));
  register_shape_rules(registry);
  register_index_rules(registry);

  for (int i = 0; i < kBuiltinOpCount; ++i)
    TESSERA_ASSERT(registry.rule(i) != nullptr, "op table row '", op_name(static_cast<OpId>(i)), "' has no sharding rule");
}

}  // namespace tessera
