#pragma once
// The registry of sharding rules and the rules of the built-in op families. Pure.
//
// A rule maps the input layouts and the op's non-tensor arguments (encoded as int64s by the op,
// the same encoding its dispatch cache keys on) to candidate proposals. Built-in rules are added
// by one explicit call, register_builtin_rules (static self-registration is dropped by linkers).
#include <cstdint>
#include <functional>
#include <atomic>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <tessera/core/shape.hpp>
#include <tessera/sharding/op_rule.hpp>

namespace tessera {

/// Candidates of an op for these inputs and arguments.
using ShardingRuleFn =
    std::function<std::vector<OpProposal>(const std::vector<const Layout*>& inputs, const DimVector& args)>;

/// Op names to ids to rules. Thread-safe; every change bumps version() so caches can drop
/// decisions made under an older rule.
class RuleRegistry {
 public:
  /// The id of `op`, registering the name (without a rule) if new.
  int id(std::string_view op);
  /// Sets (or replaces) the rule of `op`.
  void set(std::string_view op, ShardingRuleFn rule);
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

/// Argument encoding of elementwise ops: args[0] says where a scalar operand sits.
enum ScalarSlot : int64_t { kNoScalar = 0, kScalarRight = 1, kScalarLeft = 2 };

/// The factor rule of an elementwise op over inputs of these shapes with numpy broadcasting
/// (a unit dim against a longer one has no factor). Throws ValueError naming `op` and the shapes
/// if they do not broadcast.
FactorRule elementwise_factor_rule(const std::vector<Shape>& shapes, Linearity linearity, int64_t scalar_slot,
                                   std::string_view op);

/// The factor rule of torch.matmul on these shapes (1-d operands, broadcast batch dims).
FactorRule matmul_factor_rule(const Shape& a, const Shape& b, std::string_view op);

/// Adds the rules of every built-in op (elementwise, reductions, matmul/bmm/linear, softmax,
/// norms, embedding, class_pick for cross_entropy, views, cat, stack) to `registry`.
void register_builtin_rules(RuleRegistry& registry);

}  // namespace tessera
