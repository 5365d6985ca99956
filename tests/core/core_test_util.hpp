#pragma once
// Helpers shared by the core tests: error matching (STYLE.md §8d) and typed element access that
// does not go through the code under test.
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <tessera/core/tensor.hpp>

namespace tessera::testing {

/// Success iff f() throws exactly an E (or subclass) whose what() contains every part in order of
/// listing. A part starting with '[' must be the message prefix ("[op] ...", STYLE.md §5).
template <class E, class F>
::testing::AssertionResult throws_with(F&& f, const std::vector<std::string>& parts) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& part : parts) {
      const size_t at = what.find(part);
      if (at == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << part << "\"";
      if (!part.empty() && part[0] == '[' && &part == &parts.front() && at != 0)
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

/// Shorthand for the common case.
template <class F>
::testing::AssertionResult value_error(F&& f, const std::vector<std::string>& parts) {
  return throws_with<ValueError>(std::forward<F>(f), parts);
}

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                            DType::i32, DType::i64, DType::u8,  DType::b8};
  return dtypes;
}

/// A double as element type T (16-bit floats through float).
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

/// An element as double (16-bit floats through float).
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

/// Element at a multi-index, read straight from storage with the tensor's strides and offset.
template <class T>
T at(const Tensor& t, std::initializer_list<int64_t> index) {
  int64_t flat = t.offset();
  int64_t d = 0;
  for (int64_t i : index) flat += i * t.strides()[d++];
  return static_cast<const T*>(t.storage()->data())[flat];
}

/// Every element in row-major order as double, walking the tensor's own strides (independent of
/// contiguous()/to()/to_vector()).
inline std::vector<double> walk(const Tensor& t) {
  std::vector<double> out;
  if (t.numel() == 0) return out;
  visit(t.dtype(), [&]<class T>(TypeTag<T>) {
    const T* base = static_cast<const T*>(t.storage()->data());
    std::vector<int64_t> index(static_cast<size_t>(t.ndim()), 0);
    while (true) {
      int64_t flat = t.offset();
      for (int64_t d = 0; d < t.ndim(); ++d) flat += index[static_cast<size_t>(d)] * t.strides()[d];
      out.push_back(to_double(base[flat]));
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

/// 0, 1, ..., n-1 as doubles.
inline std::vector<double> iota(int64_t n, double start = 0) {
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(start + static_cast<double>(i));
  return out;
}

}  // namespace tessera::testing
