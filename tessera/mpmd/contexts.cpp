#include <tessera/mpmd/contexts.hpp>

#include <tessera/runtime/runtime.hpp>

namespace tessera::mpmd {

namespace {

bool& ignoring() { return rank_local<bool>("tessera.mpmd.ignore_transforms"); }

}  // namespace

bool transforms_ignored() { return ignoring(); }

IgnoreTransforms::IgnoreTransforms(std::optional<bool> ignore) : previous_(ignoring()) {
  if (ignore.value_or(false)) ignoring() = true;
}

IgnoreTransforms::~IgnoreTransforms() { ignoring() = previous_; }

}  // namespace tessera::mpmd
