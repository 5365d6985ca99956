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
  /// Keeps `owner` (what holds the call's buffer) alive for as long as the backend may still read
  /// or write the buffer, even after every copy of this Work is gone or the group failed first
  /// (MPI cannot take back a posted transfer; a threads peer may still match it). For a caller
  /// that may unwind before its transfers complete: hand the buffers here instead of waiting.
  const Work& keep_alive(std::shared_ptr<const void> owner) const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace tessera
