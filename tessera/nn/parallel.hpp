#pragma once
// Parallel styles (torch.distributed.tensor.parallel) and fully_shard (FSDP2), composable on a
// 2-d mesh: tensor parallel over one axis, data parallel (replicated or fully sharded) over another.
#include <map>
#include <string>
#include <variant>

#include <tessera/core/export.hpp>
#include <tessera/nn/module.hpp>

namespace tessera TESSERA_API {
namespace nn {

/// Linear: weight Shard(0) (output features split), bias Shard(0); the input is moved to
/// `input` (Replicate: all-gathered if it comes sharded) and the output stays Shard(-1).
/// Embedding: the embedding dim is split (weight Shard(1)).
struct ColwiseParallel {
  Placement input = Replicate{};
  Placement output = Shard{-1};
};
/// Linear: weight Shard(1) (input features split), bias Replicate; the input comes Shard(-1) and
/// the Partial(sum) product is moved to `output` (Replicate: all_reduce; Shard(1) with sequence
/// parallelism: reduce_scatter). Embedding: the vocabulary is split (weight Shard(0)).
struct RowwiseParallel {
  Placement input = Shard{-1};
  Placement output = Replicate{};
};
/// Norm layers over activations split along the sequence dim (Shard(1)); parameters replicated.
struct SequenceParallel {
  int64_t sequence_dim = 1;
};
using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel>;

/// True when a dotted module path matches a plan's pattern ('*' stands for one component):
/// path_matches("blocks.*.attn.q", "blocks.3.attn.q").
bool path_matches(const std::string& pattern, const std::string& path);

/// Applies a style per submodule path on mesh axis `axis`. Paths may use `*` for one component
/// ("blocks.*.attn.q"). Throws ValueError for a path that matches nothing or a style on a module
/// it does not fit. Every rank calls it (parameters move).
void parallelize_module(Module& module, const std::string& axis, const std::map<std::string, ParallelStyle>& plan);

/// The Megatron plan for TransformerLM (nn/layers.hpp): q/k/v and fc1 column-parallel, o and
/// fc2 row-parallel, the token embedding vocabulary-parallel, the output head column-parallel
/// (vocabulary-split logits, never gathered). With `sequence_parallel`, the norms run on sequence
/// shards (Shard(1)) and the row-parallel outputs are reduce-scattered onto them.
std::map<std::string, ParallelStyle> transformer_tp_plan(bool sequence_parallel = false);

/// FSDP-style sharding over mesh axis `axis`: every parameter is stored Shard(0) on it (nested
/// inside any tensor-parallel split of dim 0, so that the all-gather over `axis` alone rebuilds the
/// tensor-parallel piece), all-gathered for compute in forward, and its gradient reduce-scattered.
void fully_shard(Module& module, const std::string& axis);

}  // namespace nn
}  // namespace tessera
