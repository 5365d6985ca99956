// Indexing ops on DTensor: the Tensor op on the shards under the rules of
// sharding/index_rules.cpp. Index values are global positions along the indexed dim, which the
// rules keep whole in x, so a local index addresses the local x directly.
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/indexing.hpp>

namespace tessera {

using detail::call_op;
using Locals = std::span<const Tensor>;

namespace {

// The checks of the Tensor op, on metadata only (so every rank throws alike), plus the index
// range, checked collectively (detail::check_index_range).
int64_t checked_dim(const char* op, const DTensor& x, int64_t dim, const DTensor& index, bool same_ndim) {
  TESSERA_CHECK(x.ndim() > 0, ValueError, op, "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), op, x.shape());
  check_index_args(op, x.shape(), index.shape(), index.dtype(), d, same_ndim);
  detail::check_index_range(index, x.shape()[d], std::nullopt, op, "index");
  return d;
}

}  // namespace

DTensor gather(const DTensor& x, int64_t dim, const DTensor& index) {
  const int64_t d = checked_dim("gather", x, dim, index, true);
  return detail::recorded(
      call_op(OpId::gather, {&x, &index}, DimArgs{d}, [d](Locals l) { return gather(l[0], d, l[1]); }),
      [&](DTensor& out) { derivatives::record_gather(out, x, d, index); });
}

namespace {
DTensor scattered(OpId op, const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src) {
  const bool adding = op == OpId::scatter_add;
  const int64_t d = checked_dim(op_name(op), x, dim, index, true);
  TESSERA_CHECK(src.shape() == index.shape(), ValueError, op_name(op), "src of shape ", src.shape().to_string(),
                " for index of shape ", index.shape().to_string(), "; on DTensor src must have index's shape");
  return detail::recorded(call_op(op, {&x, &index, &src}, DimArgs{d},
                                  [d, adding](Locals l) {
                                    return adding ? scatter_add(l[0], d, l[1], l[2]) : scatter(l[0], d, l[1], l[2]);
                                  }),
                          [&](DTensor& out) { derivatives::record_scatter(out, x, d, index, src, adding); });
}
}  // namespace

DTensor scatter(const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src) {
  return scattered(OpId::scatter, x, dim, index, src);
}
DTensor scatter_add(const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src) {
  return scattered(OpId::scatter_add, x, dim, index, src);
}

DTensor index_select(const DTensor& x, int64_t dim, const DTensor& index) {
  const int64_t d = checked_dim("index_select", x, dim, index, false);
  return detail::recorded(
      call_op(OpId::index_select, {&x, &index}, DimArgs{d}, [d](Locals l) { return index_select(l[0], d, l[1]); }),
      [&](DTensor& out) { derivatives::record_index_select(out, x, d, index); });
}

DTensor index_add(const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src, Scalar alpha) {
  const int64_t d = checked_dim("index_add", x, dim, index, false);
  Shape expected = x.shape();
  expected[d] = index.shape()[0];
  TESSERA_CHECK(src.shape() == expected, ValueError, "index_add", "src of shape ", src.shape().to_string(),
                " for input of shape ", x.shape().to_string(), " and ", index.shape()[0], " indices; expected ",
                expected.to_string());
  check_index_add_alpha(x.dtype(), alpha);
  // Scaled where src lies (elementwise: no data moves), and differentiable on its own.
  const DTensor scaled = alpha.to_double() == 1.0 ? src : mul(src, alpha);
  return detail::recorded(call_op(OpId::index_add, {&x, &index, &scaled}, DimArgs{d},
                                  [d](Locals l) { return index_add(l[0], d, l[1], l[2]); }),
                          [&](DTensor& out) { derivatives::record_index_add(out, x, d, index, scaled); });
}

}  // namespace tessera
