#pragma once
// ExplicitRedistributionContext: a scope in which ops refuse to move data implicitly (PyTorch's
// torch.distributed.tensor.debug ExplicitRedistributionContext, MAX's NoReshard), for programs
// that want every collective visible in their own code.
#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// RAII scope on the calling rank (thread). While it is open, an op whose inputs must be
/// redistributed to run (matmul of (S(1)) by (S(1)), softmax or sort over a sharded dim, cumprod
/// of a Partial...) throws ShardingError naming the op, the input, its layout, the layout the op
/// needs and the plan, before any rank communicates. Communication that is part of an op's own
/// algorithm is not a redistribution and runs (the pieces' totals of a cumsum along a sharded dim,
/// topk's candidates). The caller redistributes explicitly with DTensor::redistribute,
/// full_tensor or the nn parallel styles, which the scope allows. By default a redistribution
/// that moves no data (Replicate -> Shard is a local chunk) is allowed; `strict` refuses those
/// too. `enable = false` opens a scope that allows everything (to exempt a region inside an
/// enabled one). Scopes nest; the innermost decides. Each rank opens its own, as every rank runs
/// the same ops (SPMD), so all ranks throw alike. Non-copyable, non-movable; closes on the thread
/// that opened it.
///
/// Example:
///   ExplicitRedistributionContext explicit_only;
///   DTensor y = matmul(x, w);                       // x (S(1)), w (S(1)): throws, w must move
///   DTensor y = matmul(x, w.redistribute({Shard{0}}));  // fine: the move is the caller's
class ExplicitRedistributionContext {
 public:
  explicit ExplicitRedistributionContext(bool enable = true, bool strict = false);
  ~ExplicitRedistributionContext();
  ExplicitRedistributionContext(const ExplicitRedistributionContext&) = delete;
  ExplicitRedistributionContext& operator=(const ExplicitRedistributionContext&) = delete;

  /// The innermost scope open on this thread, or null.
  static const ExplicitRedistributionContext* innermost();
  /// True when the innermost scope open on this thread refuses implicit redistributions.
  static bool active() { return innermost() != nullptr && innermost()->enabled(); }

  bool enabled() const { return enable_; }
  bool strict() const { return strict_; }

 private:
  const ExplicitRedistributionContext* previous_;
  bool enable_;
  bool strict_;
};

}  // namespace tessera
