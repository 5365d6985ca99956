#pragma once
// DType: the closed set of element types, generated from one X-macro list.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include <tessera/core/export.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/half.hpp>

namespace tessera TESSERA_API {

// name, C++ storage type, category (float / int / bool)
#define TESSERA_FORALL_DTYPES(_)   \
  _(f32, float, float)             \
  _(f64, double, float)            \
  _(f16, ::tessera::Half, float)   \
  _(bf16, ::tessera::BFloat16, float) \
  _(i32, int32_t, int)             \
  _(i64, int64_t, int)             \
  _(u8, uint8_t, int)              \
  _(b8, bool, bool)

/// Element type of a tensor. f16 and bf16 are stored as 16 bits and computed in f32.
enum class DType : uint8_t {
#define TESSERA_DTYPE_ENUM(name, type, category) name,
  TESSERA_FORALL_DTYPES(TESSERA_DTYPE_ENUM)
#undef TESSERA_DTYPE_ENUM
};

/// Number of dtypes in the closed set.
inline constexpr int kNumDTypes = 8;

/// Bytes per element.
constexpr int64_t itemsize(DType dtype) {
  switch (dtype) {
#define TESSERA_DTYPE_SIZE(name, type, category) \
  case DType::name:                              \
    return sizeof(type);
    TESSERA_FORALL_DTYPES(TESSERA_DTYPE_SIZE)
#undef TESSERA_DTYPE_SIZE
  }
  return 0;
}

/// Canonical short name: "f32", "bf16", "b8".
std::string_view name(DType dtype);
std::string to_string(DType dtype);
/// Parses a canonical name. Throws ValueError if unknown.
DType dtype_from_string(std::string_view text);

/// True for f32 f64 f16 bf16.
bool is_floating(DType dtype);
/// True for i32 i64 u8 (bool is its own category).
bool is_integral(DType dtype);

/// Type promotion for binary ops. Categories bool < integer < floating; within a category the
/// wider type wins (u8 with i32 -> i32; f16 with bf16 -> f32); across categories the higher
/// category's type wins (i64 with f16 -> f16, as in PyTorch and JAX, unlike NumPy's f64).
DType promote_types(DType a, DType b);

/// Tag type carrying a C++ element type through generic lambdas.
template <class T>
struct TypeTag {
  using type = T;
};

/// The DType of a C++ element type.
template <class T>
constexpr DType dtype_of();
#define TESSERA_DTYPE_OF(name, type, category) \
  template <>                                  \
  constexpr DType dtype_of<type>() {           \
    return DType::name;                        \
  }
TESSERA_FORALL_DTYPES(TESSERA_DTYPE_OF)
#undef TESSERA_DTYPE_OF

/// Type in which an element type is computed: float for the 16-bit floats, itself otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

/// The dtype a floating-point kernel (convolution, attention, fused backward and optimizer steps,
/// sharded norms) computes in: f64 stays, every other dtype goes through f32.
constexpr DType compute_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

template <class T>
inline constexpr bool is_floating_v =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// The one dtype switch: calls f(TypeTag<T>{}) with T the storage type of dtype.
template <class F>
decltype(auto) visit(DType dtype, F&& f) {
  switch (dtype) {
#define TESSERA_DTYPE_VISIT(name, type, category) \
  case DType::name:                               \
    return f(TypeTag<type>{});
    TESSERA_FORALL_DTYPES(TESSERA_DTYPE_VISIT)
#undef TESSERA_DTYPE_VISIT
  }
  TESSERA_ASSERT(false, "bad dtype ", static_cast<int>(dtype));
}

/// visit restricted to floating dtypes. Throws ValueError naming op otherwise.
template <class F>
decltype(auto) visit_floating(DType dtype, const char* op, F&& f) {
  TESSERA_CHECK(is_floating(dtype), ValueError, op, "unsupported dtype ", name(dtype),
                "; expected a floating dtype (f32, f64, f16, bf16)");
  return visit(dtype, [&]<class T>(TypeTag<T> tag) -> decltype(auto) {
    if constexpr (is_floating_v<T>) {
      return f(tag);
    } else {  // unreachable (checked above); keeps every branch's return type that of f
      TESSERA_ASSERT(false, "unreachable");
      return f(TypeTag<float>{});
    }
  });
}

/// visit restricted to numeric dtypes (everything but b8). Throws ValueError naming op for b8.
template <class F>
decltype(auto) visit_numeric(DType dtype, const char* op, F&& f) {
  TESSERA_CHECK(dtype != DType::b8, ValueError, op, "unsupported dtype b8; expected a numeric dtype");
  return visit(dtype, [&]<class T>(TypeTag<T> tag) -> decltype(auto) {
    if constexpr (!std::is_same_v<T, bool>) {
      return f(tag);
    } else {  // unreachable (checked above); keeps every branch's return type that of f
      TESSERA_ASSERT(false, "unreachable");
      return f(TypeTag<uint8_t>{});
    }
  });
}

/// Converts between element types with defined results everywhere: to bool is "!= 0";
/// floating to integer truncates toward zero, saturates at the integer's range, and maps NaN to 0.
template <class To, class From>
constexpr To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(value) != compute_t<From>(0);
  } else if constexpr (std::is_integral_v<To> && is_floating_v<From>) {
    const double v = static_cast<double>(static_cast<compute_t<From>>(value));
    if (!(v == v)) return To(0);
    constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
    if (v <= lo) return std::numeric_limits<To>::min();
    if (v >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(static_cast<compute_t<From>>(value)));
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(value));
  }
}

}  // namespace tessera
