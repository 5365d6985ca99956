#pragma once
// Helpers of the DTensor op files: op ids, dispatch of a callable kernel, mixed operands.
#include <initializer_list>
#include <span>

#include <tessera/dtensor/dispatch.hpp>

namespace tessera::detail {

/// The registry id of a built-in op (each op caches it in a function-local static).
inline int op_id(const char* name) { return rule_registry().id(name); }

/// Dispatches `inputs` with a kernel that takes the locals (and the decision).
template <class F>
DTensor call_op(int id, std::initializer_list<const DTensor*> inputs, const DimVector& args, F&& kernel) {
  return dispatch(id, std::span<const DTensor* const>(inputs.begin(), inputs.size()), args,
                  [&](std::span<const Tensor> locals, const Decision& decision) {
                    if constexpr (std::is_invocable_v<F, std::span<const Tensor>, const Decision&>)
                      return kernel(locals, decision);
                    else
                      return kernel(locals);
                  });
}

/// A 0-d Tensor beside a DTensor, as a replicated DTensor on its mesh. Throws ShardingError
/// naming `op` for any other plain Tensor.
/// Runs `record` (a derivatives::record_* call) on an op's result and returns it.
template <class Record>
DTensor recorded(DTensor out, Record&& record) {
  record(out);
  return out;
}

DTensor replicated_operand(const Tensor& t, const DTensor& like, const char* op);

/// Dims normalised into [0, ndim), ascending; all dims when empty. Throws ValueError naming `op`
/// and the shape for a dim out of range or repeated.
std::vector<int64_t> normalized_dims(const std::vector<int64_t>& dims, const Shape& shape, const char* op);

/// One dim normalised into [0, ndim). Throws ValueError naming `op` and the shape if out of range.
int64_t normalized_dim(int64_t dim, int64_t ndim, const Shape& shape, const char* op);

}  // namespace tessera::detail
