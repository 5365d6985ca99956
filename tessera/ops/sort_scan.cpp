// Scans and sorting: the dim is moved last and made contiguous, each row is processed, and the
// result moved back.
#include <tessera/ops/sort_scan.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace {

// x with `dim` moved last, as contiguous rows [outer, n], and the way back.
struct Rows {
  Tensor rows;
  std::vector<int64_t> order;  // the permutation that moved dim last
  Shape permuted;              // x's shape in that order
};

Rows rows_along(const Tensor& x, int64_t dim) {
  Rows r;
  int64_t outer = 1;
  for (int64_t i = 0; i < x.ndim(); ++i) {
    if (i == dim) continue;
    r.order.push_back(i);
    outer *= x.shape()[i];
  }
  r.order.push_back(dim);
  const Tensor moved = x.detach().permute(r.order).contiguous();
  r.permuted = moved.shape();
  r.rows = moved.reshape({outer, x.shape()[dim]});  // explicit: -1 cannot be inferred for empty dims
  return r;
}

// Rows [outer, m] back to x's dim order, with dim of size m.
Tensor from_rows(const Tensor& rows, const Rows& r) {
  Shape shape = r.permuted;
  shape[shape.size() - 1] = rows.shape()[1];
  std::vector<int64_t> inverse(r.order.size());
  for (size_t i = 0; i < r.order.size(); ++i) inverse[static_cast<size_t>(r.order[i])] = static_cast<int64_t>(i);
  return rows.reshape(shape).permute(inverse).contiguous();
}

int64_t scan_dim(const Tensor& x, int64_t dim, const char* op) {
  TESSERA_CHECK(x.defined(), ValueError, op, "tensor is undefined (default-constructed)");
  return normalize_dim(dim, x.ndim(), op, x.shape());
}

template <bool product>
Tensor scan(const Tensor& x, int64_t dim, const char* op) {
  const int64_t d = scan_dim(x, dim, op);
  if (x.ndim() == 0) return x.to(is_floating(x.dtype()) ? x.dtype() : DType::i64).clone();
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  const DType acc = is_floating(x.dtype()) ? DType::f64 : DType::i64;
  const Rows r = rows_along(x.to(acc), d);
  Tensor result = r.rows.clone();
  const int64_t outer = result.shape()[0], n = result.shape()[1];
  visit(acc, [&]<class T>(TypeTag<T>) {
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) {
      T* p = result.data<T>();
      for (int64_t row = 0; row < outer; ++row, p += n)
        for (int64_t i = 1; i < n; ++i) {
          if constexpr (product) {
            if constexpr (std::is_integral_v<T>)  // wraps like the other integer ops
              p[i] = static_cast<T>(static_cast<uint64_t>(p[i]) * static_cast<uint64_t>(p[i - 1]));
            else
              p[i] *= p[i - 1];
          } else {
            if constexpr (std::is_integral_v<T>)
              p[i] = static_cast<T>(static_cast<uint64_t>(p[i]) + static_cast<uint64_t>(p[i - 1]));
            else
              p[i] += p[i - 1];
          }
        }
    }
  });
  return from_rows(result, r).to(out);
}

// a before b in the sorted order (ascending, NaN last; descending, NaN first).
template <class C>
bool before(C a, C b, bool descending) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) return descending ? a_nan && !b_nan : b_nan && !a_nan;
  return descending ? a > b : a < b;
}

// Sorts each row, or keeps its first k (k < n: partial sort), returning values and indices.
ValuesIndices<Tensor> sort_rows(const Tensor& x, int64_t d, int64_t k, bool descending) {
  const Rows r = rows_along(x, d);
  const int64_t outer = r.rows.shape()[0], n = r.rows.shape()[1];
  Tensor values = empty({outer, k}, x.dtype());
  Tensor indices = empty({outer, k}, DType::i64);
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    const T* in = static_cast<const T*>(r.rows.raw_data());
    T* v = values.data<T>();
    int64_t* idx = indices.data<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t row = 0; row < outer; ++row, in += n, v += k, idx += k) {
      std::iota(order.begin(), order.end(), 0);
      const auto less = [&](int64_t a, int64_t b) {
        const C va = static_cast<C>(in[a]), vb = static_cast<C>(in[b]);
        if (before(va, vb, descending)) return true;
        if (before(vb, va, descending)) return false;
        return a < b;  // stable: ties in index order
      };
      if (k < n)
        std::partial_sort(order.begin(), order.begin() + k, order.end(), less);
      else
        std::sort(order.begin(), order.end(), less);
      for (int64_t i = 0; i < k; ++i) {
        idx[i] = order[static_cast<size_t>(i)];
        v[i] = in[order[static_cast<size_t>(i)]];
      }
    }
  });
  return {from_rows(values, r), from_rows(indices, r)};
}

