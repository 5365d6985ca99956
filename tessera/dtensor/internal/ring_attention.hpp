#pragma once
// Ring attention for scaled_dot_product_attention on DTensors whose sequence dim is sharded.
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <tessera/dtensor/dtensor.hpp>

namespace tessera::detail {

/// The attention of q, k, v by a ring over the mesh dim that splits their sequence, or nullopt
/// when the layouts do not call for one (the sequence not split over exactly one mesh dim shared
/// by q, k and v, other mesh dims that differ between them or split the sequence or the
/// features, a mask, or dropout): the caller then takes the general path.
std::optional<DTensor> ring_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                      const std::optional<DTensor>& attn_mask, double dropout_p, bool is_causal,
                                      std::optional<double> scale);

/// Load balancing for causal ring attention (context_parallel's load_balance): the sequence of
/// length L is cut into 2n chunks (these sizes, the first L % 2n one row longer) and ring position
/// p holds chunks p and 2n-1-p, so every position has as many visible (query, key) pairs. While
/// a scope is pushed for (mesh, mesh_dim), ring attention over that mesh dim reads the blocks
/// of q, k and v in that order. Per thread, nested scopes allowed.
std::vector<int64_t> zigzag_chunk_sizes(int64_t length, int64_t n);
/// The two chunks ring position p of n holds: p and 2n-1-p (the zig-zag rule, written once).
inline std::pair<size_t, size_t> zigzag_chunks(int64_t p, int64_t n) {
  return {static_cast<size_t>(p), static_cast<size_t>(2 * n - 1 - p)};
}
/// The chunks in the order the ring positions hold them: 0, 2n-1, 1, 2n-2, ...
std::vector<size_t> zigzag_order(int64_t n);
/// Rows of the sequence each ring position holds (its two chunks').
std::vector<int64_t> zigzag_piece_sizes(int64_t length, int64_t n);
void push_load_balanced_sequence(const DeviceMesh& mesh, int64_t mesh_dim);
void pop_load_balanced_sequence();
bool ring_load_balanced(const DeviceMesh& mesh, int64_t mesh_dim);

}  // namespace tessera::detail
