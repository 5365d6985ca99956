// Indexing along one dim: one walk over the index tensor's positions with x's strides.
#include <tessera/ops/indexing.hpp>

#include <string>
#include <vector>

#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>

namespace tessera {

namespace {

void check_index(const char* op, const Tensor& x, const Tensor& index, int64_t d, bool same_ndim) {
  TESSERA_CHECK(x.defined() && index.defined(), ValueError, op, "an input tensor is undefined (default-constructed)");
  check_index_args(op, x.shape(), index.shape(), index.dtype(), d, same_ndim);
}

std::vector<int64_t> index_values(const char* op, const Tensor& index, int64_t size, int64_t d, const Shape& shape) {
  std::vector<int64_t> values = index.to_vector<int64_t>();
  for (int64_t v : values)
    TESSERA_CHECK(v >= 0 && v < size, ValueError, op, "index ", v, " out of range for dim ", d, " of size ", size,
                  " (shape ", shape.to_string(), ")");
  return values;
}

// Calls f(position in index's row-major order, offset of p in `a` with p[d] replaced by the index,
// offset of p in `b`) for every position p of index's shape.
template <class F>
void for_each_position(const Shape& shape, int64_t d, const std::vector<int64_t>& index, const Tensor& a,
                       const Tensor& b, F&& f) {
  const int64_t nd = shape.size();
  std::vector<int64_t> p(static_cast<size_t>(nd), 0);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    int64_t oa = 0, ob = 0;
    for (int64_t k = 0; k < nd; ++k) {
      oa += (k == d ? index[static_cast<size_t>(i)] : p[static_cast<size_t>(k)]) * a.strides()[k];
      ob += p[static_cast<size_t>(k)] * b.strides()[k];
    }
    f(i, oa, ob);
    for (int64_t k = nd - 1; k >= 0 && ++p[static_cast<size_t>(k)] == shape[k]; --k) p[static_cast<size_t>(k)] = 0;
  }
}

Tensor scatter_impl(const char* op, const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, bool add) {
  TESSERA_CHECK(x.defined() && src.defined(), ValueError, op, "an input tensor is undefined (default-constructed)");
  const int64_t d = normalize_dim(dim, x.ndim(), op, x.shape());
  check_index(op, x, index, d, true);
  TESSERA_CHECK(src.ndim() == index.ndim(), ValueError, op, "src of shape ", src.shape().to_string(),
                " must have as many dims as index of shape ", index.shape().to_string());
  for (int64_t k = 0; k < index.ndim(); ++k)
    TESSERA_CHECK(index.shape()[k] <= src.shape()[k], ValueError, op, "index of shape ", index.shape().to_string(),
                  " is larger than src of shape ", src.shape().to_string());
  const auto values = index_values(op, index, x.ndim() == 0 ? 1 : x.shape()[d], d, x.shape());
  Tensor out = x.detach().clone();
  const Tensor s = src.detach().to(x.dtype());
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    T* o = static_cast<T*>(out.raw_data());
    const T* v = static_cast<const T*>(s.raw_data());
    for_each_position(index.shape(), d, values, out, s, [&](int64_t, int64_t oa, int64_t ob) {
      if constexpr (std::is_same_v<T, bool>)
        o[oa] = add ? (o[oa] || v[ob]) : v[ob];
      else
        o[oa] = add ? static_cast<T>(static_cast<compute_t<T>>(o[oa]) + static_cast<compute_t<T>>(v[ob])) : v[ob];
    });
  });
  return out;
}

}  // namespace

