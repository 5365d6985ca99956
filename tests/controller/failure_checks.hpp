#pragma once
// A remote function's failures (shared by the threads and the MPI tests). One that throws on
// every worker, or on one worker while no other waits for it, fails its results on every worker
// (and what is computed from them) at their futures, and the mesh's communicators on that
// stream keep working. One that returns a DTensor on another mesh fails its result at the
// future, naming both meshes.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>

#include "test_util.hpp"

namespace failure_checks {

inline tessera::Placements replicated(const tessera::DeviceMesh& mesh) {
  return tessera::Placements(static_cast<size_t>(mesh.ndim()), tessera::Replicate{});
}
inline tessera::Placements replicated(const tessera::controller::WorkerMesh& mesh) {
  return tessera::Placements(static_cast<size_t>(mesh.spec().ndim()), tessera::Replicate{});
}

/// Registers the remote functions the checks call (before controller::run; once).
inline void register_remotes() {
  using namespace tessera;
  static std::once_flag once;
  std::call_once(once, [] {
    // Every worker completes a collective, then throws: nothing is cut short.
    controller::register_remote("failure_checks.throw_after_a_collective", [](const DeviceMesh& mesh, const std::vector<DTensor>& in)
                                    -> std::vector<DTensor> {
      (void)in.at(0).redistribute(mesh, replicated(mesh));
      throw ValueError("every worker refuses after a collective");
    });
    // The last worker throws; the others return without communicating.
    controller::register_remote("failure_checks.last_refuses", [](const DeviceMesh& mesh, const std::vector<DTensor>& in) {
      if (rank() == mesh.spec().ranks().back()) throw ValueError("the last worker refuses");
      return std::vector<DTensor>{in.at(0)};
    });
    // A result on the first row of the call's mesh.
    controller::register_remote("failure_checks.on_a_slice", [](const DeviceMesh& mesh, const std::vector<DTensor>&) {
      const DeviceMesh row = mesh.slice({{mesh.axis_names().front(), 0}});
      return std::vector<DTensor>{DTensor::from_local(row.is_member() ? ones({2}) : zeros({0}), row, replicated(row))};
    });
    // Every worker throws, the first after sending the second a message it never receives.
    controller::register_remote("failure_checks.unreceived_message", [](const DeviceMesh& mesh, const std::vector<DTensor>&)
                                    -> std::vector<DTensor> {
      if (mesh.coordinate().front() == 0) {
        auto message = std::make_shared<Tensor>(ones({1}));
        mesh.comm(0).isend(message->raw_data(), 1, DType::f32, 1, 7).keep_alive(message);
      }
      throw ValueError("every worker refuses, a message unreceived");
    });
    // The whole value, through a collective.
    controller::register_remote("failure_checks.gather", [](const DeviceMesh& mesh, const std::vector<DTensor>& in) {
      return std::vector<DTensor>{in.at(0).redistribute(mesh, replicated(mesh))};
    });
  });
}

/// The shard of `t` at every worker of `mesh`, and its whole value, fail at their futures with a
/// CommError containing `what`.
inline void expect_failed_everywhere(const tessera::controller::RemoteTensor& t, const tessera::controller::WorkerMesh& mesh,
                                     const std::string& what) {
  using namespace tessera;
  for (int worker : mesh.spec().ranks()) {
    const std::vector<int64_t>& coordinate = mesh.spec().coordinate_of(worker);
    EXPECT_TRUE(tessera::testing::throws_with<CommError>([&] { controller::fetch_shard(t, coordinate).get(); }, {what}))
        << "at " << Shape(coordinate).to_string();
  }
  EXPECT_TRUE(tessera::testing::throws_with<CommError>([&] { controller::fetch_full(t).get(); }, {what}));
}

/// Inside a controller body, on `mesh` (2 or more workers): a remote function that throws on
/// every worker after a collective, and one that throws on the last worker only, fail their
/// results on every worker; the mesh then still runs collectives on this stream, in ops and in
/// remote functions.
inline void check_failures_keep_the_mesh(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  const Shape shape{2 * mesh.spec().size(), 3};
  const Tensor whole = full(shape, 1.5);
  Placements sharded(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  sharded[0] = Shard{0};
  const auto x = controller::full(shape, 1.5, mesh, sharded);
  const auto everywhere = controller::call_remote("failure_checks.throw_after_a_collective", mesh, {x})[0];
  expect_failed_everywhere(everywhere, mesh, "every worker refuses after a collective");
  expect_failed_everywhere(controller::relu(everywhere), mesh, "every worker refuses after a collective");
  EXPECT_TRUE(tessera::testing::throws_with<CommError>([&] { (void)everywhere.layout(); }, {"every worker refuses"}));
  EXPECT_TRUE(allclose(controller::fetch_full(controller::redistribute(x, replicated(mesh))).get(), whole, 0, 0));
  const auto last = controller::call_remote("failure_checks.last_refuses", mesh, {x})[0];
  const std::string last_rank = "worker rank " + std::to_string(mesh.spec().ranks().back());
  expect_failed_everywhere(last, mesh, last_rank + ": the last worker refuses");
  // A collective on it: no worker waits in it for one that skips it.
  expect_failed_everywhere(controller::redistribute(last, replicated(mesh)), mesh, "the last worker refuses");
  const auto gathered = controller::call_remote("failure_checks.gather", mesh, {x})[0];
  EXPECT_TRUE(allclose(controller::fetch_full(gathered).get(), whole, 0, 0));
  EXPECT_TRUE(allclose(controller::fetch_full(controller::add(x, x)).get(), whole * Scalar(2.0), 0, 0));
}

/// Inside a controller body, on `mesh` (2 or more workers along its first axis): a remote
/// function that throws on every worker after a message one worker sends is never received
/// leaves calls that do not pair up, so the mesh's communicators on this stream are abandoned
/// (a later receive would take the stale message): collectives there fail naming the error; a
/// new stream works on the mesh afresh.
inline void check_unpaired_calls_spend_the_mesh(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  const Shape shape{2 * mesh.spec().size(), 3};
  Placements sharded(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  sharded[0] = Shard{0};
  const auto x = controller::full(shape, 1.5, mesh, sharded);
  const auto r = controller::call_remote("failure_checks.unreceived_message", mesh, {})[0];
  expect_failed_everywhere(r, mesh, "a message unreceived");
  EXPECT_TRUE(tessera::testing::throws_with<CommError>(
      [&] { controller::fetch_full(controller::redistribute(x, replicated(mesh))).get(); },
      {"worker rank", "cannot be used", "a message unreceived"}));
  controller::Stream fresh("fresh after unpaired calls");
  controller::Borrow lent = fresh.borrow(x);
  auto on_fresh = fresh.activate();
  EXPECT_TRUE(allclose(controller::fetch_full(controller::redistribute(x, replicated(mesh))).get(), full(shape, 1.5), 0, 0));
}

/// Inside a controller body, on `mesh` (2 or more workers along its first axis): a remote
/// function returning a DTensor on the mesh's first row fails its result at the future, on every
/// worker, naming both meshes; the handle keeps the call's mesh.
inline void check_result_on_another_mesh(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  const auto r = controller::call_remote("failure_checks.on_a_slice", mesh, {})[0];
  EXPECT_EQ(r.mesh().id(), mesh.id());
  const controller::WorkerMesh row = mesh.slice({{mesh.spec().names().front(), 0}});
  const auto on_workers = [](const controller::WorkerMesh& m) {
    std::string text = "on workers [";
    for (size_t i = 0; i < m.spec().ranks().size(); ++i) text.append(i ? ", " : "").append(std::to_string(m.spec().ranks()[i]));
    return text + "]";
  };
  const std::vector<std::string> parts{"worker rank " + std::to_string(mesh.spec().ranks().front()),
                                       "[remote failure_checks.on_a_slice] result 0", on_workers(row),
                                       "not on the call's mesh", on_workers(mesh)};
  EXPECT_TRUE(tessera::testing::throws_with<CommError>([&] { (void)r.layout(); }, parts));
  expect_failed_everywhere(r, mesh, "not on the call's mesh");
}

}  // namespace failure_checks
