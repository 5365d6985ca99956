#pragma once
// Work: the handle of an asynchronous communication call.
#include <memory>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

namespace detail {
struct WorkState;
}

/// Completion handle of an async collective. Copyable; all copies refer to one operation.
/// The buffers passed to the call must stay alive and untouched until wait() returns.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
  /// Blocks until the operation finished; rethrows its error (CommError, ValueError) if it failed.
  /// A default-constructed Work is complete.
  void wait() const;
  /// True once the operation finished (successfully or not). Never blocks.
  bool is_completed() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace tessera
