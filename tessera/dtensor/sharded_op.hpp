#pragma once
// User ops on DTensor: register a sharding rule and run a local kernel under it, or run plain
// local code on the shards with declared placements (DTensor's register_sharding and local_map).
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/sharding/op_rule.hpp>

namespace tessera TESSERA_API {

/// Acceptable rows of a user op for one mesh dim (the placement of each input and of the output),
/// given the input layouts; the all-Replicate row is always added. Expanded over mesh dims.
using ShardingRowsFn = std::function<std::vector<ShardingRow>(const std::vector<Layout>& inputs)>;
/// The global output shape from the global input shapes.
using OutputShapeFn = std::function<Shape(const std::vector<Shape>& inputs)>;

/// Registers (or replaces, for every rank and op, built-ins included) the rule of `op` in factor
/// notation, e.g. "mk,kn->mn" (FactorRule::parse). Every rank calls it before using the op.
/// Throws ValueError for a malformed equation.
void register_sharding(const std::string& op, const std::string& equation);
/// Registers the rule of `op` as per-mesh-dim rows; the output shape defaults to the first
/// input's. Throws ValueError if `rows` is empty.
void register_sharding(const std::string& op, ShardingRowsFn rows, OutputShapeFn output_shape = {});

/// Runs `kernel` on the shards of `inputs` under the registered rule of `op`: the cheapest row
/// combination is chosen, inputs are redistributed, the kernel's result wrapped. Throws
/// ShardingError naming the op when it has no rule, or when the kernel returns a local that is
/// not this rank's block of the rule's output.
DTensor call_sharded(const std::string& op, const std::vector<DTensor>& inputs,
                     const std::function<Tensor(const std::vector<Tensor>&)>& kernel);

/// DTensor's local_map: a function of DTensors that runs `fn` on their locals. Inputs must have
/// `in_placements` (nullopt entries: any placements, passed as they are); with
/// `redistribute_inputs` they are moved there, else a mismatch throws ShardingError naming the
/// input. The local result is wrapped with `out_placements`; a sharded output takes its piece
/// sizes from the locals fn returned (an all_gather of their shapes), so uneven pieces give the
/// right global shape on every rank. Throws ShardingError for a wrong input count, mixed meshes,
/// or placements of the wrong length.
std::function<DTensor(const std::vector<DTensor>&)> local_map(
    std::function<Tensor(const std::vector<Tensor>&)> fn, std::vector<std::optional<Placements>> in_placements,
    Placements out_placements, bool redistribute_inputs = false);

}  // namespace tessera
