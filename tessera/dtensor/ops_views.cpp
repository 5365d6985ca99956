// Views, joins and splits on DTensor. Shapes are validated here (on the global shape), so every
// rank throws the same ValueError; the rules (sharding/view_rules.hpp) decide the layouts.
#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/detail/derivatives.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

using detail::call_op;
using detail::Decision;
using detail::op_id;
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

}  // namespace

DTensor reshape(const DTensor& x, const Shape& shape) {
  static const int id = op_id("reshape");
  Shape resolved = shape;
  int64_t known = 1, infer = -1;
  for (int64_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      TESSERA_CHECK(infer < 0, ValueError, "reshape", "more than one -1 in ", shape.to_string());
      infer = d;
    } else {
      TESSERA_CHECK(shape[d] >= 0, ValueError, "reshape", "negative size in ", shape.to_string());
      known *= shape[d];
    }
  }
  if (infer >= 0 && known > 0) resolved[infer] = x.numel() / known;
  TESSERA_CHECK(resolved.numel() == x.numel() && (infer < 0 || known > 0), ValueError, "reshape", "cannot reshape ",
                x.shape().to_string(), " (", x.numel(), " elements) to ", shape.to_string());
  return detail::recorded(
      call_op(id, {&x}, resolved, [](Locals l, const Decision& d) { return l[0].reshape(d.output_local_shape); }),
      [&](DTensor& out) {
        derivatives::record_unary(
            "reshape", out, x,
            [shape = x.shape()](const DTensor& g, const DTensor&, const DTensor&) { return reshape(g, shape); });
      });
}

DTensor view(const DTensor& x, const Shape& shape) { return reshape(x, shape); }

DTensor flatten(const DTensor& x, int64_t start_dim, int64_t end_dim) {
  const int64_t nd = std::max<int64_t>(x.ndim(), 1);
  const int64_t s = detail::normalized_dim(start_dim, nd, x.shape(), "flatten");
  const int64_t e = detail::normalized_dim(end_dim, nd, x.shape(), "flatten");
  TESSERA_CHECK(s <= e, ValueError, "flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim, " for shape ",
                x.shape().to_string());
  if (x.ndim() == 0) return reshape(x, Shape{1});
  Shape shape;
  for (int64_t d = 0; d < s; ++d) shape.push_back(x.shape()[d]);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= x.shape()[d];
  shape.push_back(merged);
  for (int64_t d = e + 1; d < x.ndim(); ++d) shape.push_back(x.shape()[d]);
  return reshape(x, shape);
}

DTensor unsqueeze(const DTensor& x, int64_t dim) {
  const int64_t d = detail::normalized_dim(dim, x.ndim() + 1, x.shape(), "unsqueeze");
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
  const int64_t d = detail::normalized_dim(dim, std::max<int64_t>(x.ndim(), 1), x.shape(), "squeeze");
  if (x.ndim() == 0 || x.shape()[d] != 1) return x;
  Shape shape = x.shape();
  shape.erase(d);
  return reshape(x, shape);
}

DTensor permute(const DTensor& x, const std::vector<int64_t>& dims) {
  static const int id = op_id("permute");
  const int64_t nd = x.ndim();
  std::vector<int64_t> normalized;
  for (int64_t d : dims) normalized.push_back(d < 0 ? d + nd : d);
  std::vector<int64_t> sorted = normalized;
  std::sort(sorted.begin(), sorted.end());
  bool is_permutation = static_cast<int64_t>(dims.size()) == nd;
  for (int64_t i = 0; is_permutation && i < nd; ++i) is_permutation = sorted[static_cast<size_t>(i)] == i;
  TESSERA_CHECK(is_permutation, ValueError, "permute", "dims ", Shape(dims).to_string(),
                " are not a permutation of the dims of ", x.shape().to_string());
  return detail::recorded(call_op(id, {&x}, DimVector(normalized), [&](Locals l) { return l[0].permute(normalized); }),
                          [&](DTensor& out) { record_permute(out, x, normalized); });
}

DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  const int64_t nd = std::max<int64_t>(x.ndim(), 1);
  const int64_t a = detail::normalized_dim(dim0, nd, x.shape(), "transpose");
  const int64_t b = detail::normalized_dim(dim1, nd, x.shape(), "transpose");
  if (x.ndim() == 0 || a == b) return x;
  std::vector<int64_t> dims(static_cast<size_t>(x.ndim()));
  for (int64_t d = 0; d < x.ndim(); ++d) dims[static_cast<size_t>(d)] = d;
  std::swap(dims[static_cast<size_t>(a)], dims[static_cast<size_t>(b)]);
  return permute(x, dims);
}

