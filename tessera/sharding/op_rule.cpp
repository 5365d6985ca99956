#include <tessera/sharding/op_rule.hpp>

#include <algorithm>
#include <limits>
#include <map>

#include <tessera/core/error.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera {

namespace {

// Index of factor f in an operand's dims, or -1.
int64_t dim_of(const std::vector<int>& dims, int f) {
  const auto it = std::find(dims.begin(), dims.end(), f);
  return it == dims.end() ? -1 : it - dims.begin();
}

template <class T>
T at_or(const std::vector<T>& values, size_t i, T fallback) {
  return i < values.size() ? values[i] : fallback;
}

}  // namespace

std::string ShardingRow::to_string() const { return tessera::to_string(inputs) + " -> " + tessera::to_string(output); }

std::string OpStrategy::to_string() const {
  std::string text = "[";
  for (size_t i = 0; i < inputs.size(); ++i) text.append(i ? ", " : "").append(tessera::to_string(inputs[i]));
  return text + "] -> " + tessera::to_string(output);
}

FactorRule FactorRule::parse(std::string_view equation) {
  const auto arrow = equation.find("->");
  TESSERA_CHECK(arrow != std::string_view::npos, ValueError, "FactorRule::parse", "equation '", equation,
                "' has no '->'; expected e.g. 'mk,kn->mn'");
  FactorRule rule;
  std::map<char, int> ids;
  const auto operand = [&](std::string_view text, bool is_output) {
    std::vector<int> dims;
    for (char c : text) {
      if (c == ' ') continue;
      if (c == '1') {
        dims.push_back(kNoFactor);
        continue;
      }
      TESSERA_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'), ValueError, "FactorRule::parse", "equation '",
                    equation, "' has '", std::string(1, c), "'; factors are letters, '1' is a dim without one");
      auto it = ids.find(c);
      if (it == ids.end()) {
        TESSERA_CHECK(!is_output, ValueError, "FactorRule::parse", "equation '", equation, "': output factor '",
                      std::string(1, c), "' appears in no input");
        it = ids.emplace(c, static_cast<int>(ids.size())).first;
      }
      TESSERA_CHECK(std::find(dims.begin(), dims.end(), it->second) == dims.end(), ValueError, "FactorRule::parse",
                    "equation '", equation, "' repeats factor '", std::string(1, c), "' in one operand");
      dims.push_back(it->second);
    }
    return dims;
  };
  std::string_view lhs = equation.substr(0, arrow);
  while (true) {
    const auto comma = lhs.find(',');
    rule.inputs.push_back(operand(lhs.substr(0, comma), false));
    if (comma == std::string_view::npos) break;
    lhs.remove_prefix(comma + 1);
  }
  rule.output = operand(equation.substr(arrow + 2), true);
  rule.num_factors = static_cast<int>(ids.size());
  return rule;
}

std::string FactorRule::to_string() const {
  const auto letters = [](const std::vector<int>& dims) {
    std::string text;
    for (int f : dims) text += f == kNoFactor ? '1' : static_cast<char>('a' + f % 26);
    return text;
  };
  std::string text;
  for (size_t i = 0; i < inputs.size(); ++i) text.append(i ? "," : "").append(letters(inputs[i]));
  return text + "->" + letters(output);
}

std::vector<ShardingRow> factor_rows(const FactorRule& rule) {
  const size_t n = rule.inputs.size();
  std::vector<ShardingRow> rows;
  rows.push_back({Placements(n, Replicate{}), Replicate{}});
  for (int f = 0; f < rule.num_factors; ++f) {
    if (at_or(rule.replicated, static_cast<size_t>(f), false)) continue;
    bool in_any_input = false;
    for (const auto& dims : rule.inputs) in_any_input |= dim_of(dims, f) >= 0;
    if (!in_any_input) continue;
    const int64_t out_dim = dim_of(rule.output, f);
    const Placement contracted = Partial{at_or(rule.contraction, static_cast<size_t>(f), ReduceOp::sum)};
    ShardingRow row{{}, out_dim >= 0 ? Placement{Shard{out_dim}} : contracted};
    for (size_t i = 0; i < n; ++i) {
      const int64_t d = dim_of(rule.inputs[i], f);
      if (d >= 0) row.inputs.push_back(Shard{d});
      else if (out_dim < 0 && at_or(rule.additive, i, false)) row.inputs.push_back(contracted);
      else row.inputs.push_back(Replicate{});
    }
    rows.push_back(std::move(row));
  }
  for (const auto& row : rule.linear) rows.push_back(row);
  return rows;
}

