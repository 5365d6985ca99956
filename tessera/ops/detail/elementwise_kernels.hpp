#pragma once
// Loop kernels shared by the elementwise, comparison and where ops. Each run (from
// strided_loop) takes a contiguous fast path the compiler vectorises, a path for one operand
// broadcast as a scalar (stride 0), and the general strided path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <tessera/core/internal/strided_loop.hpp>
#include <tessera/ops/detail/vector_math.hpp>

namespace tessera::detail {

template <class T>
inline T load(const char* p) {
  return *reinterpret_cast<const T*>(p);
}

/// out[i] = Out(op(In a[i], In b[i])) computed in compute_t<In>.
template <class In, class Out, class Op>
void binary_run(const Run<3>& run, const Op& op) {
  using C = compute_t<In>;
  auto* o = reinterpret_cast<Out*>(run.ptr[0]);
  const auto* a = reinterpret_cast<const In*>(run.ptr[1]);
  const auto* b = reinterpret_cast<const In*>(run.ptr[2]);
  const int64_t n = run.count;
  constexpr int64_t so = sizeof(Out), si = sizeof(In);
  if (run.stride[0] == so && run.stride[1] == si && run.stride[2] == si) {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(op(static_cast<C>(a[i]), static_cast<C>(b[i])));
  } else if (run.stride[0] == so && run.stride[1] == si && run.stride[2] == 0) {
    const C bv = static_cast<C>(b[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(op(static_cast<C>(a[i]), bv));
  } else if (run.stride[0] == so && run.stride[1] == 0 && run.stride[2] == si) {
    const C av = static_cast<C>(a[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(op(av, static_cast<C>(b[i])));
  } else {
    char* po = run.ptr[0];
    const char *pa = run.ptr[1], *pb = run.ptr[2];
    for (int64_t i = 0; i < n; ++i, po += run.stride[0], pa += run.stride[1], pb += run.stride[2])
      *reinterpret_cast<Out*>(po) =
          static_cast<Out>(op(static_cast<C>(load<In>(pa)), static_cast<C>(load<In>(pb))));
  }
}

/// A kernel with an array form for f32 (vector math): every f32 element goes through it.
template <class Op>
concept HasFloatArrayForm = requires(const float* x, float* y, int64_t n) { Op::floats(x, y, n); };

/// out[i] = Out(op(In x[i])) computed in compute_t<In>.
template <class In, class Out, class Op>
void unary_run(const Run<2>& run, const Op& op) {
  using C = compute_t<In>;
  auto* o = reinterpret_cast<Out*>(run.ptr[0]);
  const auto* x = reinterpret_cast<const In*>(run.ptr[1]);
  if constexpr (std::is_same_v<In, float> && std::is_same_v<Out, float> && HasFloatArrayForm<Op>) {
    if (run.stride[0] == sizeof(float) && run.stride[1] == sizeof(float)) return Op::floats(x, o, run.count);
    // Strided: gathered into blocks, so an element's result does not depend on the layout.
    constexpr int64_t kBlock = 256;
    float block[kBlock];
    for (int64_t start = 0; start < run.count; start += kBlock) {
      const int64_t n = std::min(kBlock, run.count - start);
      for (int64_t i = 0; i < n; ++i) block[i] = load<float>(run.ptr[1] + (start + i) * run.stride[1]);
      Op::floats(block, block, n);
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<float*>(run.ptr[0] + (start + i) * run.stride[0]) = block[i];
    }
    return;
  }
  if (run.stride[0] == sizeof(Out) && run.stride[1] == sizeof(In)) {
    for (int64_t i = 0; i < run.count; ++i) o[i] = static_cast<Out>(op(static_cast<C>(x[i])));
  } else {
    char* po = run.ptr[0];
    const char* px = run.ptr[1];
    for (int64_t i = 0; i < run.count; ++i, po += run.stride[0], px += run.stride[1])
      *reinterpret_cast<Out*>(po) = static_cast<Out>(op(static_cast<C>(load<In>(px))));
  }
}

/// out[i] = cond[i] ? a[i] : b[i].
template <class T>
void where_run(const Run<4>& run) {
  char* po = run.ptr[0];
  const char *pc = run.ptr[1], *pa = run.ptr[2], *pb = run.ptr[3];
  if (run.stride[0] == sizeof(T) && run.stride[1] == 1 && run.stride[2] == sizeof(T) && run.stride[3] == sizeof(T)) {
    auto* o = reinterpret_cast<T*>(po);
    const auto* c = reinterpret_cast<const bool*>(pc);
    const auto* a = reinterpret_cast<const T*>(pa);
    const auto* b = reinterpret_cast<const T*>(pb);
    for (int64_t i = 0; i < run.count; ++i) o[i] = c[i] ? a[i] : b[i];
    return;
  }
  for (int64_t i = 0; i < run.count; ++i, po += run.stride[0], pc += run.stride[1], pa += run.stride[2], pb += run.stride[3])
    *reinterpret_cast<T*>(po) = load<bool>(pc) ? load<T>(pa) : load<T>(pb);
}

}  // namespace tessera::detail

// The scalar function of each elementwise row of the op table (ops/op_table.hpp), named like the
// op. Arguments arrive in the compute type (f16/bf16 as f32; see compute_t).
namespace tessera::kernels {

// Signed integer overflow is undefined in C++; tensors wrap like PyTorch's, so integer
// add/sub/mul/neg go through the unsigned type.
template <class T, class Op>
T wrapping(Op op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return op(static_cast<int>(a), static_cast<int>(b)) != 0;
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return static_cast<T>(op(a, b));
  }
}

// --- unary ---
struct neg {
  template <class T> T operator()(T v) const { return wrapping([](auto a, auto b) { return a - b; }, T(0), v); }
};
struct abs {
  template <class T> T operator()(T v) const { return v < T(0) ? neg{}(v) : v; }
};
struct relu {
  template <class T> T operator()(T v) const { return v > T(0) || v != v ? v : T(0); }
};
struct sign {
  template <class T>
  T operator()(T v) const {
    if constexpr (std::is_same_v<T, bool>)
      return v;
    else
      return v != v ? v : static_cast<T>((T(0) < v) - (v < T(0)));
  }
};
struct exp {
  template <class T> T operator()(T v) const { return std::exp(v); }
  static void floats(const float* x, float* y, int64_t n) { detail::vexp(x, y, n); }
};
struct log { template <class T> T operator()(T v) const { return std::log(v); } };
struct sqrt { template <class T> T operator()(T v) const { return std::sqrt(v); } };
struct rsqrt { template <class T> T operator()(T v) const { return T(1) / std::sqrt(v); } };
struct sin { template <class T> T operator()(T v) const { return std::sin(v); } };
struct cos { template <class T> T operator()(T v) const { return std::cos(v); } };
struct tanh {
  template <class T> T operator()(T v) const { return std::tanh(v); }
  static void floats(const float* x, float* y, int64_t n) { detail::vtanh(x, y, n); }
};
struct sigmoid { template <class T> T operator()(T v) const { return T(1) / (T(1) + std::exp(-v)); } };
/// GELU, exact (erf) form, as PyTorch's default.
struct gelu {
  template <class T> T operator()(T v) const { return T(0.5) * v * (T(1) + std::erf(v * T(0.70710678118654752440))); }
  static void floats(const float* x, float* y, int64_t n) {
    constexpr int64_t kBlock = 256;
    float e[kBlock];
    for (int64_t start = 0; start < n; start += kBlock) {
      const int64_t m = std::min(kBlock, n - start);
      for (int64_t i = 0; i < m; ++i) e[i] = x[start + i] * 0.70710678118654752440f;
      detail::verf(e, e, m);
      for (int64_t i = 0; i < m; ++i) y[start + i] = 0.5f * x[start + i] * (1.0f + e[i]);
    }
  }
};
struct silu { template <class T> T operator()(T v) const { return v / (T(1) + std::exp(-v)); } };
struct log1p { template <class T> T operator()(T v) const { return std::log1p(v); } };
struct expm1 { template <class T> T operator()(T v) const { return std::expm1(v); } };
struct erf {
  template <class T> T operator()(T v) const { return std::erf(v); }
  static void floats(const float* x, float* y, int64_t n) { detail::verf(x, y, n); }
};
// log(1 + e^v), linear above 20 as torch.nn.functional.softplus's default threshold.
struct softplus { template <class T> T operator()(T v) const { return v > T(20) ? v : std::log1p(std::exp(v)); } };

// --- binary ---
struct add {
  template <class T> T operator()(T a, T b) const { return wrapping([](auto x, auto y) { return x + y; }, a, b); }
};
struct sub {
  template <class T> T operator()(T a, T b) const { return wrapping([](auto x, auto y) { return x - y; }, a, b); }
};
struct mul {
  template <class T> T operator()(T a, T b) const { return wrapping([](auto x, auto y) { return x * y; }, a, b); }
};
struct div {
  template <class T> T operator()(T a, T b) const { return a / b; }  // floating only (promote_floating)
};
struct pow {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return std::pow(a, b);
    } else if constexpr (std::is_same_v<T, bool>) {
      return a || !b;
    } else {  // exponentiation by squaring, wrapping like the other integer ops
      T result = 1;
      for (T e = b, base = a; e > 0; e = static_cast<T>(e >> 1)) {
        if (e & 1) result = mul{}(result, base);
        base = mul{}(base, base);
      }
      return result;
    }
  }
};
// NaN propagates: a NaN operand wins.
struct maximum { template <class T> T operator()(T a, T b) const { return (a != a || a > b) ? a : b; } };
struct minimum { template <class T> T operator()(T a, T b) const { return (a != a || a < b) ? a : b; } };

// --- comparisons (b8 results) ---
struct eq { template <class T> bool operator()(T a, T b) const { return a == b; } };
struct ne { template <class T> bool operator()(T a, T b) const { return a != b; } };
struct lt { template <class T> bool operator()(T a, T b) const { return a < b; } };
struct le { template <class T> bool operator()(T a, T b) const { return a <= b; } };
struct gt { template <class T> bool operator()(T a, T b) const { return a > b; } };
struct ge { template <class T> bool operator()(T a, T b) const { return a >= b; } };
struct logical_and { template <class T> bool operator()(T a, T b) const { return a != T(0) && b != T(0); } };
struct logical_or { template <class T> bool operator()(T a, T b) const { return a != T(0) || b != T(0); } };

}  // namespace tessera::kernels
