#include <tessera/ops/internal/spatial_args.hpp>

#include <tessera/core/error.hpp>
#include <tessera/core/shape.hpp>

namespace tessera::detail {

std::vector<int64_t> per_spatial_dim(const std::vector<int64_t>& values, int64_t spatial, const char* op,
                                     const char* what) {
  const auto count = static_cast<int64_t>(values.size());
  TESSERA_CHECK(count == 1 || count == spatial, ValueError, op, what, " ", Shape(values).to_string(), " has ", count,
                " values; expected 1", spatial == 1 ? "" : concat(" or ", spatial));
  return count == 1 ? std::vector<int64_t>(static_cast<size_t>(spatial), values.front()) : values;
}

}  // namespace tessera::detail
