// The backward pass: a topological walk of the recorded graph (Kahn's algorithm on the nodes
// reachable from the root), so each node runs once, with the sum of its output's gradients.
// Among the ready nodes the latest created runs first, as PyTorch's engine orders by sequence
// number. Every consumer of a node was created after it, so this runs the reachable nodes in
// exactly the reverse of their creation order, whatever the graph's shape: the ranks of an SPMD
// program, which create their communicating nodes (halos, rings, redistributions) in one order,
// run their backward collectives in one order too, even where their graphs differ (an empty
// piece that takes a detour through extra local ops).
#include <tessera/grad/engine.hpp>

#include <atomic>
#include <optional>
#include <queue>
#include <unordered_map>

namespace tessera::autograd {

uint64_t next_node_sequence() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

namespace {
struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence() < b->sequence(); }
};
}  // namespace

void run_backward(const std::shared_ptr<Meta>& root, const std::any& grad) {
  NoGradGuard no_grad;
  // While a tool traces modules, the pass's own work (summing a node's gradients, accumulating
  // into leaves) runs in backward outside every module; each node runs where it was recorded.
  std::optional<tessera::detail::ModulePositionScope> pass;
  if (tessera::detail::module_tracing()) pass.emplace(tessera::detail::backward_outside_modules());
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
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  ready.push(root->grad_fn.get());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::any incoming = std::move(pending[node]);
    pending.erase(node);
    std::vector<std::any> grads;
    {
      // The node's backward runs where it was recorded (a module's backward collectives count
      // against that module); nodes recorded untraced run outside every module.
      const tessera::detail::ModulePositionScope at(node->position());
      if (incoming.has_value())
        grads = node->apply(incoming);
      else if (node->zero_gradient)
        grads = node->apply(node->zero_gradient());
    }
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const auto& input = node->inputs[i];
      if (!input) continue;
      const bool has_grad = i < grads.size() && grads[i].has_value();
      if (input->grad_fn) {
        Node* next = input->grad_fn.get();
        if (has_grad) next->accumulate(pending[next], grads[i]);
        if (--consumers[next] == 0) ready.push(next);
      } else if (has_grad && input->requires_grad && input->accumulate) {
        input->accumulate(*input, grads[i]);
      }
    }
  }
}

}  // namespace tessera::autograd
