#pragma once
// The transformer LM's pipeline units (TransformerLM::forward_units): which parameters and
// modules each holds, and their measured times. parallelize prices and measures them,
// make_pipeline runs contiguous runs of them as stages.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <tessera/dtensor/dtensor.hpp>
#include <tessera/nn/layers.hpp>

namespace tessera::mpmd::detail {

/// The unit a parameter path belongs to ("blocks.3.attn.q.weight": 4); units as
/// TransformerLM::forward_units numbers them.
int64_t unit_of(const nn::TransformerLM& model, const std::string& path);
/// The module paths of a unit ({"tok", "pos"}, {"blocks.0"}, {"norm", "head"}).
std::vector<std::string> unit_modules(const nn::TransformerLM& model, int64_t unit);
/// "emb", "b0", "head": for plan names.
std::string unit_label(const nn::TransformerLM& model, int64_t unit);

/// Token ids and next tokens [rows, seq], the same on every rank, replicated on the model's
/// mesh: what parallelize times steps with.
std::pair<DTensor, DTensor> synthetic_batch(const nn::TransformerLM& model, int64_t rows, int64_t seq);

/// Each unit's forward + backward CPU time (this thread's) at [rows, seq] on the model's mesh,
/// unsharded, in us: the median of three after a warm-up, the slowest rank of `agree`'s
/// (collective over it).
std::vector<double> measure_unit_us(nn::TransformerLM& model, int64_t rows, int64_t seq, const DeviceMesh& agree);

}  // namespace tessera::mpmd::detail
