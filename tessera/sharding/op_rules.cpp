// Built-in sharding rules, one per row of the op table (ops/op_table.hpp). Each rule reads its
// op's typed arguments (sharding/op_args.hpp): elementwise ops ElementwiseArgs, reductions
// ReduceArgs, softmax/log_softmax/class_pick*/cat/stack DimArgs, norms NormArgs, reshape/expand/
// permute ShapeArgs, narrow NarrowArgs, the rest none.
#include <tessera/sharding/op_rules.hpp>

#include <algorithm>
#include <mutex>
#include <optional>

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
  for (const auto& s : shapes) text.append(text.empty() ? "" : ", ").append(s.to_string());
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
    ReduceOp op = ReduceOp::sum;
    switch (kind) {
      case ReductionKind::mean: op = ReduceOp::avg; break;
      case ReductionKind::prod: op = ReduceOp::product; break;
      case ReductionKind::amax: op = ReduceOp::max; break;
      case ReductionKind::amin: op = ReduceOp::min; break;
      default: break;
    }
    // var and arg{max,min} need a reduced dim whole; the others contract it into Partial(op).
    const bool needs_whole = kind == ReductionKind::var || kind == ReductionKind::arg;
    FactorRuleBuilder b;
    Factors in, out;
    for (int64_t d = 0; d < nd; ++d) {
      const bool is_reduced = std::find(reduced.begin(), reduced.end(), d) != reduced.end();
      const Factor f = is_reduced && needs_whole ? b.whole() : b.shardable(op);
      in.push_back(f);
      if (!is_reduced) out.push_back(f);
      else if (keepdim) out.push_back(Factor::none());
    }
    b.input(in).output(out);
    if (kind == ReductionKind::sum || kind == ReductionKind::mean) b.keep_partial({0}, kLinearOps);
    else if (!needs_whole) b.keep_partial({0}, op);
    auto proposals = factor_proposals(b.build(), inputs, op_name(op_id));
    if (kind == ReductionKind::mean) fix_uneven_mean(proposals, reduced);
    return proposals;
  };
}

ShardingRuleFn factor_rule_of(OpId op, std::function<FactorRule(const std::vector<const Layout*>&, const OpArgs&)> make) {
  return [make = std::move(make), op](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    return factor_proposals(make(inputs, args), inputs, op_name(op));
  };
}

// layer_norm, rms_norm: x "...n" with the normalized trailing dims n whole, the affine inputs "n".
FactorRule normalization_rule(const std::vector<const Layout*>& inputs, int64_t normalized) {
  const int64_t nd = inputs.front()->ndim();
  FactorRuleBuilder b;
  Factors x;
  for (int64_t d = 0; d < nd; ++d) x.push_back(d >= nd - normalized ? b.whole() : b.shardable());
  b.input(x);
  const Factors trailing(x.end() - normalized, x.end());
  for (size_t i = 1; i < inputs.size(); ++i) b.input(trailing);
  return b.output(x).build();
}

// x's dims without `dim`.
Factors without(Factors dims, int64_t dim) {
  dims.erase(dims.begin() + dim);
  return dims;
}

// One factor per dim of an `nd`-d tensor, dim `whole_dim` whole (a softmax or loss runs over it).
Factors class_whole(FactorRuleBuilder& b, int64_t nd, int64_t whole_dim) {
  Factors dims;
  for (int64_t d = 0; d < nd; ++d) dims.push_back(d == whole_dim ? b.whole() : b.shardable());
  return dims;
}