std::vector<OpStrategy> expand_rows(const std::vector<ShardingRow>& rows, int64_t mesh_ndim) {
  return expand_rows(std::vector<std::vector<ShardingRow>>(static_cast<size_t>(mesh_ndim), rows));
}

std::vector<OpStrategy> expand_rows(const std::vector<std::vector<ShardingRow>>& rows_per_dim) {
  size_t n = 0;
  for (const auto& rows : rows_per_dim)
    if (!rows.empty()) n = rows.front().inputs.size();
  std::vector<OpStrategy> out{OpStrategy{std::vector<Placements>(n), {}}};
  for (const auto& rows : rows_per_dim) {
    std::vector<OpStrategy> next;
    next.reserve(out.size() * rows.size());
    for (const auto& partial : out) {
      for (const auto& row : rows) {
        OpStrategy s = partial;
        for (size_t i = 0; i < n; ++i) s.inputs[i].push_back(row.inputs[i]);
        s.output.push_back(row.output);
        next.push_back(std::move(s));
      }
    }
    out = std::move(next);
  }
  return out;
}

Shape factor_output_shape(const FactorRule& rule, const std::vector<const Layout*>& inputs, std::string_view op) {
  TESSERA_CHECK(rule.inputs.size() == inputs.size(), ValueError, op, "rule ", rule.to_string(), " takes ",
                rule.inputs.size(), " inputs, got ", inputs.size());
  std::vector<int64_t> size(static_cast<size_t>(rule.num_factors), -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& dims = rule.inputs[i];
    const Shape& shape = inputs[i]->global_shape();
    TESSERA_CHECK(static_cast<int64_t>(dims.size()) == shape.size(), ValueError, op, "input ", i, " has shape ",
                  shape.to_string(), " but rule ", rule.to_string(), " gives it ", dims.size(), " dims");
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == kNoFactor) continue;
      auto& s = size[static_cast<size_t>(dims[d])];
      if (s < 0) s = shape[static_cast<int64_t>(d)];
      std::string shapes;
      for (const auto* in : inputs) shapes.append(shapes.empty() ? "" : ", ").append(in->global_shape().to_string());
      TESSERA_CHECK(s == shape[static_cast<int64_t>(d)], ValueError, op, "shapes ", shapes, " do not match rule ",
                    rule.to_string(), ": dim ", d, " of input ", i, " has size ", shape[static_cast<int64_t>(d)],
                    ", expected ", s);
    }
  }
  Shape out = Shape::filled(static_cast<int64_t>(rule.output.size()), 1);
  for (size_t j = 0; j < rule.output.size(); ++j)
    if (rule.output[j] != kNoFactor) out[static_cast<int64_t>(j)] = size[static_cast<size_t>(rule.output[j])];
  return out;
}

