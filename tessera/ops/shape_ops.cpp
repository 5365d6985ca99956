// Joins and splits. chunk/split return views; cat/stack copy into one new tensor.
#include <tessera/ops/shape_ops.hpp>

#include <tessera/ops/detail/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>

namespace tessera {


Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  std::vector<Shape> shapes;
  for (const Tensor& t : tensors) shapes.push_back(t.defined() ? t.shape() : Shape());
  const auto [d, out_shape] = joined_shape(shapes, dim, false);
  DType dtype = tensors.front().dtype();
  for (const Tensor& t : tensors) dtype = promote_types(dtype, t.dtype());
  Tensor out = empty(out_shape, dtype);
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    out.narrow(d, at, t.shape()[d]).copy_(t);
    at += t.shape()[d];
  }
  derivatives::record_cat(out, tensors, d);
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  std::vector<Shape> shapes;
  for (const Tensor& t : tensors) {
    TESSERA_CHECK(t.defined(), ValueError, "stack", "an input tensor is undefined (default-constructed)");
    shapes.push_back(t.shape());
  }
  const int64_t d = joined_shape(shapes, dim, true).dim;
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& t : tensors) expanded.push_back(t.unsqueeze(d));
  return cat(expanded, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  TESSERA_CHECK(x.defined() && x.ndim() > 0, ValueError, "split", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "split", x.shape());
  TESSERA_CHECK(split_size >= 1 || (split_size == 0 && x.shape()[d] == 0), ValueError, "split", "split_size ",
                split_size, " must be positive for shape ", x.shape().to_string());
  std::vector<Tensor> pieces;
  const int64_t size = x.shape()[d];
  if (size == 0) return {x};
  for (int64_t start = 0; start < size; start += split_size)
    pieces.push_back(x.narrow(d, start, std::min(split_size, size - start)));
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  TESSERA_CHECK(x.defined() && x.ndim() > 0, ValueError, "split", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "split", x.shape());
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSERA_CHECK(s >= 0, ValueError, "split", "negative size ", s, " in split sizes");
    total += s;
  }
  TESSERA_CHECK(total == x.shape()[d], ValueError, "split", "sizes ", Shape(sizes).to_string(), " add up to ", total,
                " but dim ", d, " of shape ", x.shape().to_string(), " has ", x.shape()[d]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(x.narrow(d, start, s));
    start += s;
  }
  return pieces;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TESSERA_CHECK(chunks >= 1, ValueError, "chunk", "chunks ", chunks, " must be at least 1");
  TESSERA_CHECK(x.defined() && x.ndim() > 0, ValueError, "chunk", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "chunk", x.shape());
  const int64_t size = x.shape()[d];
  // torch.chunk: an empty dim still gives `chunks` (empty) pieces; split would give one.
  if (size == 0) return std::vector<Tensor>(static_cast<size_t>(chunks), x);
  return split(x, (size + chunks - 1) / chunks, d);  // ceil: torch.chunk semantics
}

}  // namespace tessera
