#pragma once
// Loop kernels shared by the elementwise, comparison and where ops. Each run (from
// strided_loop) takes a contiguous fast path the compiler vectorises, a path for one operand
// broadcast as a scalar (stride 0), and the general strided path.
#include <tessera/core/detail/strided_loop.hpp>

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

/// out[i] = Out(op(In x[i])) computed in compute_t<In>.
template <class In, class Out, class Op>
void unary_run(const Run<2>& run, const Op& op) {
  using C = compute_t<In>;
  auto* o = reinterpret_cast<Out*>(run.ptr[0]);
  const auto* x = reinterpret_cast<const In*>(run.ptr[1]);
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
