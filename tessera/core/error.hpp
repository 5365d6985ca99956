#pragma once
// Error kinds and the checking macros every layer uses.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// Base of every exception Tessera throws. Message shape: "[op] what is wrong: values; expected ...".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// A call that can never work: bad shapes, dims out of range, unsupported dtypes.
class ValueError : public Error {
 public:
  using Error::Error;
};
/// Layouts, placements and meshes that do not fit together.
class ShardingError : public Error {
 public:
  using Error::Error;
};
/// Communication failures: backend errors, timeouts, peers that failed.
class CommError : public Error {
 public:
  using Error::Error;
};
/// A broken invariant: a bug in Tessera, never the caller's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& what);
}  // namespace detail

}  // namespace tessera

/// Caller mistakes: throws Kind("[op] parts...") if cond is false. The message is built only on failure.
#define TESSERA_CHECK(cond, Kind, op, ...)                                           \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      throw Kind(::tessera::detail::concat("[", op, "] ", __VA_ARGS__));             \
  } while (0)

/// Internal invariants: throws InternalError naming file:line; a failure is a Tessera bug.
#define TESSERA_ASSERT(cond, ...)                                                            \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::tessera::detail::throw_internal(__FILE__, __LINE__, #cond,                           \
                                        ::tessera::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

/// TESSERA_ASSERT for hot loops: checked in debug builds only.
#ifdef NDEBUG
#define TESSERA_DEBUG_ASSERT(cond, ...) ((void)0)
#else
#define TESSERA_DEBUG_ASSERT(cond, ...) TESSERA_ASSERT(cond __VA_OPT__(, ) __VA_ARGS__)
#endif