void check_index_args(const char* op, const Shape& x, const Shape& index, DType index_dtype, int64_t d, bool same_ndim) {
  TESSERA_CHECK(!is_floating(index_dtype) && index_dtype != DType::b8, ValueError, op,
                "index must be an integer tensor, got ", name(index_dtype), " of shape ", index.to_string());
  if (same_ndim) {
    TESSERA_CHECK(index.size() == x.size(), ValueError, op, "index of shape ", index.to_string(),
                  " must have as many dims as the input of shape ", x.to_string());
    for (int64_t k = 0; k < x.size(); ++k)
      TESSERA_CHECK(k == d || index[k] <= x[k], ValueError, op, "index of shape ", index.to_string(),
                    " is larger than the input of shape ", x.to_string(), " outside dim ", d);
  } else {
    TESSERA_CHECK(index.size() == 1, ValueError, op, "index must be 1-d, got shape ", index.to_string());
  }
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  TESSERA_CHECK(x.defined(), ValueError, "gather", "an input tensor is undefined (default-constructed)");
  const int64_t d = normalize_dim(dim, x.ndim(), "gather", x.shape());
  check_index("gather", x, index, d, true);
  const auto values = index_values("gather", index, x.ndim() == 0 ? 1 : x.shape()[d], d, x.shape());
  Tensor out = empty(index.shape(), x.dtype());
  visit(x.dtype(), [&]<class T>(TypeTag<T>) {
    const T* in = static_cast<const T*>(x.raw_data());
    T* o = out.data<T>();
    for_each_position(index.shape(), d, values, x, out, [&](int64_t, int64_t oa, int64_t ob) { o[ob] = in[oa]; });
  });
  derivatives::record_gather(out, x, d, index);
  return out;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = scatter_impl("scatter", x, dim, index, src, false);
  derivatives::record_scatter(out, x, normalize_dim(dim, x.ndim(), "scatter", x.shape()), index, src, false);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = scatter_impl("scatter_add", x, dim, index, src, true);
  derivatives::record_scatter(out, x, normalize_dim(dim, x.ndim(), "scatter_add", x.shape()), index, src, true);
  return out;
}

// index_select and index_add are gather and scatter_add with the index broadcast over the other
// dims: one implementation, one set of checks.
namespace {
Tensor broadcast_index(const Tensor& index, const Shape& shape, int64_t d) {
  Shape view = Shape::filled(shape.size(), 1);
  view[d] = index.shape()[0];
  Shape target = shape;
  target[d] = index.shape()[0];
  return index.to(DType::i64).reshape(view).expand(target).contiguous();
}
}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  TESSERA_CHECK(x.defined(), ValueError, "index_select", "an input tensor is undefined (default-constructed)");
  TESSERA_CHECK(x.ndim() > 0, ValueError, "index_select", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "index_select", x.shape());
  check_index("index_select", x, index, d, false);
  (void)index_values("index_select", index, x.shape()[d], d, x.shape());
  return gather(x, d, broadcast_index(index, x.shape(), d));
}

void check_index_add_alpha(DType x_dtype, Scalar alpha) {
  TESSERA_CHECK(is_floating(x_dtype) || !alpha.is_floating(), ValueError, "index_add", "alpha ", alpha.to_string(),
                " is floating for an input of dtype ", name(x_dtype), "; expected an integer alpha (as torch)");
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  TESSERA_CHECK(x.defined() && src.defined(), ValueError, "index_add", "an input tensor is undefined (default-constructed)");
  TESSERA_CHECK(x.ndim() > 0, ValueError, "index_add", "expects a tensor with at least 1 dim");
  const int64_t d = normalize_dim(dim, x.ndim(), "index_add", x.shape());
  check_index("index_add", x, index, d, false);
  Shape expected = x.shape();
  expected[d] = index.shape()[0];
  TESSERA_CHECK(src.shape() == expected, ValueError, "index_add", "src of shape ", src.shape().to_string(),
                " for input of shape ", x.shape().to_string(), " and ", index.shape()[0], " indices; expected ",
                expected.to_string());
  (void)index_values("index_add", index, x.shape()[d], d, x.shape());
  check_index_add_alpha(x.dtype(), alpha);
  // Scaled as its own (differentiable) op: scatter_add's gradient then carries alpha to src.
  const Tensor scaled = alpha.to_double() == 1.0 ? src : mul(src, alpha);
  return scatter_add(x, d, broadcast_index(index, x.shape(), d), scaled);
}

}  // namespace tessera
