// Tensor handle: metadata and views. Copies live in tensor_copy.cpp, factories in
// tensor_factories.cpp, printing in tensor_print.cpp.
#include <tessera/core/tensor.hpp>

#include <tessera/core/internal/tensor_raw.hpp>

#include <algorithm>
#include <numeric>

namespace tessera {

namespace {

// Smallest and largest element offsets a view touches (numel > 0).
std::pair<int64_t, int64_t> extent(const Shape& shape, const Strides& strides, int64_t offset) {
  int64_t lo = offset, hi = offset;
  for (int64_t d = 0; d < shape.size(); ++d) {
    const int64_t reach = (shape[d] - 1) * strides[d];
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi};
}

// Strides that express `shape` over the same elements as (old_shape, old_strides), or false.
// Walks chunks of old dims that are contiguous with each other (PyTorch's computeStride).
bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& shape, Strides& out) {
  out = Strides::filled(shape.size(), 1);
  if (old_shape.numel() == 0 || old_shape.size() == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = shape.size() - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = old_shape.size() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// Throws ValueError naming op unless (shape, strides, offset) is a valid view of storage.
void check_view(const Storage* storage, const Shape& shape, const Strides& strides, int64_t offset, DType dtype,
                const char* op) {
  TESSERA_CHECK(storage != nullptr, ValueError, op, "null storage");
  TESSERA_CHECK(shape.size() == strides.size(), ValueError, op, "shape ", shape.to_string(), " and strides ",
                strides.to_string(), " differ in length");
  for (int64_t s : shape) TESSERA_CHECK(s >= 0, ValueError, op, "negative size in shape ", shape.to_string());
  if (shape.numel() > 0) {
    const auto [lo, hi] = extent(shape, strides, offset);
    TESSERA_CHECK(lo >= 0 && (hi + 1) * tessera::itemsize(dtype) <= storage->nbytes(), ValueError, op, "view shape ",
                  shape.to_string(), " strides ", strides.to_string(), " offset ", offset,
                  " reaches outside its storage of ", storage->nbytes(), " bytes");
  }
}

}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)), shape_(std::move(shape)), strides_(std::move(strides)), offset_(offset), dtype_(dtype) {
  check_view(storage_.get(), shape_, strides_, offset_, dtype_, "Tensor");
}

void Tensor::check_defined(const char* op) const {
  TESSERA_CHECK(defined(), ValueError, op, "tensor is undefined (default-constructed)");
}

void Tensor::check_dtype(DType expected, const char* op) const {
  check_defined(op);
  TESSERA_CHECK(dtype_ == expected, ValueError, op, "tensor of shape ", shape_.to_string(), " has dtype ",
                name(dtype_), "; expected ", name(expected));
}

int64_t Tensor::size(int64_t dim) const {
  check_defined("size");
  TESSERA_CHECK(ndim() > 0, ValueError, "size", "a 0-d tensor has no dims");
  return shape_[normalize_dim(dim, ndim(), "size", shape_)];
}
int64_t Tensor::stride(int64_t dim) const {
  check_defined("stride");
  TESSERA_CHECK(ndim() > 0, ValueError, "stride", "a 0-d tensor has no dims");
  return strides_[normalize_dim(dim, ndim(), "stride", shape_)];
}
Device Tensor::device() const {
  check_defined("device");
  return storage_->device();
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    if (shape_[d] == 1) continue;
    if (strides_[d] != expected) return numel() == 0;
    expected *= shape_[d];
  }
  return true;
}

bool Tensor::is_same(const Tensor& other) const {
  return storage_ == other.storage_ && shape_ == other.shape_ && strides_ == other.strides_ &&
         offset_ == other.offset_ && dtype_ == other.dtype_;
}

void* Tensor::raw_data() {
  check_defined("raw_data");
  return static_cast<char*>(storage_->data()) + offset_ * itemsize();
}
const void* Tensor::raw_data() const {
  check_defined("raw_data");
  return static_cast<const char*>(storage_->data()) + offset_ * itemsize();
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  check_defined("as_strided");
  check_view(storage_.get(), shape, strides, offset, dtype_, "as_strided");  // so errors name as_strided
  TESSERA_CHECK(!autograd::needs_grad<Tensor>({this}), ValueError, "as_strided",
                "not differentiable; the tensor of shape ", shape_.to_string(), " requires a gradient");
  return Tensor(storage_, shape, strides, offset, dtype_);
}

