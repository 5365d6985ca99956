#include <tessera/core/reduce_op.hpp>

#include <tessera/core/error.hpp>

namespace tessera {

std::string_view name(ReduceOp op) {
  switch (op) {
#define TESSERA_REDUCE_OP_NAME(name) \
  case ReduceOp::name:               \
    return #name;
    TESSERA_FORALL_REDUCE_OPS(TESSERA_REDUCE_OP_NAME)
#undef TESSERA_REDUCE_OP_NAME
  }
  return "?";
}

std::string to_string(ReduceOp op) { return std::string(name(op)); }

ReduceOp reduce_op_from_string(std::string_view text) {
#define TESSERA_REDUCE_OP_PARSE(name) \
  if (text == #name) return ReduceOp::name;
  TESSERA_FORALL_REDUCE_OPS(TESSERA_REDUCE_OP_PARSE)
#undef TESSERA_REDUCE_OP_PARSE
  throw ValueError(detail::concat("[reduce_op_from_string] unknown reduce op '", text,
                                  "'; expected one of sum avg product max min"));
}

}  // namespace tessera
