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

}  // namespace tessera