namespace {

// Layouts already built for one operand, by placements: strategies share most operand
// placements (a 3-d mesh gives ~125 strategies over ~27 placements per operand), and a layout
// is immutable, so equal ones are built once and shared.
using LayoutMemo = std::vector<std::vector<std::pair<Placements, Layout>>>;  // per operand (inputs, then output)

OpProposal build_proposal(const FactorRule& rule, const std::vector<const Layout*>& inputs, const OpStrategy& strategy,
                          const Shape& output_shape, LayoutMemo* memo) {
  // Operands built before with the same placements come from the memo; only the rest are built.
  std::vector<const Layout*> known(inputs.size() + 1, nullptr);
  bool all_known = memo != nullptr;
  for (size_t slot = 0; memo && slot <= inputs.size(); ++slot) {
    const Placements& p = slot < inputs.size() ? strategy.inputs[slot] : strategy.output;
    for (const auto& [placements, layout] : (*memo)[slot])
      if (placements == p) {
        known[slot] = &layout;
        break;
      }
    all_known = all_known && known[slot];
  }
  if (all_known) {
    OpProposal proposal;
    for (size_t i = 0; i < inputs.size(); ++i) proposal.inputs.push_back(*known[i]);
    proposal.output = *known[inputs.size()];
    return proposal;
  }
  const MeshSpec& mesh = inputs.front()->mesh();
  const int64_t mesh_ndim = mesh.ndim();
  // Mesh dims sharding each factor, in ascending order.
  std::vector<std::vector<int64_t>> sharding(static_cast<size_t>(rule.num_factors));
  const auto note = [&](const std::vector<int>& dims, const Placements& placements) {
    for (int64_t m = 0; m < mesh_ndim; ++m)
      if (const auto* s = std::get_if<Shard>(&placements[static_cast<size_t>(m)]); s && dims[s->dim] != kNoFactor) {
        auto& list = sharding[static_cast<size_t>(dims[s->dim])];
        if (std::find(list.begin(), list.end(), m) == list.end()) list.push_back(m);
      }
  };
  for (size_t i = 0; i < inputs.size(); ++i) note(rule.inputs[i], strategy.inputs[i]);
  note(rule.output, strategy.output);
  // Shard order and sizes per factor: from the first input already sharded over the same mesh dims.
  std::vector<std::vector<int64_t>> order(sharding.size());
  std::vector<std::vector<int64_t>> sizes(sharding.size());
  for (size_t f = 0; f < sharding.size(); ++f) {
    auto& mine = sharding[f];
    std::sort(mine.begin(), mine.end());
    order[f] = mine;
    if (mine.empty()) continue;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t d = dim_of(rule.inputs[i], static_cast<int>(f));
      if (d < 0) continue;
      std::vector<int64_t> theirs = inputs[i]->shard_order(d);
      std::sort(theirs.begin(), theirs.end());
      if (theirs != mine) continue;
      order[f] = inputs[i]->shard_order(d);
      if (inputs[i]->has_explicit_sizes(d)) sizes[f] = inputs[i]->piece_sizes(d);
      break;
    }
  }
  const auto layout_of = [&](const std::vector<int>& dims, const Shape& shape, DType dtype, const Placements& p) {
    ShardOrder orders;
    ShardSizes explicit_sizes;
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == kNoFactor) continue;
      const auto f = static_cast<size_t>(dims[d]);
      bool sharded = false;
      for (const auto& placement : p) sharded |= is_shard(placement, static_cast<int64_t>(d));
      if (!sharded) continue;
      // Only a non-default (unsorted) order needs an entry: most are the default.
      if (!std::is_sorted(order[f].begin(), order[f].end())) orders[static_cast<int64_t>(d)] = order[f];
      if (!sizes[f].empty()) explicit_sizes[static_cast<int64_t>(d)] = sizes[f];
    }
    return Layout(shape, dtype, mesh, p, orders, explicit_sizes);
  };
  // An operand's layout depends only on its own placements: the factors it carries are sharded
  // by exactly the mesh dims its placements name.
  const auto operand = [&](size_t slot, const std::vector<int>& dims, const Shape& shape, DType dtype,
                           const Placements& p) {
    if (known[slot]) return *known[slot];
    Layout built = layout_of(dims, shape, dtype, p);
    if (memo) (*memo)[slot].emplace_back(p, built);
    return built;
  };
  OpProposal proposal;
  for (size_t i = 0; i < inputs.size(); ++i)
    proposal.inputs.push_back(
        operand(i, rule.inputs[i], inputs[i]->global_shape(), inputs[i]->dtype(), strategy.inputs[i]));
  proposal.output = operand(inputs.size(), rule.output, output_shape, inputs.front()->dtype(), strategy.output);
  return proposal;
}

}  // namespace

