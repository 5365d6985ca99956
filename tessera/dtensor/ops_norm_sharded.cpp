// layer_norm and rms_norm with a normalised dim sharded. Moving x so that rows are whole (what the
// factor rule asks for) costs an all_to_all of x in the forward and of its gradient in the
// backward, plus the reduction of the affine gradients: two collectives in the backward. Here each
// rank normalises its own block of every row and only per-row numbers move:
//   forward:  per piece and row the sum and the centred sum of squares, one all_gather; merged
//             exactly (Chan et al.'s parallel variance, no E[x^2] - E[x]^2 cancellation);
//   backward: per row sum(g w xhat) and sum(g w), one all_reduce, carrying the affine gradients
//             too when those are replicated (each rank fills in the columns it holds).
// The statistics of the forward are kept for the backward, as ATen keeps mean and rstd.
#include <tessera/dtensor/detail/norm_sharded.hpp>

#include <algorithm>
#include <memory>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/dtensor/explicit_redistribution.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::detail {

namespace {

// Where x's normalised dims are split: the group that splits them and the mesh dims splitting rows.
struct NormSplit {
  int64_t first = 0;                   // x's first normalised dim
  std::vector<int64_t> group_dims;     // mesh dims (> 1 rank) sharding a normalised dim, ascending
  std::vector<int64_t> row_mesh_dims;  // mesh dims sharding a row dim: affine gradients are Partial over them
};

NormSplit split_of(const DTensor& x, int64_t count) {
  NormSplit s;
  s.first = x.ndim() - count;
  const Placements& placements = x.placements();
  for (int64_t m = 0; m < static_cast<int64_t>(placements.size()); ++m) {
    const auto* shard = std::get_if<Shard>(&placements[static_cast<size_t>(m)]);
    if (!shard) continue;
    if (shard->dim < s.first) s.row_mesh_dims.push_back(m);
    else if (x.device_mesh().size(m) > 1) s.group_dims.push_back(m);
  }
  return s;
}

// x's sharding of its normalised dims, on a tensor of those dims (an affine operand): the same
// mesh dims in the same order with the same pieces, Replicate elsewhere.
Layout mirrored(const Layout& x, int64_t first, const Shape& shape, DType dtype) {
  Placements placements(x.placements().size(), Replicate{});
  for (size_t m = 0; m < placements.size(); ++m)
    if (const auto* shard = std::get_if<Shard>(&x.placements()[m]); shard && shard->dim >= first)
      placements[m] = Shard{shard->dim - first};
  ShardOrder order;
  ShardSizes sizes;
  for (int64_t k = 0; k < shape.size(); ++k) {
    if (x.shard_order(first + k).size() > 1) order[k] = x.shard_order(first + k);
    if (x.has_explicit_sizes(first + k)) sizes[k] = x.piece_sizes(first + k);
  }
  return Layout(shape, dtype, x.mesh(), std::move(placements), std::move(order), std::move(sizes));
}

// An affine operand as the rows use it: its block matching x's block of the normalised dims.
struct Affine {
  DTensor source;   // what its gradient is recorded against: the operand, or the operand moved
  Tensor local;     // that block, flattened
  bool whole = false;  // the operand is replicated: its gradient is made whole in the backward
};

std::optional<Affine> affine_of(const std::optional<DTensor>& param, const char* what, size_t input, const char* op,
                                const DTensor& x, const NormSplit& split, const Block& x_block) {
  if (!param) return std::nullopt;
  Shape normalized;
  for (int64_t d = split.first; d < x.ndim(); ++d) normalized.push_back(x.shape()[d]);
  TESSERA_CHECK(param->shape() == normalized, ValueError, op, what, " shape ", param->shape().to_string(),
                " does not match normalized_shape ", normalized.to_string(), " (input shape ", x.shape().to_string(), ")");
  TESSERA_CHECK(param->dtype() == x.dtype(), ValueError, op, what, " dtype ", name(param->dtype()),
                " does not match input dtype ", name(x.dtype()), "; convert it with .to(", name(x.dtype()), ")");
  const Layout target = mirrored(x.layout(), split.first, normalized, x.dtype());
  Affine a;
  a.source = *param;
  if (param->layout().is_replicated() && !(param->layout() == target)) {
    // Sliced here rather than redistributed: the gradient then comes back whole with the
    // backward's all_reduce instead of an all_gather of its own.
    a.whole = true;
    Tensor block = DTensorAccess::local(*param);
    for (int64_t k = 0; k < normalized.size(); ++k) {
      const int64_t d = split.first + k;
      block = block.narrow(k, x_block.begin[d], x_block.end[d] - x_block.begin[d]);
    }
    a.local = block.reshape({-1});
    return a;
  }
  if (!(param->layout() == target)) {
    if (ExplicitRedistributionContext::active()) check_implicit_redistribution(op, input, *cached_plan(param->layout(), target));
    a.source = param->redistribute(param->device_mesh(), target);
  }
  a.local = DTensorAccess::local(a.source).reshape({-1});
  return a;
}

// Per row of `rows` ([R, C]): the sum and the sum of squares about the piece's own mean, [R, 2] f64.
Tensor piece_stats(const Tensor& rows) {
  const Tensor r = rows.to(DType::f64);
  const int64_t c = r.shape()[1];
  const Tensor total = sum(r, {1}, true);
  const Tensor centred = c > 0 ? sub(r, div(total, Scalar(static_cast<double>(c)))) : r;
  return cat({total, sum(mul(centred, centred), {1}, true)}, 1);
}

// The pieces' counts of normalised elements per row, in group rank order (row-major over the
// group's mesh dims, as DeviceMesh::comm_ptr numbers them).
std::vector<int64_t> piece_counts(const Layout& layout, const NormSplit& split, const DeviceMesh& mesh) {
  int64_t members = 1;
  for (int64_t m : split.group_dims) members *= mesh.size(m);
  std::vector<int64_t> counts;
  std::vector<int64_t> coordinate = mesh.coordinate();
  for (int64_t j = 0; j < members; ++j) {
    int64_t rest = j;
    for (auto it = split.group_dims.rbegin(); it != split.group_dims.rend(); ++it) {
      coordinate[static_cast<size_t>(*it)] = rest % mesh.size(*it);
      rest /= mesh.size(*it);
    }
    const Shape block = layout.block(coordinate).shape();
    int64_t c = 1;
    for (int64_t d = split.first; d < layout.ndim(); ++d) c *= block[d];
    counts.push_back(c);
  }
  return counts;
}

// Mean (0 for rms_norm) and 1 / sqrt(variance or mean square + eps) per row, [R, 1] f64 each,
// from the gathered [pieces, R, 2] stats: M2 = sum_j M2_j + c_j (mean_j - mean)^2.
std::pair<Tensor, Tensor> merged(const Tensor& gathered, const std::vector<int64_t>& counts, double eps, bool centred) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  const double inv_n = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  const Shape row_shape{gathered.shape()[1], 1};
  Tensor mean = zeros(row_shape, DType::f64);
  if (centred)
    for (size_t j = 0; j < counts.size(); ++j) mean = add(mean, gathered.select(0, static_cast<int64_t>(j)).narrow(1, 0, 1));
  mean = mul(mean, Scalar(inv_n));
  Tensor squares = zeros(row_shape, DType::f64);
  for (size_t j = 0; j < counts.size(); ++j) {
    if (counts[j] == 0) continue;
    const Tensor piece = gathered.select(0, static_cast<int64_t>(j));
    const double c = static_cast<double>(counts[j]);
    const Tensor offset = sub(div(piece.narrow(1, 0, 1), Scalar(c)), mean);
    squares = add(squares, add(piece.narrow(1, 1, 1), mul(mul(offset, offset), Scalar(c))));
  }
  return {mean, rsqrt(add(mul(squares, Scalar(inv_n)), Scalar(eps)))};
}

