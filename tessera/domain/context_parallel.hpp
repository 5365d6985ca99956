#pragma once
// context_parallel (PyTorch DTensor's experimental context parallelism, ShardTensor's sequence
// parallel attention): a block of code runs with a model's sequence buffers (inputs, positions,
// labels) split along their sequence dims over one mesh dim, so every scaled_dot_product_attention
// on them runs as ring attention and no rank holds the whole sequence. With load_balance the
// sequence is cut into 2n chunks and rank p holds chunks p and 2n-1-p (zig-zag), so a causal
// mask leaves every rank the same work; the model sees the permuted sequence, which
// position-independent ops do not notice (positions come in as a buffer like the others).
#include <cstdint>
#include <functional>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {

/// Options of context_parallel and context_parallel_unshard.
struct ContextParallelOptions {
  /// Zig-zag order (torch's _cp_options.enable_load_balance): rank p holds sequence chunks p and
  /// 2n-1-p of 2n. Off: contiguous pieces, as distribute_tensor's Shard.
  bool load_balance = true;
  /// The mesh dim whose ranks split the sequence; -1: the mesh's only dim.
  int64_t mesh_dim = -1;
};

/// Runs body with each *buffers[i] split along seq_dims[i] over the context-parallel mesh dim,
/// in place, as torch's `with context_parallel(mesh, buffers, buffer_seq_dims, no_restore_buffers)`.
/// The buffers must be DTensors on `mesh`, replicated on that mesh dim with the sequence dim
/// unsplit (other mesh dims may split other dims: batch, heads). Splitting moves no data: each
/// rank keeps its rows. Inside body, causal ring attention over that mesh dim takes the blocks in
/// the load-balanced order. After body (or when it throws) every buffer gets its old value back,
/// except those also listed in no_restore, which keep the split one. Differentiable. Throws
/// ShardingError naming the buffer, its layout and the mesh dim for a buffer that is not
/// replicated there or a sequence dim out of range, ValueError for mismatched lists.
/// Example: context_parallel(mesh, {&q, &k, &v}, {2, 2, 2}, [&] { out = sdpa(q, k, v, ..., true); });
void context_parallel(const DeviceMesh& mesh, const std::vector<DTensor*>& buffers, const std::vector<int64_t>& seq_dims,
                      const std::function<void()>& body, const ContextParallelOptions& options = {},
                      const std::vector<DTensor*>& no_restore = {});

/// The buffers split by context_parallel (or results computed from them inside, with the same
/// options) back in natural sequence order, replicated on the context-parallel mesh dim: torch's
/// context_parallel_unshard. Gathers the sequence (communicates). Differentiable.
std::vector<DTensor> context_parallel_unshard(const DeviceMesh& mesh, const std::vector<DTensor>& buffers,
                                              const std::vector<int64_t>& seq_dims,
                                              const ContextParallelOptions& options = {});

}  // namespace tessera
