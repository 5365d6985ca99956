// Copies between tensors: the strided, converting copy kernel and what is built on it.
#include <cstring>
#include <utility>

#include <tessera/core/internal/strided_loop.hpp>
#include <tessera/core/tensor.hpp>

#include <tessera/core/internal/tensor_raw.hpp>

namespace tessera {

namespace {

// Copies (and converts) one run; the contiguous case is a plain loop the compiler vectorises.
template <class To, class From>
void copy_run(const detail::Run<2>& run) {
  auto* dst = reinterpret_cast<To*>(run.ptr[0]);
  const auto* src = reinterpret_cast<const From*>(run.ptr[1]);
  if (run.stride[0] == sizeof(To) && run.stride[1] == sizeof(From)) {
    for (int64_t i = 0; i < run.count; ++i) dst[i] = convert<To>(src[i]);
  } else if (run.stride[0] == sizeof(To) && run.stride[1] == 0) {
    const To value = convert<To>(*src);
    for (int64_t i = 0; i < run.count; ++i) dst[i] = value;
  } else {
    char* d = run.ptr[0];
    const char* s = run.ptr[1];
    for (int64_t i = 0; i < run.count; ++i, d += run.stride[0], s += run.stride[1])
      *reinterpret_cast<To*>(d) = convert<To>(*reinterpret_cast<const From*>(s));
  }
}

// True when some element of t is reachable through two indices (a size>1 dim with stride 0).
bool has_internal_overlap(const Tensor& t) {
  for (int64_t d = 0; d < t.ndim(); ++d)
    if (t.shape()[d] > 1 && t.strides()[d] == 0) return true;
  return false;
}

// True when src and dst touch some of the same bytes but are not the same view, so an
// element-by-element copy could read an element it has already overwritten.
bool partially_overlaps(const Tensor& dst, const Tensor& src) {
  if (dst.storage() != src.storage() || dst.numel() == 0 || src.numel() == 0 || dst.is_same(src)) return false;
  auto byte_range = [](const Tensor& t) {
    int64_t lo = t.offset(), hi = t.offset();
    for (int64_t d = 0; d < t.ndim(); ++d) {
      const int64_t reach = (t.shape()[d] - 1) * t.strides()[d];
      (reach < 0 ? lo : hi) += reach;
    }
    return std::pair{lo * t.itemsize(), (hi + 1) * t.itemsize()};
  };
  const auto [dst_lo, dst_hi] = byte_range(dst);
  const auto [src_lo, src_hi] = byte_range(src);
  return dst_lo < src_hi && src_lo < dst_hi;
}

}  // namespace

namespace {

void check_not_differentiable_target(const Tensor& t, const char* op) {
  TESSERA_CHECK(!autograd::needs_grad<Tensor>({&t}), ValueError, op, "in-place write into a tensor of shape ",
                t.shape().to_string(), " that requires a gradient; do it under autograd::NoGradGuard or on detach()");
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  check_defined("copy_");
  check_not_differentiable_target(*this, "copy_");
  TESSERA_CHECK(src.defined(), ValueError, "copy_", "source tensor is undefined");
  TESSERA_CHECK(!has_internal_overlap(*this), ValueError, "copy_", "destination of shape ", shape_.to_string(),
                " with strides ", strides_.to_string(), " has elements that share memory (expanded); clone it first");
  TESSERA_CHECK(broadcast_shapes(shape_, src.shape(), "copy_") == shape_, ValueError, "copy_", "source shape ",
                src.shape().to_string(), " does not broadcast to destination shape ", shape_.to_string());
  if (numel() == 0) return *this;
  if (src.dtype() == dtype_ && src.shape() == shape_ && src.is_contiguous() && is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), static_cast<size_t>(nbytes()));
    return *this;
  }
  if (partially_overlaps(*this, src)) return copy_(detail::raw_clone(src));  // e.g. x.copy_(x.t())
  const Tensor from = detail::raw_expand(src, shape_);
  visit(dtype_, [&]<class To>(TypeTag<To>) {
    visit(from.dtype(), [&]<class From>(TypeTag<From>) {
      detail::strided_loop<2>(shape_, {&strides_, &from.strides()}, {detail::bytes(*this), detail::bytes(from)},
                              {itemsize(), from.itemsize()}, copy_run<To, From>);
    });
  });
  return *this;
}

Tensor& Tensor::fill_(Scalar value) {
  check_defined("fill_");
  check_not_differentiable_target(*this, "fill_");
  visit(dtype_, [&]<class T>(TypeTag<T>) {
    const T v = value.to<T>();
    const Tensor source = Tensor(Storage::allocate(sizeof(T)), {}, {}, 0, dtype_);
    *static_cast<T*>(const_cast<void*>(source.raw_data())) = v;
    copy_(source);
  });
  return *this;
}

namespace detail {

Tensor raw_clone(const Tensor& x) {
  TESSERA_CHECK(x.defined(), ValueError, "clone", "tensor is undefined (default-constructed)");
  Tensor out = empty(x.shape(), x.dtype());
  out.copy_(x);
  return out;
}

Tensor raw_to(const Tensor& x, DType dtype) {
  TESSERA_CHECK(x.defined(), ValueError, "to", "tensor is undefined (default-constructed)");
  if (dtype == x.dtype()) return x;
  Tensor out = empty(x.shape(), dtype);
  out.copy_(x);
  return out;
}

Tensor raw_contiguous(const Tensor& x) {
  TESSERA_CHECK(x.defined(), ValueError, "contiguous", "tensor is undefined (default-constructed)");
  return x.is_contiguous() ? x : raw_clone(x);
}

}  // namespace detail

template <class T>
T Tensor::item() const {
  check_defined("item");
  TESSERA_CHECK(numel() == 1, ValueError, "item", "expects a tensor with one element, got shape ", shape_.to_string());
  return visit(dtype_, [&]<class S>(TypeTag<S>) { return convert<T>(*static_cast<const S*>(raw_data())); });
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_defined("to_vector");
  const Tensor c = detail::raw_contiguous(detail::raw_to(*this, dtype_of<T>()));
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  for (int64_t s : shape) TESSERA_CHECK(s >= 0, ValueError, "from_vector", "negative size in shape ", shape.to_string());
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), ValueError, "from_vector", "got ", values.size(),
                " values for shape ", shape.to_string(), "; expected ", shape.numel());
  Tensor out = empty(shape, dtype_of<T>());
  T* p = out.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];  // element-wise: std::vector<bool> is bit-packed
  return out;
}

#define TESSERA_INSTANTIATE_VALUES(name, type, category)                        \
  template type Tensor::item<type>() const;                                     \
  template std::vector<type> Tensor::to_vector<type>() const;                   \
  template TESSERA_API Tensor from_vector<type>(const std::vector<type>&, const Shape&);
TESSERA_FORALL_DTYPES(TESSERA_INSTANTIATE_VALUES)
#undef TESSERA_INSTANTIATE_VALUES

}  // namespace tessera
