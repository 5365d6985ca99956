// pad and roll along sharded dims, without gathering them: each piece's output rows are, from
// the layout alone, a list of runs of global input rows (or of the pad's fill), and the row
// exchange (internal/row_exchange.hpp) moves only the rows that change piece. pad grows the first
// and the last piece (explicit piece sizes; a crop shrinks them); roll keeps the layout. Both are
// differentiable through the exchange (the backward sends the gradients of the moved rows back).
#include <tessera/dtensor/detail/sharded_shape.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/internal/row_exchange.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::detail {

bool touches_sharded_dim(const Layout& layout, const DimVector& before, const DimVector& after) {
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if ((before[d] != 0 || after[d] != 0) && !layout.shard_order(d).empty()) return true;
  return false;
}

DTensor pad_sharded(const DTensor& x, const PadSpec& spec, PadMode mode, Scalar value) {
  const DeviceMesh& mesh = x.device_mesh();
  const Layout& layout = x.layout();
  const double fill = mode == PadMode::constant ? value.to_double() : 0.0;
  TESSERA_CHECK(mesh.is_member(), ShardingError, "pad", "world rank ", rank(), " is not in ", mesh.to_string(),
                " holding ", layout.to_string());
  // A Partial's local gradient is the whole gradient (Replicate), not a share of it.
  Tensor local = x.to_local(gradient_layout(x.layout()).placements());
  // The unsharded dims pad locally, in one call.
  std::vector<int64_t> local_pads;
  for (int64_t d = layout.ndim() - 1; d >= 0; --d) {
    const bool sharded = !layout.shard_order(d).empty();
    local_pads.push_back(sharded ? 0 : spec.before[d]);
    local_pads.push_back(sharded ? 0 : spec.after[d]);
  }
  if (std::any_of(local_pads.begin(), local_pads.end(), [](int64_t v) { return v != 0; }))
    local = pad(local, local_pads, mode, value);
  Shape shape = layout.global_shape();
  ShardSizes sizes = layout.explicit_sizes();
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (layout.shard_order(d).empty()) shape[d] = spec.shape[d];
  // Then one sharded dim after another (the corners come along), each on the layout so far.
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    if (layout.shard_order(d).empty() || (spec.before[d] == 0 && spec.after[d] == 0)) continue;
    const Layout current(shape, layout.dtype(), layout.mesh(), layout.placements(), layout.shard_orders(), sizes);
    const int64_t length = shape[d], before = spec.before[d], padded = spec.shape[d];
    // Piece p keeps its rows shifted by `before`; the first piece also takes the rows before
    // them, the last the rows after (a crop clips the pieces at the ends).
    const auto plan = row_plan(current, mesh, d, [&](size_t p, RowRunBuilder& runs) {
      const std::vector<int64_t>& starts = runs.starts();
      const size_t last = starts.size() - 2;
      const int64_t begin = p == 0 ? 0 : std::clamp<int64_t>(starts[p] + before, 0, padded);
      const int64_t end = p == last ? padded : std::clamp<int64_t>(starts[p + 1] + before, 0, padded);
      // The unpadded rows in one span, the padding row by row.
      const int64_t inside_begin = std::clamp<int64_t>(before, begin, end);
      const int64_t inside_end = std::clamp<int64_t>(before + length, inside_begin, end);
      for (int64_t j = begin; j < inside_begin; ++j) runs.row(pad_source_row(j - before, length, mode));
      runs.rows(inside_begin - before, inside_end - inside_begin);
      for (int64_t j = inside_end; j < end; ++j) runs.row(pad_source_row(j - before, length, mode));
    });
    local = exchange_rows(plan, local, fill, "pad", kRowExchangeTag);
    shape[d] = padded;
    sizes[d] = plan->out_rows;  // the Layout keeps them only where they differ from chunking
  }
  return DTensor(local, mesh, Layout(shape, layout.dtype(), layout.mesh(), layout.placements(), layout.shard_orders(), sizes));
}

DTensor roll_sharded(const DTensor& x, const DimVector& shifts) {
  const DeviceMesh& mesh = x.device_mesh();
  const Layout& layout = x.layout();
  TESSERA_CHECK(mesh.is_member(), ShardingError, "roll", "world rank ", rank(), " is not in ", mesh.to_string(),
                " holding ", layout.to_string());
  // A Partial's local gradient is the whole gradient (Replicate), not a share of it.
  Tensor local = x.to_local(gradient_layout(x.layout()).placements());
  std::vector<int64_t> local_shifts, local_dims;
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (layout.shard_order(d).empty() && shifts[d] != 0) {
      local_shifts.push_back(shifts[d]);
      local_dims.push_back(d);
    }
  if (!local_dims.empty()) local = roll(local, local_shifts, local_dims);
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const int64_t length = layout.global_shape()[d];
    if (layout.shard_order(d).empty() || length == 0 || shifts[d] % length == 0) continue;
    const int64_t shift = ((shifts[d] % length) + length) % length;
    // Output row j is input row (j - shift) mod length: at most two spans per piece.
    const auto plan = row_plan(layout, mesh, d, [&](size_t p, RowRunBuilder& runs) {
      const std::vector<int64_t>& starts = runs.starts();
      for (int64_t j = starts[p]; j < starts[p + 1];) {
        const int64_t source = ((j - shift) % length + length) % length;
        const int64_t take = std::min(starts[p + 1] - j, length - source);
        runs.rows(source, take);
        j += take;
      }
    });
    local = exchange_rows(plan, local, 0.0, "roll", kRowExchangeTag);
  }
  return DTensor(local, mesh, layout);
}

}  // namespace tessera::detail
