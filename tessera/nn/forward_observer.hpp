#pragma once
// ForwardObserver: told of every module forward (nn::ForwardScope) on the calling thread, for
// debugging tools (CommDebugMode records each module's parameters from it, as PyTorch's forward
// pre-hooks do). No observer: nothing is built per forward.
#include <string>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace nn {

class Module;

class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  /// `path`: the module's path (Module::path); called as its forward starts.
  virtual void on_forward(const std::string& path, const Module& module) = 0;
};
/// Registers an observer for the calling thread (rank); every registered one sees every forward.
void add_forward_observer(ForwardObserver* observer);
/// Unregisters it. Throws ValueError if it was not registered on this thread.
void remove_forward_observer(ForwardObserver* observer);

}  // namespace nn
}  // namespace tessera
