// Sharded convolution: every rank computes, from the layout alone, which outputs each piece
// owns and which input rows they read; the halos bring the missing rows, the local kernel
// does the rest.
#include <tessera/domain/spatial.hpp>

#include <algorithm>
#include <memory>
#include <utility>
#include <limits>
#include <string>

#include <tessera/core/error.hpp>
#include <tessera/domain/detail/halo_local.hpp>
#include <tessera/domain/detail/spatial_args.hpp>
#include <tessera/dtensor/internal/row_exchange.hpp>
#include <tessera/ops/conv.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

using detail::per_spatial_dim;
using detail::replicate_where;
using detail::replicated;

namespace {

// Along one sharded spatial dim: the outputs each piece owns and the input rows they read.
struct DimPlan {
  std::vector<int64_t> out_begin, out_end;    // per piece: its outputs [begin, end)
  std::vector<int64_t> need_begin, need_end;  // per piece: the input rows they read (maybe beyond the edges)
};

DimPlan plan_dim(const Layout& layout, int64_t dim, int64_t kernel, int64_t stride, int64_t padding,
                 int64_t dilation, const char* call) {
  const int64_t length = layout.global_shape()[dim];
  const int64_t extent = dilation * (kernel - 1) + 1;
  TESSERA_CHECK(length + 2 * padding >= extent, ValueError, call, "spatial dim ", dim, " of ", length,
                " rows (padding ", padding, ") is shorter than the kernel's extent ", extent, " (",
                layout.to_string(), ")");
  const int64_t outputs = (length + 2 * padding - extent) / stride + 1;
  const auto& pieces = layout.piece_sizes(dim);
  std::vector<int64_t> starts(pieces.size() + 1, 0);
  for (size_t p = 0; p < pieces.size(); ++p) starts[p + 1] = starts[p] + pieces[p];
  DimPlan plan;
  // Output o belongs to the piece holding its window's centre (outputs stay with their rows).
  int64_t o = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const int64_t begin = o;
    while (o < outputs) {
      const int64_t centre = std::clamp<int64_t>(o * stride - padding + (extent - 1) / 2, 0, length - 1);
      if (centre >= starts[p + 1] && p + 1 < pieces.size()) break;
      ++o;
    }
    plan.out_begin.push_back(begin);
    plan.out_end.push_back(o);
    const bool any = o > begin;
    const int64_t need_begin = any ? begin * stride - padding : starts[p];
    const int64_t need_end = any ? (o - 1) * stride - padding + extent : starts[p];
    plan.need_begin.push_back(need_begin);
    plan.need_end.push_back(need_end);
  }
  return plan;
}

// This rank's piece index along a sharded dim (mixed radix over the shard order).
int64_t my_piece(const Layout& layout, const DeviceMesh& mesh, int64_t dim) {
  return piece_of(layout.mesh(), layout.shard_order(dim), mesh.coordinate());
}

// What a window op (convolution, pooling) runs on locally: this rank's block widened by the halo
// rows its outputs read (one sharded spatial dim after another, so corners come along) and cut
// to them, the padding left for the local op (the unsharded dims'), and the output layout.
struct Windows {
  Tensor local;
  std::vector<int64_t> local_padding;
  Layout out_layout;
  // Sharded dims along which this rank owns no outputs. It still runs the op, on one window of
  // padding, and keeps none of the result: its row exchanges stay in the graph, so their
  // backward runs here too (the peers that sent it rows wait for those rows' gradients).
  std::vector<int64_t> empty_dims;

  DTensor finish(Tensor out, const DeviceMesh& mesh) const {
    for (int64_t d : empty_dims) out = out.narrow(d, 0, 0);
    return DTensor(out, mesh, out_layout);
  }
};

std::vector<int64_t> kernel_of(const DTensor& weight, int64_t spatial) {
  const Shape shape = weight.shape();  // by value: both iterators must come from one Shape
  return std::vector<int64_t>(shape.end() - spatial, shape.end());
}

