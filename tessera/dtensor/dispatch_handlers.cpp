// The registry of user handlers and the dispatcher's call into one (detail/dispatch.hpp).
#include <tessera/dtensor/dispatch_handlers.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>

#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>
#include <tessera/dtensor/detail/dispatch_handler_call.hpp>
#include <tessera/grad/engine.hpp>

namespace tessera {

namespace {

struct Handler {
  DispatchHandler run;
  HandlerLevel level;
};

struct Handlers {
  std::shared_mutex mutex;
  std::unordered_map<int, std::shared_ptr<const Handler>> by_op;
  // Read without the lock on every dispatch: most programs register none.
  std::atomic<size_t> count{0};
};

Handlers& handlers() {
  static Handlers registry;
  return registry;
}

// Ops whose handler runs on this thread (rank): their calls inside it take the built-in path.
thread_local std::unordered_set<int> running;

// A Scalar operand reaches the dispatcher as its kind only: a handler could not compute with it.
bool carries_scalar(const OpArgs& args) {
  const auto* e = std::get_if<ElementwiseArgs>(&args);
  return e && (e->slot != ScalarSlot::none || e->kinds[0] >= 0 || e->kinds[1] >= 0);
}

// The op records its derivative around what dispatch returns (detail::recorded, or a record_*
// call after the dispatch) when recording is on and an input requires a gradient. A handler above
// autograd recorded the result's graph itself: the result gets a handle of its own (an identity
// step over the handler's graph, so that no tensor the handler returned as is, such as an input,
// is marked), marked so that the op's recording leaves it alone.
void keep_handlers_graph(DTensor& out, std::span<const DTensor* const> inputs) {
  if (!autograd::is_grad_enabled() ||
      std::none_of(inputs.begin(), inputs.end(), [](const DTensor* t) { return t->requires_grad(); }))
    return;  // the op records nothing: whatever graph the handler made stands as it is
  DTensor own = out;
  if (out.requires_grad()) {
    autograd::record<DTensor>("function_handler", own, {&out},
                              [](const DTensor& g) { return std::vector<DTensor>{g}; });
  } else {
    own.set_autograd_meta(std::make_shared<autograd::Meta>());  // no gradient flows: the handler's choice
  }
  own.autograd_meta()->recorded_by_handler = true;
  out = std::move(own);
}

}  // namespace

void set_dispatch_handler(int op_id, DispatchHandler handler, HandlerLevel level) {
  Handlers& h = handlers();
  std::unique_lock lock(h.mutex);
  if (handler)
    h.by_op[op_id] = std::make_shared<const Handler>(Handler{std::move(handler), level});
  else
    h.by_op.erase(op_id);
  h.count.store(h.by_op.size(), std::memory_order_release);
}

bool has_dispatch_handler(int op_id) {
  Handlers& h = handlers();
  std::shared_lock lock(h.mutex);
  return h.by_op.contains(op_id);
}

namespace detail {

std::optional<DTensor> run_dispatch_handler(int op, std::span<const DTensor* const> inputs, const OpArgs& args) {
  Handlers& h = handlers();
  if (h.count.load(std::memory_order_acquire) == 0 || running.contains(op) || carries_scalar(args)) return std::nullopt;
  std::shared_ptr<const Handler> handler;
  {
    std::shared_lock lock(h.mutex);
    const auto it = h.by_op.find(op);
    if (it == h.by_op.end()) return std::nullopt;
    handler = it->second;
  }
  std::vector<DTensor> given;
  given.reserve(inputs.size());
  for (const DTensor* t : inputs) given.push_back(*t);
  struct Running {
    int op;
    explicit Running(int o) : op(o) { running.insert(op); }
    ~Running() { running.erase(op); }
  } scope(op);
  DTensor out;
  if (handler->level == HandlerLevel::below_autograd) {
    // As a dispatch handler is in PyTorch: the caller records the op's derivative.
    const autograd::NoGradGuard no_grad;
    out = handler->run(given, args);
  } else {
    out = handler->run(given, args);
  }
  // The op's name only for a message: TESSERA_CHECK builds it on failure alone.
  const auto name = [op] { return rule_registry().name(op); };
  const DeviceMesh& mesh = inputs.front()->device_mesh();
  TESSERA_CHECK(out.device_mesh().size() > 0, ShardingError, name(), "the dispatch handler of '", name(),
                "' returned an undefined DTensor for inputs ", inputs.front()->layout().to_string(),
                inputs.size() > 1 ? " and more" : "");
  TESSERA_CHECK(out.layout().mesh() == mesh.spec(), ShardingError, name(), "the dispatch handler of '", name(),
                "' returned a DTensor on ", out.device_mesh().to_string(), "; its inputs live on ", mesh.to_string());
  if (handler->level == HandlerLevel::above_autograd) keep_handlers_graph(out, inputs);
  return out;
}

}  // namespace detail
}  // namespace tessera