// cat along a dim the inputs shard alike, when concatenating every rank's pieces gives a piece
// of the result per rank in rank order (a stencil restoring its boundary rows: [first row (rank
// 0's piece), interior, last row (the last rank's)]): the inputs stay as they are and the output
// is sharded with explicit sizes, the sum of the inputs' pieces. nullopt when the pieces do not
// line up (the factor strategies then move what must move).
std::optional<OpProposal> lined_up_cat(const std::vector<const Layout*>& inputs, int64_t dim, const Shape& shape) {
  const Layout& first = *inputs.front();
  if (first.shard_order(dim).empty()) return std::nullopt;
  std::vector<int64_t> sums(first.piece_sizes(dim).size(), 0);
  size_t last_piece = 0;  // the pieces, input by input, must come in rank order
  for (const Layout* in : inputs) {
    if (!(in->mesh() == first.mesh()) || in->placements() != first.placements()) return std::nullopt;
    for (int64_t d = 0; d < first.ndim(); ++d) {
      if (in->shard_order(d) != first.shard_order(d)) return std::nullopt;
      if (d != dim && in->piece_sizes(d) != first.piece_sizes(d)) return std::nullopt;
    }
    const auto& pieces = in->piece_sizes(dim);
    for (size_t p = 0; p < pieces.size(); ++p) {
      if (pieces[p] == 0) continue;
      if (p < last_piece) return std::nullopt;
      last_piece = p;
      sums[p] += pieces[p];
    }
  }
  ShardOrder order;
  ShardSizes sizes;
  for (int64_t d = 0; d < first.ndim(); ++d) {
    if (first.shard_order(d).empty()) continue;
    order[d] = first.shard_order(d);
    sizes[d] = d == dim ? sums : first.piece_sizes(d);
  }
  std::vector<Layout> same;
  for (const Layout* in : inputs) same.push_back(*in);
  return OpProposal{std::move(same), Layout(shape, first.dtype(), first.mesh(), first.placements(), order, sizes)};
}

