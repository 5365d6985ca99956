#pragma once
// What a tensor carries for reverse-mode autograd, and whether recording is on: the state the
// core layer needs. The graph, the recording helpers and the backward pass are the grad layer
// (grad/engine.hpp), above core; the derivatives of the ops are the ops layer's
// (ops/internal/derivatives.hpp). As in PyTorch, where GradMode and the AutogradMeta interface
// live in c10 and the engine in torch/csrc/autograd.
#include <any>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace autograd {

class Node;

/// Autograd state of one tensor handle (shared by its copies).
struct Meta {
  bool requires_grad = false;
  /// The node that produced this tensor; null for a leaf.
  std::shared_ptr<Node> grad_fn;
  /// Leaves: the accumulated gradient (Tensor or DTensor), empty until backward reaches it.
  std::any grad;
  /// Leaves: adds `incoming` into `grad`, converting it to the leaf's dtype and layout.
  std::function<void(Meta&, const std::any& incoming)> accumulate;
  /// Set on the result of an op whose sharded implementation ran above autograd (a function
  /// handler, tessera/dtensor/dispatch_handlers.hpp): the handler recorded the result's graph, so
  /// the op's own derivative is not recorded over it. The op's recording clears it.
  bool recorded_by_handler = false;
};

/// Whether ops record the graph on this thread (each rank of the threads backend has its own).
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

/// RAII: no recording inside the scope (optimizer updates, evaluation). Restores the previous mode.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// True when recording is on and any input requires a gradient.
template <class T>
bool needs_grad(std::initializer_list<const T*> inputs) {
  if (!is_grad_enabled()) return false;
  for (const T* input : inputs)
    if (input && input->requires_grad()) return true;
  return false;
}
template <class T>
bool needs_grad(const std::vector<T>& inputs) {
  if (!is_grad_enabled()) return false;
  for (const T& input : inputs)
    if (input.requires_grad()) return true;
  return false;
}

}  // namespace autograd
}  // namespace tessera