// `fill`: the value beyond the domain's edges (zeros, or max pooling's -inf). `x_grad`: what the
// gradient of x's local block is (default: x's placements).
Windows windows(const char* call, const DTensor& x, int64_t spatial, const std::vector<int64_t>& kernel,
                const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                const std::vector<int64_t>& dilation, int64_t out_channels, std::optional<double> fill,
                const Placements& x_grad = {}) {
  const Layout& layout = x.layout();
  const DeviceMesh& mesh = x.device_mesh();
  TESSERA_CHECK(mesh.is_member(), ShardingError, call, "world rank ", rank(), " is not in ", mesh.to_string());
  Tensor local = x_grad.empty() ? x.to_local() : x.to_local(x_grad);
  std::vector<int64_t> local_padding = padding;
  Shape out_shape = layout.global_shape();
  out_shape[1] = out_channels;
  ShardSizes out_sizes;
  std::vector<int64_t> empty_dims;
  std::vector<std::pair<int64_t, int64_t>> edge_pads(static_cast<size_t>(spatial), {0, 0});
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t d = 2 + i;
    const size_t k = static_cast<size_t>(i);
    const DimPlan plan = plan_dim(layout, d, kernel[k], stride[k], padding[k], dilation[k], call);
    out_shape[d] = plan.out_end.back();
    if (layout.shard_order(d).empty()) continue;
    const size_t p = static_cast<size_t>(my_piece(layout, mesh, d));
    // Each piece fetches the rows its outputs read that lie in the domain, exactly those; the
    // rows beyond the edges are padded in after every dim's exchange, so the next dim's exchange
    // never carries them.
    const int64_t length = layout.global_shape()[d];
    const auto rows = detail::row_plan(layout, mesh, d, [&](size_t q, detail::RowRunBuilder& runs) {
      const int64_t first = std::clamp<int64_t>(plan.need_begin[q], 0, length);
      runs.rows(first, std::clamp<int64_t>(plan.need_end[q], first, length) - first);
    });
    local = detail::exchange_rows(rows, local, 0.0, call, detail::kRowExchangeTag);
    edge_pads[k] = {std::max<int64_t>(0, -plan.need_begin[p]), std::max<int64_t>(0, plan.need_end[p] - length)};
    local_padding[k] = 0;
    std::vector<int64_t> sizes;
    for (size_t q = 0; q < plan.out_begin.size(); ++q) sizes.push_back(plan.out_end[q] - plan.out_begin[q]);
    if (sizes[p] == 0) empty_dims.push_back(d);
    out_sizes[d] = std::move(sizes);  // the Layout keeps them only where they differ from chunking
  }
  for (int64_t d : {int64_t{0}, int64_t{1}})
    if (layout.has_explicit_sizes(d) && out_shape[d] == layout.global_shape()[d]) out_sizes[d] = layout.piece_sizes(d);
  // The rows beyond the domain's edges: zeros for a convolution, the fill for pooling.
  std::vector<int64_t> pads;
  for (int64_t i = spatial - 1; i >= 0; --i) {
    pads.push_back(edge_pads[static_cast<size_t>(i)].first);
    pads.push_back(edge_pads[static_cast<size_t>(i)].second);
  }
  if (std::any_of(pads.begin(), pads.end(), [](int64_t v) { return v != 0; }))
    local = pad(local, pads, PadMode::constant, fill.value_or(0.0));
  const ShardOrder order = layout.shard_orders();
  Windows out{local, local_padding, Layout(out_shape, layout.dtype(), layout.mesh(), layout.placements(), order, out_sizes),
              empty_dims};
  for (int64_t d : empty_dims) {
    Shape window = out.local.shape();
    window[d] = dilation[static_cast<size_t>(d - 2)] * (kernel[static_cast<size_t>(d - 2)] - 1) + 1;
    out.local = cat({out.local, full(window, fill.value_or(0.0), out.local.dtype())}, d);
  }
  return out;
}

// Channel sharding, as DTensor's linear: a mesh dim splitting the input channels (x's dim 1 with
// the weight's dim 1) computes each rank's share of every output, a Partial(sum) with no
// communication (rowwise); one splitting the weight's output channels (dim 0) while x is whole
// on it gives the output's channels sharded (colwise). Any other channel sharding, and every
// channel sharding of a grouped convolution, is made Replicate; Partial inputs are reduced.
struct ChannelPlan {
  Layout x, weight, bias;                 // where the operands go
  Placements x_grad, weight_grad, bias_grad;  // what their local gradients are
  std::vector<int64_t> rowwise, colwise;  // the mesh dims of each kind

