#include <tessera/core/module_position.hpp>

#include <utility>

namespace tessera::detail {

namespace {
// Per thread: each rank of the threads backend runs its own modules.
thread_local std::shared_ptr<const ModulePosition> position;
thread_local int tracing = 0;
// The backward twin of a position, made once per position rather than once per recorded node
// (twin_of holds the position, so its address cannot come back for another one).
thread_local std::shared_ptr<const ModulePosition> backward_twin;
thread_local std::shared_ptr<const ModulePosition> twin_of;
}  // namespace

const std::shared_ptr<const ModulePosition>& module_position() { return position; }

bool module_tracing() { return tracing > 0; }

ModuleTracing::ModuleTracing() { ++tracing; }
ModuleTracing::~ModuleTracing() { --tracing; }

ModulePositionScope::ModulePositionScope(std::shared_ptr<const ModulePosition> next)
    : previous_(std::exchange(position, std::move(next))) {}

ModulePositionScope::~ModulePositionScope() { position = std::move(previous_); }

const std::shared_ptr<const ModulePosition>& backward_outside_modules() {
  static const auto outside = std::make_shared<const ModulePosition>(ModulePosition{{}, true});
  return outside;
}

std::shared_ptr<const ModulePosition> backward_position() {
  if (tracing == 0) return nullptr;
  // Outside every module, the node's backward still runs in backward (counted under Global).
  if (!position) return backward_outside_modules();
  if (position->backward) return position;  // a node recorded during backward (double backward)
  if (twin_of != position) {
    backward_twin = std::make_shared<const ModulePosition>(ModulePosition{position->modules, true});
    twin_of = position;
  }
  return backward_twin;
}

}  // namespace tessera::detail
