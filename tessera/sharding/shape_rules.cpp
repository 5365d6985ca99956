// Sharding rules of the shape ops that copy (TESSERA_SHAPE_OPS in ops/op_table.hpp). Pure.
#include <tessera/sharding/op_rules.hpp>

namespace tessera {

void register_shape_rules(RuleRegistry& registry) { (void)registry; }

}  // namespace tessera
