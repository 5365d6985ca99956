// Joins and splits (chunk/split return views; cat/stack copy into one new tensor), and the shape
// ops that copy (flip, roll, tril, triu, repeat, tile, pad).
#include <tessera/ops/shape_ops.hpp>

#include <algorithm>

#include <tessera/core/internal/tensor_raw.hpp>
#include <tessera/ops/internal/derivatives.hpp>
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
  return split(x, split_sizes(x.shape(), d, split_size), d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  TESSERA_CHECK(x.defined() && x.ndim() > 0, ValueError, "split", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "split", x.shape());
  check_split_sizes(sizes, x.shape(), d);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(x.narrow(d, start, s));
    start += s;
  }
  return pieces;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TESSERA_CHECK(x.defined() && x.ndim() > 0, ValueError, "chunk", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "chunk", x.shape());
  return split(x, chunk_sizes(x.shape(), d, chunks), d);
}

// --- shape ops that copy ------------------------------------------------------------------------

const char* to_string(PadMode mode) {
  switch (mode) {
    case PadMode::constant: return "constant";
    case PadMode::reflect: return "reflect";
    case PadMode::replicate: return "replicate";
    case PadMode::circular: return "circular";
  }
  return "?";
}

DimVector flip_dims(const std::vector<int64_t>& dims, const Shape& shape) {
  const int64_t nd = shape.size();
  std::vector<bool> flipped(static_cast<size_t>(nd), false);
  for (int64_t dim : dims) {
    const int64_t d = normalize_dim(dim, nd, "flip", shape);
    if (nd == 0) continue;
    TESSERA_CHECK(!flipped[static_cast<size_t>(d)], ValueError, "flip", "dim ", d, " appears more than once in dims ",
                  Shape(dims).to_string(), " of shape ", shape.to_string());
    flipped[static_cast<size_t>(d)] = true;
  }
  DimVector out;
  for (int64_t d = 0; d < nd; ++d)
    if (flipped[static_cast<size_t>(d)]) out.push_back(d);
  return out;
}

DimVector roll_shifts(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims, const Shape& shape) {
  if (dims.empty()) {
    TESSERA_CHECK(shifts.size() == 1, ValueError, "roll", "shifts ", Shape(shifts).to_string(),
                  " must hold one shift when no dims are given (the tensor of shape ", shape.to_string(),
                  " is flattened)");
    const int64_t n = shape.numel();
    return DimVector{n == 0 ? 0 : (shifts[0] % n + n) % n};
  }
  TESSERA_CHECK(shifts.size() == dims.size(), ValueError, "roll", "shifts ", Shape(shifts).to_string(), " and dims ",
                Shape(dims).to_string(), " differ in length for shape ", shape.to_string());
  const int64_t nd = shape.size();
  DimVector out = DimVector::filled(nd, 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], nd, "roll", shape);
    if (nd == 0 || shape[d] == 0) continue;
    out[d] = ((out[d] + shifts[i]) % shape[d] + shape[d]) % shape[d];
  }
  return out;
}

Shape repeat_shape(const Shape& shape, const std::vector<int64_t>& repeats, const char* op) {
  const int64_t n = static_cast<int64_t>(repeats.size());
  TESSERA_CHECK(n >= shape.size(), ValueError, op, "repeats ", Shape(repeats).to_string(), " has fewer entries than the ",
                shape.size(), " dims of shape ", shape.to_string());
  Shape out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = repeats[static_cast<size_t>(i)];
    TESSERA_CHECK(r >= 0, ValueError, op, "negative repeat ", r, " in ", Shape(repeats).to_string(), " for shape ",
                  shape.to_string());
    const int64_t lead = n - shape.size();
    out.push_back(r * (i < lead ? 1 : shape[i - lead]));
  }
  return out;
}

std::vector<int64_t> tile_repeats(const Shape& shape, const std::vector<int64_t>& reps) {
  std::vector<int64_t> out;
  for (int64_t i = static_cast<int64_t>(reps.size()); i < shape.size(); ++i) out.push_back(1);
  out.insert(out.end(), reps.begin(), reps.end());
  return out;
}

void check_triangle_shape(const Shape& shape, const char* op) {
  TESSERA_CHECK(shape.size() >= 2, ValueError, op, "expects at least 2 dims (a matrix, or a batch of them); got shape ",
                shape.to_string());
}

