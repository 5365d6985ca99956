// Finite-difference gradient check, in f64 throughout.
#include <tessera/autograd/gradcheck.hpp>

#include <cmath>
#include <sstream>

#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/reduce.hpp>

namespace tessera::autograd {

namespace {

// Fixed output weights in [0.5, 1.5): a vector-Jacobian product that sees every output element.
Tensor weights_like(const Tensor& out) {
  std::vector<double> w(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + static_cast<double>((i * 37 + 11) % 64) / 64.0;
  return from_vector(w, out.shape());
}

double weighted_loss(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;
  const Tensor out = fn(inputs).to(DType::f64);
  return sum(mul(out, weights_like(out))).item();
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  std::vector<Tensor> leaves;
  for (const Tensor& input : inputs) {
    Tensor leaf = is_floating(input.dtype()) ? input.to(DType::f64).detach().clone() : input;
    if (is_floating(leaf.dtype())) leaf.requires_grad_();
    leaves.push_back(leaf);
  }
  const Tensor out = fn(leaves);
  const Tensor loss = sum(mul(out.to(DType::f64), weights_like(out)));
  GradcheckResult result;
  if (!loss.requires_grad()) {
    result.ok = false;
    result.message = "the output does not depend on any floating input through recorded ops";
    return result;
  }
  loss.backward();
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!leaves[i].requires_grad()) continue;
    const Tensor analytic = leaves[i].grad().defined() ? leaves[i].grad() : zeros(leaves[i].shape(), DType::f64);
    std::vector<Tensor> probe = leaves;
    for (auto& t : probe) t = t.detach();
    Tensor base = probe[i].clone();
    double* values = base.numel() ? base.data<double>() : nullptr;
    const std::vector<double> grads = analytic.to_vector<double>();
    probe[i] = base;
    for (int64_t k = 0; k < base.numel(); ++k) {
      const double saved = values[k];
      values[k] = saved + options.eps;
      const double plus = weighted_loss(fn, probe);
      values[k] = saved - options.eps;
      const double minus = weighted_loss(fn, probe);
      values[k] = saved;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double error = std::abs(grads[static_cast<size_t>(k)] - numeric);
      result.max_error = std::max(result.max_error, error);
      if (error > options.atol + options.rtol * std::abs(numeric) && result.ok) {
        result.ok = false;
        std::ostringstream text;
        text << "input " << i << " element " << k << ": backward gives " << grads[static_cast<size_t>(k)]
             << ", finite differences " << numeric;
        result.message = text.str();
      }
    }
  }
  return result;
}

}  // namespace tessera::autograd
