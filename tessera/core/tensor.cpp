// Tensor handle: metadata and views. Copies live in tensor_copy.cpp, factories in
// tensor_factories.cpp, printing in tensor_print.cpp.
#include <tessera/core/tensor.hpp>

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

namespace {

// Records `out`, a view or copy of `in`, when `in` requires a gradient; `backward` maps out's
// gradient to in's.
template <class Backward>
Tensor recorded(const char* op, Tensor out, const Tensor& in, Backward backward) {
  if (autograd::needs_grad<Tensor>({&in}))
    autograd::record<Tensor>(
        op, out, {&in}, [backward = std::move(backward)](const Tensor& g) { return std::vector<Tensor>{backward(g)}; });
  return out;
}

// The gradient of a narrowed/selected view: zeros with `grad` written into the viewed region.
template <class Region>
Tensor scattered(const Tensor& grad, const Shape& shape, Region region) {
  Tensor out = zeros(shape, grad.dtype());
  region(out).copy_(grad);
  return out;
}

}  // namespace

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  check_defined("as_strided");
  check_view(storage_.get(), shape, strides, offset, dtype_, "as_strided");  // so errors name as_strided
  TESSERA_CHECK(!autograd::needs_grad<Tensor>({this}), ValueError, "as_strided",
                "not differentiable; the tensor of shape ", shape_.to_string(), " requires a gradient");
  return Tensor(storage_, shape, strides, offset, dtype_);
}

Tensor Tensor::view(const Shape& requested) const {
  check_defined("view");
  const Shape shape = infer_shape(requested, numel(), shape_, "view");
  Strides strides;
  TESSERA_CHECK(view_strides(shape_, strides_, shape, strides), ValueError, "view", "cannot view shape ",
                shape_.to_string(), " with strides ", strides_.to_string(), " as ", shape.to_string(),
                " without a copy; use reshape");
  return recorded("view", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::reshape(const Shape& requested) const {
  check_defined("reshape");
  const Shape shape = infer_shape(requested, numel(), shape_, "reshape");
  Strides strides;
  const Tensor out = view_strides(shape_, strides_, shape, strides) ? Tensor(storage_, shape, strides, offset_, dtype_)
                                                                    : detach().clone().view(shape);
  return recorded("reshape", out, *this, [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  check_defined("transpose");
  const int64_t a = normalize_dim(dim0, ndim(), "transpose", shape_);
  const int64_t b = normalize_dim(dim1, ndim(), "transpose", shape_);
  if (ndim() == 0) return *this;
  Shape shape = shape_;
  Strides strides = strides_;
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return recorded("transpose", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [a, b](const Tensor& g) { return g.transpose(a, b); });
}

Tensor Tensor::t() const {
  check_defined("t");
  TESSERA_CHECK(ndim() <= 2, ValueError, "t", "expects a tensor with <= 2 dims, got shape ", shape_.to_string());
  return ndim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  check_defined("permute");
  TESSERA_CHECK(static_cast<int64_t>(dims.size()) == ndim(), ValueError, "permute", "got ", dims.size(),
                " dims for shape ", shape_.to_string(), "; expected ", ndim());
  Shape shape = Shape::filled(ndim(), 0);
  Strides strides = Strides::filled(ndim(), 0);
  std::vector<int64_t> inverse(static_cast<size_t>(ndim()), 0);
  std::vector<bool> seen(static_cast<size_t>(ndim()), false);
  for (int64_t i = 0; i < ndim(); ++i) {
    const int64_t d = normalize_dim(dims[static_cast<size_t>(i)], ndim(), "permute", shape_);
    TESSERA_CHECK(!seen[static_cast<size_t>(d)], ValueError, "permute", "dim ", d, " repeated in permutation of shape ",
                  shape_.to_string());
    seen[static_cast<size_t>(d)] = true;
    inverse[static_cast<size_t>(d)] = i;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return recorded("permute", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  check_defined("narrow");
  TESSERA_CHECK(ndim() > 0, ValueError, "narrow", "cannot narrow a 0-d tensor");
  const int64_t d = normalize_dim(dim, ndim(), "narrow", shape_);
  if (start < 0) start += shape_[d];
  TESSERA_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], ValueError, "narrow", "range [", start, ", ",
                start + length, ") out of bounds for dim ", d, " of shape ", shape_.to_string());
  Shape shape = shape_;
  shape[d] = length;
  return recorded("narrow", Tensor(storage_, shape, strides_, offset_ + (length > 0 ? start * strides_[d] : 0), dtype_),
                  *this, [in = shape_, d, start, length](const Tensor& g) {
                    return scattered(g, in, [&](const Tensor& z) { return z.narrow(d, start, length); });
                  });
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  check_defined("select");
  TESSERA_CHECK(ndim() > 0, ValueError, "select", "cannot select from a 0-d tensor");
  const int64_t d = normalize_dim(dim, ndim(), "select", shape_);
  const int64_t i = index < 0 ? index + shape_[d] : index;
  TESSERA_CHECK(i >= 0 && i < shape_[d], ValueError, "select", "index ", index, " out of range for dim ", d,
                " of shape ", shape_.to_string());
  Shape shape = shape_;
  Strides strides = strides_;
  shape.erase(d);
  strides.erase(d);
  return recorded("select", Tensor(storage_, shape, strides, offset_ + i * strides_[d], dtype_), *this,
                  [in = shape_, d, i](const Tensor& g) {
                    return scattered(g, in, [&](const Tensor& z) { return z.select(d, i); });
                  });
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  check_defined("unsqueeze");
  const int64_t d = normalize_dim(dim, ndim() + 1, "unsqueeze", shape_);
  Shape shape = shape_;
  Strides strides = strides_;
  const int64_t stride = d < ndim() ? shape_[d] * strides_[d] : 1;
  shape.insert(d, 1);
  strides.insert(d, stride);
  return recorded("unsqueeze", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze() const {
  check_defined("squeeze");
  Shape shape;
  Strides strides;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (shape_[d] == 1) continue;
    shape.push_back(shape_[d]);
    strides.push_back(strides_[d]);
  }
  return recorded("squeeze", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze(int64_t dim) const {
  check_defined("squeeze");
  const int64_t d = normalize_dim(dim, ndim(), "squeeze", shape_);
  if (ndim() == 0 || shape_[d] != 1) return *this;
  Shape shape = shape_;
  Strides strides = strides_;
  shape.erase(d);
  strides.erase(d);
  return recorded("squeeze", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  check_defined("flatten");
  return reshape(flatten_shape(shape_, start_dim, end_dim));
}

Tensor Tensor::expand(const Shape& requested) const {
  check_defined("expand");
  const Shape shape = expand_shape(shape_, requested);
  const int64_t n = shape.size(), lead = n - ndim();
  Strides strides = Strides::filled(n, 0);
  for (int64_t i = lead; i < n; ++i)
    if (shape[i] == shape_[i - lead]) strides[i] = strides_[i - lead];
  return recorded("expand", Tensor(storage_, shape, strides, offset_, dtype_), *this,
                  [in = shape_](const Tensor& g) { return autograd::GradOps<Tensor>::sum_to(g, in); });
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.to_string(); }

}  // namespace tessera
