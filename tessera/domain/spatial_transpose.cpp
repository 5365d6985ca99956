// The sharded spatial ops whose windows are defined on the output: a transposed convolution
// (each output row sums the input rows whose kernel footprint covers it) and adaptive average
// pooling (output cell o averages rows [floor(o L / n), ceil((o + 1) L / n))). Every rank works
// out from the layout which outputs each piece owns and the input rows they read; a row
// exchange brings the rows from the other pieces, the local op does the rest.
#include <tessera/domain/spatial.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/domain/detail/spatial_args.hpp>
#include <tessera/dtensor/internal/row_exchange.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/conv.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

using detail::per_spatial_dim;
using detail::replicate_where;
using detail::replicated;

namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// Along one sharded dim: the outputs [out_begin, out_end) each piece owns and the input rows
// [in_begin, in_end) they read.
struct OwnedRows {
  std::vector<int64_t> out_begin, out_end, in_begin, in_end;

  std::vector<int64_t> out_sizes() const {
    std::vector<int64_t> sizes;
    for (size_t p = 0; p < out_begin.size(); ++p) sizes.push_back(out_end[p] - out_begin[p]);
    return sizes;
  }
};

// The exchange that gives every piece its input rows [in_begin, in_end).
Tensor fetch_rows(const Tensor& local, const Layout& layout, const DeviceMesh& mesh, int64_t dim,
                  const OwnedRows& owned, const char* call) {
  const auto plan = detail::row_plan(layout, mesh, dim, [&](size_t p, detail::RowRunBuilder& runs) {
    runs.rows(owned.in_begin[p], owned.in_end[p] - owned.in_begin[p]);
  });
  return detail::exchange_rows(plan, local, 0.0, call, detail::kRowExchangeTag);
}

// Rows [begin, end) (global) of a local block whose row 0 is global row `first`, with zero rows
// where the block does not reach.
Tensor rows_or_zeros(const Tensor& block, int64_t dim, int64_t first, int64_t begin, int64_t end) {
  const int64_t last = first + block.shape()[dim];
  const int64_t a = std::clamp(first, begin, end), b = std::clamp(last, a, end);
  Tensor kept = block.narrow(dim, std::clamp<int64_t>(a - first, 0, block.shape()[dim]), b - a);
  if (a == begin && b == end) return kept;
  std::vector<int64_t> pads(static_cast<size_t>(2 * (block.ndim() - dim)), 0);
  pads[pads.size() - 2] = a - begin;
  pads[pads.size() - 1] = end - b;
  return pad(kept, pads);
}

}  // namespace

