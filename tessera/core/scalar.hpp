#pragma once
// Scalar: a number that keeps whether it was written as bool, integer or floating point, so
// that `x + 2` keeps an integer tensor integral while `x + 2.5` promotes it (as in PyTorch).
#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>

#include <tessera/core/export.hpp>
#include <tessera/core/dtype.hpp>

namespace tessera TESSERA_API {

/// A bool, integer or floating value. Constructible implicitly from any arithmetic type.
class Scalar {
 public:
  enum class Kind : uint8_t { boolean, integral, floating };

  template <class T>
    requires std::is_arithmetic_v<T> || std::same_as<T, Half> || std::same_as<T, BFloat16>
  Scalar(T value) {  // NOLINT: implicit by design
    if constexpr (std::is_same_v<T, bool>) {
      kind_ = Kind::boolean;
      int_ = value;
      double_ = value;
    } else if constexpr (std::is_integral_v<T>) {
      kind_ = Kind::integral;
      int_ = static_cast<int64_t>(value);
      double_ = static_cast<double>(value);
    } else {
      kind_ = Kind::floating;
      double_ = static_cast<double>(static_cast<compute_t<T>>(value));
      int_ = convert<int64_t>(double_);
    }
  }

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::floating; }
  double to_double() const { return double_; }
  int64_t to_int() const { return int_; }
  /// The value as element type T (integers exactly, floats rounded).
  template <class T>
  T to() const {
    if constexpr (std::is_integral_v<T>) return kind_ == Kind::floating ? convert<T>(double_) : static_cast<T>(int_);
    else return convert<T>(double_);
  }
  /// The dtype a tensor of dtype `tensor_dtype` has after an op with this scalar: the tensor's,
  /// unless the scalar is of a higher category (float scalar with integer tensor -> f32).
  DType result_dtype(DType tensor_dtype) const;
  std::string to_string() const;

 private:
  Kind kind_ = Kind::integral;
  int64_t int_ = 0;
  double double_ = 0;
};

/// The value no element of `dtype` lies below (lowest) or above: -inf/+inf for floating dtypes,
/// the integer limits, false/true for b8. The identity of max (lowest) and of min.
Scalar lowest_value(DType dtype);
Scalar highest_value(DType dtype);

}  // namespace tessera
