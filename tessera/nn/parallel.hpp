#pragma once
// Parallel styles (torch.distributed.tensor.parallel) and fully_shard (FSDP2), composable on a
// 2-d mesh: tensor parallel over one axis, data parallel (replicated or fully sharded) over another.
#include <functional>
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

/// PyTorch's distribute_module: `partition_fn(path, submodule, mesh)` runs on every submodule,
/// depth first from the module itself (path ""), and may lay its parameters out
/// (Module::set_parameter_layout); without one, parameters keep their layouts (replicated unless
/// a parallel style moved them). `input_fn(module, input, mesh)` and `output_fn(module, output,
/// mesh)` become the module's forward hooks (Module::set_input_hook / set_output_hook): they run
/// on the input before forward and on its output after (in the built-in layers' forward, and in a
/// user module's that passes its input through prepare_input and its output through
/// finish_output). Every rank calls it (parameters move).
/// Throws ValueError naming both meshes when `mesh` is not the module's.
using PartitionFn = std::function<void(const std::string& path, Module& module, const DeviceMesh& mesh)>;
void distribute_module(Module& module, const DeviceMesh& mesh, PartitionFn partition_fn = {},
                       Module::InputHook input_fn = {}, Module::InputHook output_fn = {});

/// The Megatron plan for TransformerLM (nn/layers.hpp): q/k/v and fc1 column-parallel, o and
/// fc2 row-parallel, the token embedding vocabulary-parallel, the output head column-parallel
/// (vocabulary-split logits, never gathered). With `sequence_parallel`, the norms run on sequence
/// shards (Shard(1)) and the row-parallel outputs are reduce-scattered onto them.
std::map<std::string, ParallelStyle> transformer_tp_plan(bool sequence_parallel = false);

/// FSDP2's fully_shard over mesh axis `axis`: the parameters of `module` and its submodules that
/// no earlier fully_shard call took become one unit. Each is stored Shard(0) on the axis (nested
/// inside any tensor-parallel split of dim 0, so that the all-gather over `axis` alone rebuilds the
/// tensor-parallel piece). When forward first uses one of a unit's parameters, the whole unit is
/// all-gathered in one collective (foreach_all_gather); in backward its gradients are
/// reduce-scattered together, in one collective, as soon as backward has passed the unit. As
/// with FSDP2, call it on each block, then on the root for what remains:
/// `for (block : blocks) fully_shard(block, "dp"); fully_shard(model, "dp");`.
/// Gathered values serve one forward. After writing a parameter's storage by hand (not through an
/// optimizer, load_state_dict or set_parameter_layout), call reshard(module).
void fully_shard(Module& module, const std::string& axis);

/// FSDP2's reshard: drops the gathered parameters of every unit in `module` (the next forward
/// gathers them again). Local; no communication.
void reshard(Module& module);

}  // namespace nn
}  // namespace tessera