DTensor conv_transpose2d(const DTensor& x_in, const DTensor& weight_in, const std::optional<DTensor>& bias_in,
                         std::vector<int64_t> stride, std::vector<int64_t> padding,
                         std::vector<int64_t> output_padding, int64_t groups, std::vector<int64_t> dilation) {
  constexpr const char* call = "conv_transpose2d";
  TESSERA_CHECK(x_in.defined() && weight_in.defined(), ShardingError, call, "undefined input or weight");
  TESSERA_CHECK(x_in.ndim() == 4 && weight_in.ndim() == 4, ValueError, call, "input ", x_in.layout().to_string(),
                " and weight ", weight_in.layout().to_string(), " are not [N, C, H, W] and [C, O / groups, KH, KW]");
  const MeshSpec& spec = x_in.layout().mesh();
  TESSERA_CHECK(weight_in.layout().mesh() == spec && (!bias_in || bias_in->layout().mesh() == spec), ShardingError,
                call, "weight ", weight_in.layout().to_string(), bias_in ? " and bias " + bias_in->layout().to_string() : "",
                " are not on the input's mesh ", spec.to_string());
  stride = per_spatial_dim(stride, 2, call, "stride");
  padding = per_spatial_dim(padding, 2, call, "padding");
  output_padding = per_spatial_dim(output_padding, 2, call, "output_padding");
  dilation = per_spatial_dim(dilation, 2, call, "dilation");
  const DTensor x = replicate_where(x_in, [](const Placement& p) { return is_partial(p) || is_shard(p, 1); });
  const DTensor weight = replicated(weight_in);
  const std::optional<DTensor> bias = bias_in ? std::optional<DTensor>(replicated(*bias_in)) : std::nullopt;
  const Layout& layout = x.layout();
  const DeviceMesh& mesh = x.device_mesh();
  TESSERA_CHECK(mesh.is_member(), ShardingError, call, "world rank ", rank(), " is not in ", mesh.to_string());
  // The parameters' gradients add up over the mesh dims that split the input.
  Placements parameter_grad(x.placements().size(), Replicate{});
  for (size_t m = 0; m < parameter_grad.size(); ++m)
    if (is_shard(x.placements()[m])) parameter_grad[m] = Partial{};
  const Tensor w = weight.to_local(parameter_grad);
  const std::optional<Tensor> b = bias ? std::optional<Tensor>(bias->to_local(parameter_grad)) : std::nullopt;
  const Shape weight_shape = weight.shape();
  Shape out_shape = layout.global_shape();
  out_shape[1] = weight_shape[1] * groups;
  ShardSizes out_sizes;
  // A Partial's local gradient is the whole gradient (Replicate), not a share of it.
  Tensor local = x.to_local(gradient_layout(x.layout()).placements());
  std::vector<int64_t> local_padding = padding, local_output_padding = output_padding;
  struct Crop {
    int64_t dim, first, begin, end;  // local output row 0 is global row `first`; keep [begin, end)
  };
  std::vector<Crop> crops;
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t d = 2 + i;
    const size_t k = static_cast<size_t>(i);
    const int64_t length = layout.global_shape()[d], s = stride[k], pad_k = padding[k];
    const int64_t extent = dilation[k] * (weight_shape[d] - 1) + 1;
    const int64_t outputs = (length - 1) * s - 2 * pad_k + extent + output_padding[k];
    TESSERA_CHECK(s >= 1 && pad_k >= 0 && dilation[k] >= 1 && output_padding[k] >= 0 &&
                      output_padding[k] < std::max(s, dilation[k]) && length > 0 && outputs > 0,
                  ValueError, call, "spatial dim ", d, " of ", layout.to_string(), " with stride ", s, ", padding ",
                  pad_k, ", output_padding ", output_padding[k], ", dilation ", dilation[k], " and kernel ",
                  weight_shape[d], " gives no valid output (", outputs, " rows)");
    out_shape[d] = outputs;
    if (layout.shard_order(d).empty()) continue;
    // Output o of input row r lies in [r s - padding, r s - padding + extent): the pieces split
    // the outputs where their first input row's footprint is centred.
    const auto& pieces = layout.piece_sizes(d);
    OwnedRows owned;
    int64_t start = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const int64_t begin = p == 0 ? 0 : std::clamp<int64_t>(start * s - pad_k + (extent - 1) / 2, 0, outputs);
      start += pieces[p];
      const int64_t end =
          p + 1 == pieces.size() ? outputs : std::clamp<int64_t>(start * s - pad_k + (extent - 1) / 2, 0, outputs);
      owned.out_begin.push_back(begin);
      owned.out_end.push_back(end);
      const int64_t first = std::clamp<int64_t>(ceil_div(begin + pad_k - (extent - 1), s), 0, length);
      const int64_t last = std::clamp<int64_t>(floor_div(end - 1 + pad_k, s) + 1, first, length);
      owned.in_begin.push_back(end > begin ? first : 0);
      owned.in_end.push_back(end > begin ? last : 0);
    }
    local = fetch_rows(local, layout, mesh, d, owned, call);
    const size_t me = static_cast<size_t>(piece_of(spec, layout.shard_order(d), mesh.coordinate()));
    int64_t first_row = owned.in_begin[me];
    if (local.shape()[d] == 0) {
      // No input row reaches this piece's outputs (or it owns none): one zero row stands in, so
      // the local op runs; the outputs it gives are zeros.
      Shape one = local.shape();
      one[d] = 1;
      local = cat({local, zeros(one, local.dtype())}, d);
      first_row = 0;
    }
    crops.push_back({d, first_row * s - pad_k, owned.out_begin[me], owned.out_end[me]});
    local_padding[k] = 0;
    local_output_padding[k] = 0;
    out_sizes[d] = owned.out_sizes();  // kept only where they differ from chunking
  }
  if (layout.has_explicit_sizes(0)) out_sizes[0] = layout.piece_sizes(0);
  Tensor out = tessera::conv_transpose2d(local, w, std::nullopt, stride, local_padding, local_output_padding, groups,
                                         dilation);
  for (const Crop& c : crops) out = rows_or_zeros(out, c.dim, c.first, c.begin, c.end);
  if (b) out = out + b->reshape({1, b->numel(), 1, 1});
  return DTensor(out, mesh,
                 Layout(out_shape, layout.dtype(), layout.mesh(), layout.placements(), layout.shard_orders(), out_sizes));
}

