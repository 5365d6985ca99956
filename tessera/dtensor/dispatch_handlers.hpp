#pragma once
// Sharded implementations a user supplies for an op (PhysicsNeMo ShardTensor's dispatch
// registry; the ShardTensor names are in tessera/domain/handlers.hpp): the dispatcher calls the
// handler instead of the op's rule, its plans and the local kernel.
#include <cstdint>
#include <functional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/sharding/op_args.hpp>

namespace tessera TESSERA_API {

/// The sharded implementation of one op: it receives the op's DTensor inputs as the caller passed
/// them (any placements) and its non-tensor arguments, may redistribute and communicate, and
/// returns the result as a DTensor on the inputs' mesh, in any placements. It runs on every rank
/// of the mesh, as any collective code does, below or above autograd (HandlerLevel).
using DispatchHandler = std::function<DTensor(const std::vector<DTensor>& inputs, const OpArgs& args)>;

/// Where a handler runs with respect to autograd.
enum class HandlerLevel : uint8_t {
  /// Recording off inside it; the op's own derivative is recorded around its result (PyTorch's
  /// __torch_dispatch__, PhysicsNeMo's register_dispatch_handler).
  below_autograd,
  /// Recording as the caller has it: the handler's own ops record the result's graph (its
  /// gradient is the handler's, not the op's), and the op records nothing around it (PyTorch's
  /// __torch_function__, PhysicsNeMo's register_function_handler).
  above_autograd,
};

/// Sets the handler of an op id (RuleRegistry::id of an OpId, or of a user op's name) for every
/// rank of the process, replacing any handler it had; an empty handler removes it. Inside a
/// handler, calls of the same op on the same rank take the built-in path, so a handler may move
/// its inputs and call the op itself. Ops called with a Scalar operand (x * 2.5, clamp's bounds)
/// keep the built-in path: their arguments carry the scalar's kind, not its value.
void set_dispatch_handler(int op_id, DispatchHandler handler, HandlerLevel level = HandlerLevel::below_autograd);
/// True when op id `op_id` has a handler.
bool has_dispatch_handler(int op_id);

}  // namespace tessera