OpProposal factor_proposal(const FactorRule& rule, const std::vector<const Layout*>& inputs, const OpStrategy& strategy,
                           const Shape& output_shape) {
  return build_proposal(rule, inputs, strategy, output_shape, nullptr);
}

std::vector<OpProposal> factor_proposals(const FactorRule& rule, const std::vector<const Layout*>& inputs,
                                         std::string_view op) {
  return factor_proposals(rule, inputs, factor_output_shape(rule, inputs, op));
}

namespace {

// On a mesh dim of one rank every row holds the same data, so a row costs only the tie-break of
// the placements it changes there: keep the rows that change fewest inputs (ties among them stay
// for the search). A 3-d mesh with a unit dim prices a third to a quarter of the strategies.
void keep_closest_rows(std::vector<ShardingRow>& rows, const std::vector<const Layout*>& inputs, int64_t m) {
  const auto matches = [&](const ShardingRow& row) {
    int64_t n = 0;
    for (size_t i = 0; i < inputs.size(); ++i) n += inputs[i]->placements()[static_cast<size_t>(m)] == row.inputs[i];
    return n;
  };
  int64_t best = 0;
  for (const ShardingRow& row : rows) best = std::max(best, matches(row));
  std::erase_if(rows, [&](const ShardingRow& row) { return matches(row) < best; });
}

}  // namespace

std::vector<OpProposal> factor_proposals(const FactorRule& rule, const std::vector<const Layout*>& inputs,
                                         const Shape& output_shape) {
  // A row whose inputs are Partial or Replicate (a linearity row), none of the Partial ones
  // holding that Partial on its mesh dim, is never chosen: its Partials would be made from
  // Replicate (a local step after reaching Replicate), so the all-Replicate row is cheaper by at
  // least that step. Dropped per mesh dim: a matmul on a 3-d mesh without Partial inputs prices
  // 64 strategies instead of 512. (A contraction's additive bias is Partial beside Shards: kept.)
  const std::vector<ShardingRow> rows = factor_rows(rule);
  std::vector<std::vector<ShardingRow>> rows_per_dim;
  for (int64_t m = 0; m < inputs.front()->mesh().ndim(); ++m) {
    auto& kept = rows_per_dim.emplace_back();
    for (const ShardingRow& row : rows) {
      bool partial = false, held = false, sharded = false;
      for (size_t i = 0; i < inputs.size(); ++i) {
        sharded = sharded || is_shard(row.inputs[i]);
        if (!is_partial(row.inputs[i])) continue;
        partial = true;
        held = held || inputs[i]->placements()[static_cast<size_t>(m)] == row.inputs[i];
      }
      if (!partial || held || sharded) kept.push_back(row);
    }
    if (inputs.front()->mesh().shape()[m] == 1) keep_closest_rows(kept, inputs, m);
  }
  std::vector<OpProposal> proposals;
  LayoutMemo memo(inputs.size() + 1);
  for (const auto& strategy : expand_rows(rows_per_dim))
    proposals.push_back(build_proposal(rule, inputs, strategy, output_shape, &memo));
  return proposals;
}

Factor FactorRuleBuilder::shardable(ReduceOp contraction) {
  const Factor f(rule_.num_factors++);
  rule_.replicated.push_back(false);
  rule_.contraction.push_back(contraction);
  return f;
}

Factors FactorRuleBuilder::shardable(int64_t count, ReduceOp contraction) {
  Factors factors;
  for (int64_t i = 0; i < count; ++i) factors.push_back(shardable(contraction));
  return factors;
}

Factor FactorRuleBuilder::whole() {
  const Factor f = shardable();
  rule_.replicated.back() = true;
  return f;
}

FactorRuleBuilder& FactorRuleBuilder::make_whole(Factor factor) {
  if (!factor.is_none()) rule_.replicated[static_cast<size_t>(factor.id_)] = true;
  return *this;
}

FactorRuleBuilder& FactorRuleBuilder::input(Factors dims, bool additive) {
  std::vector<int> ids;
  for (Factor f : dims) ids.push_back(f.id_);
  rule_.inputs.push_back(std::move(ids));
  rule_.additive.resize(rule_.inputs.size() - 1, false);
  rule_.additive.push_back(additive);
  return *this;
}

