#pragma once
// PhysicsNeMo ShardTensor's custom sharded implementations: ShardTensor.register_dispatch_handler
// (an op's sharded implementation, used by the dispatcher instead of the op's rule and local
// kernel), register_named_function_handler (the same for a custom op by its name) and
// register_function_handler (an op's implementation above autograd, which owns the gradient).
// Lowered onto the DTensor dispatcher's handler registry (tessera/dtensor/dispatch_handlers.hpp).
//
// Example: a sum that gathers and returns a Replicate result where the built-in rule would give
// a Partial one.
//   register_dispatch_handler(OpId::sum, [](const std::vector<DTensor>& in, const OpArgs& args) {
//     const auto& r = std::get<ReduceArgs>(args);
//     const Tensor s = sum(in[0].full_tensor(), r.dims.vec(), r.keepdim);
//     return DTensor::from_local(s, in[0].device_mesh(), Placements(in[0].device_mesh().ndim(), Replicate{}));
//   });
// And a sign whose gradient passes straight through (the built-in sign's is zero):
//   register_function_handler(OpId::sign, [](const std::vector<DTensor>& in, const OpArgs&) {
//     return add(in[0], sub(sign(in[0]), in[0]).detach());
//   });
#include <string>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dispatch_handlers.hpp>
#include <tessera/ops/op_table.hpp>

namespace tessera TESSERA_API {

/// Registers (or replaces) the sharded implementation of built-in op `op` for every rank of the
/// process: every later call of the op on DTensors runs `handler` (see DispatchHandler: any
/// placements in and out, below autograd; calls of the op inside the handler take the built-in
/// path; a Scalar operand keeps the built-in path). Every process registers it before use, as
/// with register_sharding. Throws ValueError for an empty handler.
void register_dispatch_handler(OpId op, DispatchHandler handler);
/// The same by the op's name (a built-in's, e.g. "matmul"), as PhysicsNeMo matches an op by its
/// name when the overload object differs. Throws ValueError for an unknown or empty name.
void register_dispatch_handler(const std::string& op, DispatchHandler handler);
/// The sharded implementation of a custom op (one run with call_sharded, named as in
/// register_sharding), used instead of its rule and kernel; the op needs no rule then. Throws
/// ValueError for a built-in's name (register_dispatch_handler takes those) or an empty handler.
void register_named_function_handler(const std::string& op, DispatchHandler handler);

/// PhysicsNeMo's register_function_handler: the implementation of built-in op `op` above
/// autograd. Every later call of the op on DTensors runs `handler` with recording as the caller
/// has it, and the result's gradient is whatever the handler's own ops record (the op's built-in
/// derivative is not recorded around it); otherwise as register_dispatch_handler (calls of the op
/// inside the handler take the built-in path, a Scalar operand keeps it, every process registers
/// it before use). Replaces a dispatch handler of the op, and is replaced by one. Throws
/// ValueError for an empty handler.
void register_function_handler(OpId op, DispatchHandler handler);
/// The same by the op's name (a built-in's, e.g. "matmul"). Throws ValueError for an unknown or
/// empty name.
void register_function_handler(const std::string& op, DispatchHandler handler);

/// Removes the handler of `op` (built-in or custom, by OpId or name); its calls take the rule and
/// kernel again. No effect when it has none.
void remove_dispatch_handler(OpId op);
void remove_dispatch_handler(const std::string& op);

}  // namespace tessera
