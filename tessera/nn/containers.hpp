#pragma once
// PyTorch's nn.Sequential and activation modules on DTensor: a chain of one-in, one-out modules
// called in order, and the elementwise activations and dropout as modules, so a model reads as
// its PyTorch original: `nn::Sequential{fc1, std::make_shared<nn::GELU>(), fc2}`.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/nn/module.hpp>

namespace tessera TESSERA_API {
namespace nn {

/// Modules called in order, each on the previous one's output; submodules named "0", "1", ...
/// as PyTorch names them, so a plan reaches them by index ({"0", ColwiseParallel{}}). Empty: the
/// identity. Its mesh is its first module's with one (activations have none). Throws ValueError
/// for a null module.
class Sequential : public UnaryModule {
 public:
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules);
  explicit Sequential(const std::vector<std::shared_ptr<UnaryModule>>& modules);
  DTensor forward(const DTensor& x) const override;
  /// Appends `module` under the next index; returns it.
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> module) {
    add(module);
    return module;
  }
  int64_t size() const { return static_cast<int64_t>(steps_.size()); }
  /// Module i (PyTorch's seq[i]); negative counts from the end. Throws ValueError out of range.
  UnaryModule& operator[](int64_t i) const;

 private:
  void add(std::shared_ptr<UnaryModule> module);
  std::vector<std::shared_ptr<UnaryModule>> steps_;
};

/// An elementwise activation as a module: no parameters, no mesh of its own (any input's).
class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule(DeviceMesh()) {}
  DTensor forward(const DTensor& x) const override;
};
/// The tanh approximation, as Tessera's gelu.
class GELU : public UnaryModule {
 public:
  GELU() : UnaryModule(DeviceMesh()) {}
  DTensor forward(const DTensor& x) const override;
};
class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule(DeviceMesh()) {}
  DTensor forward(const DTensor& x) const override;
};
class Tanh : public UnaryModule {
 public:
  Tanh() : UnaryModule(DeviceMesh()) {}
  DTensor forward(const DTensor& x) const override;
};
class Sigmoid : public UnaryModule {
 public:
  Sigmoid() : UnaryModule(DeviceMesh()) {}
  DTensor forward(const DTensor& x) const override;
};
/// torch.nn.Dropout(p): dropout(x, p) in training mode (the unsharded draw, bit for bit), the
/// identity after eval(). Throws ValueError for p outside [0, 1).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  DTensor forward(const DTensor& x) const override;
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace nn
}  // namespace tessera
