#pragma once
// What the convolutions, pools and resampling ops (convolution.cpp, pooling.cpp, resampling.cpp)
// share: their argument checks and parsing (every spatial op sees 1-d and 2-d as 3-d, leading
// dims of size 1), and their compute dtype (f32, f64 for f64; f16/bf16 converted and back).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/internal/spatial_args.hpp>

namespace tessera::detail::spatial {

using Dims3 = std::array<int64_t, 3>;

inline std::string text(const std::vector<int64_t>& v) { return Shape(v).to_string(); }
inline std::string text(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out.append(i ? ", " : "").append(concat(v[i]));
  return out + "]";
}

// The operand detached, in its compute dtype, contiguous.
inline Tensor compute_copy(const Tensor& t) { return t.detach().to(compute_dtype(t.dtype())).contiguous(); }

inline void check_defined(const Tensor& t, const char* op, const char* what) {
  TESSERA_CHECK(t.defined(), ValueError, op, what, " tensor is undefined (default-constructed)");
}

inline void check_floating(const Tensor& x, const char* op) {
  TESSERA_CHECK(is_floating(x.dtype()), ValueError, op, "unsupported dtype ", name(x.dtype()), " of input ",
                x.shape().to_string(), "; expected a floating dtype (f32, f64, f16, bf16)");
}

// One value per spatial dim (per_spatial_dim), placed in the last `spatial` of 3 dims; the leading
// dims get `fill`.
inline Dims3 spatial_param(const std::vector<int64_t>& values, int spatial, int64_t fill, const char* op,
                           const char* what) {
  const std::vector<int64_t> per_dim = per_spatial_dim(values, spatial, op, what);
  Dims3 out{fill, fill, fill};
  for (int i = 0; i < spatial; ++i) out[static_cast<size_t>(3 - spatial + i)] = per_dim[static_cast<size_t>(i)];
  return out;
}

inline bool all_at_least(const Dims3& v, int64_t bound) { return v[0] >= bound && v[1] >= bound && v[2] >= bound; }

// The `spatial` dims of a shape from dim `from` on, front-filled to 3 with 1.
inline Dims3 spatial_dims(const Shape& s, int spatial, int64_t from) {
  Dims3 d{1, 1, 1};
  for (int i = 0; i < spatial; ++i) d[static_cast<size_t>(3 - spatial + i)] = s[from + i];
  return d;
}

// Checks x as a 3-d or 4-d floating input of a 2-d pool (max, avg, adaptive avg).
inline void check_pool_input(const char* op, const Tensor& x) {
  check_defined(x, op, "input");
  check_floating(x, op);
  TESSERA_CHECK(x.ndim() == 3 || x.ndim() == 4, ValueError, op, "input shape ", x.shape().to_string(),
                " is not 3-d or 4-d; expected [N, C, H, W] or unbatched [C, H, W]");
  TESSERA_CHECK(x.size(-2) > 0 && x.size(-1) > 0, ValueError, op, "input shape ", x.shape().to_string(),
                " has an empty spatial dim; expected H, W >= 1");
}

// Runs body(TypeTag<C>) with C the compute type of dtype.
template <class F>
void on_compute_type(DType dtype, F&& body) {
  if (compute_dtype(dtype) == DType::f64)
    body(TypeTag<double>{});
  else
    body(TypeTag<float>{});
}

}  // namespace tessera::detail::spatial