DTensor expand(const DTensor& x, const Shape& shape) {
  static const int id = op_id("expand");
  const int64_t offset = shape.size() - x.ndim();
  bool ok = offset >= 0;
  Shape resolved = shape;
  for (int64_t d = 0; ok && d < x.ndim(); ++d) {
    int64_t& s = resolved[d + offset];
    if (s == -1) s = x.shape()[d];
    ok = s == x.shape()[d] || x.shape()[d] == 1;
  }
  for (int64_t d = 0; ok && d < offset; ++d) ok = resolved[d] >= 0;
  TESSERA_CHECK(ok, ValueError, "expand", "cannot expand ", x.shape().to_string(), " to ", shape.to_string());
  return detail::recorded(
      call_op(id, {&x}, resolved, [](Locals l, const Decision& d) { return l[0].expand(d.output_local_shape); }),
      [&](DTensor& out) {
        derivatives::record_unary("expand", out, x,
                                  [shape = x.shape()](const DTensor& g, const DTensor&, const DTensor&) {
                                    return derivatives::sum_to(g, shape);
                                  });
      });
}

DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length) {
  static const int id = op_id("narrow");
  const int64_t d = detail::normalized_dim(dim, x.ndim(), x.shape(), "narrow");
  if (start < 0) start += x.shape()[d];
  TESSERA_CHECK(start >= 0 && length >= 0 && start + length <= x.shape()[d], ValueError, "narrow", "range [", start,
                ", ", start + length, ") out of dim ", dim, " of shape ", x.shape().to_string());
  return detail::recorded(call_op(id, {&x}, DimVector{d, start, length},
                                  [&](Locals l, const Decision& dec) {
                                    const int64_t begin = dec.blocks[0].begin[d];
                                    const int64_t local_start = std::clamp<int64_t>(start - begin, 0, l[0].shape()[d]);
                                    return l[0].narrow(d, local_start, dec.output_local_shape[d]);
                                  }),
                          [&](DTensor& out) { record_narrow(out, x, d, start, length); });
}

DTensor select(const DTensor& x, int64_t dim, int64_t index) {
  const int64_t d = detail::normalized_dim(dim, x.ndim(), x.shape(), "select");
  const int64_t size = x.shape()[d];
  TESSERA_CHECK(index >= -size && index < size, ValueError, "select", "index ", index, " out of range for dim ", dim,
                " of shape ", x.shape().to_string());
  Shape shape = x.shape();
  shape.erase(d);
  return reshape(narrow(x, d, index < 0 ? index + size : index, 1), shape);
}

namespace {

DTensor join(const std::vector<DTensor>& tensors, int64_t dim, bool stacking) {
  const char* name = stacking ? "stack" : "cat";
  static const int cat_id = op_id("cat");
  static const int stack_id = op_id("stack");
  TESSERA_CHECK(!tensors.empty(), ValueError, name, "needs at least one tensor");
  const Shape& first = tensors.front().shape();
  const int64_t d = detail::normalized_dim(dim, first.size() + (stacking ? 1 : 0), first, name);
  for (const auto& t : tensors) {
    bool ok = t.ndim() == first.size();
    for (int64_t i = 0; ok && i < first.size(); ++i) ok = t.shape()[i] == first[i] || (!stacking && i == d);
    TESSERA_CHECK(ok, ValueError, name, "shapes ", first.to_string(), " and ", t.shape().to_string(),
                  stacking ? " differ" : " differ outside dim " + std::to_string(d));
  }
  std::vector<const DTensor*> inputs;
  for (const auto& t : tensors) inputs.push_back(&t);
  DTensor out = detail::dispatch(stacking ? stack_id : cat_id, inputs, DimVector{d},
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
  const int64_t d = detail::normalized_dim(dim, x.ndim(), x.shape(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSERA_CHECK(s >= 0, ValueError, "split", "negative size in ", Shape(sizes).to_string());
    total += s;
  }
  TESSERA_CHECK(total == x.shape()[d], ValueError, "split", "sizes ", Shape(sizes).to_string(), " add up to ", total,
                ", not dim ", dim, " of shape ", x.shape().to_string());
  std::vector<DTensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, d, start, s));
    start += s;
  }
  return out;
}

std::vector<DTensor> split(const DTensor& x, int64_t split_size, int64_t dim) {
  const int64_t d = detail::normalized_dim(dim, x.ndim(), x.shape(), "split");
  TESSERA_CHECK(split_size > 0 || x.shape()[d] == 0, ValueError, "split", "split_size ", split_size,
                " must be positive");
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < x.shape()[d]; start += split_size)
    sizes.push_back(std::min(split_size, x.shape()[d] - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d);
}

std::vector<DTensor> chunk(const DTensor& x, int64_t chunks, int64_t dim) {
  TESSERA_CHECK(chunks >= 1, ValueError, "chunk", "chunks ", chunks, " must be at least 1");
  const int64_t d = detail::normalized_dim(dim, x.ndim(), x.shape(), "chunk");
  const int64_t size = x.shape()[d];
  return split(x, std::max<int64_t>((size + chunks - 1) / chunks, 1), d);
}

}  // namespace tessera