// `part` (x's block of the normalised dims, flattened) in a zero tensor of the normalised dims.
Tensor placed(const Tensor& part, const Shape& normalized, const Block& x_block, int64_t first) {
  Shape block_shape;
  std::vector<int64_t> pads;
  for (int64_t k = normalized.size() - 1; k >= 0; --k)
    pads.insert(pads.end(), {x_block.begin[first + k], normalized[k] - x_block.end[first + k]});
  for (int64_t k = 0; k < normalized.size(); ++k) block_shape.push_back(x_block.end[first + k] - x_block.begin[first + k]);
  return pad(part.reshape(block_shape), pads).reshape({-1});
}

// What the backward needs of the forward.
struct Saved {
  DTensor x;  // detached
  NormSplit split;
  std::shared_ptr<Communicator> group;
  Tensor mean, rstd;  // per local row, [R, 1] in the compute dtype
  int64_t n = 0;      // normalised elements per row
  bool centred = true;
  std::optional<Tensor> weight;                  // the weight's block (flattened)
  bool weight_whole = false, bias_whole = false;  // Affine::whole
  bool has_bias = false;
  Layout weight_layout, bias_layout;  // their sources' layouts
};

// The affine gradient's layout: the source's, Partial over the mesh dims that split the rows.
Layout partial_over_rows(const Layout& source, const NormSplit& split) {
  Placements placements = source.placements();
  for (int64_t m : split.row_mesh_dims) placements[static_cast<size_t>(m)] = Partial{ReduceOp::sum};
  return source.with_placements(std::move(placements));
}

