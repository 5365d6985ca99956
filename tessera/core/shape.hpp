#pragma once
// Shape and Strides: small inline vectors of int64 (no heap allocation up to 6 dims).
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// A vector of int64 that stores up to 6 elements inline and spills to the heap beyond.
/// Value type: copyable, comparable, printable as "[2, 3]".
class DimVector {
 public:
  static constexpr int64_t kInline = 6;

  DimVector() = default;
  DimVector(std::initializer_list<int64_t> values) { assign(values.begin(), static_cast<int64_t>(values.size())); }
  DimVector(const std::vector<int64_t>& values) { assign(values.data(), static_cast<int64_t>(values.size())); }  // NOLINT
  DimVector(const int64_t* values, int64_t count) { assign(values, count); }
  /// count copies of value.
  static DimVector filled(int64_t count, int64_t value);
  DimVector(const DimVector& other) { assign(other.data(), other.size_); }
  DimVector(DimVector&& other) noexcept { steal(other); }
  DimVector& operator=(const DimVector& other) {
    if (this != &other) assign(other.data(), other.size_);
    return *this;
  }
  DimVector& operator=(DimVector&& other) noexcept {
    if (this != &other) {
      release();
      steal(other);
    }
    return *this;
  }
  ~DimVector() { release(); }

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return heap_ ? heap_ : inline_; }
  const int64_t* data() const { return heap_ ? heap_ : inline_; }
  int64_t& operator[](int64_t i) { return data()[i]; }
  int64_t operator[](int64_t i) const { return data()[i]; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t back() const { return data()[size_ - 1]; }

  void push_back(int64_t value);
  void insert(int64_t position, int64_t value);
  void erase(int64_t position);
  void resize(int64_t count, int64_t value = 0);
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }

  /// Product of the elements (1 for an empty vector).
  int64_t numel() const;
  /// "[2, 3]"; "[]" for a 0-d shape.
  std::string to_string() const;

  friend bool operator==(const DimVector& a, const DimVector& b) {
    return a.size_ == b.size_ && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_) * sizeof(int64_t)) == 0;
  }

 private:
  void assign(const int64_t* values, int64_t count);
  void reserve(int64_t capacity);
  void release() {
    delete[] heap_;
    heap_ = nullptr;
  }
  void steal(DimVector& other) {
    size_ = other.size_;
    capacity_ = other.capacity_;
    heap_ = other.heap_;
    if (!heap_) std::memcpy(inline_, other.inline_, sizeof(inline_));
    other.heap_ = nullptr;
    other.size_ = 0;
    other.capacity_ = kInline;
  }

  int64_t size_ = 0;
  int64_t capacity_ = kInline;
  int64_t* heap_ = nullptr;
  int64_t inline_[kInline] = {};
};

/// Sizes of a tensor's dims. Example: [8, 6].
using Shape = DimVector;
/// Element strides of a tensor's dims.
using Strides = DimVector;

/// Writes to_string(): "[8, 6]"; "[]" for a 0-d shape.
std::ostream& operator<<(std::ostream& out, const DimVector& dims);

/// Row-major (C-contiguous) strides of shape.
Strides contiguous_strides(const Shape& shape);

/// Maps dim in [-ndim, ndim) to [0, ndim). Throws ValueError naming op and shape otherwise.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op, const Shape& shape);

/// Numpy broadcasting of two shapes. Throws ValueError naming op and both shapes if incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Shape logic shared by the Tensor ops, the DTensor ops, their sharding rules and derivatives:
// written once so that one mistake gives one error text on either type. Pure.

/// The dims of a reduction: each normalised as normalize_dim does, ascending; every dim when
/// `dims` is empty. A 0-d shape accepts 0 and -1 and reduces nothing. Throws ValueError naming op
/// and shape for a dim out of range or repeated. Example: ([-1, 0], [4, 5, 6]) -> [0, 2].
DimVector normalize_dims(const std::vector<int64_t>& dims, const Shape& shape, const char* op);

/// The shape of a reduction over normalised `dims`: removed, or kept as 1 with keepdim.
Shape reduced_shape(const Shape& shape, const DimVector& dims, bool keepdim);

/// `requested` with its one -1 (if any) replaced so that it holds numel elements. Throws
/// ValueError naming op and `from` for a second -1, a negative size or a count mismatch.
Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from, const char* op);

/// The shape expand gives: -1 keeps a dim, size-1 dims stretch, new leading dims are prepended.
/// Throws ValueError naming "expand" and both shapes otherwise.
Shape expand_shape(const Shape& from, const Shape& requested);

/// cat (stacking false) or stack of tensors of `shapes` along `dim`: the normalised dim and the
/// result's shape. Throws ValueError naming the op and the shapes for none, 0-d inputs of cat,
/// or shapes that differ (outside dim, for cat).
struct JoinedShape {
  int64_t dim;
  Shape shape;
};
JoinedShape joined_shape(const std::vector<Shape>& shapes, int64_t dim, bool stacking);

/// The piece sizes of split(x, split_size, dim) along dim `dim` (normalised) of `shape`:
/// split_size each, the last one smaller; one empty piece for an empty dim (torch.split).
/// Throws ValueError naming "split" and the shape for split_size < 1 on a non-empty dim.
std::vector<int64_t> split_sizes(const Shape& shape, int64_t dim, int64_t split_size);
/// Checks explicit split sizes along dim `dim` (normalised) of `shape`: none negative, adding up
/// to the dim's size. Throws ValueError naming "split", the sizes and the shape otherwise.
void check_split_sizes(const std::vector<int64_t>& sizes, const Shape& shape, int64_t dim);
/// The piece sizes of chunk(x, chunks, dim): ceil(size / chunks) each, the last smaller (so
/// possibly fewer than `chunks` pieces), and `chunks` empty pieces for an empty dim (torch.chunk).
/// Throws ValueError naming "chunk" for chunks < 1.
std::vector<int64_t> chunk_sizes(const Shape& shape, int64_t dim, int64_t chunks);

/// The shape flatten(start_dim, end_dim) gives: those dims merged into one ([1] for a 0-d shape).
/// Throws ValueError naming "flatten" and the shape for dims out of range or in the wrong order.
Shape flatten_shape(const Shape& shape, int64_t start_dim, int64_t end_dim);

}  // namespace tessera
