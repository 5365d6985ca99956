#pragma once
// nn::Module: named parameters (DTensor leaves on one DeviceMesh) and named submodules, as in
// torch.nn.Module. A parameter has a storage layout (how it is kept between steps, where its
// gradient lands) and a compute layout (what forward uses): they differ under fully_shard, where
// forward all-gathers the parameter (differentiably: its gradient is reduce-scattered).
// Parallel styles (nn/parallel.hpp) also set per-module input/output placements.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/module_position.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/nn/forward_observer.hpp>

namespace tessera TESSERA_API {
namespace nn {

namespace detail {
class FsdpUnit;
}

class Module {
 public:
  explicit Module(DeviceMesh mesh) : mesh_(std::move(mesh)) {}
  /// Detaches its submodules (a submodule kept elsewhere becomes a root).
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const DeviceMesh& mesh() const { return mesh_; }

  /// Every parameter of this module and its submodules, with dotted paths ("blocks.0.attn.q.weight").
  std::vector<std::pair<std::string, DTensor*>> named_parameters();
  std::vector<DTensor*> parameters();
  /// Every submodule with its path ("" is this module), depth first.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// The submodule at a dotted path. Throws ValueError naming the path if there is none.
  Module& submodule(const std::string& path);
  /// The module's class name without namespaces ("Linear", "TransformerLM"): PyTorch's type(m).__name__.
  virtual std::string type_name() const;
  /// The module's path as PyTorch's module tracker names it: a root's class name, a submodule's
  /// parent path and its name there ("TransformerLM.blocks.0.attn").
  std::string path() const;
  /// Clears every parameter's gradient.
  void zero_grad();
  /// PyTorch's train(mode) / eval(): sets the mode of this module and every submodule (Dropout
  /// drops only in training). Modules start in training mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  /// Total number of elements of all parameters.
  int64_t num_parameters();
  /// The parameters by path, detached (they share storage with the module's).
  std::map<std::string, DTensor> state_dict();
  /// Copies every parameter from `state` (same paths and global shapes), resharding each value to
  /// the parameter's layout: a state saved under one parallel plan loads into another. Throws
  /// ValueError naming the path for a missing entry or a shape mismatch; extra entries are an error.
  void load_state_dict(const std::map<std::string, DTensor>& state);

  // --- layouts (set by parallelize_module / fully_shard) ---------------------------------------
  /// Stores parameter `name` of this module in `layout` (moves the data; it stays a leaf).
  void set_parameter_layout(const std::string& name, const Layout& layout);
  /// The layout forward uses for parameter `name` (default: its storage layout).
  void set_compute_layout(const std::string& name, const Layout& layout);
  /// Names of this module's own parameters.
  std::vector<std::string> parameter_names() const;
  DTensor& parameter(const std::string& name);
  const DTensor& parameter(const std::string& name) const;
  /// Per mesh dim, the placement forward's input / output is moved to (nullopt: left as it comes).
  void set_input_placement(int64_t mesh_dim, Placement placement);
  void set_output_placement(int64_t mesh_dim, Placement placement);
  /// Functions forward applies to its input before and to its output after the placements above
  /// (distribute_module's input_fn and output_fn, PyTorch's forward pre- and post-hooks).
  using InputHook = std::function<DTensor(Module& module, const DTensor& input, const DeviceMesh& mesh)>;
  void set_input_hook(InputHook hook) { input_hook_ = std::move(hook); }
  void set_output_hook(InputHook hook) { output_hook_ = std::move(hook); }

 protected:
  /// Registers a parameter (made a leaf that requires a gradient) and returns it.
  DTensor& register_parameter(std::string name, DTensor value);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    adopt(name, module.get());
    children_.emplace_back(std::move(name), module);
    return module;
  }
  /// The parameter in its compute layout (a recorded redistribution when that differs).
  DTensor use(const std::string& name) const;
  /// Moves `x` to the input / output placements set by a parallel style (recorded).
  DTensor prepare_input(const DTensor& x) const;
  DTensor finish_output(const DTensor& y) const;

 private:
  struct Slot {
    std::string name;
    DTensor value;
    std::optional<Layout> compute;
    std::shared_ptr<detail::FsdpUnit> unit;  // set by fully_shard: gathered with the unit's other parameters
    size_t unit_index = 0;
  };
  friend void fully_shard(Module& module, const std::string& axis);
  friend void reshard(Module& module);
  Slot& slot(const std::string& name);
  const Slot& slot(const std::string& name) const;
  /// Makes this module `child`'s parent under `name` (its first parent, if registered twice).
  void adopt(const std::string& name, Module* child);

  DeviceMesh mesh_;
  Module* parent_ = nullptr;  // cleared by the parent's destructor
  std::string name_in_parent_;
  std::vector<std::unique_ptr<Slot>> params_;  // unique_ptr: pointers handed out stay valid
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::optional<Placement>> input_placements_, output_placements_;
  InputHook input_hook_, output_hook_;
  bool training_ = true;
};

/// A module of one DTensor in and one out, as every built-in layer is: callable as PyTorch's
/// modules are (model(x) is model.forward(x)), and a step of a Sequential.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual DTensor forward(const DTensor& x) const = 0;
  DTensor operator()(const DTensor& x) const { return forward(x); }
};

/// Marks the forward of `module` on the calling thread for debugging tools, as PyTorch's module
/// hooks do: while it is open, CommDebugMode counts communication and ops against the module and
/// its parents, in forward and in the backward of the ops recorded under it. Every built-in layer
/// opens one at the top of forward; a user's module does the same
/// (`const nn::ForwardScope scope(*this);`), or its work counts against its parent. One
/// thread-local test when no tool traces.
class ForwardScope {
 public:
  explicit ForwardScope(const Module& module);
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

 private:
  std::optional<tessera::detail::ModulePositionScope> scope_;
};

}  // namespace nn
}  // namespace tessera
