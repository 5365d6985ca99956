#pragma once
// Tensor: the local, dense, strided CPU tensor each rank holds and computes on.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/scalar.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/core/storage.hpp>

namespace tessera TESSERA_API {

/// A cheap, copyable handle on shared storage with shape, strides (in elements) and offset.
/// Copies of a handle alias the same data; views (reshape, transpose, narrow, ...) never copy.
/// A default-constructed Tensor is undefined: views, copies, data access and every op throw
/// ValueError; the inline metadata accessors (shape, dtype, ...) return those of a 0-d f32 tensor.
/// Example: `Tensor x = arange(6).reshape({2, 3});` prints `tensor([[0, 1, 2], [3, 4, 5]], dtype=i64)`.
class Tensor {
 public:
  Tensor() = default;
  /// A view on storage. Throws ValueError if the view reaches outside the storage.
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype);

  // --- metadata -------------------------------------------------------------------------
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t ndim() const { return shape_.size(); }
  /// Size of one dim; negative dims count from the end. Throws ValueError if out of range.
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t numel() const { return shape_.numel(); }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  int64_t itemsize() const { return tessera::itemsize(dtype_); }
  int64_t nbytes() const { return numel() * itemsize(); }
  /// Row-major with no gaps (size-1 dims may have any stride).
  bool is_contiguous() const;
  /// True when both handles view the same storage with the same shape, strides and offset.
  bool is_same(const Tensor& other) const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // --- raw access -----------------------------------------------------------------------
  /// Address of the first element (offset applied).
  void* raw_data();
  const void* raw_data() const;
  /// Typed pointer to the first element. Throws ValueError if T is not this tensor's dtype.
  template <class T>
  T* data() {
    check_dtype(dtype_of<T>(), "data");
    return static_cast<T*>(raw_data());
  }
  template <class T>
  const T* data() const {
    check_dtype(dtype_of<T>(), "data");
    return static_cast<const T*>(raw_data());
  }

  // --- views (no copies) ------------------------------------------------------------------
  /// Same data, new shape; one dim may be -1. Throws ValueError if numel differs or the
  /// strides cannot express the new shape without a copy (use reshape).
  Tensor view(const Shape& shape) const;
  /// view() when the strides allow it, otherwise a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  /// Transpose of a tensor with at most 2 dims.
  Tensor t() const;
  /// Reorders dims; dims must be a permutation of 0..ndim-1 (negatives allowed).
  Tensor permute(const std::vector<int64_t>& dims) const;
  /// Elements [start, start+length) along dim (start may be negative).
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// Index `index` along dim, removing that dim.
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  /// Removes every size-1 dim.
  Tensor squeeze() const;
  /// Removes dim if its size is 1; otherwise returns the same view.
  Tensor squeeze(int64_t dim) const;
  /// Merges dims start..end into one (a view when strides allow, else a copy).
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  /// Broadcasts size-1 dims (and new leading dims) to shape with stride 0; -1 keeps a size.
  Tensor expand(const Shape& shape) const;
  Tensor broadcast_to(const Shape& shape) const { return expand(shape); }
  /// Any shape/strides/offset over the same storage. Throws ValueError if out of bounds.
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;

  // --- copies -----------------------------------------------------------------------------
  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const;
  /// A contiguous copy with its own storage.
  Tensor clone() const;
  /// Copies src into this tensor's elements, broadcasting src and converting its dtype.
  /// Throws ValueError if src does not broadcast to this shape or this tensor has
  /// self-overlapping (expanded) elements.
  Tensor& copy_(const Tensor& src);
  /// Sets every element to value (converted to this dtype).
  Tensor& fill_(Scalar value);
  /// This tensor if already of dtype, else a converted contiguous copy.
  Tensor to(DType dtype) const;

  // --- values -----------------------------------------------------------------------------
  /// The value of a one-element tensor as T. Throws ValueError if numel != 1.
  template <class T>
  T item() const;
  /// The value of a one-element tensor as double.
  double item() const { return item<double>(); }
  /// All elements in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;
  /// Readable text: `tensor([[1, 2], [3, 4]], dtype=f32)`; large tensors are summarised.
  std::string to_string() const;

  // --- autograd (state: core/grad_mode.hpp; engine: grad/engine.hpp; defined in ops/tensor_autograd.cpp)
  // State lives in a Meta shared by copies of the handle made after requires_grad_(). Every op
  // and view on a tensor that requires a gradient records itself while grad mode is on.
  /// Whether gradients flow to this tensor (a leaf marked by requires_grad_, or an op's result).
  bool requires_grad() const { return autograd_ && autograd_->requires_grad; }
  /// Marks a leaf to accumulate a gradient in grad(). Throws ValueError for a non-floating dtype
  /// or (with false) for a tensor that is the result of a recorded op.
  Tensor& requires_grad_(bool on = true);
  /// True unless this tensor is the result of a recorded op.
  bool is_leaf() const { return !autograd_ || !autograd_->grad_fn; }
  /// The gradient accumulated by backward() on a leaf; undefined before the first backward.
  Tensor grad() const;
  /// Replaces a leaf's gradient (undefined clears it, like PyTorch's `x.grad = None`).
  void set_grad(const Tensor& grad);
  /// Backpropagates from this tensor with `grad` (default: 1, for a one-element tensor), adding
  /// into the grad() of every leaf it depends on. Throws ValueError if this tensor does not require
  /// a gradient, or grad is missing for a tensor with more than one element or has another shape.
  void backward() const;
  void backward(const Tensor& grad) const;
  /// The same data with no autograd history (never requires a gradient).
  Tensor detach() const;
  /// The recorded op that produced this tensor ("add", "matmul", ...), or "" for a leaf.
  std::string grad_fn_name() const;
  /// Internal: the autograd state (null when none), for the recording helpers.
  const std::shared_ptr<autograd::Meta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<autograd::Meta> meta) { autograd_ = std::move(meta); }

 private:
  void check_dtype(DType expected, const char* op) const;
  void check_defined(const char* op) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
  std::shared_ptr<autograd::Meta> autograd_;
};


std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// --- factories ------------------------------------------------------------------------------
/// Uninitialised contiguous tensor.
Tensor empty(const Shape& shape, DType dtype = DType::f32);
Tensor zeros(const Shape& shape, DType dtype = DType::f32);
Tensor ones(const Shape& shape, DType dtype = DType::f32);
Tensor full(const Shape& shape, Scalar value, DType dtype = DType::f32);
Tensor empty_like(const Tensor& like);
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
/// A 0-d tensor holding value.
Tensor scalar_tensor(Scalar value, DType dtype);
/// [0, 1, ..., n-1] (i64 by default).
Tensor arange(int64_t n, DType dtype = DType::i64);
/// [start, start+step, ...) below end (above end for negative step). Throws ValueError if step == 0.
Tensor arange(double start, double end, double step, DType dtype = DType::f32);
/// n x m identity (m = n when m < 0).
Tensor eye(int64_t n, int64_t m = -1, DType dtype = DType::f32);

/// A contiguous tensor of T's dtype holding values. Throws ValueError if values.size() != numel.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape);
/// 1-d form: shape [values.size()].
template <class T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())});
}

/// |a - b| <= atol + rtol * |b| everywhere (shapes must broadcast; NaNs compare unequal unless
/// equal_nan). Throws ValueError if shapes do not broadcast.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
/// Same shape and exactly equal values (after promotion to a common dtype).
bool equal(const Tensor& a, const Tensor& b);

}  // namespace tessera
