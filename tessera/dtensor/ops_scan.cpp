// Scans and sorting along one dim on DTensor. A sharded dim is not gathered for a scan or a topk:
// each piece works on its own rows and only a slice per piece (the pieces' totals, or k
// candidates) moves, over all the mesh dims that shard the dim at once, in any shard order.
#include <algorithm>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
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

// x's placements with the Partials other than those in `kept` reduced. The Shards stay: the
// scanned dim's pieces are never gathered.
Placements scannable(const DTensor& x, std::initializer_list<ReduceOp> kept) {
  Placements placements = x.placements();
  for (auto& p : placements)
    if (const auto* partial = std::get_if<Partial>(&p))
      if (std::find(kept.begin(), kept.end(), partial->op) == kept.end()) p = Replicate{};
  return placements;
}

// Every piece of a dim sharded over the mesh dims `order` (splitting order): each rank's `local`
// (the same shape on all of them), stacked on a new dim 0 in piece order, i.e. in the order of
// the pieces along the dim. One all_gather over the ranks that differ from this one only on
// those mesh dims, whose group ranks run row-major over the mesh dims in ascending order.
Tensor gather_pieces(const DeviceMesh& mesh, const std::vector<int64_t>& order, const Tensor& local) {
  std::vector<int64_t> dims = order;
  std::sort(dims.begin(), dims.end());
  const Tensor send = local.contiguous();
  Shape shape = send.shape();
  int64_t pieces = 1;
  for (int64_t m : order) pieces *= mesh.size(m);
  shape.insert(0, pieces);
  Tensor all = empty(shape, send.dtype());
  Communicator& comm = dims.size() == 1 ? mesh.comm(dims.front()) : *mesh.comm_ptr(dims);
  comm.all_gather(send.raw_data(), all.raw_data(), send.numel(), send.dtype());
  std::vector<int64_t> slot_of_piece;
  for (int64_t p = 0; p < pieces; ++p)
    slot_of_piece.push_back(piece_of(mesh.spec(), dims, piece_coordinate(mesh.spec(), order, p)));
  return index_select(all, 0, from_vector<int64_t>(slot_of_piece));
}

template <bool product>
DTensor scan(const DTensor& x, int64_t dim, const char* op) {
  check_defined(x, op);
  const int64_t d = x.ndim() == 0 ? 0 : normalize_dim(dim, x.ndim(), op, x.shape());
  const Placements placements = product ? scannable(x, {}) : scannable(x, {ReduceOp::sum, ReduceOp::avg});
  // A 0-d scan is the identity, which keeps any Partial.
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
  const std::vector<int64_t> order = x.ndim() == 0 ? std::vector<int64_t>{} : xr.layout().shard_order(d);
  const int64_t me = order.empty() ? 0 : piece_of(mesh.spec(), order, mesh.coordinate());
  if (!order.empty() && xr.layout().piece_sizes(d).size() > 1) {
    // Each piece's running value starts from the combined totals of the pieces before it along
    // the dim (empty pieces contribute the identity).
    const Tensor totals = product ? prod(local, {d}, true) : sum(local, {d}, true);
    const Tensor all = gather_pieces(mesh, order, totals);
    Tensor offset = product ? ones(totals.shape(), acc) : zeros(totals.shape(), acc);
    for (int64_t i = 0; i < me; ++i) offset = product ? mul(offset, all.select(0, i)) : add(offset, all.select(0, i));
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
  const DTensor xr = implicit_redistribute(x, scannable(x, {}), "topk");
  const DeviceMesh& mesh = xr.device_mesh();
  const std::vector<int64_t> order = xr.layout().shard_order(d);
  // The result: dim d of size k, whole on every rank of the mesh dims that shard d.
  Placements out_placements = xr.placements();
  for (int64_t m : order) out_placements[static_cast<size_t>(m)] = Replicate{};
  Shape out_shape = x.shape();
  out_shape[d] = k;
  // The other dims keep xr's shard order and explicit piece sizes (an uneven layout stays uneven).
  ShardOrder kept_order;
  ShardSizes sizes;
  for (int64_t i = 0; i < x.ndim(); ++i) {
    if (i == d || xr.layout().shard_order(i).empty()) continue;
    kept_order[i] = xr.layout().shard_order(i);
    if (xr.layout().has_explicit_sizes(i)) sizes[i] = xr.layout().piece_sizes(i);
  }
  const Layout values_layout(out_shape, x.dtype(), xr.layout().mesh(), out_placements, kept_order, sizes);
  if (!mesh.is_member()) return {};
  const Tensor local = DTensorAccess::local(xr).detach();
  ValuesIndices<Tensor> picked;
  if (xr.layout().piece_sizes(d).size() <= 1) {
    picked = topk(local, k, d, largest, sorted);
  } else {
    // Each piece's best min(k, piece) with global indices, gathered over the mesh dims sharding d
    // (one all_gather over all of them, whatever their order): every piece sends k
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
    const Tensor all_values = gather_pieces(mesh, order, values), all_indices = gather_pieces(mesh, order, indices);
    // [p, ..., k, ...] -> [..., p * k, ...] along d, in piece order.
    std::vector<Tensor> value_parts, index_parts;
    for (int64_t i = 0; i < all_values.shape()[0]; ++i) {
      value_parts.push_back(all_values.select(0, i));
      index_parts.push_back(all_indices.select(0, i));
    }
    const Tensor pool_values = cat(value_parts, d), pool_indices = cat(index_parts, d);
    // Real candidates first on ties with a marker: sort by (value, index) through a stable pick
    // over candidates ordered by global index.
    const ValuesIndices<Tensor> by_index = sort(pool_indices, d, false);
    const Tensor by_index_values = gather(pool_values, d, by_index.indices);
    const ValuesIndices<Tensor> best = topk(by_index_values, k, d, largest, true);
    picked = {best.values, gather(by_index.values, d, best.indices)};
  }
  ValuesIndices<DTensor> out{DTensor(picked.values, mesh, values_layout),
                             DTensor(picked.indices, mesh, values_layout.with_dtype(DType::i64))};
  record_picked("topk", out.values, xr, out.indices, d);
  return out;
}

}  // namespace tessera
