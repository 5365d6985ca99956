#include <tessera/controller/detail/command.hpp>

#include <iterator>

namespace tessera::controller::detail {

int64_t stream_of(const Command& command) {
  return std::visit(
      [](const auto& c) -> int64_t {
        if constexpr (requires { c.stream; })
          return c.stream;
        else
          return 0;
      },
      command);
}

uint64_t request_of(const Command& command) {
  return std::visit(
      [](const auto& c) -> uint64_t {
        if constexpr (requires { c.request; })
          return c.request;
        else
          return 0;
      },
      command);
}

const char* kind_name(const Command& command) {
  static constexpr const char* kNames[] = {"stop",        "make_mesh", "slice_mesh", "make_stream",  "run_op",
                                           "call_remote", "seed",      "fetch",      "query_layout", "drop",
                                           "signal",      "wait",      "to_mesh"};
  static_assert(std::size(kNames) == std::variant_size_v<Command>, "a name per kind of command");
  return kNames[command.index()];
}

}  // namespace tessera::controller::detail
