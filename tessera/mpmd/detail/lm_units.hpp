#pragma once
// The transformer LM cut into pipeline units: unit 0 the embeddings (tok, pos), unit 1 + i block
// i, the last unit the final norm and head. parallelize prices and measures them, make_pipeline
// runs contiguous runs of them as stages.
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/dtensor/dtensor.hpp>
#include <tessera/nn/layers.hpp>

namespace tessera::mpmd::detail {

inline int64_t unit_count(const nn::TransformerLM& model) { return model.config().layers + 2; }

/// The unit a parameter path belongs to ("blocks.3.attn.q.weight": 4).
int64_t unit_of(const nn::TransformerLM& model, const std::string& path);
/// The module paths of a unit ({"tok", "pos"}, {"blocks.0"}, {"norm", "head"}).
std::vector<std::string> unit_modules(const nn::TransformerLM& model, int64_t unit);
/// "emb", "b0", "head": for plan names.
std::string unit_label(const nn::TransformerLM& model, int64_t unit);

/// Units [first, end) applied to x: token ids [batch, seq] where first is 0, otherwise hidden
/// states [batch, seq, dim]; logits after the last unit.
DTensor run_units(const nn::TransformerLM& model, int64_t first, int64_t end, const DTensor& x);
/// The mean next-token cross-entropy of logits [batch, seq, vocab] against targets [batch, seq].
DTensor next_token_loss(const DTensor& logits, const DTensor& targets);

/// Each unit's forward + backward CPU time (this thread's) at [rows, seq] on the model's mesh,
/// unsharded, in us: the median of three after a warm-up, the slowest rank of `agree`'s
/// (collective over it).
std::vector<double> measure_unit_us(nn::TransformerLM& model, int64_t rows, int64_t seq, const DeviceMesh& agree);

}  // namespace tessera::mpmd::detail
