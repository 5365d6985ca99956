#pragma once
// The reverse-mode autograd graph, shared by Tensor and DTensor (docs/architecture.md: the layers). The graph is
// type-erased so that this layer names neither type's ops: a node maps the gradient of its output
// (a Tensor or a DTensor, held in std::any) to the gradients of its inputs, and each op's
// derivative lives next to the op (ops/internal/derivatives.hpp), written once for both types.
//
// Recording costs one thread-local flag test and one pointer test per input when nothing
// requires a gradient, so the dispatch hot path is unchanged.
#include <any>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/core/module_position.hpp>

namespace tessera TESSERA_API {
namespace autograd {

/// Gradient arithmetic per tensor type, specialised beside each type (Tensor, DTensor).
template <class T>
struct GradOps;  // static T add(const T&, const T&);

/// A number that grows with every node created in the process (any thread).
uint64_t next_node_sequence();

/// One recorded op: gradients of its inputs from the gradient of its output.
class Node {
 public:
  explicit Node(const char* name)
      : name_(name), sequence_(next_node_sequence()), position_(::tessera::detail::backward_position()) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// One entry per input; an empty std::any means no gradient flows to that input.
  virtual std::vector<std::any> apply(const std::any& grad_output) = 0;
  /// total += grad, both of this node's output type (total may be empty).
  virtual void accumulate(std::any& total, const std::any& grad) const = 0;
  const char* name() const { return name_; }
  /// Creation order: a node's inputs were created before it, so a larger number runs first.
  uint64_t sequence() const { return sequence_; }
  /// Where the node was recorded, as its backward runs there (module_position.hpp); null unless a
  /// tool traced modules then.
  const std::shared_ptr<const ModulePosition>& position() const { return position_; }

  /// One edge per op input: the input's Meta, or null when that input needs no gradient.
  std::vector<std::shared_ptr<Meta>> inputs;
  /// Set on nodes whose backward communicates (a halo, a ring): when no gradient reaches such a
  /// node (its output fed only ops that give none, e.g. an empty piece), it runs with this zero
  /// gradient anyway, so the peers whose backward exchanges with it never wait for it.
  std::function<std::any()> zero_gradient;

 private:
  const char* name_;
  uint64_t sequence_;
  std::shared_ptr<const ModulePosition> position_;
};

/// Runs the backward pass from `root` (the Meta of the tensor backward() was called on) with the
/// gradient `grad` of that tensor: every node reachable from root runs once, in the reverse of
/// the order the nodes were created (so after all the nodes that feed it gradient), and every leaf that requires a gradient accumulates into its grad. The
/// graph is kept, so a second backward accumulates again. Recording is off during the pass.
void run_backward(const std::shared_ptr<Meta>& root, const std::any& grad);

/// A node whose backward is a function from the output gradient (type Out) to the input
/// gradients (type In; an undefined In means none). Out != In for the bridges between Tensor and
/// DTensor (to_local, from_local, full_tensor).
template <class Out, class In = Out>
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<In>(const Out&)>;
  FunctionNode(const char* name, Backward backward) : Node(name), backward_(std::move(backward)) {}

  std::vector<std::any> apply(const std::any& grad_output) override {
    std::vector<In> grads = backward_(std::any_cast<const Out&>(grad_output));
    std::vector<std::any> out(grads.size());
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) out[i] = std::move(grads[i]);
    return out;
  }
  void accumulate(std::any& total, const std::any& grad) const override {
    if (!total.has_value())
      total = grad;
    else
      total = GradOps<Out>::add(std::any_cast<const Out&>(total), std::any_cast<const Out&>(grad));
  }

 private:
  Backward backward_;
};

/// Makes `out` the output of a new node over `inputs` (null entries: inputs that are not tensors).
template <class Out, class In>
void record(const char* name, Out& out, const std::vector<const In*>& inputs,
            typename FunctionNode<Out, In>::Backward backward) {
  if (const auto& own = out.autograd_meta(); own && own->recorded_by_handler) {
    own->recorded_by_handler = false;  // the handler's graph stands; a later in-place op records as usual
    return;
  }
  auto node = std::make_shared<FunctionNode<Out, In>>(name, std::move(backward));
  node->inputs.reserve(inputs.size());
  for (const In* input : inputs)
    node->inputs.push_back(input && input->requires_grad() ? input->autograd_meta() : nullptr);
  auto meta = std::make_shared<Meta>();
  meta->requires_grad = true;
  meta->grad_fn = std::move(node);
  out.set_autograd_meta(std::move(meta));
}
template <class T>
void record(const char* name, T& out, std::initializer_list<const T*> inputs,
            typename FunctionNode<T, T>::Backward backward) {
  record<T, T>(name, out, std::vector<const T*>(inputs), std::move(backward));
}

}  // namespace autograd
}  // namespace tessera