// The raw views (core/internal/tensor_raw.hpp): validation and the new (shape, strides, offset).
// The Tensor members that users call add autograd recording on top (ops/tensor_autograd.cpp).
namespace detail {

namespace {
void check_defined(const Tensor& x, const char* op) {
  TESSERA_CHECK(x.defined(), ValueError, op, "tensor is undefined (default-constructed)");
}
Tensor with_view(const Tensor& x, Shape shape, Strides strides, int64_t offset) {
  return Tensor(x.storage(), std::move(shape), std::move(strides), offset, x.dtype());
}
}  // namespace

Tensor raw_view(const Tensor& x, const Shape& requested) {
  check_defined(x, "view");
  const Shape shape = infer_shape(requested, x.numel(), x.shape(), "view");
  Strides strides;
  TESSERA_CHECK(view_strides(x.shape(), x.strides(), shape, strides), ValueError, "view", "cannot view shape ",
                x.shape().to_string(), " with strides ", x.strides().to_string(), " as ", shape.to_string(),
                " without a copy; use reshape");
  return with_view(x, shape, strides, x.offset());
}

Tensor raw_reshape(const Tensor& x, const Shape& requested) {
  check_defined(x, "reshape");
  const Shape shape = infer_shape(requested, x.numel(), x.shape(), "reshape");
  Strides strides;
  if (view_strides(x.shape(), x.strides(), shape, strides)) return with_view(x, shape, strides, x.offset());
  return raw_view(raw_clone(x), shape);
}

Tensor raw_transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_defined(x, "transpose");
  const int64_t a = normalize_dim(dim0, x.ndim(), "transpose", x.shape());
  const int64_t b = normalize_dim(dim1, x.ndim(), "transpose", x.shape());
  if (x.ndim() == 0) return x;
  Shape shape = x.shape();
  Strides strides = x.strides();
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return with_view(x, shape, strides, x.offset());
}

Tensor raw_permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined(x, "permute");
  const int64_t nd = x.ndim();
  TESSERA_CHECK(static_cast<int64_t>(dims.size()) == nd, ValueError, "permute", "got ", dims.size(),
                " dims for shape ", x.shape().to_string(), "; expected ", nd);
  Shape shape = Shape::filled(nd, 0);
  Strides strides = Strides::filled(nd, 0);
  std::vector<bool> seen(static_cast<size_t>(nd), false);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t d = normalize_dim(dims[static_cast<size_t>(i)], nd, "permute", x.shape());
    TESSERA_CHECK(!seen[static_cast<size_t>(d)], ValueError, "permute", "dim ", d, " repeated in permutation of shape ",
                  x.shape().to_string());
    seen[static_cast<size_t>(d)] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  return with_view(x, shape, strides, x.offset());
}

Tensor raw_narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined(x, "narrow");
  TESSERA_CHECK(x.ndim() > 0, ValueError, "narrow", "cannot narrow a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.ndim(), "narrow", x.shape());
  if (start < 0) start += x.shape()[d];
  TESSERA_CHECK(start >= 0 && length >= 0 && start + length <= x.shape()[d], ValueError, "narrow", "range [", start,
                ", ", start + length, ") out of bounds for dim ", d, " of shape ", x.shape().to_string());
  Shape shape = x.shape();
  shape[d] = length;
  return with_view(x, shape, x.strides(), x.offset() + (length > 0 ? start * x.strides()[d] : 0));
}

Tensor raw_select(const Tensor& x, int64_t dim, int64_t index) {
  check_defined(x, "select");
  TESSERA_CHECK(x.ndim() > 0, ValueError, "select", "cannot select from a 0-d tensor");
  const int64_t d = normalize_dim(dim, x.ndim(), "select", x.shape());
  const int64_t i = index < 0 ? index + x.shape()[d] : index;
  TESSERA_CHECK(i >= 0 && i < x.shape()[d], ValueError, "select", "index ", index, " out of range for dim ", d,
                " of shape ", x.shape().to_string());
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape.erase(d);
  strides.erase(d);
  return with_view(x, shape, strides, x.offset() + i * x.strides()[d]);
}

Tensor raw_unsqueeze(const Tensor& x, int64_t dim) {
  check_defined(x, "unsqueeze");
  const int64_t d = normalize_dim(dim, x.ndim() + 1, "unsqueeze", x.shape());
  Shape shape = x.shape();
  Strides strides = x.strides();
  const int64_t stride = d < x.ndim() ? x.shape()[d] * x.strides()[d] : 1;
  shape.insert(d, 1);
  strides.insert(d, stride);
  return with_view(x, shape, strides, x.offset());
}

Tensor raw_squeeze(const Tensor& x) {
  check_defined(x, "squeeze");
  Shape shape;
  Strides strides;
  for (int64_t d = 0; d < x.ndim(); ++d) {
    if (x.shape()[d] == 1) continue;
    shape.push_back(x.shape()[d]);
    strides.push_back(x.strides()[d]);
  }
  return with_view(x, shape, strides, x.offset());
}

Tensor raw_squeeze(const Tensor& x, int64_t dim) {
  check_defined(x, "squeeze");
  const int64_t d = normalize_dim(dim, x.ndim(), "squeeze", x.shape());
  if (x.ndim() == 0 || x.shape()[d] != 1) return x;
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape.erase(d);
  strides.erase(d);
  return with_view(x, shape, strides, x.offset());
}

Tensor raw_expand(const Tensor& x, const Shape& requested) {
  check_defined(x, "expand");
  const Shape shape = expand_shape(x.shape(), requested);
  const int64_t n = shape.size(), lead = n - x.ndim();
  Strides strides = Strides::filled(n, 0);
  for (int64_t i = lead; i < n; ++i)
    if (shape[i] == x.shape()[i - lead]) strides[i] = x.strides()[i - lead];
  return with_view(x, shape, strides, x.offset());
}

}  // namespace detail

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.to_string(); }

}  // namespace tessera
