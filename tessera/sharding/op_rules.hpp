#pragma once
// The registry of sharding rules and the rules of the built-in op families. Pure.
//
// A rule maps the input layouts and the op's typed non-tensor arguments (OpArgs, what its
// dispatch cache keys on) to candidate proposals. Built-in ops are named by OpId (the op table,
// ops/op_table.hpp), user ops by strings. Built-in rules are added by one explicit call,
// register_builtin_rules (static self-registration is dropped by linkers).
#include <cstdint>
#include <functional>
#include <atomic>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/ops/op_table.hpp>
#include <tessera/sharding/op_args.hpp>
#include <tessera/sharding/op_rule.hpp>

namespace tessera TESSERA_API {

/// Candidates of an op for these inputs and arguments.
using ShardingRuleFn =
    std::function<std::vector<OpProposal>(const std::vector<const Layout*>& inputs, const OpArgs& args)>;

/// Op ids to rules: ids [0, kBuiltinOpCount) are the OpIds of the op table, user ops get the ids
/// after them by name. Thread-safe; every change bumps version() so caches can drop decisions
/// made under an older rule.
class RuleRegistry {
 public:
  RuleRegistry();
  /// The id of the op named `op` (a built-in's name gives its OpId), registering a new name
  /// (without a rule).
  int id(std::string_view op);
  static int id(OpId op) { return static_cast<int>(op); }
  /// Sets (or replaces) the rule of an op.
  void set(int id, ShardingRuleFn rule);
  void set(OpId op, ShardingRuleFn rule) { set(id(op), std::move(rule)); }
  void set(std::string_view op, ShardingRuleFn rule) { set(id(op), std::move(rule)); }
  /// The rule of an id, or null when the op has none.
  std::shared_ptr<const ShardingRuleFn> rule(int id) const;
  std::string name(int id) const;
  /// Bumped by every set(); lock-free, for the dispatch hot path.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, int> ids_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<const ShardingRuleFn>> rules_;
  std::atomic<uint64_t> version_{0};
};

/// How an elementwise op treats Partial inputs (which Partial rows its rule has).
enum class Linearity : uint8_t {
  none,       ///< reduce first
  additive,   ///< add, sub: all inputs P(sum) -> P(sum) (or all P(avg)); not with a scalar
  scaling,    ///< mul: one input P(sum/avg), the rest R -> P; also with a scalar
  dividing,   ///< div: numerator P(sum/avg), denominator R or a scalar -> P
  negating,   ///< neg: P(sum/avg) kept, P(max) <-> P(min)
  monotone,   ///< non-decreasing everywhere (relu, exp, sigmoid, tanh, clamp): P(max), P(min) kept
  max_like,   ///< maximum: P(max) on any inputs, the rest R -> P(max)
  min_like,   ///< minimum
  selecting,  ///< where: condition R, both values the same Partial -> that Partial
};

/// The factor rule of an elementwise op over inputs of these shapes with numpy broadcasting
/// (a unit dim against a longer one has no factor). Throws ValueError naming `op` and the shapes
/// if they do not broadcast.
FactorRule elementwise_factor_rule(const std::vector<Shape>& shapes, Linearity linearity, ScalarSlot scalar_slot,
                                   std::string_view op);

/// The factor rule of torch.matmul on these shapes (1-d operands, broadcast batch dims).
FactorRule matmul_factor_rule(const Shape& a, const Shape& b, std::string_view op);

/// The rules of the TESSERA_SHAPE_OPS family (sharding/shape_rules.cpp).
void register_shape_rules(RuleRegistry& registry);

/// The rules of the TESSERA_INDEX_OPS family (sharding/index_rules.cpp).
void register_index_rules(RuleRegistry& registry);

/// Adds the rule of every op of the op table to `registry`. Throws InternalError if an OpId is
/// left without one.
void register_builtin_rules(RuleRegistry& registry);

}  // namespace tessera
