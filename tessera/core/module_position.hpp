#pragma once
// Where the calling thread is in a model, for debugging tools (CommDebugMode's per-module
// counts, PyTorch's ModuleTracker): the modules whose forward is running, and whether the code
// runs in a backward pass. nn modules set it while their forward runs (nn::ForwardScope); a node
// of the autograd graph keeps the position it was recorded at, and the backward pass runs it
// there, so a backward collective counts against the module whose forward made the op. Kept only
// while a tool asks for it (ModuleTracing): otherwise the cost is one thread-local test per module
// call and per recorded node.
#include <memory>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// The modules a thread is in, outermost first, by their paths ("TransformerLM",
/// "TransformerLM.blocks.0", ...), and whether it runs the backward of ops they recorded.
struct ModulePosition {
  std::vector<std::string> modules;
  bool backward = false;
};

namespace detail {

/// The calling thread's position; null outside every module and while nothing traces (and in
/// the backward of nodes recorded untraced).
const std::shared_ptr<const ModulePosition>& module_position();

/// Whether some tool on the calling thread wants positions kept (a ModuleTracing is open).
bool module_tracing();

/// RAII: the calling thread keeps module positions while one of these is open on it (they nest).
class ModuleTracing {
 public:
  ModuleTracing();
  ~ModuleTracing();
  ModuleTracing(const ModuleTracing&) = delete;
  ModuleTracing& operator=(const ModuleTracing&) = delete;
};

/// RAII: sets the calling thread's position to `position` (null: outside every module) until it
/// goes, then restores the one before, however the scope ends.
class ModulePositionScope {
 public:
  explicit ModulePositionScope(std::shared_ptr<const ModulePosition> position);
  ~ModulePositionScope();
  ModulePositionScope(const ModulePositionScope&) = delete;
  ModulePositionScope& operator=(const ModulePositionScope&) = delete;

 private:
  std::shared_ptr<const ModulePosition> previous_;
};

/// The position a node recorded now runs its backward at: the calling thread's modules (none
/// outside every module) with `backward` set; null while nothing traces.
std::shared_ptr<const ModulePosition> backward_position();

/// The position of backward work outside every module (the gradient sums and leaf accumulations
/// between nodes; nodes recorded outside every module).
const std::shared_ptr<const ModulePosition>& backward_outside_modules();

}  // namespace detail
}  // namespace tessera
