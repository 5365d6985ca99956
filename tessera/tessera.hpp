#pragma once
// Umbrella header: everything a Tessera program uses.
#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/scalar.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/sharding/placement.hpp>
#include <tessera/sharding/layout.hpp>
#include <tessera/sharding/plan.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/dtensor/sharded_op.hpp>
#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/debug/visualize_sharding.hpp>