std::vector<DTensor> backward(const Saved& s, const DTensor& grad) {
  const DeviceMesh& mesh = s.x.device_mesh();
  const Layout& layout = s.x.layout();
  const DTensor g = grad.layout() == layout.with_dtype(grad.dtype()) ? grad
                                                                     : grad.redistribute(mesh, layout.with_dtype(grad.dtype()));
  const Tensor& x_local = DTensorAccess::local(s.x);
  const DType acc = s.mean.dtype();
  const int64_t rows = s.mean.shape()[0];
  int64_t columns = 1;
  for (int64_t d = s.split.first; d < x_local.ndim(); ++d) columns *= x_local.shape()[d];
  const Tensor xr = x_local.to(acc).reshape({rows, columns});
  const Tensor gr = DTensorAccess::local(g).to(acc).reshape(xr.shape());
  const Tensor xhat = mul(s.centred ? sub(xr, s.mean) : xr, s.rstd);
  const Tensor gw = s.weight ? mul(gr, s.weight->to(acc)) : gr;
  // One buffer, one all_reduce: the per-row sums, then the replicated affine gradients' blocks
  // placed among zeros (each column is held by one rank of the group).
  const Block x_block = layout.block(mesh.coordinate());
  Shape normalized;
  for (int64_t d = s.split.first; d < layout.ndim(); ++d) normalized.push_back(layout.global_shape()[d]);
  std::vector<Tensor> packed{sum(mul(gw, xhat), {1})};
  if (s.centred) packed.push_back(sum(gw, {1}));
  const Tensor dw = s.weight ? sum(mul(gr, xhat), {0}) : Tensor();
  const Tensor db = s.has_bias ? sum(gr, {0}) : Tensor();
  if (s.weight && s.weight_whole) packed.push_back(placed(dw, normalized, x_block, s.split.first));
  if (s.has_bias && s.bias_whole) packed.push_back(placed(db, normalized, x_block, s.split.first));
  Tensor buffer = cat(packed, 0).contiguous();
  s.group->all_reduce(buffer.raw_data(), buffer.numel(), buffer.dtype(), ReduceOp::sum);
  int64_t at = 0;
  const auto take = [&](int64_t count) {
    const Tensor part = buffer.narrow(0, at, count);
    at += count;
    return part;
  };
  const double inv_n = s.n > 0 ? 1.0 / static_cast<double>(s.n) : 0.0;
  const Tensor dot = mul(take(rows).reshape({rows, 1}), Scalar(inv_n));
  Tensor inner = sub(gw, mul(xhat, dot));
  if (s.centred) inner = sub(inner, mul(take(rows).reshape({rows, 1}), Scalar(inv_n)));
  const DType out_dtype = grad.dtype();
  std::vector<DTensor> grads{DTensor(mul(inner, s.rstd).to(out_dtype).reshape(x_local.shape()), mesh,
                                     layout.with_dtype(out_dtype))};
  const auto affine_grad = [&](const Tensor& part, bool whole, const Layout& source) {
    const Layout out = partial_over_rows(source, s.split).with_dtype(out_dtype);
    const Tensor local = whole ? take(normalized.numel()) : part;
    return DTensor(local.to(out_dtype).reshape(out.local_shape(mesh.coordinate())), mesh, out);
  };
  grads.push_back(s.weight ? affine_grad(dw, s.weight_whole, s.weight_layout) : DTensor());
  grads.push_back(s.has_bias ? affine_grad(db, s.bias_whole, s.bias_layout) : DTensor());
  return grads;
}

}  // namespace