PadSpec pad_spec(const Shape& shape, const std::vector<int64_t>& pads, PadMode mode) {
  const int64_t nd = shape.size(), n = static_cast<int64_t>(pads.size());
  const std::string text = Shape(pads).to_string();
  TESSERA_CHECK(n % 2 == 0, ValueError, "pad", "pads ", text, " have an odd count ", n,
                " for shape ", shape.to_string(), "; expected (before, after) pairs from the last dim backwards");
  TESSERA_CHECK(n / 2 <= nd, ValueError, "pad", "pads ", text, " pad ", n / 2, " dims but shape ", shape.to_string(),
                " has ", nd);
  PadSpec spec{DimVector::filled(nd, 0), DimVector::filled(nd, 0), shape};
  for (int64_t i = 0; i < n / 2; ++i) {
    spec.before[nd - 1 - i] = pads[static_cast<size_t>(2 * i)];
    spec.after[nd - 1 - i] = pads[static_cast<size_t>(2 * i + 1)];
  }
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t b = spec.before[d], a = spec.after[d], size = shape[d];
    if (b == 0 && a == 0) continue;
    if (mode != PadMode::constant)
      TESSERA_CHECK(b >= 0 && a >= 0, ValueError, "pad", "negative pads ", text, " for shape ", shape.to_string(),
                    " in ", to_string(mode), " mode; only constant mode crops");
    if (mode == PadMode::reflect)
      TESSERA_CHECK(b < size && a < size, ValueError, "pad", "reflect pads (", b, ", ", a, ") of dim ", d,
                    " of shape ", shape.to_string(), " must be smaller than its size ", size);
    if (mode == PadMode::circular)
      TESSERA_CHECK(b <= size && a <= size, ValueError, "pad", "circular pads (", b, ", ", a, ") of dim ", d,
                    " of shape ", shape.to_string(), " wrap around more than once; expected at most its size ", size);
    if (mode == PadMode::replicate)
      TESSERA_CHECK(size > 0, ValueError, "pad", "replicate pads (", b, ", ", a, ") of the zero-size dim ", d,
                    " of shape ", shape.to_string(), "; there is no edge element to repeat");
    spec.shape[d] = size + b + a;
    TESSERA_CHECK(spec.shape[d] >= 0, ValueError, "pad", "pads ", text, " leave dim ", d, " of shape ",
                  shape.to_string(), " with the negative size ", spec.shape[d]);
  }
  return spec;
}

namespace {

void require_defined(const Tensor& x, const char* op) {
  TESSERA_CHECK(x.defined(), ValueError, op, "the input tensor is undefined (default-constructed)");
}

// out[o] = x[map_0[o_0], ..., map_n[o_n]], or `fill` where an entry is -1: every op here is such a
// gather, separable over dims.
Tensor gather_dims(const Tensor& x, const Shape& out_shape, const std::vector<std::vector<int64_t>>& maps,
                   Scalar fill) {
  Tensor out = full(out_shape, fill, x.dtype());
  const int64_t nd = out_shape.size(), numel = out_shape.numel();
  if (numel == 0) return out;
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    const T* in = static_cast<const T*>(x.raw_data());
    T* o = static_cast<T*>(out.raw_data());
    DimVector index = DimVector::filled(nd, 0);
    for (int64_t n = 0; n < numel; ++n) {
      int64_t at = 0;
      bool inside = true;
      for (int64_t d = 0; d < nd && inside; ++d) {
        const int64_t source = maps[static_cast<size_t>(d)][static_cast<size_t>(index[d])];
        inside = source >= 0;
        at += source * x.strides()[d];
      }
      if (inside) o[n] = in[at];
      for (int64_t d = nd - 1; d >= 0 && ++index[d] == out_shape[d]; --d) index[d] = 0;
    }
  });
  return out;
}

std::vector<std::vector<int64_t>> identity_maps(const Shape& shape) {
  std::vector<std::vector<int64_t>> maps;
  for (int64_t size : shape) {
    maps.emplace_back(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) maps.back()[static_cast<size_t>(i)] = i;
  }
  return maps;
}

