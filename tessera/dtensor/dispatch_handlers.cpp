// The registry of user handlers and the dispatcher's call into one (detail/dispatch.hpp).
#include <tessera/dtensor/dispatch_handlers.hpp>

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

namespace tessera {

namespace {

struct Handlers {
  std::shared_mutex mutex;
  std::unordered_map<int, std::shared_ptr<const DispatchHandler>> by_op;
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

}  // namespace

void set_dispatch_handler(int op_id, DispatchHandler handler) {
  Handlers& h = handlers();
  std::unique_lock lock(h.mutex);
  if (handler)
    h.by_op[op_id] = std::make_shared<const DispatchHandler>(std::move(handler));
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
  std::shared_ptr<const DispatchHandler> handler;
  {
    std::shared_lock lock(h.mutex);
    const auto it = h.by_op.find(op);
    if (it == h.by_op.end()) return std::nullopt;
    handler = it->second;
  }
  std::vector<DTensor> given;
  given.reserve(inputs.size());
  for (const DTensor* t : inputs) given.push_back(*t);
  // Below autograd, as a dispatch handler is in PyTorch: the caller records the op's derivative.
  struct Running {
    int op;
    explicit Running(int o) : op(o) { running.insert(op); }
    ~Running() { running.erase(op); }
  } scope(op);
  const autograd::NoGradGuard no_grad;
  DTensor out = (*handler)(given, args);
  // The op's name only for a message: TESSERA_CHECK builds it on failure alone.
  const auto name = [op] { return rule_registry().name(op); };
  const DeviceMesh& mesh = inputs.front()->device_mesh();
  TESSERA_CHECK(out.device_mesh().size() > 0, ShardingError, name(), "the dispatch handler of '", name(),
                "' returned an undefined DTensor for inputs ", inputs.front()->layout().to_string(),
                inputs.size() > 1 ? " and more" : "");
  TESSERA_CHECK(out.layout().mesh() == mesh.spec(), ShardingError, name(), "the dispatch handler of '", name(),
                "' returned a DTensor on ", out.device_mesh().to_string(), "; its inputs live on ", mesh.to_string());
  return out;
}

}  // namespace detail
}  // namespace tessera
