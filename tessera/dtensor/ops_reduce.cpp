// Reductions on DTensor. A sharded reduced dim makes the local result a Partial (the rule says
// which); the kernels here only handle what the local op cannot: empty shards of amax/amin and
// mean over uneven shards.
#include <limits>

#include <tessera/core/error.hpp>
#include <tessera/ops/internal/composites.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>

namespace tessera {

using detail::call_op;
using detail::Decision;
using Locals = std::span<const Tensor>;

namespace {

ReduceArgs encode(bool keepdim, const std::vector<int64_t>& dims, int64_t correction = 0) {
  return ReduceArgs{DimVector(dims), keepdim, correction};
}

DTensor extremum(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_max) {
  const char* name = is_max ? "amax" : "amin";
  const auto reduced = normalize_dims(dims, x.shape(), name).vec();
  for (int64_t d : reduced)
    TESSERA_CHECK(x.shape()[d] > 0, ValueError, name, "reducing the zero-size dim ", d, " of shape ",
                  x.shape().to_string());
  return detail::recorded(call_op(is_max ? OpId::amax : OpId::amin, {&x}, encode(keepdim, reduced),
                                  [&](Locals l, const Decision& d) {
                                    bool empty_shard = false;
                                    for (int64_t dim : reduced) empty_shard |= l[0].shape()[dim] == 0;
                                    if (empty_shard)
                                      return full(d.output_local_shape, is_max ? lowest_value(l[0].dtype()) : highest_value(l[0].dtype()), l[0].dtype());
                                    return is_max ? amax(l[0], reduced, keepdim) : amin(l[0], reduced, keepdim);
                                  }),
                          [&](DTensor& out) { derivatives::record_extreme_reduction(name, out, x, reduced, keepdim); });
}

std::vector<int64_t> every_dim(int64_t ndim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  return dims;
}

}  // namespace

DTensor sum(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const auto reduced = normalize_dims(dims, x.shape(), "sum").vec();
  return detail::recorded(
      call_op(OpId::sum, {&x}, encode(keepdim, reduced), [&](Locals l) { return sum(l[0], reduced, keepdim); }),
      [&](DTensor& out) { derivatives::record_sum(out, x, reduced, keepdim, false); });
}

DTensor mean(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const auto reduced = normalize_dims(dims, x.shape(), "mean").vec();
  return detail::recorded(call_op(OpId::mean, {&x}, encode(keepdim, reduced),
                                  [&](Locals l, const Decision& d) {
                                    // A contraction the rule made P(sum) (uneven shards): local sum over the global
                                    // count.
                                    const Placements& in = d.targets[0]->placements();
                                    const Placements& out = d.output->placements();
                                    bool summed = false;
                                    for (size_t m = 0; m < out.size(); ++m)
                                      summed |= out[m] == Placement{Partial{ReduceOp::sum}} &&
                                                in[m] != Placement{Partial{ReduceOp::sum}};
                                    if (!summed) return mean(l[0], reduced, keepdim);
                                    int64_t count = 1;
                                    for (int64_t dim : reduced) count *= x.shape()[dim];
                                    return div(sum(l[0], reduced, keepdim), static_cast<double>(count));
                                  }),
                          [&](DTensor& out) { derivatives::record_sum(out, x, reduced, keepdim, true); });
}

DTensor prod(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const auto reduced = normalize_dims(dims, x.shape(), "prod").vec();
  return detail::recorded(
      call_op(OpId::prod, {&x}, encode(keepdim, reduced), [&](Locals l) { return prod(l[0], reduced, keepdim); }),
      [&](DTensor& out) { derivatives::record_prod(out, x, reduced, keepdim); });
}

DTensor amax(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(x, dims, keepdim, true);
}
DTensor amin(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(x, dims, keepdim, false);
}

DTensor var(const DTensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const auto reduced = normalize_dims(dims, x.shape(), "var").vec();
  return detail::recorded(call_op(OpId::var, {&x}, encode(keepdim, reduced, correction), [&](Locals l) { return var(l[0], reduced, correction, keepdim); }),
                          [&](DTensor& out) { derivatives::record_var(out, x, reduced, correction, keepdim); });
}

namespace {

DTensor arg_extremum(const DTensor& x, std::optional<int64_t> dim, bool keepdim, bool is_max) {
  const char* name = is_max ? "argmax" : "argmin";
  std::optional<int64_t> d;
  if (dim) d = normalize_dim(*dim, x.ndim(), name, x.shape());
  if (x.ndim() == 0) d.reset();
  return call_op(is_max ? OpId::argmax : OpId::argmin, {&x}, encode(keepdim, d ? std::vector<int64_t>{*d} : every_dim(x.ndim())), [&](Locals l) {
    return is_max ? argmax(l[0], d, keepdim) : argmin(l[0], d, keepdim);
  });
}

}  // namespace

DTensor argmax(const DTensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(x, dim, keepdim, true);
}
DTensor argmin(const DTensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extremum(x, dim, keepdim, false);
}

DTensor logsumexp(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return composites::logsumexp(x, dims, keepdim);
}
DTensor std(const DTensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return composites::std_dev(x, dims, correction, keepdim);
}
DTensor vector_norm(const DTensor& x, double ord, const std::vector<int64_t>& dims, bool keepdim) {
  return composites::vector_norm(x, ord, dims, keepdim);
}
DTensor all(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) { return composites::all(x, dims, keepdim); }
DTensor any(const DTensor& x, const std::vector<int64_t>& dims, bool keepdim) { return composites::any(x, dims, keepdim); }
ValuesIndices<DTensor> max(const DTensor& x, int64_t dim, bool keepdim) {
  return composites::max_along(x, dim, keepdim, true);
}
ValuesIndices<DTensor> min(const DTensor& x, int64_t dim, bool keepdim) {
  return composites::max_along(x, dim, keepdim, false);
}

}  // namespace tessera