// The gradient of values picked from x along d at `indices`: g placed back at those positions
// (the picks are distinct positions, so no two gradients add up).
void record_picked(const char* op, Tensor& values, const Tensor& x, const Tensor& indices, int64_t d) {
  if (!autograd::needs_grad<Tensor>({&x})) return;
  autograd::record<Tensor>(op, values, {&x}, [shape = x.shape(), indices, d](const Tensor& g) {
    return std::vector<Tensor>{detail::place_along(shape, d, indices, g, 0)};
  });
}

}  // namespace

namespace detail {

Tensor place_along(const Shape& shape, int64_t d, const Tensor& indices, const Tensor& values, int64_t offset) {
  const Rows picked = rows_along(values, d), at = rows_along(indices.to(DType::i64), d);
  const Rows out = rows_along(zeros(shape, values.dtype()), d);
  Tensor rows = out.rows;
  const int64_t outer = rows.shape()[0], n = rows.shape()[1], k = picked.rows.shape()[1];
  visit(values.dtype(), [&]<class T>(TypeTag<T>) {
    const T* v = static_cast<const T*>(picked.rows.raw_data());
    const int64_t* ip = static_cast<const int64_t*>(at.rows.raw_data());
    T* o = rows.data<T>();
    for (int64_t row = 0; row < outer; ++row)
      for (int64_t i = 0; i < k; ++i) {
        const int64_t j = ip[row * k + i] - offset;
        if (j >= 0 && j < n) o[row * n + j] = v[row * k + i];
      }
  });
  return from_rows(rows, out);
}

}  // namespace detail

Tensor cumsum(const Tensor& x, int64_t dim) {
  Tensor out = scan<false>(x.detach(), dim, "cumsum");
  derivatives::record_cumsum(out, x, x.ndim() == 0 ? 0 : normalize_dim(dim, x.ndim(), "cumsum", x.shape()));
  return out;
}

Tensor cumprod(const Tensor& x, int64_t dim) {
  Tensor out = scan<true>(x.detach(), dim, "cumprod");
  derivatives::record_cumprod(out, x, x.ndim() == 0 ? 0 : normalize_dim(dim, x.ndim(), "cumprod", x.shape()));
  return out;
}

ValuesIndices<Tensor> sort(const Tensor& x, int64_t dim, bool descending) {
  const int64_t d = scan_dim(x, dim, "sort");
  if (x.ndim() == 0) return {x.clone(), zeros({}, DType::i64)};
  ValuesIndices<Tensor> out = sort_rows(x, d, x.shape()[d], descending);
  record_picked("sort", out.values, x, out.indices, d);
  return out;
}

ValuesIndices<Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  (void)sorted;  // always sorted: the order costs nothing extra here
  const int64_t d = scan_dim(x, dim, "topk");
  if (x.ndim() == 0) {
    TESSERA_CHECK(k == 1, ValueError, "topk", "k = ", k, " for a 0-d tensor; expected 1");
    return {x.clone(), zeros({}, DType::i64)};
  }
  TESSERA_CHECK(k >= 0 && k <= x.shape()[d], ValueError, "topk", "k = ", k, " out of range for dim ", d, " of size ",
                x.shape()[d], " (shape ", x.shape().to_string(), ")");
  ValuesIndices<Tensor> out = sort_rows(x, d, k, largest);
  record_picked("topk", out.values, x, out.indices, d);
  return out;
}

}  // namespace tessera