// roll by per-dim shifts in [0, size): the local kernel of roll and its backward.
Tensor roll_by(const Tensor& x, const DimVector& shifts) {
  auto maps = identity_maps(x.shape());
  for (int64_t d = 0; d < x.ndim(); ++d)
    for (int64_t o = 0; o < x.shape()[d]; ++o)
      maps[static_cast<size_t>(d)][static_cast<size_t>(o)] = (o - shifts[d] + x.shape()[d]) % x.shape()[d];
  return gather_dims(x, x.shape(), maps, 0);
}

Tensor triangle(const Tensor& x, int64_t diagonal, bool lower) {
  const char* name = lower ? "tril" : "triu";
  require_defined(x, name);
  check_triangle_shape(x.shape(), name);
  Tensor out = detail::raw_clone(x);
  const int64_t rows = x.shape()[x.ndim() - 2], cols = x.shape()[x.ndim() - 1];
  const int64_t batches = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    T* o = static_cast<T*>(out.raw_data());
    const T zero = Scalar(0).to<T>();
    for (int64_t b = 0; b < batches; ++b)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          if (lower ? j - i > diagonal : j - i < diagonal) o[(b * rows + i) * cols + j] = zero;
  });
  derivatives::record_triangle(out, x, diagonal, lower);
  return out;
}

}  // namespace

Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  require_defined(x, "flip");
  const DimVector flipped = flip_dims(dims, x.shape());
  auto maps = identity_maps(x.shape());
  for (int64_t d : flipped)
    for (int64_t o = 0; o < x.shape()[d]; ++o)
      maps[static_cast<size_t>(d)][static_cast<size_t>(o)] = x.shape()[d] - 1 - o;
  Tensor out = gather_dims(x, x.shape(), maps, 0);
  derivatives::record_flip(out, x, flipped);
  return out;
}

Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  require_defined(x, "roll");
  const DimVector by = roll_shifts(shifts, dims, x.shape());
  if (dims.empty()) return roll(x.reshape({x.numel()}), {by[0]}, {0}).reshape(x.shape());
  Tensor out = roll_by(x, by);
  derivatives::record_roll(out, x, by);
  return out;
}

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false); }

Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats) {
  require_defined(x, "repeat");
  const Shape shape = repeat_shape(x.shape(), repeats);
  const int64_t lead = shape.size() - x.ndim();
  const Tensor padded = detail::raw_reshape(x, repeat_shape(x.shape(), std::vector<int64_t>(repeats.size(), 1)));
  std::vector<std::vector<int64_t>> maps;
  for (int64_t d = 0; d < shape.size(); ++d) {
    const int64_t size = d < lead ? 1 : x.shape()[d - lead];
    maps.emplace_back(static_cast<size_t>(shape[d]));
    for (int64_t o = 0; o < shape[d]; ++o) maps.back()[static_cast<size_t>(o)] = o % size;
  }
  Tensor out = gather_dims(padded, shape, maps, 0);
  derivatives::record_repeat(out, x, repeats);
  return out;
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps) {
  require_defined(x, "tile");
  const auto repeats = tile_repeats(x.shape(), reps);
  repeat_shape(x.shape(), repeats, "tile");
  return repeat(x, repeats);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode, Scalar value) {
  require_defined(x, "pad");
  const PadSpec spec = pad_spec(x.shape(), pads, mode);
  std::vector<std::vector<int64_t>> maps;
  for (int64_t d = 0; d < x.ndim(); ++d) {
    const int64_t size = x.shape()[d];
    maps.emplace_back(static_cast<size_t>(spec.shape[d]));
    for (int64_t o = 0; o < spec.shape[d]; ++o) {
      int64_t source = o - spec.before[d];
      switch (mode) {
        case PadMode::constant: if (source < 0 || source >= size) source = -1; break;
        case PadMode::reflect: source = source < 0 ? -source : source >= size ? 2 * (size - 1) - source : source; break;
        case PadMode::replicate: source = std::clamp<int64_t>(source, 0, size - 1); break;
        case PadMode::circular: source = (source % size + size) % size; break;
      }
      maps.back()[static_cast<size_t>(o)] = source;
    }
  }
  Tensor out = gather_dims(x, spec.shape, maps, mode == PadMode::constant ? value : Scalar(0));
  derivatives::record_pad(out, x, spec.before, spec.after, mode);
  return out;
}

}  // namespace tessera
