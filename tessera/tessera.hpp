#pragma once
// Umbrella header: everything a Tessera program uses.
#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/scalar.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/ops.hpp>
