#pragma once
// multimesh.jax's compiler contexts: settings in force on the calling rank while a block of code
// runs. Python's `with ignore_transforms():` is `ignore_transforms([&] { ... })` here (or an
// IgnoreTransforms scope); settings nest, and leaving a block restores what was in force before
// it, however the block ends. Per rank: every rank of a program enters the same contexts (SPMD).
#include <optional>
#include <type_traits>
#include <utility>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace mpmd {

/// Whether multimesh transforms are no-ops on this rank now (inside ignore_transforms).
bool transforms_ignored();

/// The scope of ignore_transforms: while it lives, every multimesh transform is a no-op on this
/// rank, as multimesh.jax's debugging context makes them, so a program runs as plain SPMD code:
///  - a Task (task(...), MultiMesh::task, a registered task) calls its function on the inputs
///    where they live, on every rank that calls it: nothing moves onto the task's mesh, its
///    logical rules are not installed and no layouts travel, so the inputs should live on a mesh
///    of every rank (the program's world mesh), as one JAX program spans every device;
///  - microbatch runs the step once on the whole inputs and calls backward on its loss (the
///    same loss and gradients as the microbatched run, up to the order of summation);
///  - mpmd::with_sharding_constraint returns its input unchanged.
/// A false or absent `ignore` changes nothing (as multimesh.jax's ignore_transforms(False)), so
/// an outer scope's setting stands. Pipelines (pipeline.hpp) are not transforms: they run as
/// built.
class IgnoreTransforms {
 public:
  explicit IgnoreTransforms(std::optional<bool> ignore = true);
  ~IgnoreTransforms();
  IgnoreTransforms(const IgnoreTransforms&) = delete;
  IgnoreTransforms& operator=(const IgnoreTransforms&) = delete;

 private:
  bool previous_;
};

/// multimesh.jax's ignore_transforms: `body()` with every multimesh transform a no-op
/// (IgnoreTransforms), returning what it returns.
/// Example: `DTensor loss = mpmd::ignore_transforms([&] { return step(params, batch); });`
template <class F>
std::invoke_result_t<F> ignore_transforms(F&& body) {
  const IgnoreTransforms scope(true);
  return std::forward<F>(body)();
}
/// The same with multimesh.jax's argument: a false or absent `ignore` runs body as it is.
template <class F>
std::invoke_result_t<F> ignore_transforms(std::optional<bool> ignore, F&& body) {
  const IgnoreTransforms scope(ignore);
  return std::forward<F>(body)();
}

/// multimesh.jax's context(...): several contexts at once, each field as the context of its name
/// (absent: that context's setting unchanged).
/// Example: `mpmd::context({.ignore_transforms = debugging}, [&] { run(); });`
struct ContextOptions {
  std::optional<bool> ignore_transforms;
};

/// Runs body under the contexts `options` sets, returning what it returns.
template <class F>
std::invoke_result_t<F> context(const ContextOptions& options, F&& body) {
  const IgnoreTransforms ignore(options.ignore_transforms);
  return std::forward<F>(body)();
}

}  // namespace mpmd
}  // namespace tessera