bool shards_normalized_dim(const DTensor& x, int64_t count) {
  if (x.layout().has_partial()) return false;
  return !split_of(x, count).group_dims.empty();
}

DTensor norm_over_sharded_dims(const char* op, const DTensor& x, int64_t count, const std::optional<DTensor>& weight,
                               const std::optional<DTensor>& bias, double eps, bool centred) {
  TESSERA_CHECK(is_floating(x.dtype()), ValueError, op, "expects a floating input, got ", name(x.dtype()));
  const DeviceMesh& mesh = x.device_mesh();
  for (const std::optional<DTensor>* param : {&weight, &bias})
    TESSERA_CHECK(!*param || (*param)->layout().mesh() == mesh.spec(), ShardingError, op, "input ",
                  x.layout().to_string(), " and ", param == &weight ? "weight " : "bias ", (*param)->layout().to_string(),
                  " live on different meshes; move one with redistribute(mesh, placements)");
  TESSERA_CHECK(mesh.is_member(), ShardingError, op, "world rank ", rank(), " is not in ", mesh.to_string(),
                "; ops on DTensors run on the mesh's ranks only");
  const NormSplit split = split_of(x, count);
  const Block x_block = x.layout().block(mesh.coordinate());
  std::optional<Affine> w = affine_of(weight, "weight", 1, op, x, split, x_block);
  std::optional<Affine> b = affine_of(bias, "bias", 2, op, x, split, x_block);

  const Tensor& x_local = DTensorAccess::local(x);
  const DType acc = compute_dtype(x.dtype());
  int64_t rows = 1, columns = 1;
  for (int64_t d = 0; d < x.ndim(); ++d) (d < split.first ? rows : columns) *= x_block.end[d] - x_block.begin[d];
  const Tensor xr = x_local.detach().to(acc).reshape({rows, columns});

  std::shared_ptr<Communicator> group = mesh.comm_ptr(split.group_dims);
  const Tensor stats = piece_stats(xr).contiguous();
  Tensor gathered = empty(Shape{group->size(), rows, 2}, DType::f64);
  group->all_gather(stats.raw_data(), gathered.raw_data(), stats.numel(), DType::f64);
  const std::vector<int64_t> counts = piece_counts(x.layout(), split, mesh);
  const auto [mean, rstd] = merged(gathered, counts, eps, centred);

  const Tensor mean_acc = mean.to(acc), rstd_acc = rstd.to(acc);
  Tensor y = mul(centred ? sub(xr, mean_acc) : xr, rstd_acc);
  if (w) y = mul(y, w->local.detach().to(acc));
  if (b) y = add(y, b->local.detach().to(acc));
  DTensor out(y.to(x.dtype()).reshape(x_local.shape()), mesh, x.layout());

  const std::vector<const DTensor*> inputs{&x, w ? &w->source : nullptr, b ? &b->source : nullptr};
  if (!autograd::needs_grad<DTensor>({inputs[0], inputs[1], inputs[2]})) return out;
  auto saved = std::make_shared<Saved>();
  saved->x = x.detach();
  saved->split = split;
  saved->group = group;
  saved->mean = mean_acc;
  saved->rstd = rstd_acc;
  for (int64_t c : counts) saved->n += c;
  saved->centred = centred;
  if (w) {
    saved->weight = w->local.detach();
    saved->weight_whole = w->whole;
    saved->weight_layout = w->source.layout();
  }
  if (b) {
    saved->has_bias = true;
    saved->bias_whole = b->whole;
    saved->bias_layout = b->source.layout();
  }
  autograd::record<DTensor, DTensor>(op, out, inputs, [saved](const DTensor& g) { return backward(*saved, g); });
  return out;
}

}  // namespace tessera::detail
