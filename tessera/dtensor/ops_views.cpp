// Views, joins and splits on DTensor. Shapes are validated here (on the global shape), so every
// rank throws the same ValueError; the rules (sharding/view_rules.hpp) decide the layouts.
#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

using detail::call_op;
using detail::Decision;
using Locals = std::span<const Tensor>;

namespace {

void record_permute(DTensor& out, const DTensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
  derivatives::record_unary(
      "permute", out, x, [inverse](const DTensor& g, const DTensor&, const DTensor&) { return permute(g, inverse); });
}

// The gradient of narrow: g with zeros joined on either side along dim (in g's sharding).
void record_narrow(DTensor& out, const DTensor& x, int64_t dim, int64_t start, int64_t length) {
  derivatives::record_unary("narrow", out, x,
                            [shape = x.shape(), dim, start, length](const DTensor& g, const DTensor&, const DTensor&) {
                              const Placements placements = gradient_layout(g.layout()).placements();
                              std::vector<DTensor> pieces;
                              const auto zeros_of = [&](int64_t size) {
                                Shape piece = shape;
                                piece[dim] = size;
                                return zeros(piece, g.device_mesh(), placements, g.dtype());
                              };
                              if (start > 0) pieces.push_back(zeros_of(start));
                              pieces.push_back(g);
                              if (shape[dim] - start - length > 0)
                                pieces.push_back(zeros_of(shape[dim] - start - length));
                              return pieces.size() == 1 ? g : cat(pieces, dim);
                            });
}

// reshape and view share one rule; `op` is the user's call, for its errors and its graph node.
DTensor reshape_named(const char* op, const DTensor& x, const Shape& shape) {
  TESSERA_CHECK(x.device_mesh().size() > 0, ShardingError, op,
                "the input is an undefined DTensor (default-constructed), for shape ", shape.to_string(),
                "; expected a DTensor on a mesh");
  const Shape resolved = infer_shape(shape, x.numel(), x.shape(), op);
  return detail::recorded(
      call_op(OpId::reshape, {&x}, ShapeArgs{resolved}, [](Locals l, const Decision& d) { return l[0].reshape(d.output_local_shape); }),
      [&](DTensor& out) {
        derivatives::record_unary(
            op, out, x,
            [shape = x.shape()](const DTensor& g, const DTensor&, const DTensor&) { return reshape(g, shape); });
      });
}

}  // namespace

DTensor reshape(const DTensor& x, const Shape& shape) { return reshape_named("reshape", x, shape); }

DTensor view(const DTensor& x, const Shape& shape) { return reshape_named("view", x, shape); }

DTensor flatten(const DTensor& x, int64_t start_dim, int64_t end_dim) {
  return reshape(x, flatten_shape(x.shape(), start_dim, end_dim));
}

DTensor unsqueeze(const DTensor& x, int64_t dim) {
  const int64_t d = normalize_dim(dim, x.ndim() + 1, "unsqueeze", x.shape());
  Shape shape = x.shape();
  shape.insert(d, 1);
  return reshape(x, shape);
}

DTensor squeeze(const DTensor& x) {
  Shape shape;
  for (int64_t s : x.shape())
    if (s != 1) shape.push_back(s);
  return reshape(x, shape);
}

DTensor squeeze(const DTensor& x, int64_t dim) {
  const int64_t d = normalize_dim(dim, x.ndim(), "squeeze", x.shape());
  if (x.ndim() == 0 || x.shape()[d] != 1) return x;
  Shape shape = x.shape();
  shape.erase(d);
  return reshape(x, shape);
}

DTensor permute(const DTensor& x, const std::vector<int64_t>& dims) {
  const int64_t nd = x.ndim();
  std::vector<int64_t> normalized;
  for (int64_t d : dims) normalized.push_back(d < 0 ? d + nd : d);
  std::vector<int64_t> sorted = normalized;
  std::sort(sorted.begin(), sorted.end());
  bool is_permutation = static_cast<int64_t>(dims.size()) == nd;
  for (int64_t i = 0; is_permutation && i < nd; ++i) is_permutation = sorted[static_cast<size_t>(i)] == i;
  TESSERA_CHECK(is_permutation, ValueError, "permute", "dims ", Shape(dims).to_string(),
                " are not a permutation of the dims of ", x.shape().to_string());
  return detail::recorded(call_op(OpId::permute, {&x}, ShapeArgs{DimVector(normalized)}, [&](Locals l) { return l[0].permute(normalized); }),
                          [&](DTensor& out) { record_permute(out, x, normalized); });
}

DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  const int64_t nd = std::max<int64_t>(x.ndim(), 1);
  const int64_t a = normalize_dim(dim0, nd, "transpose", x.shape());
  const int64_t b = normalize_dim(dim1, nd, "transpose", x.shape());
  if (x.ndim() == 0 || a == b) return x;
  std::vector<int64_t> dims(static_cast<size_t>(x.ndim()));
  for (int64_t d = 0; d < x.ndim(); ++d) dims[static_cast<size_t>(d)] = d;
  std::swap(dims[static_cast<size_t>(a)], dims[static_cast<size_t>(b)]);
  return permute(x, dims);
}

DTensor expand(const DTensor& x, const Shape& shape) {
  const Shape resolved = expand_shape(x.shape(), shape);
  return detail::recorded(
      call_op(OpId::expand, {&x}, ShapeArgs{resolved}, [](Locals l, const Decision& d) { return l[0].expand(d.output_local_shape); }),
      [&](DTensor& out) {
        derivatives::record_unary("expand", out, x,
                                  [shape = x.shape()](const DTensor& g, const DTensor&, const DTensor&) {
                                    return derivatives::sum_to(g, shape);
                                  });
      });
}

DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length) {
  TESSERA_CHECK(x.ndim() > 0, ValueError, "narrow", "cannot narrow a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.ndim(), "narrow", x.shape());
  if (start < 0) start += x.shape()[d];
  TESSERA_CHECK(start >= 0 && length >= 0 && start + length <= x.shape()[d], ValueError, "narrow", "range [", start,
                ", ", start + length, ") out of dim ", dim, " of shape ", x.shape().to_string());
  return detail::recorded(call_op(OpId::narrow, {&x}, NarrowArgs{d, start, length},
                                  [&](Locals l, const Decision& dec) {
                                    const int64_t begin = dec.blocks[0].begin[d];
                                    const int64_t local_start = std::clamp<int64_t>(start - begin, 0, l[0].shape()[d]);
                                    return l[0].narrow(d, local_start, dec.output_local_shape[d]);
                                  }),
                          [&](DTensor& out) { record_narrow(out, x, d, start, length); });
}

DTensor select(const DTensor& x, int64_t dim, int64_t index) {
  TESSERA_CHECK(x.ndim() > 0, ValueError, "select", "cannot select from a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.ndim(), "select", x.shape());
  const int64_t size = x.shape()[d];
  TESSERA_CHECK(index >= -size && index < size, ValueError, "select", "index ", index, " out of range for dim ", dim,
                " of shape ", x.shape().to_string());
  Shape shape = x.shape();
  shape.erase(d);
  return reshape(narrow(x, d, index < 0 ? index + size : index, 1), shape);
}

namespace {

DTensor join(const std::vector<DTensor>& tensors, int64_t dim, bool stacking) {
  std::vector<Shape> shapes;
  for (const auto& t : tensors) shapes.push_back(t.shape());
  const int64_t d = joined_shape(shapes, dim, stacking).dim;
  std::vector<const DTensor*> inputs;
  for (const auto& t : tensors) inputs.push_back(&t);
  DTensor out = detail::dispatch(RuleRegistry::id(stacking ? OpId::stack : OpId::cat), inputs, DimArgs{d},
                                 [&](std::span<const Tensor> l, const Decision&) {
                                   const std::vector<Tensor> locals(l.begin(), l.end());
                                   return stacking ? stack(locals, d) : cat(locals, d);
                                 });
  if (stacking)
    derivatives::record_stack(out, tensors, d);
  else
    derivatives::record_cat(out, tensors, d);
  return out;
}

}  // namespace

DTensor cat(const std::vector<DTensor>& tensors, int64_t dim) { return join(tensors, dim, false); }
DTensor stack(const std::vector<DTensor>& tensors, int64_t dim) { return join(tensors, dim, true); }

std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  TESSERA_CHECK(x.ndim() > 0, ValueError, "split", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "split", x.shape());
  check_split_sizes(sizes, x.shape(), d);
  std::vector<DTensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, d, start, s));
    start += s;
  }
  return out;
}

std::vector<DTensor> split(const DTensor& x, int64_t split_size, int64_t dim) {
  TESSERA_CHECK(x.ndim() > 0, ValueError, "split", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "split", x.shape());
  return split(x, split_sizes(x.shape(), d, split_size), d);
}

std::vector<DTensor> chunk(const DTensor& x, int64_t chunks, int64_t dim) {
  TESSERA_CHECK(x.ndim() > 0, ValueError, "chunk", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "chunk", x.shape());
  return split(x, chunk_sizes(x.shape(), d, chunks), d);
}

}  // namespace tessera
