#include <tessera/core/error.hpp>

namespace tessera::detail {

void throw_internal(const char* file, int line, const char* cond, const std::string& what) {
  throw InternalError(concat("internal error at ", file, ":", line, ": ", cond, " failed",
                             what.empty() ? "" : ": ", what, " (this is a bug in Tessera)"));
}

}  // namespace tessera::detail
