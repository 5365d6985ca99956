#pragma once
// Monarch's remote(fn, propagate=) (shared by the threads and the MPI tests): a propagation
// function's layouts are the results' at the call, and the workers hold the function to them;
// "cached" asks the workers once per input pattern; what remote() and call() refuse.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/sharding/layout.hpp>

#include "test_util.hpp"

namespace propagate_checks {

struct Handles {
  tessera::controller::Remote doubled{""};  // x -> 2 x, layouts propagated as they are
  tessera::controller::Remote wrong{""};    // x -> 2 x, but the propagation says Replicate
  tessera::controller::Remote cached{""};   // x -> (x + 1, x Replicate), "cached"
};

inline Handles& handles() {
  static Handles h;
  return h;
}

/// Registers the remote functions (before controller::run, in every process).
inline void register_remotes() {
  using namespace tessera;
  static std::once_flag once;
  std::call_once(once, [] {
    const auto twice = [](const DeviceMesh&, const std::vector<DTensor>& in) {
      return std::vector<DTensor>{in.at(0) * 2.0};
    };
    handles().doubled = controller::remote("propagate_checks.doubled", twice,
                                           [](const std::vector<Layout>& in) { return std::vector<Layout>{in.at(0)}; });
    handles().wrong = controller::remote("propagate_checks.wrong", twice, [](const std::vector<Layout>& in) {
      const Layout& x = in.at(0);
      return std::vector<Layout>{x.with_placements(Placements(static_cast<size_t>(x.mesh().ndim()), Replicate{}))};
    });
    handles().cached = controller::remote(
        "propagate_checks.cached",
        [](const DeviceMesh& mesh, const std::vector<DTensor>& in) {
          return std::vector<DTensor>{
              in.at(0) + 1.0, in.at(0).redistribute(mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}))};
        },
        "cached");
  });
}

/// On `mesh` (its first dim sharding rows): the propagated layouts, the workers' check of them,
/// the cache's hits and misses, and the errors.
inline void check_propagation(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  namespace c = tessera::controller;
  using tessera::testing::throws_with;
  Placements rows(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  rows[0] = Shard{0};
  const Placements replicated(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  c::manual_seed(3, mesh);
  const c::RemoteTensor x = c::randn({5, 3}, mesh, rows);
  const Tensor whole = c::fetch_full(x).get();
  const Layout x_layout = x.layout();

  // A propagation function: the result's layout is the one it gave, and the value is right.
  const c::RemoteTensor y = handles().doubled.call(mesh, {x})[0];
  EXPECT_EQ(y.layout(), x_layout);
  EXPECT_TRUE(allclose(c::fetch_full(y).get(), whole * 2.0, 0, 0));
  EXPECT_STREQ(handles().doubled.propagation(), "function");
  // Chained: y's layout is known at the call, so the next call's propagation reads it directly.
  const c::RemoteTensor z = handles().doubled.call(mesh, {y})[0];
  EXPECT_TRUE(allclose(c::fetch_full(z).get(), whole * 4.0, 0, 0));

  // A propagation the function does not keep: the controller's layout is the propagated one, and
  // the result fails at its futures naming both layouts; the workers carry on.
  const c::RemoteTensor w = handles().wrong.call(mesh, {x})[0];
  EXPECT_EQ(w.layout().placements(), replicated);
  EXPECT_TRUE(throws_with<CommError>(
      [&] { (void)c::fetch_full(w).get(); },
      {"worker rank", "[remote propagate_checks.wrong] result 0 is", "but the propagation function said", "(R"}));
  EXPECT_TRUE(allclose(c::fetch_full(c::add(x, x)).get(), whole * 2.0, 0, 0));

  // "cached": the first call with these inputs asks the workers, later ones reuse the layouts;
  // another input layout asks again.
  const c::Remote& cached = handles().cached;
  const int64_t hits = cached.cache_hits(), misses = cached.cache_misses();
  for (int i = 0; i < 3; ++i) {
    const auto out = cached.call(mesh, {x}, 2);
    EXPECT_EQ(out[0].layout(), x_layout);
    EXPECT_EQ(out[1].layout(), x_layout.with_placements(replicated));
    EXPECT_TRUE(allclose(c::fetch_full(out[0]).get(), whole + 1.0, 0, 0));
    EXPECT_TRUE(allclose(c::fetch_full(out[1]).get(), whole, 0, 0));
  }
  EXPECT_EQ(cached.cache_misses() - misses, 1);
  EXPECT_EQ(cached.cache_hits() - hits, 2);
  const c::RemoteTensor x_replicated = c::redistribute(x, replicated);
  const auto other = cached.call(mesh, {x_replicated}, 2);
  EXPECT_EQ(other[0].layout().placements(), replicated);
  EXPECT_EQ(cached.cache_misses() - misses, 2);
  EXPECT_STREQ(cached.propagation(), "cached");

  // Refused at the call: another result count than the propagation gives, or a layout on
  // another mesh.
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)handles().doubled.call(mesh, {x}, 2); },
                                      {"[remote propagate_checks.doubled]", "gave 1 layouts; the call expects 2"}));
  const c::WorkerMesh line({static_cast<int64_t>(mesh.spec().size())}, {"all"});
  if (!(line.spec() == mesh.spec())) {
    const c::RemoteTensor on_line = c::ones({4}, line, {Replicate{}});
    EXPECT_TRUE(
        throws_with<ShardingError>([&] { (void)handles().doubled.call(mesh, {on_line}); },
                                   {"[remote propagate_checks.doubled]", "the propagation function gave result 0"}));
  }
}

/// Refused at remote(): a propagation Tessera's controller cannot run, and an empty function.
inline void check_refused_propagations() {
  using namespace tessera;
  namespace c = tessera::controller;
  using tessera::testing::throws_with;
  const auto fn = [](const DeviceMesh&, const std::vector<DTensor>& in) { return in; };
  EXPECT_TRUE(throws_with<ValueError>([&] { c::remote("propagate_checks.mocked", fn, "mocked"); },
                                      {"[remote]", "propagate = 'mocked'", "\"cached\" or a propagation function"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { c::remote("propagate_checks.empty", fn, c::Propagator()); },
                                      {"[remote]", "an empty propagation function"}));
}

}  // namespace propagate_checks