  bool bias_here(const DeviceMesh& mesh) const {
    for (int64_t m : rowwise)
      if (mesh.coordinate()[static_cast<size_t>(m)] != 0) return false;
    return true;
  }

  // The window op's output layout (x's placements, out-channel count) with the channel sharding.
  Layout output(const Layout& windows) const {
    Placements placements = windows.placements();
    ShardOrder order = windows.shard_orders();
    ShardSizes sizes = windows.explicit_sizes();
    order.erase(1);
    sizes.erase(1);
    for (int64_t m : rowwise) placements[static_cast<size_t>(m)] = Partial{};
    for (int64_t m : colwise) placements[static_cast<size_t>(m)] = Shard{1};
    if (!colwise.empty()) order[1] = weight.shard_order(0);
    return Layout(windows.global_shape(), windows.dtype(), windows.mesh(), placements, order, sizes);
  }
};

ChannelPlan plan_channels(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias,
                          int64_t groups) {
  const Layout& xl = x.layout();
  const Placements& xp = xl.placements();
  const Placements& wp = weight.placements();
  const size_t mesh_dims = xp.size();
  ChannelPlan plan;
  Placements x_to = xp, w_to(mesh_dims, Replicate{}), b_to(mesh_dims, Replicate{});
  plan.weight_grad.assign(mesh_dims, Replicate{});
  plan.bias_grad.assign(mesh_dims, Replicate{});
  // Input channels keep x's own split when it has one; a weight-only split is added after it.
  std::vector<int64_t> channel_order = groups == 1 ? xl.shard_order(1) : std::vector<int64_t>{};
  for (size_t m = 0; m < mesh_dims; ++m) {
    const int64_t dim = static_cast<int64_t>(m);
    const bool x_channels = is_shard(xp[m], 1), x_whole = is_replicate(xp[m]);
    if (groups == 1 && x_channels && (is_shard(wp[m], 1) || is_replicate(wp[m]))) {
      plan.rowwise.push_back(dim);
    } else if (groups == 1 && x_whole && is_shard(wp[m], 1) && !xl.has_explicit_sizes(1)) {
      plan.rowwise.push_back(dim);
      channel_order.push_back(dim);
    } else if (x_whole && is_shard(wp[m], 0)) {
      plan.colwise.push_back(dim);
    } else if (is_partial(xp[m]) || x_channels) {
      x_to[m] = Replicate{};
    }
  }
  // x's own channel split, less the mesh dims made Replicate; its explicit sizes only if whole.
  const bool split_kept = channel_order == xl.shard_order(1);
  std::erase_if(channel_order, [&](int64_t m) {
    return std::find(plan.rowwise.begin(), plan.rowwise.end(), m) == plan.rowwise.end();
  });
  for (int64_t m : plan.rowwise) {
    x_to[static_cast<size_t>(m)] = w_to[static_cast<size_t>(m)] = Shard{1};
    plan.weight_grad[static_cast<size_t>(m)] = Shard{1};
    plan.bias_grad[static_cast<size_t>(m)] = Partial{};
  }
  // Under colwise each rank's x gradient comes from its output channels only: a share (P(sum)).
  plan.x_grad = x_to;
  for (int64_t m : plan.colwise) {
    plan.x_grad[static_cast<size_t>(m)] = Partial{};
    w_to[static_cast<size_t>(m)] = b_to[static_cast<size_t>(m)] = Shard{0};
    plan.weight_grad[static_cast<size_t>(m)] = plan.bias_grad[static_cast<size_t>(m)] = Shard{0};
  }
  // The parameters' gradients add up over the mesh dims that split the input's batch or rows.
  for (size_t m = 0; m < mesh_dims; ++m)
    if (is_shard(x_to[m]) && !is_shard(x_to[m], 1)) plan.weight_grad[m] = plan.bias_grad[m] = Partial{};
  ShardOrder x_order = xl.shard_orders();
  ShardSizes x_sizes = xl.explicit_sizes();
  if (!split_kept || channel_order != xl.shard_order(1)) x_sizes.erase(1);
  if (!plan.rowwise.empty()) {
    x_order[1] = channel_order;
  } else {
    x_order.erase(1);
    x_sizes.erase(1);
  }
  plan.x = Layout(xl.global_shape(), xl.dtype(), xl.mesh(), x_to, x_order, x_sizes);
  ShardOrder w_order;
  ShardSizes w_sizes;
  if (!plan.rowwise.empty()) {
    w_order[1] = channel_order;
    if (x_sizes.count(1)) w_sizes[1] = x_sizes[1];
  }
  if (!plan.colwise.empty()) w_order[0] = plan.colwise;
  plan.weight = Layout(weight.shape(), weight.dtype(), xl.mesh(), w_to, w_order, w_sizes);
  if (bias) {
    ShardOrder b_order;
    if (!plan.colwise.empty()) b_order[0] = plan.colwise;
    plan.bias = Layout(bias->shape(), bias->dtype(), xl.mesh(), b_to, b_order);
  }
  return plan;
}

