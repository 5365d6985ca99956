// Tensor's autograd surface: leaves, grad(), backward(), detach(), and the Tensor members that
// record a derivative: the views and copies, which are the raw views of the core layer
// (core/internal/tensor_raw.hpp) plus their derivatives. They live here, in the layer that owns the
// derivatives and the gradient arithmetic, so that core links without the layers above it.
#include <tessera/core/tensor.hpp>

#include <tessera/core/internal/tensor_raw.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/elementwise.hpp>

namespace tessera {

namespace {

// Records `out`, a view or copy of `in`, when `in` requires a gradient; `backward` maps out's
// gradient to in's.
template <class Backward>
Tensor recorded(const char* op, Tensor out, const Tensor& in, Backward backward) {
  if (autograd::needs_grad<Tensor>({&in}))
    autograd::record<Tensor>(
        op, out, {&in}, [backward = std::move(backward)](const Tensor& g) { return std::vector<Tensor>{backward(g)}; });
  return out;
}

// The gradient of a narrowed/selected view: zeros with `grad` written into the viewed region.
template <class Region>
Tensor scattered(const Tensor& grad, const Shape& shape, Region region) {
  Tensor out = zeros(shape, grad.dtype());
  region(out).copy_(grad);
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  return recorded("view", detail::raw_view(*this, shape), *this, [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::reshape(const Shape& shape) const {
  return recorded("reshape", detail::raw_reshape(*this, shape), *this,
                  [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const Tensor out = detail::raw_transpose(*this, dim0, dim1);
  if (ndim() == 0) return out;
  const int64_t a = normalize_dim(dim0, ndim(), "transpose", shape_), b = normalize_dim(dim1, ndim(), "transpose", shape_);
  return recorded("transpose", out, *this, [a, b](const Tensor& g) { return g.transpose(a, b); });
}

Tensor Tensor::t() const {
  check_defined("t");
  TESSERA_CHECK(ndim() <= 2, ValueError, "t", "expects a tensor with <= 2 dims, got shape ", shape_.to_string());
  return ndim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  const Tensor out = detail::raw_permute(*this, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[static_cast<size_t>(normalize_dim(dims[i], ndim(), "permute", shape_))] = static_cast<int64_t>(i);
  return recorded("permute", out, *this, [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const Tensor out = detail::raw_narrow(*this, dim, start, length);
  const int64_t d = normalize_dim(dim, ndim(), "narrow", shape_);
  if (start < 0) start += shape_[d];
  return recorded("narrow", out, *this, [in = shape_, d, start, length](const Tensor& g) {
    return scattered(g, in, [&](const Tensor& z) { return z.narrow(d, start, length); });
  });
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const Tensor out = detail::raw_select(*this, dim, index);
  const int64_t d = normalize_dim(dim, ndim(), "select", shape_);
  const int64_t i = index < 0 ? index + shape_[d] : index;
  return recorded("select", out, *this, [in = shape_, d, i](const Tensor& g) {
    return scattered(g, in, [&](const Tensor& z) { return z.select(d, i); });
  });
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  return recorded("unsqueeze", detail::raw_unsqueeze(*this, dim), *this,
                  [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze() const {
  return recorded("squeeze", detail::raw_squeeze(*this), *this, [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::squeeze(int64_t dim) const {
  const Tensor out = detail::raw_squeeze(*this, dim);
  if (out.is_same(*this)) return *this;
  return recorded("squeeze", out, *this, [in = shape_](const Tensor& g) { return g.reshape(in); });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  check_defined("flatten");
  return reshape(flatten_shape(shape_, start_dim, end_dim));
}

Tensor Tensor::expand(const Shape& shape) const {
  return recorded("expand", detail::raw_expand(*this, shape), *this,
                  [in = shape_](const Tensor& g) { return autograd::GradOps<Tensor>::sum_to(g, in); });
}

Tensor Tensor::contiguous() const {
  check_defined("contiguous");
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  Tensor out = detail::raw_clone(*this);
  if (autograd::needs_grad<Tensor>({this}))
    autograd::record<Tensor>("clone", out, {this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor Tensor::to(DType dtype) const {
  check_defined("to");
  if (dtype == dtype_) return *this;
  Tensor out = detail::raw_to(*this, dtype);
  if (is_floating(dtype) && autograd::needs_grad<Tensor>({this}))
    autograd::record<Tensor>("to", out, {this},
                             [from = dtype_](const Tensor& g) { return std::vector<Tensor>{g.to(from)}; });
  return out;
}

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
