#pragma once
// Helpers shared by the tests of every layer: error matching (STYLE.md §8d), dtype lists, and typed
// element access that does not go through the code under test (values are written to and read from
// storage directly, walking shape/strides/offset here).
//
// Test files say `using namespace tessera;` and `using namespace tessera::testing;`, so they spell
// GoogleTest's namespace ::testing in full (a bare `testing::` is ambiguous there), and a local helper
// must not reuse a name from here with the same parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <tessera/core/tensor.hpp>

namespace tessera::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// --- error matching ---------------------------------------------------------------------------

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
inline bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

/// Success iff f() throws exactly an E (or subclass) whose what() contains every part. A first
/// part starting with '[' must be the message prefix ("[op] ...", STYLE.md §5).
template <class E, class F>
::testing::AssertionResult throws_with(F&& f, const std::vector<std::string>& parts) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& part : parts) {
      if (!contains(what, part))
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << part << "\"";
      if (!part.empty() && part[0] == '[' && &part == &parts.front() && !starts_with(what, part))
        return ::testing::AssertionFailure() << "message \"" << what << "\" does not start with \"" << part << "\"";
    }
    return ::testing::AssertionSuccess() << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw " << typeid(e).name() << " instead: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw a non-std exception";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

/// Shorthand for the common case: `EXPECT_TRUE(value_error([&] { ... }, {"[op] prefix", "part"}))`.
template <class F>
::testing::AssertionResult value_error(F&& f, const std::vector<std::string>& parts) {
  return throws_with<ValueError>(std::forward<F>(f), parts);
}

/// The same for ShardingError (layouts, placements, meshes).
template <class F>
::testing::AssertionResult sharding_error(F&& f, const std::vector<std::string>& parts) {
  return throws_with<ShardingError>(std::forward<F>(f), parts);
}

/// The message of the ValueError fn throws ("" and a test failure if it throws none), for tests
/// that check it with contains() / starts_with().
template <class F>
std::string value_error_message(F&& fn) {
  try {
    std::forward<F>(fn)();
  } catch (const ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ValueError";
  return "";
}

// --- dtype lists ------------------------------------------------------------------------------

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                            DType::i32, DType::i64, DType::u8,  DType::b8};
  return dtypes;
}

inline const std::vector<DType>& floating_dtypes() {
  static const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
  return dtypes;
}

/// The integer dtypes (bool excluded).
inline const std::vector<DType>& integral_dtypes() {
  static const std::vector<DType> dtypes = {DType::i32, DType::i64, DType::u8};
  return dtypes;
}

// --- element conversions ----------------------------------------------------------------------

/// A double as element type T (16-bit floats through float; bool is v != 0).
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0;
  else return static_cast<T>(v);
}

/// An element as R (16-bit floats through float).
template <class R, class T>
R element_as(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<R>(static_cast<float>(v));
  else return static_cast<R>(v);
}

/// An element as double (16-bit floats through float).
template <class T>
double to_double(T v) {
  return element_as<double>(v);
}

// --- storage access ---------------------------------------------------------------------------

/// Element at a multi-index, read straight from storage with the tensor's strides and offset.
template <class T>
T at(const Tensor& t, std::initializer_list<int64_t> index) {
  int64_t flat = t.offset();
  int64_t d = 0;
  for (int64_t i : index) flat += i * t.strides()[d++];
  return static_cast<const T*>(t.storage()->data())[flat];
}

/// Every element in row-major order as R, walking the tensor's own strides and offset
/// (independent of contiguous()/to()/to_vector()).
template <class R = double>
std::vector<R> walk(const Tensor& t) {
  std::vector<R> out;
  if (t.numel() == 0) return out;
  visit(t.dtype(), [&]<class T>(TypeTag<T>) {
    const T* base = static_cast<const T*>(t.storage()->data());
    std::vector<int64_t> index(static_cast<size_t>(t.ndim()), 0);
    while (true) {
      int64_t flat = t.offset();
      for (int64_t d = 0; d < t.ndim(); ++d) flat += index[static_cast<size_t>(d)] * t.strides()[d];
      out.push_back(element_as<R>(base[flat]));
      int64_t d = t.ndim() - 1;
      for (; d >= 0; --d) {
        if (++index[static_cast<size_t>(d)] < t.shape()[d]) break;
        index[static_cast<size_t>(d)] = 0;
      }
      if (d < 0) break;
    }
  });
  return out;
}

/// A contiguous tensor of dtype holding values (row-major), written element by element with
/// from_double (no to()/copy_/from_vector).
inline Tensor make(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  EXPECT_EQ(static_cast<size_t>(t.numel()), values.size()) << "test bug: value count vs shape " << shape.to_string();
  visit(dtype, [&]<class T>(TypeTag<T>) {
    T* p = static_cast<T*>(t.raw_data());
    for (size_t i = 0; i < values.size(); ++i) p[i] = from_double<T>(values[i]);
  });
  return t;
}

/// A contiguous tensor holding values of the element type itself (for values a double cannot hold).
template <class T>
Tensor make_typed(const std::vector<T>& values, const Shape& shape) {
  Tensor t = empty(shape, dtype_of<T>());
  EXPECT_EQ(static_cast<size_t>(t.numel()), values.size()) << "test bug: value count vs shape " << shape.to_string();
  T* p = static_cast<T*>(t.raw_data());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

/// Every element as double through the library's to_vector (for tests whose subject is not the
/// element access itself).
inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

/// 0, 1, ..., n-1 (plus start) as doubles.
inline std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(start + static_cast<double>(i));
  return out;
}

// --- comparing results ------------------------------------------------------------------------

/// Relative and absolute tolerance: |actual - expected| <= atol + rtol * |expected|.
struct Tol {
  double rtol, atol;
};

/// A Tol per dtype; `other` covers the integer and bool dtypes. Each test file keeps its own table
/// (they are tuned per op family and differ on purpose); this is only the lookup.
struct TolTable {
  Tol f64, f32, f16, bf16, other;

  constexpr Tol operator()(DType dtype) const {
    switch (dtype) {
      case DType::f64:
        return f64;
      case DType::f32:
        return f32;
      case DType::f16:
        return f16;
      case DType::bf16:
        return bf16;
      default:
        return other;
    }
  }
};

/// Shape, dtype and every element of t (read with walk) against expected: NaN matches NaN, an
/// infinite expected value must be hit exactly, any other within tolerance.
inline ::testing::AssertionResult matches(const Tensor& t, const Shape& shape, DType dtype,
                                          const std::vector<double>& expected, Tol tolerance) {
  if (!t.defined()) return ::testing::AssertionFailure() << "result is undefined";
  if (t.shape() != shape)
    return ::testing::AssertionFailure() << "shape " << t.shape().to_string() << ", expected " << shape.to_string();
  if (t.dtype() != dtype)
    return ::testing::AssertionFailure() << "dtype " << name(t.dtype()) << ", expected " << name(dtype);
  const std::vector<double> actual = walk(t);
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << actual.size() << " elements, expected " << expected.size();
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok = std::isnan(e)   ? std::isnan(a)
                    : std::isinf(e) ? a == e
                                    : std::abs(a - e) <= tolerance.atol + tolerance.rtol * std::abs(e);
    if (!ok) return ::testing::AssertionFailure() << "element " << i << " is " << a << ", expected " << e;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tessera::testing