// A window op's (convolution, pooling) arguments per spatial dim, on the global layout the user
// passed: plan_dim divides by the stride and walks the kernel's extent.
void check_windows(const char* call, const DTensor& x, const std::vector<int64_t>& kernel,
                   const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                   const std::vector<int64_t>& dilation) {
  for (size_t k = 0; k < kernel.size(); ++k)
    TESSERA_CHECK(kernel[k] >= 1 && stride[k] >= 1 && padding[k] >= 0 && dilation[k] >= 1, ValueError, call,
                  "spatial dim ", k, " of input ", x.layout().to_string(), " has kernel ", kernel[k], ", stride ",
                  stride[k], ", padding ", padding[k], " and dilation ", dilation[k],
                  "; expected kernel >= 1, stride >= 1, padding >= 0 and dilation >= 1");
}

// The local convolution's checks, on the global shapes and layouts the user passed: each rank's
// local op sees only its own block, widened by halos.
void check_conv(const char* call, int64_t spatial, const DTensor& x, const DTensor& weight,
                const std::optional<DTensor>& bias, int64_t groups) {
  const std::string xt = x.layout().to_string(), wt = weight.layout().to_string();
  TESSERA_CHECK(weight.ndim() == spatial + 2, ValueError, call, "weight ", wt, " is not ", spatial + 2,
                "-d; expected [out_channels, in_channels / groups, ", spatial, " kernel dims]");
  TESSERA_CHECK(groups >= 1, ValueError, call, "groups ", groups, " is not positive; expected groups >= 1");
  const int64_t in_channels = x.shape()[1], out_channels = weight.shape()[0];
  TESSERA_CHECK(out_channels % groups == 0, ValueError, call, "groups ", groups, " does not divide the ",
                out_channels, " output channels of weight ", wt);
  TESSERA_CHECK(in_channels % groups == 0, ValueError, call, "groups ", groups, " does not divide the ", in_channels,
                " channels of input ", xt);
  TESSERA_CHECK(weight.shape()[1] * groups == in_channels, ValueError, call, "input ", xt, " has ", in_channels,
                " channels for weight ", wt, " with groups ", groups, "; expected weight.shape[1] * groups = ",
                weight.shape()[1] * groups);
  TESSERA_CHECK(!bias || (bias->ndim() == 1 && bias->shape()[0] == out_channels), ValueError, call, "bias ",
                bias->layout().to_string(), " does not match weight ", wt, "; expected [", out_channels, "]");
}

