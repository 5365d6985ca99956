#pragma once
// Helpers of the DTensor op files: op ids, dispatch of a callable kernel, mixed operands.
#include <initializer_list>
#include <optional>
#include <span>

#include <tessera/dtensor/detail/dispatch.hpp>

namespace tessera::detail {

/// Dispatches built-in op `op` on `inputs` with a kernel that takes the locals (and the decision).
template <class F>
DTensor call_op(OpId op, std::initializer_list<const DTensor*> inputs, const OpArgs& args, F&& kernel) {
  return dispatch(RuleRegistry::id(op), std::span<const DTensor* const>(inputs.begin(), inputs.size()), args,
                  [&](std::span<const Tensor> locals, const Decision& decision) {
                    if constexpr (std::is_invocable_v<F, std::span<const Tensor>, const Decision&>)
                      return kernel(locals, decision);
                    else
                      return kernel(locals);
                  });
}

/// Runs `record` (a derivatives::record_* call) on an op's result and returns it.
template <class Record>
DTensor recorded(DTensor out, Record&& record) {
  record(out);
  return out;
}

/// A 0-d Tensor beside a DTensor, as a replicated DTensor on its mesh. Throws ShardingError
/// naming `op` for any other plain Tensor.
DTensor replicated_operand(const Tensor& t, const DTensor& like, const char* op);

/// Throws ValueError on every rank when any index is outside [0, count) (and not `allowed`),
/// naming `op` and `what`. A replicated tensor is checked where it lies; a sharded one with one
/// sum over the mesh, so that every rank throws alike and none is left waiting in a later
/// collective.
void check_index_range(const DTensor& indices, int64_t count, std::optional<int64_t> allowed, const char* op,
                       const char* what);

}  // namespace tessera::detail
