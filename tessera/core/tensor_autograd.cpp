// Tensor's autograd surface: leaves, grad(), backward(), detach().
#include <tessera/core/tensor.hpp>

namespace tessera {

Tensor& Tensor::requires_grad_(bool on) {
  check_defined("requires_grad_");
  if (!on) {
    TESSERA_CHECK(is_leaf(), ValueError, "requires_grad_", "cannot turn off gradients of a non-leaf tensor (result of ",
                  grad_fn_name(), "); use detach()");
    if (autograd_) autograd_->requires_grad = false;
    return *this;
  }
  TESSERA_CHECK(is_floating(dtype_), ValueError, "requires_grad_", "only floating tensors can require gradients; got ",
                name(dtype_), " of shape ", shape_.to_string());
  if (requires_grad()) return *this;
  auto meta = std::make_shared<autograd::Meta>();
  meta->requires_grad = true;
  meta->accumulate = [shape = shape_, dtype = dtype_](autograd::Meta& leaf, const std::any& incoming) {
    Tensor grad = std::any_cast<const Tensor&>(incoming).to(dtype);
    TESSERA_ASSERT(grad.shape() == shape, "gradient of shape ", grad.shape().to_string(), " for a leaf of shape ",
                   shape.to_string());
    if (leaf.grad.has_value()) grad = autograd::GradOps<Tensor>::add(std::any_cast<const Tensor&>(leaf.grad), grad);
    leaf.grad = grad.contiguous();
  };
  autograd_ = std::move(meta);
  return *this;
}

Tensor Tensor::grad() const {
  if (!autograd_ || !autograd_->grad.has_value()) return Tensor();
  return std::any_cast<const Tensor&>(autograd_->grad);
}

void Tensor::set_grad(const Tensor& grad) {
  TESSERA_CHECK(requires_grad() && is_leaf(), ValueError, "set_grad", "only a leaf that requires a gradient has one");
  if (!grad.defined()) {
    autograd_->grad.reset();
    return;
  }
  TESSERA_CHECK(grad.shape() == shape_, ValueError, "set_grad", "gradient of shape ", grad.shape().to_string(),
                " for a tensor of shape ", shape_.to_string());
  autograd_->grad = grad.to(dtype_);
}

void Tensor::backward() const { backward(Tensor()); }

void Tensor::backward(const Tensor& grad) const {
  check_defined("backward");
  TESSERA_CHECK(requires_grad(), ValueError, "backward", "tensor of shape ", shape_.to_string(),
                " does not require a gradient (no input called requires_grad_)");
  Tensor seed = grad;
  if (!seed.defined()) {
    TESSERA_CHECK(numel() == 1, ValueError, "backward", "a gradient is needed for a tensor of shape ",
                  shape_.to_string(), "; only one-element tensors default to 1");
    seed = full(shape_, 1.0, dtype_);
  }
  TESSERA_CHECK(seed.shape() == shape_, ValueError, "backward", "gradient of shape ", seed.shape().to_string(),
                " for a tensor of shape ", shape_.to_string());
  autograd::run_backward(autograd_, std::any(seed));
}

Tensor Tensor::detach() const {
  Tensor out = *this;
  out.autograd_.reset();
  return out;
}

std::string Tensor::grad_fn_name() const { return is_leaf() ? "" : autograd_->grad_fn->name(); }

}  // namespace tessera
