// Scans and sorting along one dim on DTensor. A sharded dim is not gathered for a scan or a topk:
// each piece works on its own rows and only a slice per piece (the pieces' totals, or k
// candidates) moves over the mesh dim that shards the dim.
#include <algorithm>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/detail/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/indexing.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/ops/sort_scan.hpp>

namespace tessera {

namespace {

using detail::DTensorAccess;
using detail::implicit_redistribute;

// Ranks outside the mesh hold no local; a default-constructed DTensor has no mesh at all.
void check_defined(const DTensor& x, const char* op) {
  TESSERA_CHECK(x.device_mesh().ndim() > 0 && (x.defined() || !x.device_mesh().is_member()), ShardingError, op,
                "the input is an undefined DTensor");
}

// x's placements with dim d sharded by at most its first mesh dim in shard order (the others
// Replicate), and Partials other than those in `kept` reduced. Returns the mesh dim still sharding
// d, or -1.
int64_t scannable(const DTensor& x, int64_t d, std::initializer_list<ReduceOp> kept, Placements& placements) {
  placements = x.placements();
  const auto& order = x.layout().shard_order(d);
  for (size_t i = 1; i < order.size(); ++i) placements[static_cast<size_t>(order[i])] = Replicate{};
  for (auto& p : placements)
    if (const auto* partial = std::get_if<Partial>(&p))
      if (std::find(kept.begin(), kept.end(), partial->op) == kept.end()) p = Replicate{};
  return order.empty() ? -1 : order.front();
}

// Every rank of mesh dim m's pieces of `local` (the same shape along m), stacked on a new dim 0.
Tensor gather_over(const DeviceMesh& mesh, int64_t m, const Tensor& local) {
  const Tensor send = local.contiguous();
  Shape shape = send.shape();
  shape.insert(0, mesh.size(m));
  Tensor all = empty(shape, send.dtype());
  mesh.comm(m).all_gather(send.raw_data(), all.raw_data(), send.numel(), send.dtype());
  return all;
}

template <bool product>
DTensor scan(const DTensor& x, int64_t dim, const char* op) {
  check_defined(x, op);
  const int64_t d = x.ndim() == 0 ? 0 : normalize_dim(dim, x.ndim(), op, x.shape());
  Placements placements;
  const int64_t m = x.ndim() == 0 ? -1
                                  : scannable(x, d, product ? std::initializer_list<ReduceOp>{}
                                                            : std::initializer_list<ReduceOp>{ReduceOp::sum, ReduceOp::avg},
                                              placements);
  const DTensor xr = x.ndim() == 0 ? x : implicit_redistribute(x, placements, op);
  const DeviceMesh& mesh = xr.device_mesh();
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  const Layout out_layout = xr.layout().with_dtype(out_dtype);
  if (!mesh.is_member()) return DTensor();
  // Accumulate in f64 / i64 like the Tensor kernel, so the pieces' offsets add no rounding of
  // their own.
  const DType acc = is_floating(x.dtype()) ? DType::f64 : DType::i64;
  const Tensor local = DTensorAccess::local(xr).to(acc);
  Tensor result = product ? cumprod(local, d) : cumsum(local, d);
  if (m >= 0 && mesh.size(m) > 1) {
    const Tensor totals = product ? prod(local, {d}, true) : sum(local, {d}, true);
    const Tensor all = gather_over(mesh, m, totals);
    const int64_t c = mesh.coordinate()[static_cast<size_t>(m)];
    Tensor offset = product ? ones(totals.shape(), acc) : zeros(totals.shape(), acc);
    for (int64_t i = 0; i < c; ++i) offset = product ? mul(offset, all.select(0, i)) : add(offset, all.select(0, i));
    result = product ? mul(result, offset) : add(result, offset);
  }
  DTensor out(result.to(out_dtype), mesh, out_layout);
  if (product)
    derivatives::record_cumprod(out, xr, d);
  else
    derivatives::record_cumsum(out, xr, d);
  return out;
}

// Records the values of a pick along d (sort, topk): the gradient is written back at the picked
// global indices, each rank into its own piece of x (no communication).
void record_picked(const char* op, DTensor& values, const DTensor& x, const DTensor& indices, int64_t d) {
  if (!autograd::needs_grad<DTensor>({&x})) return;
  autograd::record<DTensor>(op, values, {&x},
                            [x_layout = x.layout(), values_layout = values.layout(), indices, d](const DTensor& g) {
                              const DTensor gv = g.redistribute(g.device_mesh(), values_layout.with_dtype(g.dtype()));
                              const DeviceMesh& mesh = gv.device_mesh();
                              const Block block = x_layout.block(mesh.coordinate());
                              const Tensor local = detail::place_along(block.shape(), d, DTensorAccess::local(indices),
                                                                       DTensorAccess::local(gv), block.begin[d]);
                              return std::vector<DTensor>{DTensor(local, mesh, x_layout.with_dtype(g.dtype()))};
                            });
}

}  // namespace

DTensor cumsum(const DTensor& x, int64_t dim) { return scan<false>(x, dim, "cumsum"); }
DTensor cumprod(const DTensor& x, int64_t dim) { return scan<true>(x, dim, "cumprod"); }

ValuesIndices<DTensor> sort(const DTensor& x, int64_t dim, bool descending) {
  check_defined(x, "sort");
  const int64_t d = x.ndim() == 0 ? 0 : normalize_dim(dim, x.ndim(), "sort", x.shape());
  Placements placements = x.placements();
  for (auto& p : placements)
    if (is_partial(p) || (x.ndim() > 0 && std::get_if<Shard>(&p) && std::get<Shard>(p).dim == d)) p = Replicate{};
  const DTensor xr = implicit_redistribute(x, placements, "sort");
  const DeviceMesh& mesh = xr.device_mesh();
  if (!mesh.is_member()) return {};
  ValuesIndices<Tensor> local = sort(DTensorAccess::local(xr).detach(), d, descending);
  ValuesIndices<DTensor> out{DTensor(local.values, mesh, xr.layout()),
                             DTensor(local.indices, mesh, xr.layout().with_dtype(DType::i64))};
  record_picked("sort", out.values, xr, out.indices, d);
  return out;
}

ValuesIndices<DTensor> topk(const DTensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  check_defined(x, "topk");
  const int64_t d = x.ndim() == 0 ? 0 : normalize_dim(dim, x.ndim(), "topk", x.shape());
  if (x.ndim() == 0) {
    TESSERA_CHECK(k == 1, ValueError, "topk", "k = ", k, " for a 0-d tensor; expected 1");
    const Placements replicated(x.placements().size(), Replicate{});
    return {implicit_redistribute(x, replicated, "topk"), zeros({}, x.device_mesh(), replicated, DType::i64)};
  }
  const int64_t n = x.shape()[d];
  TESSERA_CHECK(k >= 0 && k <= n, ValueError, "topk", "k = ", k, " out of range for dim ", d, " of size ", n,
                " (shape ", x.shape().to_string(), ")");
  Placements placements;
  const int64_t m = scannable(x, d, {}, placements);
  const DTensor xr = implicit_redistribute(x, placements, "topk");
  const DeviceMesh& mesh = xr.device_mesh();
  // The result: dim d of size k, whole on every rank of mesh dim m.
  Placements out_placements = xr.placements();
  if (m >= 0) out_placements[static_cast<size_t>(m)] = Replicate{};
  Shape out_shape = x.shape();
  out_shape[d] = k;
  // The other dims keep xr's shard order and explicit piece sizes (an uneven layout stays uneven).
  ShardOrder order;
  ShardSizes sizes;
  for (int64_t k = 0; k < x.ndim(); ++k) {
    if (k == d || xr.layout().shard_order(k).empty()) continue;
    order[k] = xr.layout().shard_order(k);
    if (xr.layout().has_explicit_sizes(k)) sizes[k] = xr.layout().piece_sizes(k);
  }
  const Layout values_layout(out_shape, x.dtype(), xr.layout().mesh(), out_placements, order, sizes);
  if (!mesh.is_member()) return {};
  const Tensor local = DTensorAccess::local(xr).detach();
  ValuesIndices<Tensor> picked;
  if (m < 0 || mesh.size(m) == 1) {
    picked = topk(local, k, d, largest, sorted);
  } else {
    // Each piece's best min(k, piece) with global indices, gathered over m: every piece sends k
    // (padded with the piece's own candidates' worst, never better than a real one), then the
    // best k of the p * k candidates.
    const std::vector<int64_t> coordinate = mesh.coordinate();
    const Block block = xr.layout().block(coordinate);
    const int64_t piece = local.shape()[d];
    const int64_t mine = std::min(k, piece);
    ValuesIndices<Tensor> candidates = topk(local, mine, d, largest, true);
    Tensor indices = add(candidates.indices, Scalar(block.begin[d]));
    Tensor values = candidates.values;
    // Pad to k per piece with markers that lose every comparison: the dim's own extreme value
    // and an index past the dim, dropped below.
    if (mine < k) {
      Shape pad_shape = values.shape();
      pad_shape[d] = k - mine;
      const Tensor pad_values = full(pad_shape, largest ? lowest_value(values.dtype()) : highest_value(values.dtype()),
                                     values.dtype());
      values = cat({values, pad_values}, d);
      indices = cat({indices, full(pad_shape, static_cast<double>(n), DType::i64)}, d);
    }
    const Tensor all_values = gather_over(mesh, m, values), all_indices = gather_over(mesh, m, indices);
    // [p, ..., k, ...] -> [..., p * k, ...] along d, in piece order.
    std::vector<Tensor> value_parts, index_parts;
    for (int64_t i = 0; i < mesh.size(m); ++i) {
      value_parts.push_back(all_values.select(0, i));
      index_parts.push_back(all_indices.select(0, i));
    }
    const Tensor pool_values = cat(value_parts, d), pool_indices = cat(index_parts, d);
    // Real candidates first on ties with a marker: sort by (value, index) through a stable pick
    // over candidates ordered by global index.
    const ValuesIndices<Tensor> order = sort(pool_indices, d, false);
    const Tensor by_index_values = gather(pool_values, d, order.indices);
    const ValuesIndices<Tensor> best = topk(by_index_values, k, d, largest, true);
    picked = {best.values, gather(order.values, d, best.indices)};
  }
  ValuesIndices<DTensor> out{DTensor(picked.values, mesh, values_layout),
                             DTensor(picked.indices, mesh, values_layout.with_dtype(DType::i64))};
  record_picked("topk", out.values, xr, out.indices, d);
  return out;
}

}  // namespace tessera