FactorRuleBuilder& FactorRuleBuilder::output(Factors dims) {
  rule_.output.clear();
  for (Factor f : dims) rule_.output.push_back(f.id_);
  return *this;
}

FactorRuleBuilder& FactorRuleBuilder::keep_partial(Placements inputs, Placement output) {
  rule_.linear.push_back({std::move(inputs), output});
  return *this;
}

FactorRuleBuilder& FactorRuleBuilder::keep_partial(const std::vector<size_t>& partial_inputs, ReduceOp op) {
  Placements row(rule_.inputs.size(), Replicate{});
  for (size_t i : partial_inputs) row[i] = Partial{op};
  rule_.linear.push_back({std::move(row), Partial{op}});
  return *this;
}

FactorRuleBuilder& FactorRuleBuilder::keep_partial(const std::vector<size_t>& partial_inputs,
                                                   std::span<const ReduceOp> ops) {
  for (ReduceOp op : ops) keep_partial(partial_inputs, op);
  return *this;
}

double planned_cost(const Layout& from, const Layout& to) {
  PlanOptions options;
  options.allow_partial_destination = true;
  return plan(from, to, options).cost;
}

size_t cheapest_proposal(const std::vector<OpProposal>& proposals, const std::vector<const Layout*>& inputs,
                         const RedistributionCost& cost, std::string_view op, const RedistributionBound& bound) {
  constexpr double kUnreachable = std::numeric_limits<double>::infinity();
  // Strategies share input targets; plan each (input, target) once.
  std::vector<std::vector<std::pair<const Layout*, double>>> memo(inputs.size());
  const auto move_cost = [&](size_t i, const Layout& to) {
    if (to == *inputs[i]) return 0.0;
    for (const auto& [seen, c] : memo[i])
      if (*seen == to) return c;
    double c = kUnreachable;
    try {
      c = cost(*inputs[i], to);
    } catch (const ShardingError&) {
    }
    memo[i].emplace_back(&to, c);
    return c;
  };
  // Without a bound every proposal is priced in order; with one, in order of its bounded total.
  std::vector<std::vector<std::pair<const Layout*, double>>> bounds(inputs.size());  // each (input, target) once
  const auto move_bound = [&](size_t i, const Layout& to) {
    for (const auto& [seen, b] : bounds[i])
      if (*seen == to) return b;
    const double b = bound(*inputs[i], to);
    bounds[i].emplace_back(&to, b);
    return b;
  };
  std::vector<double> floor(proposals.size(), 0.0);
  std::vector<size_t> order(proposals.size());
  for (size_t p = 0; p < proposals.size(); ++p) {
    order[p] = p;
    if (bound)
      for (size_t i = 0; i < inputs.size(); ++i)
        if (!(proposals[p].inputs[i] == *inputs[i])) floor[p] += move_bound(i, proposals[p].inputs[i]);
  }
  if (bound) std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return floor[a] < floor[b]; });
  // A margin for rounding: the bound and the cost add the same terms in different orders.
  const auto cannot_beat = [](double floor_total, double best) { return floor_total > best + 1e-9 * (1 + best); };

  size_t best = proposals.size();
  double best_cost = kUnreachable;
  for (size_t p : order) {
    if (cannot_beat(floor[p], best_cost)) break;  // every later floor is at least as high
    if (floor[p] >= best_cost && p > best) continue;  // at best a tie, and ties go to the first
    double total = 0;
    for (size_t i = 0; i < inputs.size() && total <= best_cost; ++i) total += move_cost(i, proposals[p].inputs[i]);
    if (total < best_cost || (total == best_cost && total < kUnreachable && p < best)) {
      best = p;
      best_cost = total;
    }
  }
  if (best == proposals.size()) {
    std::string described;
    for (const auto* in : inputs) described.append(described.empty() ? "" : ", ").append(in->to_string());
    TESSERA_CHECK(false, ShardingError, op, "no sharding strategy is reachable from inputs ", described);
  }
  return best;
}

}  // namespace tessera
