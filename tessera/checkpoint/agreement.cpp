#include <tessera/checkpoint/detail/agreement.hpp>

#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::checkpoint::detail {

std::string first_failure(const std::string& failure) {
  const std::vector<std::string> all = tessera::detail::all_gather_text(world(), failure);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) return tessera::detail::concat("rank ", r, " failed: ", all[r]);
  return "";
}

}  // namespace tessera::checkpoint::detail
