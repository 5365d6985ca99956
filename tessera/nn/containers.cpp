#include <tessera/nn/containers.hpp>

#include <string>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera::nn {

namespace {

// The first module's mesh that has ranks (an activation's has none).
DeviceMesh first_mesh(const std::vector<std::shared_ptr<UnaryModule>>& modules) {
  for (const auto& m : modules)
    if (m && m->mesh().spec().size() > 0) return m->mesh();
  return DeviceMesh();
}

}  // namespace

Sequential::Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules)
    : Sequential(std::vector<std::shared_ptr<UnaryModule>>(modules)) {}

Sequential::Sequential(const std::vector<std::shared_ptr<UnaryModule>>& modules) : UnaryModule(first_mesh(modules)) {
  for (const auto& m : modules) add(m);
}

void Sequential::add(std::shared_ptr<UnaryModule> module) {
  TESSERA_CHECK(module != nullptr, ValueError, "Sequential", "module ", steps_.size(), " is null");
  register_module(std::to_string(steps_.size()), module);
  steps_.push_back(std::move(module));
}

UnaryModule& Sequential::operator[](int64_t i) const {
  const int64_t at = i < 0 ? i + size() : i;
  TESSERA_CHECK(at >= 0 && at < size(), ValueError, "Sequential", "index ", i, " is out of range for ", size(),
                " modules");
  return *steps_[static_cast<size_t>(at)];
}

DTensor Sequential::forward(const DTensor& x) const {
  const ForwardScope scope(*this);
  DTensor y = prepare_input(x);
  for (const auto& m : steps_) y = m->forward(y);
  return finish_output(y);
}

#define TESSERA_ACTIVATION_FORWARD(Module, op)      \
  DTensor Module::forward(const DTensor& x) const { \
    const ForwardScope scope(*this);                \
    return finish_output(op(prepare_input(x)));     \
  }
TESSERA_ACTIVATION_FORWARD(ReLU, relu)
TESSERA_ACTIVATION_FORWARD(GELU, gelu)
TESSERA_ACTIVATION_FORWARD(SiLU, silu)
TESSERA_ACTIVATION_FORWARD(Tanh, tanh)
TESSERA_ACTIVATION_FORWARD(Sigmoid, sigmoid)
#undef TESSERA_ACTIVATION_FORWARD

Dropout::Dropout(double p) : UnaryModule(DeviceMesh()), p_(p) {
  TESSERA_CHECK(p >= 0 && p < 1, ValueError, "Dropout", "p = ", p, "; it must lie in [0, 1)");
}

DTensor Dropout::forward(const DTensor& x) const {
  const ForwardScope scope(*this);
  return finish_output(dropout(prepare_input(x), p_, training()));
}

}  // namespace tessera::nn
