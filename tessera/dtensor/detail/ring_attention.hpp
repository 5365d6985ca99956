#pragma once
// Ring attention for scaled_dot_product_attention on DTensors whose sequence dim is sharded.
#include <optional>

#include <tessera/dtensor/dtensor.hpp>

namespace tessera::detail {

/// The attention of q, k, v by a ring over the mesh dim that splits their sequence, or nullopt
/// when the layouts do not call for one (the sequence not split over exactly one mesh dim shared
/// by q, k and v, other mesh dims that differ between them or split the sequence or the
/// features, a mask, or dropout): the caller then takes the general path.
std::optional<DTensor> ring_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                      const std::optional<DTensor>& attn_mask, double dropout_p, bool is_causal,
                                      std::optional<double> scale);

}  // namespace tessera::detail