DTensor conv_nd(const char* call, int64_t spatial, const DTensor& x_in, const DTensor& weight_in,
                const std::optional<DTensor>& bias_in, std::vector<int64_t> stride, std::vector<int64_t> padding,
                std::vector<int64_t> dilation, int64_t groups) {
  TESSERA_CHECK(x_in.defined() && weight_in.defined(), ShardingError, call, "undefined input or weight");
  TESSERA_CHECK(x_in.ndim() == spatial + 2, ValueError, call, "input ", x_in.layout().to_string(), " is not [N, C, ",
                spatial, " spatial dims]");
  const MeshSpec& spec = x_in.layout().mesh();
  TESSERA_CHECK(weight_in.layout().mesh() == spec && (!bias_in || bias_in->layout().mesh() == spec), ShardingError,
                call, "weight ", weight_in.layout().to_string(), bias_in ? " and bias " + bias_in->layout().to_string() : "",
                " are not on the input's mesh ", spec.to_string());
  stride = per_spatial_dim(stride, spatial, call, "stride");
  padding = per_spatial_dim(padding, spatial, call, "padding");
  dilation = per_spatial_dim(dilation, spatial, call, "dilation");
  check_conv(call, spatial, x_in, weight_in, bias_in, groups);
  check_windows(call, x_in, kernel_of(weight_in, spatial), stride, padding, dilation);
  const ChannelPlan plan = plan_channels(x_in, weight_in, bias_in, groups);
  const DTensor x = x_in.redistribute(x_in.device_mesh(), plan.x);
  const DTensor weight = weight_in.redistribute(weight_in.device_mesh(), plan.weight);
  const std::optional<DTensor> bias =
      bias_in ? std::optional<DTensor>(bias_in->redistribute(bias_in->device_mesh(), plan.bias)) : std::nullopt;
  const DeviceMesh& mesh = x.device_mesh();
  TESSERA_CHECK(mesh.is_member(), ShardingError, call, "world rank ", rank(), " is not in ", mesh.to_string());
  const Tensor w = weight.to_local(plan.weight_grad);
  std::optional<Tensor> b = bias ? std::optional<Tensor>(bias->to_local(plan.bias_grad)) : std::nullopt;
  // Under a Partial output the bias counts once: on the ranks at coordinate 0 of every mesh dim
  // that splits the input channels (elsewhere times zero, so every rank's graph reaches it).
  if (b && !plan.bias_here(mesh)) b = *b * 0.0;
  Windows win = windows(call, x, spatial, kernel_of(weight, spatial), stride, padding, dilation, weight.shape()[0],
                        std::nullopt, plan.x_grad);
  using LocalConv = Tensor (*)(const Tensor&, const Tensor&, const std::optional<Tensor>&, std::vector<int64_t>,
                               std::vector<int64_t>, std::vector<int64_t>, int64_t);
  const LocalConv conv = spatial == 1   ? static_cast<LocalConv>(conv1d)
                         : spatial == 2 ? static_cast<LocalConv>(conv2d)
                                        : static_cast<LocalConv>(conv3d);
  win.out_layout = plan.output(win.out_layout);
  return win.finish(conv(win.local, w, b, stride, win.local_padding, dilation, groups), mesh);
}

DTensor pool2d(const char* call, const DTensor& x_in, std::vector<int64_t> kernel, std::vector<int64_t> stride,
               std::vector<int64_t> padding, bool max) {
  TESSERA_CHECK(x_in.defined(), ShardingError, call, "undefined input");
  TESSERA_CHECK(x_in.ndim() == 4, ValueError, call, "input ", x_in.layout().to_string(), " is not [N, C, H, W]");
  kernel = per_spatial_dim(kernel, 2, call, "kernel");
  stride = stride.empty() ? kernel : per_spatial_dim(stride, 2, call, "stride");
  padding = per_spatial_dim(padding, 2, call, "padding");
  check_windows(call, x_in, kernel, stride, padding, {1, 1});
  const DTensor x = replicate_where(x_in, [](const Placement& p) { return is_partial(p); });
  const auto fill = max ? std::optional<double>(-std::numeric_limits<double>::infinity()) : std::nullopt;
  Windows win = windows(call, x, 2, kernel, stride, padding, {1, 1}, x.shape()[1], fill);
  const Tensor out = max ? tessera::max_pool2d(win.local, kernel, stride, win.local_padding)
                         : tessera::avg_pool2d(win.local, kernel, stride, win.local_padding);
  return win.finish(out, x.device_mesh());
}

}  // namespace

DTensor max_pool2d(const DTensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                   std::vector<int64_t> padding) {
  return pool2d("max_pool2d", x, std::move(kernel), std::move(stride), std::move(padding), true);
}
DTensor avg_pool2d(const DTensor& x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                   std::vector<int64_t> padding) {
  return pool2d("avg_pool2d", x, std::move(kernel), std::move(stride), std::move(padding), false);
}

