#include <tessera/domain/handlers.hpp>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/dispatch.hpp>

namespace tessera {

namespace {

void check_handler(const DispatchHandler& handler, const char* call, const std::string& op) {
  TESSERA_CHECK(handler != nullptr, ValueError, call, "empty handler for op '", op,
                "'; remove_dispatch_handler removes one");
}

bool is_builtin(int id) { return id < kBuiltinOpCount; }

// A built-in op's handler by id or name, at `level`; `call` names the user's call in errors.
void register_builtin(OpId op, DispatchHandler handler, HandlerLevel level, const char* call) {
  TESSERA_CHECK(op < OpId::count, ValueError, call, "op id ", static_cast<int>(op), " is not a built-in op");
  check_handler(handler, call, op_name(op));
  set_dispatch_handler(RuleRegistry::id(op), std::move(handler), level);
}

void register_builtin(const std::string& op, DispatchHandler handler, HandlerLevel level, const char* call) {
  TESSERA_CHECK(!op.empty(), ValueError, call, "empty op name");
  const int id = rule_registry().id(op);
  TESSERA_CHECK(is_builtin(id), ValueError, call, "'", op,
                "' is not a built-in op; a custom op's handler is registered with register_named_function_handler");
  check_handler(handler, call, op);
  set_dispatch_handler(id, std::move(handler), level);
}

}  // namespace

void register_dispatch_handler(OpId op, DispatchHandler handler) {
  register_builtin(op, std::move(handler), HandlerLevel::below_autograd, "register_dispatch_handler");
}

void register_dispatch_handler(const std::string& op, DispatchHandler handler) {
  register_builtin(op, std::move(handler), HandlerLevel::below_autograd, "register_dispatch_handler");
}

void register_function_handler(OpId op, DispatchHandler handler) {
  register_builtin(op, std::move(handler), HandlerLevel::above_autograd, "register_function_handler");
}

void register_function_handler(const std::string& op, DispatchHandler handler) {
  register_builtin(op, std::move(handler), HandlerLevel::above_autograd, "register_function_handler");
}

void register_named_function_handler(const std::string& op, DispatchHandler handler) {
  TESSERA_CHECK(!op.empty(), ValueError, "register_named_function_handler", "empty op name");
  const int id = rule_registry().id(op);
  TESSERA_CHECK(!is_builtin(id), ValueError, "register_named_function_handler", "'", op,
                "' is a built-in op; register its handler with register_dispatch_handler");
  check_handler(handler, "register_named_function_handler", op);
  set_dispatch_handler(id, std::move(handler));
}

void remove_dispatch_handler(OpId op) { set_dispatch_handler(RuleRegistry::id(op), {}); }

void remove_dispatch_handler(const std::string& op) { set_dispatch_handler(rule_registry().id(op), {}); }

}  // namespace tessera
