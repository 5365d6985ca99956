#include <tessera/core/shape.hpp>

#include <algorithm>
#include <sstream>

#include <tessera/core/error.hpp>

namespace tessera {

DimVector DimVector::filled(int64_t count, int64_t value) {
  DimVector out;
  out.resize(count, value);
  return out;
}

void DimVector::reserve(int64_t capacity) {
  if (capacity <= capacity_) return;
  const int64_t grown = std::max(capacity, capacity_ * 2);
  auto* fresh = new int64_t[static_cast<size_t>(grown)];
  std::memcpy(fresh, data(), static_cast<size_t>(size_) * sizeof(int64_t));
  delete[] heap_;
  heap_ = fresh;
  capacity_ = grown;
}

void DimVector::assign(const int64_t* values, int64_t count) {
  size_ = 0;
  reserve(count);
  if (count > 0) std::memmove(data(), values, static_cast<size_t>(count) * sizeof(int64_t));
  size_ = count;
}

void DimVector::push_back(int64_t value) {
  reserve(size_ + 1);
  data()[size_++] = value;
}

void DimVector::insert(int64_t position, int64_t value) {
  reserve(size_ + 1);
  int64_t* d = data();
  std::memmove(d + position + 1, d + position, static_cast<size_t>(size_ - position) * sizeof(int64_t));
  d[position] = value;
  ++size_;
}

void DimVector::erase(int64_t position) {
  int64_t* d = data();
  std::memmove(d + position, d + position + 1, static_cast<size_t>(size_ - position - 1) * sizeof(int64_t));
  --size_;
}

void DimVector::resize(int64_t count, int64_t value) {
  reserve(count);
  for (int64_t i = size_; i < count; ++i) data()[i] = value;
  size_ = count;
}

int64_t DimVector::numel() const {
  int64_t n = 1;
  for (int64_t v : *this) n *= v;
  return n;
}

std::string DimVector::to_string() const {
  std::ostringstream out;
  out << '[';
  for (int64_t i = 0; i < size_; ++i) out << (i ? ", " : "") << (*this)[i];
  out << ']';
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const DimVector& dims) { return out << dims.to_string(); }

Strides contiguous_strides(const Shape& shape) {
  Strides strides = Strides::filled(shape.size(), 1);
  for (int64_t i = shape.size() - 2; i >= 0; --i) strides[i] = strides[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  return strides;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op, const Shape& shape) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  TESSERA_CHECK(dim >= lo && dim <= hi, ValueError, op, "dim ", dim, " out of range for shape ", shape.to_string(),
                "; expected a dim in [", lo, ", ", hi, "]");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int64_t ndim = std::max(a.size(), b.size());
  Shape out = Shape::filled(ndim, 1);
  for (int64_t i = 0; i < ndim; ++i) {
    const int64_t da = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    const int64_t db = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    TESSERA_CHECK(da == db || da == 1 || db == 1, ValueError, op, "shapes ", a.to_string(), " and ", b.to_string(),
                  " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

DimVector normalize_dims(const std::vector<int64_t>& dims, const Shape& shape, const char* op) {
  const int64_t ndim = shape.size();
  std::vector<bool> reduced(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) {
    const int64_t n = normalize_dim(d, ndim, op, shape);
    if (ndim == 0) continue;
    TESSERA_CHECK(!reduced[static_cast<size_t>(n)], ValueError, op, "dim ", n,
                  " appears more than once in the reduction dims of shape ", shape.to_string());
    reduced[static_cast<size_t>(n)] = true;
  }
  DimVector out;
  for (int64_t d = 0; d < ndim; ++d)
    if (reduced[static_cast<size_t>(d)]) out.push_back(d);
  return out;
}

Shape reduced_shape(const Shape& shape, const DimVector& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0, next = 0; d < shape.size(); ++d) {
    const bool is_reduced = next < dims.size() && dims[next] == d;
    if (is_reduced) ++next;
    if (!is_reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from, const char* op) {
  Shape shape = requested;
  int64_t known = 1, infer_at = -1;
  for (int64_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      TESSERA_CHECK(infer_at < 0, ValueError, op, "only one dim can be -1 in ", requested.to_string());
      infer_at = d;
    } else {
      TESSERA_CHECK(shape[d] >= 0, ValueError, op, "invalid size ", shape[d], " in ", requested.to_string());
      known *= shape[d];
    }
  }
  if (infer_at >= 0) {
    TESSERA_CHECK(known != 0 && numel % known == 0, ValueError, op, "shape ", requested.to_string(),
                  " is invalid for input of shape ", from.to_string(), " (", numel, " elements)");
    shape[infer_at] = numel / known;
  }
  TESSERA_CHECK(shape.numel() == numel, ValueError, op, "shape ", requested.to_string(),
                " is invalid for input of shape ", from.to_string(), " (", numel, " elements)");
  return shape;
}

Shape flatten_shape(const Shape& shape, int64_t start_dim, int64_t end_dim) {
  const int64_t s = normalize_dim(start_dim, shape.size(), "flatten", shape);
  const int64_t e = normalize_dim(end_dim, shape.size(), "flatten", shape);
  TESSERA_CHECK(s <= e, ValueError, "flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim,
                " for shape ", shape.to_string());
  if (shape.size() == 0) return Shape{1};
  Shape out;
  for (int64_t d = 0; d < s; ++d) out.push_back(shape[d]);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= shape[d];
  out.push_back(merged);
  for (int64_t d = e + 1; d < shape.size(); ++d) out.push_back(shape[d]);
  return out;
}

Shape expand_shape(const Shape& from, const Shape& requested) {
  const int64_t n = requested.size(), lead = n - from.size();
  TESSERA_CHECK(lead >= 0, ValueError, "expand", "cannot expand shape ", from.to_string(), " to ", requested.to_string(),
                " (fewer dims)");
  Shape shape = requested;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t want = requested[i];
    if (i < lead) {
      TESSERA_CHECK(want >= 0, ValueError, "expand", "size -1 not allowed for new leading dim ", i, " in ",
                    requested.to_string());
      continue;
    }
    const int64_t have = from[i - lead];
    if (want == -1) shape[i] = have;
    else
      TESSERA_CHECK(want == have || (have == 1 && want >= 0), ValueError, "expand", "cannot expand shape ",
                    from.to_string(), " to ", requested.to_string(), " (dim ", i, ": ", have, " vs ", want, ")");
  }
  return shape;
}

namespace {

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string text;
  for (const Shape& s : shapes) text.append(text.empty() ? "" : ", ").append(s.to_string());
  return text;
}

}  // namespace

JoinedShape joined_shape(const std::vector<Shape>& shapes, int64_t dim, bool stacking) {
  const char* op = stacking ? "stack" : "cat";
  TESSERA_CHECK(!shapes.empty(), ValueError, op, "expects at least one tensor");
  const Shape& first = shapes.front();
  if (stacking) {
    for (const Shape& s : shapes)
      TESSERA_CHECK(s == first, ValueError, "stack", "expects tensors of equal shape, got ", shapes_text(shapes));
    const int64_t d = normalize_dim(dim, first.size() + 1, "stack", first);
    Shape out = first;
    out.insert(d, static_cast<int64_t>(shapes.size()));
    return {d, out};
  }
  for (const Shape& s : shapes)
    TESSERA_CHECK(s.size() > 0, ValueError, "cat", "cannot join 0-d or undefined tensors (shapes ", shapes_text(shapes), ")");
  const int64_t d = normalize_dim(dim, first.size(), "cat", first);
  Shape out = first;
  out[d] = 0;
  for (const Shape& s : shapes) {
    bool match = s.size() == first.size();
    for (int64_t i = 0; match && i < s.size(); ++i) match = i == d || s[i] == first[i];
    TESSERA_CHECK(match, ValueError, "cat", "shapes ", shapes_text(shapes), " differ outside dim ", d);
    out[d] += s[d];
  }
  return {d, out};
}

std::vector<int64_t> split_sizes(const Shape& shape, int64_t dim, int64_t split_size) {
  const int64_t size = shape[dim];
  TESSERA_CHECK(split_size >= 1 || size == 0, ValueError, "split", "split_size ", split_size,
                " must be positive for shape ", shape.to_string(), " (dim ", dim, ")");
  if (size == 0) return {0};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += split_size) sizes.push_back(std::min(split_size, size - start));
  return sizes;
}

void check_split_sizes(const std::vector<int64_t>& sizes, const Shape& shape, int64_t dim) {
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSERA_CHECK(s >= 0, ValueError, "split", "negative size ", s, " in split sizes ", Shape(sizes).to_string());
    total += s;
  }
  TESSERA_CHECK(total == shape[dim], ValueError, "split", "sizes ", Shape(sizes).to_string(), " add up to ", total,
                " but dim ", dim, " of shape ", shape.to_string(), " has ", shape[dim]);
}

std::vector<int64_t> chunk_sizes(const Shape& shape, int64_t dim, int64_t chunks) {
  TESSERA_CHECK(chunks >= 1, ValueError, "chunk", "chunks ", chunks, " must be at least 1");
  const int64_t size = shape[dim];
  if (size == 0) return std::vector<int64_t>(static_cast<size_t>(chunks), 0);
  return split_sizes(shape, dim, (size + chunks - 1) / chunks);
}

}  // namespace tessera
