#include <tessera/ops/op_table.hpp>

namespace tessera {

const char* op_name(OpId op) {
  static constexpr const char* kNames[] = {
#define TESSERA_OP_NAME(name, ...) #name,
      TESSERA_UNARY_OPS(TESSERA_OP_NAME) TESSERA_BINARY_OPS(TESSERA_OP_NAME)
          TESSERA_COMPARISON_OPS(TESSERA_OP_NAME) TESSERA_STRUCTURED_OPS(TESSERA_OP_NAME)
#undef TESSERA_OP_NAME
  };
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kBuiltinOpCount);
  const auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(kBuiltinOpCount) ? kNames[i] : "?";
}

}  // namespace tessera
