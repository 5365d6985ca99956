// The backward pass: a topological walk of the recorded graph (Kahn's algorithm on the nodes
// reachable from the root), so each node runs once, with the sum of its output's gradients.
#include <tessera/grad/engine.hpp>

#include <deque>
#include <unordered_map>

namespace tessera::autograd {

void run_backward(const std::shared_ptr<Meta>& root, const std::any& grad) {
  NoGradGuard no_grad;
  if (!root->grad_fn) {
    if (root->requires_grad && root->accumulate) root->accumulate(*root, grad);
    return;
  }
  // How many edges feed each node: a node runs once all of its consumers have run.
  std::unordered_map<Node*, int> consumers{{root->grad_fn.get(), 0}};
  std::vector<Node*> stack{root->grad_fn.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& input : node->inputs) {
      if (!input || !input->grad_fn) continue;
      auto [it, first] = consumers.try_emplace(input->grad_fn.get(), 0);
      ++it->second;
      if (first) stack.push_back(input->grad_fn.get());
    }
  }
  std::unordered_map<Node*, std::any> pending{{root->grad_fn.get(), grad}};
  std::deque<Node*> ready{root->grad_fn.get()};
  while (!ready.empty()) {
    Node* node = ready.front();
    ready.pop_front();
    std::any incoming = std::move(pending[node]);
    pending.erase(node);
    std::vector<std::any> grads;
    if (incoming.has_value()) grads = node->apply(incoming);
    else if (node->zero_gradient) grads = node->apply(node->zero_gradient());
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const auto& input = node->inputs[i];
      if (!input) continue;
      const bool has_grad = i < grads.size() && grads[i].has_value();
      if (input->grad_fn) {
        Node* next = input->grad_fn.get();
        if (has_grad) next->accumulate(pending[next], grads[i]);
        if (--consumers[next] == 0) ready.push_back(next);
      } else if (has_grad && input->requires_grad && input->accumulate) {
        input->accumulate(*input, grads[i]);
      }
    }
  }
}

}  // namespace tessera::autograd
