#include <tessera/ops/fused_optim.hpp>

#include <cmath>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {

// T: the storage and compute type (float for f32, double for f64). The loop has no calls but
// sqrt, so the compiler vectorises it.
template <class T>
void adamw_run(T* __restrict p, T* __restrict m, T* __restrict v, const T* __restrict g, int64_t n, const AdamWStep& s) {
  const T b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2), one_b1 = static_cast<T>(1 - s.beta1),
          one_b2 = static_cast<T>(1 - s.beta2), inv_c1 = static_cast<T>(1 / s.correction1),
          inv_c2 = static_cast<T>(1 / s.correction2), eps = static_cast<T>(s.eps),
          decay = static_cast<T>(1 - s.lr * s.weight_decay), lr = static_cast<T>(s.lr);
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = b1 * m[i] + one_b1 * gi;
    const T vi = b2 * v[i] + one_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - lr * (mi * inv_c1) / (std::sqrt(vi * inv_c2) + eps);
  }
}

}  // namespace

bool adamw_fusable(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad) {
  const DType d = param.dtype();
  for (const Tensor* t : {&param, &exp_avg, &exp_avg_sq, &grad})
    if (!t->defined() || !t->is_contiguous() || t->dtype() != d || t->shape() != param.shape()) return false;
  return d == DType::f32 || d == DType::f64;
}

void adamw_update_(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWStep& step) {
  TESSERA_CHECK(adamw_fusable(param, exp_avg, exp_avg_sq, grad), ValueError, "adamw_update_",
                "param ", param.shape().to_string(), " ", name(param.dtype()), ", exp_avg ", exp_avg.shape().to_string(),
                " ", name(exp_avg.dtype()), ", exp_avg_sq ", exp_avg_sq.shape().to_string(), " ",
                name(exp_avg_sq.dtype()), " and grad ", grad.shape().to_string(), " ", name(grad.dtype()),
                " must be contiguous, of one shape and one dtype, f32 or f64");
  const int64_t n = param.numel();
  if (param.dtype() == DType::f32)
    adamw_run(param.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), grad.data<float>(), n, step);
  else
    adamw_run(param.data<double>(), exp_avg.data<double>(), exp_avg_sq.data<double>(), grad.data<double>(), n, step);
}

double sum_of_squares(const Tensor& t) {
  TESSERA_CHECK(is_floating(t.dtype()), ValueError, "sum_of_squares", "dtype ", name(t.dtype()),
                " is not floating");
  const Tensor c = t.dtype() == DType::f32 || t.dtype() == DType::f64 ? t.contiguous() : t.to(DType::f32).contiguous();
  const int64_t n = c.numel();
  double total = 0;
  if (c.dtype() == DType::f32) {
    const float* x = c.data<float>();
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  } else {
    const double* x = c.data<double>();
#pragma omp simd reduction(+ : total)
    for (int64_t i = 0; i < n; ++i) total += x[i] * x[i];
  }
  return total;
}

}  // namespace tessera
