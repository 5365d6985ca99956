#pragma once
// Op dispatch on DTensor (docs/architecture.md: the life of one DTensor op): look up the op's
// rule, pick the cheapest strategy, redistribute the inputs, run the local kernel on the shards,
// wrap the output. Decisions are cached per rank by (op, input layouts, non-tensor args): a cache
// hit plans nothing and allocates nothing but the output. Internal to the dtensor layer.
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <tessera/dtensor/dispatch.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera {

namespace detail {

/// A non-owning reference to a callable (no allocation; the callable outlives the call).
template <class Signature>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>)
  FunctionRef(F&& f)  // NOLINT: implicit by design, like std::function_ref
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

/// What the dispatcher decided for one (op, input layouts, args) on this rank.
struct Decision {
  std::vector<std::shared_ptr<const Layout>> targets;  ///< layout each input needs
  std::vector<std::shared_ptr<const Plan>> plans;      ///< null where the input is already there
  std::shared_ptr<const Layout> output;                ///< with the kernel's dtype once known
  std::vector<Block> blocks;                           ///< this rank's block of each target
  Block output_block;                                  ///< this rank's block of the output
  Shape output_local_shape;
};

/// Runs `kernel(locals, decision)` for op `op_id` (RuleRegistry::id of an OpId, or of a user op's
/// name) on the shards.
/// Throws ShardingError naming the op for a missing rule, inputs on different meshes, undefined
/// inputs or a rank outside the mesh.
using Kernel = FunctionRef<Tensor(std::span<const Tensor> locals, const Decision& decision)>;
DTensor dispatch(int op_id, std::span<const DTensor* const> inputs, const OpArgs& args, Kernel kernel);

/// Wraps an already-validated local (the dispatcher's output path; no block check).
struct DTensorAccess {
  static DTensor make(Tensor local, const DeviceMesh& mesh, std::shared_ptr<const Layout> layout) {
    return DTensor(std::move(local), mesh, std::move(layout), true);
  }
  static const Tensor& local(const DTensor& t) { return t.local_; }
  static const std::shared_ptr<const Layout>& layout_ptr(const DTensor& t) { return t.layout_; }
};

}  // namespace detail
}  // namespace tessera
