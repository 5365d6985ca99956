// nn::Module bookkeeping: paths, layouts, the input/output moves of parallel styles.
#include <tessera/nn/module.hpp>

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <typeinfo>

#include <tessera/core/internal/thread_observers.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/nn/detail/fsdp_unit.hpp>

namespace tessera::nn {

namespace {

// `x` with placement `p` on mesh dim m (negative Shard dims count from x's last dim).
DTensor with_placement(const DTensor& x, int64_t m, Placement p) {
  if (auto* shard = std::get_if<Shard>(&p); shard && shard->dim < 0) shard->dim += x.ndim();
  Placements placements = x.placements();
  if (placements[static_cast<size_t>(m)] == p) return x;
  placements[static_cast<size_t>(m)] = p;
  return x.redistribute(placements);
}

DTensor moved(const DTensor& x, const std::vector<std::optional<Placement>>& targets) {
  DTensor out = x;
  for (size_t m = 0; m < targets.size(); ++m)
    if (targets[m]) out = with_placement(out, static_cast<int64_t>(m), *targets[m]);
  return out;
}

}  // namespace

Module::~Module() {
  for (auto& [name, child] : children_)
    if (child->parent_ == this) child->parent_ = nullptr;
}

void Module::adopt(const std::string& name, Module* child) {
  TESSERA_CHECK(child != nullptr, ValueError, "Module::register_module", "submodule '", name, "' is null");
  if (child->parent_) return;
  child->parent_ = this;
  child->name_in_parent_ = name;
}

std::string Module::type_name() const {
  // The demangled dynamic type, less its namespaces and template arguments.
  const char* mangled = typeid(*this).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  if (const size_t angle = name.find('<'); angle != std::string::npos) name.resize(angle);
  if (const size_t colons = name.rfind("::"); colons != std::string::npos) name.erase(0, colons + 2);
  return name;
}

std::string Module::path() const { return parent_ ? parent_->path() + "." + name_in_parent_ : type_name(); }

namespace {
// Per thread: each rank of the threads backend runs its own modules.
thread_local std::vector<ForwardObserver*> forward_observers;
}  // namespace

void add_forward_observer(ForwardObserver* observer) { forward_observers.push_back(observer); }

void remove_forward_observer(ForwardObserver* observer) {
  tessera::detail::remove_observer(forward_observers, observer, "remove_forward_observer");
}

ForwardScope::ForwardScope(const Module& module) {
  if (!tessera::detail::module_tracing()) return;
  const auto& outer = tessera::detail::module_position();
  ModulePosition here;
  if (outer) here = *outer;  // a forward inside backward (a recomputation) stays in backward
  std::string path = module.path();
  here.modules.push_back(path);
  scope_.emplace(std::make_shared<const ModulePosition>(std::move(here)));
  for (ForwardObserver* observer : forward_observers) observer->on_forward(path, module);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [name, child] : children_)
    for (auto& [path, module] : child->named_modules()) out.emplace_back(path.empty() ? name : name + "." + path, module);
  return out;
}

std::vector<std::pair<std::string, DTensor*>> Module::named_parameters() {
  std::vector<std::pair<std::string, DTensor*>> out;
  for (auto& [path, module] : named_modules())
    for (auto& slot : module->params_) out.emplace_back(path.empty() ? slot->name : path + "." + slot->name, &slot->value);
  return out;
}

