// Optimizer updates under NoGradGuard, written into each parameter's local shard in place (the
// parameter stays the same leaf, so the module keeps referring to it).
#include <tessera/nn/optim.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include <tessera/grad/engine.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/nn/detail/fsdp_unit.hpp>
#include <tessera/ops/fused_optim.hpp>

namespace tessera::nn {

namespace {

// p's shard takes the values of `value` (same layout: the update is elementwise).
void assign(DTensor& p, const DTensor& value) {
  Tensor local = p.to_local();
  local.copy_(value.to_local());
}

// A zero DTensor in p's exact layout (shard orders and explicit sizes included), with a
// contiguous local of its own.
DTensor zeros_like_layout(const DTensor& p) {
  return DTensor(zeros(p.to_local().shape(), p.dtype()), p.device_mesh(), p.layout());
}

// "<i>.<name>": parameter i's state entry.
std::string entry(size_t i, const std::string& name) { return std::to_string(i) + "." + name; }

// A 0-d `value` replicated on the mesh of `on` (every rank knows it: no communication).
DTensor replicated_scalar(const DTensor& on, Scalar value, DType dtype) {
  const DeviceMesh& mesh = on.device_mesh();
  return DTensor::from_local(scalar_tensor(value, dtype), mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
}

// `into` takes the values of `given`, resharded to its layout. Entries loaded in place (a
// checkpoint read into the tensors state_dict returned) are already there.
void assign_resharded(DTensor& into, const DTensor& given) {
  const DTensor source = given.detach().redistribute(into.device_mesh(), into.layout().with_dtype(given.dtype()));
  Tensor local = into.to_local();
  const Tensor from = source.to_local();
  if (from.raw_data() != local.raw_data()) local.copy_(from);
}

}  // namespace

std::map<std::string, DTensor> Optimizer::state_dict() {
  std::map<std::string, DTensor> out;
  if (!params_.empty()) out.emplace("lr", replicated_scalar(*params_.front(), Scalar(lr_), DType::f64));
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, DTensor>& state) {
  check_state("Optimizer::load_state_dict", state, {}, {"lr"});
  if (member_of_first_mesh()) lr_ = state.at("lr").item().to_double();
}

bool Optimizer::member_of_first_mesh() const {
  return !params_.empty() && params_.front()->device_mesh().is_member();
}

void Optimizer::check_state(const char* op, const std::map<std::string, DTensor>& state,
                            const std::vector<std::string>& per_parameter,
                            const std::vector<std::string>& global) const {
  std::map<std::string, Shape> expected;
  if (!params_.empty())
    for (const std::string& name : global) expected.emplace(name, Shape{});
  for (size_t i = 0; i < params_.size(); ++i)
    for (const std::string& name : per_parameter) expected.emplace(entry(i, name), params_[i]->shape());
  for (const auto& [key, value] : state)
    TESSERA_CHECK(expected.count(key) != 0, ValueError, op, "unexpected entry '", key, "' (", params_.size(),
                  " parameters)");
  for (const auto& [key, shape] : expected) {
    const auto it = state.find(key);
    TESSERA_CHECK(it != state.end(), ValueError, op, "missing entry '", key, "'");
    TESSERA_CHECK(it->second.defined() || !it->second.device_mesh().is_member(), ValueError, op, "entry '", key,
                  "' is undefined");
    const bool fits = shape.size() == 0 ? it->second.numel() == 1 : it->second.shape() == shape;
    TESSERA_CHECK(fits, ValueError, op, "entry '", key, "' has shape ", it->second.shape().to_string(), "; expected ",
                  shape.to_string());
  }
}

void Optimizer::zero_grad() {
  for (DTensor* p : params_) p->set_grad(DTensor());
}

SGD::SGD(std::vector<DTensor*> params, double lr, double momentum, double weight_decay)
    : Optimizer(std::move(params), lr), momentum_(momentum), weight_decay_(weight_decay) {
  TESSERA_CHECK(lr >= 0 && momentum >= 0 && weight_decay >= 0, ValueError, "SGD", "lr ", lr, ", momentum ", momentum,
                " and weight_decay ", weight_decay, " must be non-negative");
  momentum_buffers_.resize(params_.size());
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  detail::parameters_written();
  reduce_gradients_(params_);
  for (size_t i = 0; i < params_.size(); ++i) {
    DTensor& p = *params_[i];
    DTensor g = p.grad();
    if (!g.defined()) continue;
    if (weight_decay_ != 0) g = add(g, mul(p.detach(), Scalar(weight_decay_)));
    if (momentum_ != 0) {
      DTensor& buf = momentum_buffers_[i];
      buf = buf.defined() ? add(mul(buf, Scalar(momentum_)), g) : g;
      g = buf;
    }
    assign(p, sub(p.detach(), mul(g, Scalar(lr_))));
  }
}

std::map<std::string, DTensor> SGD::state_dict() {
  std::map<std::string, DTensor> out = Optimizer::state_dict();
  if (momentum_ == 0) return out;
  for (size_t i = 0; i < params_.size(); ++i) {
    DTensor& buf = momentum_buffers_[i];
    // Zeros update as no buffer does (momentum * 0 + g == g exactly); the parameter's layout.
    if (!buf.defined()) buf = zeros_like_layout(*params_[i]);
    else if (!(buf.layout() == params_[i]->layout())) buf = buf.redistribute(params_[i]->device_mesh(), params_[i]->layout());
    out.emplace(entry(i, "momentum_buffer"), buf);
  }
  return out;
}

void SGD::load_state_dict(const std::map<std::string, DTensor>& state) {
  if (momentum_ == 0) check_state("SGD::load_state_dict", state, {}, {"lr"});
  else check_state("SGD::load_state_dict", state, {"momentum_buffer"}, {"lr"});
  autograd::NoGradGuard no_grad;
  if (member_of_first_mesh()) lr_ = state.at("lr").item().to_double();
  if (momentum_ == 0) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    DTensor& buf = momentum_buffers_[i];
    if (!buf.defined() || !(buf.layout() == params_[i]->layout())) buf = zeros_like_layout(*params_[i]);
    assign_resharded(buf, state.at(entry(i, "momentum_buffer")));
  }
}

AdamW::AdamW(std::vector<DTensor*> params, double lr, double beta1, double beta2, double eps, double weight_decay)
    : Optimizer(std::move(params), lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  TESSERA_CHECK(lr >= 0 && beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps > 0 && weight_decay >= 0,
                ValueError, "AdamW", "invalid hyperparameters lr ", lr, ", betas (", beta1, ", ", beta2, "), eps ", eps,
                ", weight_decay ", weight_decay);
  m_.resize(params_.size());
  v_.resize(params_.size());
}

void AdamW::step() {
  autograd::NoGradGuard no_grad;
  detail::parameters_written();
  reduce_gradients_(params_);  // data-parallel sums in buckets (a no-op after clip_grad_norm_)
  ++steps_;
  AdamWStep hyper{lr_, beta1_, beta2_, eps_, weight_decay_, 1 - std::pow(beta1_, static_cast<double>(steps_)),
                  1 - std::pow(beta2_, static_cast<double>(steps_))};
  for (size_t i = 0; i < params_.size(); ++i) {
    DTensor& p = *params_[i];
    DTensor g = p.grad();
    if (!g.defined()) continue;
    // The update is elementwise: the gradient in the parameter's layout (Partial -> reduced).
    if (!(g.layout() == p.layout())) g = g.redistribute(p.device_mesh(), p.layout());
    if (!m_[i].defined()) {
      m_[i] = zeros_like_layout(p);
      v_[i] = zeros_like_layout(p);
    }
    Tensor param = p.to_local(), m = m_[i].to_local(), v = v_[i].to_local();
    const Tensor grad = g.to_local();
    if (adamw_fusable(param, m, v, grad)) {
      adamw_update_(param, m, v, grad, hyper);  // one pass over the four arrays
      continue;
    }
    m_[i] = add(mul(m_[i], Scalar(beta1_)), mul(g, Scalar(1 - beta1_)));
    v_[i] = add(mul(v_[i], Scalar(beta2_)), mul(mul(g, g), Scalar(1 - beta2_)));
    const DTensor denom = add(sqrt(div(v_[i], Scalar(hyper.correction2))), Scalar(eps_));
    const DTensor update = div(div(m_[i], Scalar(hyper.correction1)), denom);
    const DTensor decayed = mul(p.detach(), Scalar(1 - lr_ * weight_decay_));
    assign(p, sub(decayed, mul(update, Scalar(lr_))));
  }
}

std::map<std::string, DTensor> AdamW::state_dict() {
  std::map<std::string, DTensor> out = Optimizer::state_dict();
  if (params_.empty()) return out;
  out.emplace("step", replicated_scalar(*params_.front(), Scalar(steps_), DType::i64));
  for (size_t i = 0; i < params_.size(); ++i) {
    // Zero moments update exactly as absent ones (step creates them so); the parameter's layout,
    // which the fused update writes in place.
    if (!m_[i].defined()) {
      m_[i] = zeros_like_layout(*params_[i]);
      v_[i] = zeros_like_layout(*params_[i]);
    }
    out.emplace(entry(i, "exp_avg"), m_[i]);
    out.emplace(entry(i, "exp_avg_sq"), v_[i]);
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, DTensor>& state) {
  check_state("AdamW::load_state_dict", state, {"exp_avg", "exp_avg_sq"}, {"lr", "step"});
  autograd::NoGradGuard no_grad;
  if (member_of_first_mesh()) {  // the scalars' mesh (item is collective over it)
    lr_ = state.at("lr").item().to_double();
    steps_ = state.at("step").item().to_int();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const DTensor& p = *params_[i];
    if (!m_[i].defined() || !(m_[i].layout() == p.layout())) m_[i] = zeros_like_layout(p);
    if (!v_[i].defined() || !(v_[i].layout() == p.layout())) v_[i] = zeros_like_layout(p);
    assign_resharded(m_[i], state.at(entry(i, "exp_avg")));
    assign_resharded(v_[i], state.at(entry(i, "exp_avg_sq")));
  }
}

void reduce_gradients_(const std::vector<DTensor*>& params, int64_t bucket_bytes) {
  autograd::NoGradGuard no_grad;
  std::vector<DTensor*> partial;
  std::vector<DTensor> grads;
  std::vector<Layout> targets;  // the parameters' layouts: FSDP's gradients are reduce-scattered
  for (DTensor* p : params) {
    const DTensor g = p->grad();
    if (!g.defined() || !g.layout().has_partial()) continue;
    partial.push_back(p);
    grads.push_back(g);
    targets.push_back(gradient_layout(p->layout()).with_dtype(g.dtype()));
  }
  if (partial.empty()) return;
  const std::vector<DTensor> reduced = reduce_partials(grads, targets, bucket_bytes);
  for (size_t i = 0; i < partial.size(); ++i) partial[i]->set_grad(reduced[i]);
}

double clip_grad_norm_(const std::vector<DTensor*>& params, double max_norm) {
  autograd::NoGradGuard no_grad;
  reduce_gradients_(params);  // no gradient is Partial after this
  // Per mesh, one all_reduce over the mesh dims that shard some gradient: each rank sums the
  // squares of the blocks it owns, one replica of each block counting (coordinate 0 of those
  // dims where the block is replicated). Over the other dims every rank holds the same total.
  struct Group {
    DeviceMesh mesh;
    std::vector<DTensor> grads;
    std::vector<bool> sharded;  // per mesh dim
  };
  std::vector<Group> groups;
  for (DTensor* p : params) {
    const DTensor g = p->grad();
    if (!g.defined() || !g.device_mesh().is_member()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& group) { return group.mesh.spec() == g.device_mesh().spec(); });
    if (it == groups.end())
      it = groups.insert(groups.end(), Group{g.device_mesh(), {}, std::vector<bool>(g.placements().size(), false)});
    for (size_t d = 0; d < g.placements().size(); ++d)
      it->sharded[d] = it->sharded[d] || !is_replicate(g.placements()[d]);
    it->grads.push_back(g);
  }
  double total_sq = 0;
  for (const Group& group : groups) {
    const std::vector<int64_t> coordinate = group.mesh.coordinate();
    double squares = 0;
    for (const DTensor& g : group.grads) {
      bool owner = true;
      for (size_t d = 0; d < g.placements().size(); ++d)
        owner = owner && !(group.sharded[d] && is_replicate(g.placements()[d]) && coordinate[d] != 0);
      if (owner) squares += sum_of_squares(g.to_local());
    }
    std::vector<int64_t> dims;
    for (size_t d = 0; d < group.sharded.size(); ++d)
      if (group.sharded[d]) dims.push_back(static_cast<int64_t>(d));
    if (!dims.empty()) group.mesh.comm_ptr(dims)->all_reduce(&squares, 1, DType::f64, ReduceOp::sum);
    total_sq += squares;
  }
  const double total = std::sqrt(total_sq);
  if (total > max_norm && total > 0) {
    const double scale = max_norm / (total + 1e-6);
    for (DTensor* p : params)
      if (p->grad().defined()) p->set_grad(mul(p->grad(), Scalar(scale)));
  }
  return total;
}

double warmup_cosine_lr(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  if (warmup > 0 && step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(total - warmup, 1));
  return min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace tessera::nn
