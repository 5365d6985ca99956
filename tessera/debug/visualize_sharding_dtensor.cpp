// The DTensor overload lives apart so the Layout form builds and links without the dtensor layer.
#include <tessera/debug/visualize_sharding.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera {

std::string visualize_sharding(const DTensor& t) { return visualize_sharding(t.layout()); }

}  // namespace tessera