std::vector<DTensor*> Module::parameters() {
  std::vector<DTensor*> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

Module& Module::submodule(const std::string& path) {
  for (auto& [name, module] : named_modules())
    if (name == path) return *module;
  TESSERA_CHECK(false, ValueError, "Module::submodule", "no submodule at path '", path, "'");
  return *this;
}

void Module::zero_grad() {
  for (DTensor* p : parameters()) p->set_grad(DTensor());
}

void Module::train(bool on) {
  for (const auto& [path, module] : named_modules()) module->training_ = on;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (DTensor* p : parameters()) n += p->numel();
  return n;
}

std::map<std::string, DTensor> Module::state_dict() {
  std::map<std::string, DTensor> out;
  for (auto& [name, p] : named_parameters()) out.emplace(name, p->detach());
  return out;
}

void Module::load_state_dict(const std::map<std::string, DTensor>& state) {
  const auto params = named_parameters();
  for (const auto& [name, value] : state) {
    const bool known = std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
    TESSERA_CHECK(known, ValueError, "Module::load_state_dict", "unexpected entry '", name, "'");
  }
  // Everything is checked before anything is written: a bad state leaves the module as it was.
  for (auto& [name, p] : params) {
    const auto it = state.find(name);
    TESSERA_CHECK(it != state.end(), ValueError, "Module::load_state_dict", "missing entry '", name, "'");
    TESSERA_CHECK(it->second.shape() == p->shape(), ValueError, "Module::load_state_dict", "entry '", name,
                  "' has shape ", it->second.shape().to_string(), "; the parameter has ", p->shape().to_string());
  }
  autograd::NoGradGuard no_grad;
  detail::parameters_written();
  for (auto& [name, p] : params) {
    const DTensor& given = state.at(name);
    const DTensor source = given.detach().redistribute(mesh_, p->layout().with_dtype(given.dtype()));
    Tensor local = p->to_local();
    const Tensor from = source.to_local();
    if (from.raw_data() != local.raw_data()) local.copy_(from);  // not what was loaded in place
  }
}

DTensor& Module::register_parameter(std::string name, DTensor value) {
  value = value.detach();
  value.requires_grad_();
  params_.push_back(std::make_unique<Slot>(Slot{std::move(name), std::move(value), std::nullopt, nullptr, 0}));
  return params_.back()->value;
}

Module::Slot& Module::slot(const std::string& name) {
  for (auto& s : params_)
    if (s->name == name) return *s;
  TESSERA_CHECK(false, ValueError, "Module::parameter", "no parameter '", name, "' in this module");
  return *params_.front();
}
const Module::Slot& Module::slot(const std::string& name) const { return const_cast<Module*>(this)->slot(name); }

std::vector<std::string> Module::parameter_names() const {
  std::vector<std::string> out;
  for (const auto& s : params_) out.push_back(s->name);
  return out;
}

DTensor& Module::parameter(const std::string& name) { return slot(name).value; }
const DTensor& Module::parameter(const std::string& name) const { return slot(name).value; }

void Module::set_parameter_layout(const std::string& name, const Layout& layout) {
  Slot& s = slot(name);
  autograd::NoGradGuard no_grad;
  DTensor moved_value = s.value.detach().redistribute(mesh_, layout);
  moved_value.requires_grad_();
  s.value = moved_value;
  detail::parameters_written();
}

void Module::set_compute_layout(const std::string& name, const Layout& layout) { slot(name).compute = layout; }

void Module::set_input_placement(int64_t mesh_dim, Placement placement) {
  input_placements_.resize(static_cast<size_t>(mesh_.ndim()));
  input_placements_[static_cast<size_t>(mesh_dim)] = placement;
}

void Module::set_output_placement(int64_t mesh_dim, Placement placement) {
  output_placements_.resize(static_cast<size_t>(mesh_.ndim()));
  output_placements_[static_cast<size_t>(mesh_dim)] = placement;
}

DTensor Module::use(const std::string& name) const {
  const Slot& s = slot(name);
  if (s.unit) return s.unit->take(s.unit_index);
  if (!s.compute || *s.compute == s.value.layout()) return s.value;
  return s.value.redistribute(mesh_, *s.compute);
}

// The hooks take the module as PyTorch's do; forward is const only because it changes no
// parameter, so the module itself is not a constant object.
DTensor Module::prepare_input(const DTensor& x) const {
  const DTensor in = input_hook_ ? input_hook_(const_cast<Module&>(*this), x, mesh_) : x;
  return moved(in, input_placements_);
}
DTensor Module::finish_output(const DTensor& y) const {
  const DTensor out = moved(y, output_placements_);
  return output_hook_ ? output_hook_(const_cast<Module&>(*this), out, mesh_) : out;
}

}  // namespace tessera::nn