// cat and stack: every non-joined dim is shared; the joined dim stays whole; Partials of one op
// join into that Partial. cat of lined-up shards keeps them (lined_up_cat).
ShardingRuleFn joining(bool stacking) {
  return [stacking](const std::vector<const Layout*>& inputs, const OpArgs& args) {
    const int64_t dim = std::get<DimArgs>(args).dim;
    FactorRuleBuilder b;
    Factors dims = b.shardable(inputs.front()->ndim());
    if (!stacking) dims[static_cast<size_t>(dim)] = Factor::none();
    std::vector<size_t> all;
    for (size_t i = 0; i < inputs.size(); ++i) {
      b.input(dims);
      all.push_back(i);
    }
    if (stacking) dims.insert(dims.begin() + dim, Factor::none());
    b.output(dims).keep_partial(all, kAllOps);
    std::vector<Shape> shapes;
    for (const auto* in : inputs) shapes.push_back(in->global_shape());
    const Shape shape = joined_shape(shapes, dim, stacking).shape;
    std::vector<OpProposal> proposals = factor_proposals(b.build(), inputs, shape);
    if (!stacking)
      if (auto kept = lined_up_cat(inputs, dim, shape)) proposals.insert(proposals.begin(), std::move(*kept));
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
  FactorRuleBuilder b;
  const Factors dims = b.shardable(nd);
  for (const auto& s : shapes) {
    Factors in;
    for (int64_t d = 0; d < s.size(); ++d) {
      const int64_t j = d + nd - s.size();
      in.push_back(s[d] == out[j] ? dims[static_cast<size_t>(j)] : Factor::none());
    }
    b.input(std::move(in));
  }
  b.output(dims);
  for (const auto& row : linear_rows(linearity, shapes.size(), scalar_slot)) b.keep_partial(row.inputs, row.output);
  return b.build();
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
  // "...mk,...kn->...mn" with broadcast batch dims; m (n) absent for a 1-d a (b).
  FactorRuleBuilder rule;
  const Factors batch_factors = rule.shardable(nb);
  const Factor m = rule.shardable(), k = rule.shardable(), n = rule.shardable();
  const auto batch_dims = [&](const Shape& s, int64_t count) {
    Factors dims;
    for (int64_t d = 0; d < count; ++d) {
      const int64_t j = d + nb - count;
      dims.push_back(s[d] == batch[j] ? batch_factors[static_cast<size_t>(j)] : Factor::none());
    }
    return dims;
  };
  Factors ad = batch_dims(a, a_batch), bd = batch_dims(b, b_batch), out = batch_factors;
  if (a.size() >= 2) {
    ad.push_back(m);
    out.push_back(m);
  }
  ad.push_back(k);
  bd.push_back(k);
  if (b.size() >= 2) {
    bd.push_back(n);
    out.push_back(n);
  }
  rule.input(ad).input(bd).output(out);
  for (ReduceOp op : kLinearOps) rule.keep_partial({0}, op).keep_partial({1}, op);
  return rule.build();
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
                               FactorRuleBuilder b;
                               const Factors x = b.shardable(in[0]->ndim());
                               const Factor i = x.back(), o = b.shardable();
                               Factors out(x.begin(), x.end() - 1);
                               out.push_back(o);
                               b.input(x).input({o, i});
                               std::vector<size_t> with_x{0}, with_weight{1};
                               if (in.size() == 3) {
                                 b.input({o}, /*additive=*/true);
                                 with_x.push_back(2);
                                 with_weight.push_back(2);
                               }
                               b.output(out);
                               for (ReduceOp op : kLinearOps) b.keep_partial(with_x, op).keep_partial(with_weight, op);
                               return b.build();
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
    const int64_t dim = std::get<DimArgs>(args).dim;
    FactorRuleBuilder b;
    Factors x;
    for (int64_t d = 0; d < in[0]->ndim(); ++d) x.push_back(d == dim ? b.whole() : b.shardable());
    return b.input(x).output(x).build();
  };
  registry.set(OpId::softmax, factor_rule_of(OpId::softmax, along_dim));
  registry.set(OpId::log_softmax, factor_rule_of(OpId::log_softmax, along_dim));
  const auto normalizing = [](const std::vector<const Layout*>& in, const OpArgs& args) {
    return normalization_rule(in, std::get<NormArgs>(args).normalized_ndim);
  };
  registry.set(OpId::layer_norm, factor_rule_of(OpId::layer_norm, normalizing));
  registry.set(OpId::rms_norm, factor_rule_of(OpId::rms_norm, normalizing));
  // embedding: weight "vd", indices "i..." -> "i...d"; a sharded vocabulary v is contracted: each
  // rank looks up the rows it holds and zeros the rest, a Partial(sum).
  registry.set(OpId::embedding, factor_rule_of(OpId::embedding,
                                [](const std::vector<const Layout*>& in, const OpArgs&) {
                                  FactorRuleBuilder b;
                                  const Factors indices = b.shardable(in[1]->ndim());
                                  const Factor v = b.shardable(), d = b.shardable();
                                  Factors out = indices;
                                  out.push_back(d);
                                  return b.input({v, d}).input(indices).output(out).keep_partial({0}, ReduceOp::sum).build();
                                }));
  // class_pick (cross_entropy's target logit): logits [N, C, d...] and target [N, d...] -> the
  // logit of each target class; a sharded class dim gives a Partial(sum) (ranks pick what they hold).
  registry.set(OpId::class_pick, factor_rule_of(OpId::class_pick,
                                 [](const std::vector<const Layout*>& in, const OpArgs& args) {
                                   FactorRuleBuilder b;
                                   const Factors logits = b.shardable(in[0]->ndim());
                                   const Factors rest = without(logits, std::get<DimArgs>(args).dim);
                                   return b.input(logits).input(rest).output(rest).keep_partial({0}, ReduceOp::sum).build();
                                 }));

  // cross_entropy (per-target losses in one pass): logits [N, C, d...] and target [N, d...] ->
  // [N, d...]; the class dim whole (the log-sum-exp runs over it), the rest shards with the target.
  registry.set(OpId::cross_entropy, factor_rule_of(OpId::cross_entropy,
                                    [](const std::vector<const Layout*>& in, const OpArgs& args) {
                                      FactorRuleBuilder b;
                                      const Factors logits = class_whole(b, in[0]->ndim(), std::get<DimArgs>(args).dim);
                                      const Factors rest = without(logits, std::get<DimArgs>(args).dim);
                                      return b.input(logits).input(rest).output(rest).build();
                                    }));

  // scaled_dot_product_attention: q "...le", k "...se", v "...sf", mask broadcast to "...ls" ->
  // "...lf". Batch/head dims and q's rows shard; the keys' sequence s and the features are whole
  // (the softmax runs over s; e and f are not contracted into a Partial through it).
  registry.set(OpId::scaled_dot_product_attention,
               factor_rule_of(OpId::scaled_dot_product_attention, [](const std::vector<const Layout*>& in, const OpArgs&) {
                 FactorRuleBuilder b;
                 const Factors batch = b.shardable(in[0]->ndim() - 2);
                 const Factor l = b.shardable(), s = b.whole(), e = b.whole(), f = b.whole();
                 const auto with = [&](Factor x, Factor y) {
                   Factors dims = batch;
                   dims.push_back(x);
                   dims.push_back(y);
                   return dims;
                 };
                 b.input(with(l, e)).input(with(s, e)).input(with(s, f));
                 if (in.size() == 4) {
                   const Factors scores = with(l, s);
                   const Shape& mask = in[3]->global_shape();
                   Factors dims;
                   for (int64_t d = 0; d < mask.size(); ++d) {
                     const int64_t j = d + static_cast<int64_t>(scores.size()) - mask.size();
                     const int64_t size = j < in[0]->ndim() - 1 ? in[0]->global_shape()[j] : in[1]->global_shape()[j - 1];
                     dims.push_back(mask[d] == size ? scores[static_cast<size_t>(j)] : Factor::none());
                   }
                   b.input(dims);
                 }
                 return b.output(with(l, f)).build();
               }));

  // Backward ops (autograd). embedding_backward: weight "vd" (its layout only), grad "i...d",
  // indices "i..." -> "vd": a sharded i is contracted (Partial(sum)), a sharded vocabulary keeps
  // the weight's sharding (each rank adds the rows it holds). Linear in the gradient.
  registry.set(
      OpId::embedding_backward,
      factor_rule_of(OpId::embedding_backward,
          [](const std::vector<const Layout*>& in, const OpArgs&) {
            FactorRuleBuilder b;
            const Factor v = b.shardable(), d = b.shardable();
            const Factors batch = b.shardable(in[2]->ndim());
            Factors grad = batch;
            grad.push_back(d);
            return b.input({v, d}).input(grad).input(batch).output({v, d}).keep_partial({1}, ReduceOp::sum).build();
          }));
  // class_pick_backward: logits "nc..." (its layout only), grad and target "n..." -> "nc...": the
  // gradient placed at each target class; a sharded class dim keeps the logits' sharding.
  registry.set(
      OpId::class_pick_backward,
      factor_rule_of(OpId::class_pick_backward,
          [](const std::vector<const Layout*>& in, const OpArgs& args) {
            FactorRuleBuilder b;
            const Factors logits = b.shardable(in[0]->ndim());
            const Factors rest = without(logits, std::get<DimArgs>(args).dim);
            return b.input(logits).input(rest).input(rest).output(logits).keep_partial({1}, ReduceOp::sum).build();
          }));

  // cross_entropy_backward: logits "nc..." (class dim whole), grad and target "n..." -> "nc...";
  // linear in the gradient.
  registry.set(
      OpId::cross_entropy_backward,
      factor_rule_of(OpId::cross_entropy_backward,
          [](const std::vector<const Layout*>& in, const OpArgs& args) {
            FactorRuleBuilder b;
            const Factors logits = class_whole(b, in[0]->ndim(), std::get<DimArgs>(args).dim);
            const Factors rest = without(logits, std::get<DimArgs>(args).dim);
            return b.input(logits).input(rest).input(rest).output(logits).keep_partial({1}, ReduceOp::sum).build();
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