DTensor interpolate(const DTensor& x_in, std::vector<int64_t> size, std::string_view mode) {
  constexpr const char* call = "interpolate";
  TESSERA_CHECK(x_in.defined(), ShardingError, call, "undefined input");
  TESSERA_CHECK(x_in.ndim() >= 3, ValueError, call, "input ", x_in.layout().to_string(), " is not [N, C, spatial...]");
  const int64_t spatial = x_in.ndim() - 2;
  size = per_spatial_dim(size, spatial, call, "size");
  TESSERA_CHECK(mode == "nearest" || mode == "bilinear", ValueError, call, "mode '", mode,
                "' is not one of 'nearest', 'bilinear'");
  const bool bilinear = mode == "bilinear";
  const DTensor x = replicate_where(x_in, [](const Placement& p) { return is_partial(p); });
  const Layout& layout = x.layout();
  const DeviceMesh& mesh = x.device_mesh();
  TESSERA_CHECK(mesh.is_member(), ShardingError, call, "world rank ", rank(), " is not in ", mesh.to_string());
  Tensor local = x.to_local();
  Shape out_shape = layout.global_shape();
  ShardSizes out_sizes;
  std::vector<int64_t> local_size(size), keep_begin(static_cast<size_t>(spatial), 0), keep_length(size);
  std::vector<int64_t> sharded;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t d = 2 + i;
    const size_t k = static_cast<size_t>(i);
    const int64_t length = layout.global_shape()[d];
    out_shape[d] = size[k];
    if (layout.shard_order(d).empty()) continue;
    TESSERA_CHECK(length > 0 && size[k] % length == 0, ShardingError, call, "size ", size[k], " along sharded dim ",
                  d, " is not a whole multiple of its ", length, " rows (", layout.to_string(),
                  "); each piece must grow by the same factor");
    const int64_t scale = size[k] / length, rows = local.shape()[d];
    sharded.push_back(d);
    keep_length[k] = rows * scale;
    if (bilinear) {
      // One row from each side (the edge row repeated beyond the domain, as the op clamps): the
      // outputs kept read only rows of the widened block, with the unsharded weights up to the
      // rounding of source coordinates computed from local indices (about 1e-12 relative on a
      // dim of 4099 rows; exact on short dims).
      local = detail::halo_exchange_local(local, layout, mesh, d, 1, 1, HaloPadding::replicate);
      local_size[k] = (rows + 2) * scale;
      keep_begin[k] = scale;
    } else {
      // Nearest reads only the piece's own rows. An empty piece interpolates one zero row and
      // keeps nothing (the local op needs a row).
      if (rows == 0) {
        Shape one = local.shape();
        one[d] = 1;
        local = cat({local, zeros(one, local.dtype())}, d);
      }
      local_size[k] = std::max<int64_t>(rows, 1) * scale;
    }
    std::vector<int64_t> pieces = layout.piece_sizes(d);
    for (auto& p : pieces) p *= scale;
    out_sizes[d] = std::move(pieces);  // the Layout keeps them only where they differ from chunking
  }
  for (int64_t d : {int64_t{0}, int64_t{1}})
    if (layout.has_explicit_sizes(d)) out_sizes[d] = layout.piece_sizes(d);
  const ShardOrder order = layout.shard_orders();
  Tensor out = tessera::interpolate(local, local_size, mode);
  for (int64_t d : sharded) {
    const size_t k = static_cast<size_t>(d - 2);
    out = out.narrow(d, keep_begin[k], keep_length[k]);
  }
  return DTensor(out, mesh, Layout(out_shape, layout.dtype(), layout.mesh(), layout.placements(), order, out_sizes));
}

DTensor conv1d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias, std::vector<int64_t> stride,
               std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  return conv_nd("conv1d", 1, x, weight, bias, std::move(stride), std::move(padding), std::move(dilation), groups);
}
DTensor conv2d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias, std::vector<int64_t> stride,
               std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  return conv_nd("conv2d", 2, x, weight, bias, std::move(stride), std::move(padding), std::move(dilation), groups);
}
DTensor conv3d(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias, std::vector<int64_t> stride,
               std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  return conv_nd("conv3d", 3, x, weight, bias, std::move(stride), std::move(padding), std::move(dilation), groups);
}

}  // namespace tessera
