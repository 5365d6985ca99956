#pragma once
// All local ops.
#include <tessera/ops/attention.hpp>
#include <tessera/ops/conv.hpp>
#include <tessera/ops/einsum.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/fused_backward.hpp>
#include <tessera/ops/fused_optim.hpp>
#include <tessera/ops/indexing.hpp>
#include <tessera/ops/linalg.hpp>
#include <tessera/ops/nn.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/ops/sort_scan.hpp>
// The engine on Tensor: autograd::record<Tensor> for custom differentiable functions.
#include <tessera/ops/tensor_grad_ops.hpp>