DTensor adaptive_avg_pool2d(const DTensor& x_in, std::vector<int64_t> output_size) {
  constexpr const char* call = "adaptive_avg_pool2d";
  TESSERA_CHECK(x_in.defined(), ShardingError, call, "undefined input");
  TESSERA_CHECK(x_in.ndim() == 4, ValueError, call, "input ", x_in.layout().to_string(), " is not [N, C, H, W]");
  output_size = per_spatial_dim(output_size, 2, call, "output_size");
  DTensor x = replicate_where(x_in, [](const Placement& p) { return is_partial(p); });
  // One output along a sharded dim (global pooling): the mean over it, a Partial; nothing moves.
  // The pooling below is linear, so the Partial passes through it.
  for (int64_t d = 2; d < 4; ++d)
    if (output_size[static_cast<size_t>(d - 2)] == 1 && !x.layout().shard_order(d).empty()) x = mean(x, {d}, true);
  const Layout& layout = x.layout();
  const DeviceMesh& mesh = x.device_mesh();
  TESSERA_CHECK(mesh.is_member(), ShardingError, call, "world rank ", rank(), " is not in ", mesh.to_string());
  Shape out_shape = layout.global_shape();
  ShardSizes out_sizes;
  // A Partial's local gradient is the whole gradient (Replicate), not a share of it.
  Tensor local = x.to_local(gradient_layout(x.layout()).placements());
  std::vector<int64_t> local_size(2);
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t d = 2 + i, n = output_size[static_cast<size_t>(i)], length = layout.global_shape()[d];
    TESSERA_CHECK(n >= 1 && length >= 1, ValueError, call, "output size ", n, " for spatial dim ", d, " of ",
                  layout.to_string(), ": both must be >= 1");
    out_shape[d] = n;
    local_size[static_cast<size_t>(i)] = n;
    if (layout.shard_order(d).empty()) continue;
    const auto window_begin = [&](int64_t o) { return o * length / n; };
    const auto window_end = [&](int64_t o) { return ((o + 1) * length + n - 1) / n; };
    // Output o belongs to the piece holding its window's first row.
    const auto& pieces = layout.piece_sizes(d);
    OwnedRows owned;
    int64_t o = 0, start = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      start += pieces[p];
      const int64_t begin = o;
      while (o < n && (window_begin(o) < start || p + 1 == pieces.size())) ++o;
      owned.out_begin.push_back(begin);
      owned.out_end.push_back(o);
      owned.in_begin.push_back(o > begin ? window_begin(begin) : 0);
      owned.in_end.push_back(o > begin ? window_end(o - 1) : 0);
    }
    local = fetch_rows(local, layout, mesh, d, owned, call);
    const size_t me = static_cast<size_t>(piece_of(layout.mesh(), layout.shard_order(d), mesh.coordinate()));
    const int64_t first = owned.out_begin[me], count = owned.out_end[me] - first;
    if (count > 0 && length % n == 0) {
      // Equal windows that do not overlap: one reshape and one mean.
      std::vector<int64_t> split(local.shape().begin(), local.shape().end());
      split[static_cast<size_t>(d)] = length / n;
      split.insert(split.begin() + d, count);
      local = mean(local.reshape(Shape(split)), {d + 1}, false);
    } else if (count > 0) {
      std::vector<Tensor> cells;
      for (int64_t c = first; c < first + count; ++c)
        cells.push_back(mean(local.narrow(d, window_begin(c) - window_begin(first), window_end(c) - window_begin(c)),
                             {d}, true));
      local = cat(cells, d);
    }
    local_size[static_cast<size_t>(i)] = count;
    out_sizes[d] = owned.out_sizes();  // kept only where they differ from chunking
  }
  for (int64_t d : {int64_t{0}, int64_t{1}})
    if (layout.has_explicit_sizes(d)) out_sizes[d] = layout.piece_sizes(d);
  if (local.numel() > 0) {
    local = tessera::adaptive_avg_pool2d(local, local_size);
  } else {
    // An empty block (no outputs here): the unsharded dims take their output size with no data.
    std::vector<int64_t> pads;
    for (int64_t d = 3; d >= 2; --d) {
      pads.push_back(0);
      pads.push_back(local_size[static_cast<size_t>(d - 2)] - local.shape()[d]);
    }
    local = pad(local, pads);
  }
  return DTensor(local, mesh,
                 Layout(out_shape, layout.dtype(), layout.mesh(), layout.placements(), layout.shard_orders(), out_sizes));
}

}  // namespace tessera
