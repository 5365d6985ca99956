// Tensor factories and whole-tensor comparisons.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <tessera/core/internal/strided_loop.hpp>
#include <tessera/core/tensor.hpp>

#include <tessera/core/internal/tensor_raw.hpp>

namespace tessera {

namespace {
void check_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) TESSERA_CHECK(s >= 0, ValueError, op, "negative size in shape ", shape.to_string());
}
}  // namespace

Tensor empty(const Shape& shape, DType dtype) {
  check_shape(shape, "empty");
  return Tensor(Storage::allocate(shape.numel() * itemsize(dtype)), shape, contiguous_strides(shape), 0, dtype);
}

Tensor zeros(const Shape& shape, DType dtype) {
  Tensor out = empty(shape, dtype);
  std::memset(out.raw_data(), 0, static_cast<size_t>(out.nbytes()));  // all-zero bits is zero for every dtype
  return out;
}

Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1, dtype); }

Tensor full(const Shape& shape, Scalar value, DType dtype) {
  Tensor out = empty(shape, dtype);
  out.fill_(value);
  return out;
}

namespace {
// An undefined tensor has no shape to copy; without this check *_like would return a 0-d f32.
const Tensor& check_like(const Tensor& like, const char* op) {
  TESSERA_CHECK(like.defined(), ValueError, op, "tensor is undefined (default-constructed)");
  return like;
}
}  // namespace

Tensor empty_like(const Tensor& like) { return empty(check_like(like, "empty_like").shape(), like.dtype()); }
Tensor zeros_like(const Tensor& like) { return zeros(check_like(like, "zeros_like").shape(), like.dtype()); }
Tensor ones_like(const Tensor& like) { return ones(check_like(like, "ones_like").shape(), like.dtype()); }

Tensor scalar_tensor(Scalar value, DType dtype) { return full({}, value, dtype); }

Tensor arange(int64_t n, DType dtype) {
  TESSERA_CHECK(n >= 0, ValueError, "arange", "negative length ", n);
  return arange(0.0, static_cast<double>(n), 1.0, dtype);
}

Tensor arange(double start, double end, double step, DType dtype) {
  TESSERA_CHECK(step != 0, ValueError, "arange", "step must be non-zero");
  TESSERA_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), ValueError, "arange",
                "non-finite bounds (start ", start, ", end ", end, ", step ", step, ")");
  const double count = std::ceil((end - start) / step);  // may be inf when end - start overflows
  // Checked before the cast, which would be undefined (and in practice wrap to an empty tensor).
  TESSERA_CHECK(count <= 0x1p62, ValueError, "arange", "too many elements (", count, ") for start ", start, ", end ",
                end, ", step ", step);
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(count));
  Tensor out = empty({n}, dtype);
  visit(dtype, [&]<class T>(TypeTag<T>) {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(start + static_cast<double>(i) * step);
  });
  return out;
}

Tensor eye(int64_t n, int64_t m, DType dtype) {
  if (m < 0) m = n;
  TESSERA_CHECK(n >= 0, ValueError, "eye", "negative size ", n);
  Tensor out = zeros({n, m}, dtype);
  visit(dtype, [&]<class T>(TypeTag<T>) {
    T* p = out.data<T>();
    for (int64_t i = 0; i < std::min(n, m); ++i) p[i * m + i] = convert<T>(1);
  });
  return out;
}

namespace {
// Calls f(a_i, b_i) as doubles for every broadcast element pair until f returns false.
template <class F>
bool all_pairs(const Tensor& a, const Tensor& b, const char* op, F&& f) {
  TESSERA_CHECK(a.defined() && b.defined(), ValueError, op, "tensor is undefined");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  const Tensor x = detail::raw_expand(detail::raw_to(a, DType::f64), shape),
               y = detail::raw_expand(detail::raw_to(b, DType::f64), shape);
  bool ok = true;
  detail::strided_loop<2>(shape, {&x.strides(), &y.strides()}, {detail::bytes(x), detail::bytes(y)}, {8, 8},
                          [&](const detail::Run<2>& run) {
                            for (int64_t i = 0; i < run.count && ok; ++i)
                              ok = f(*reinterpret_cast<const double*>(run.ptr[0] + i * run.stride[0]),
                                     *reinterpret_cast<const double*>(run.ptr[1] + i * run.stride[1]));
                          });
  return ok;
}
}  // namespace

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return all_pairs(a, b, "allclose", [&](double x, double y) {
    if (std::isnan(x) || std::isnan(y)) return equal_nan && std::isnan(x) && std::isnan(y);
    if (x == y) return true;  // equal infinities
    // An infinite difference is never close, even when rtol * |y| is infinite too (x finite, y inf).
    const double diff = std::abs(x - y);
    return std::isfinite(diff) && diff <= atol + rtol * std::abs(y);
  });
}

bool equal(const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(a.defined() && b.defined(), ValueError, "equal", "tensor is undefined");
  if (a.shape() != b.shape()) return false;
  // i64 values beyond 2^53 would collide as doubles: compare integers as integers.
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) {
    const auto va = a.to_vector<int64_t>(), vb = b.to_vector<int64_t>();
    return va == vb;
  }
  return all_pairs(a, b, "equal", [](double x, double y) { return x == y; });
}

}  // namespace tessera
