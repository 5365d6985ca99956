#pragma once
// The dispatcher's call into a user's handler (dispatch_handlers.hpp), which takes the place of
// the op's rule and kernel. Internal to the dtensor layer.
#include <optional>
#include <span>

#include <tessera/dtensor/dtensor.hpp>
#include <tessera/sharding/op_args.hpp>

namespace tessera::detail {

/// The result of the handler of op `op_id` on these inputs; nullopt when the op has no handler,
/// its handler is already running on this rank, or `args` carries a Scalar operand.
std::optional<DTensor> run_dispatch_handler(int op_id, std::span<const DTensor* const> inputs, const OpArgs& args);

}  // namespace tessera::detail
