// The controller with workers as MPI processes (run under mpirun -np N: rank 0 is the
// controller, ranks 1..N-1 the workers; ctest runs it as controller.mpi_np3 and _np5). The same
// program as on threads: ops, a remote function, fetches, layouts, a worker's error, a slice and
// a mesh reduce, a remote function's failures; every value is checked against the same
// computation done locally. Outside mpirun the test is skipped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/sharding/layout.hpp>

#include "failure_checks.hpp"
#include "monarch_checks.hpp"
#include "op_checks.hpp"
#include "propagate_checks.hpp"
#include "stream_checks.hpp"
#include "test_util.hpp"
#include "training_checks.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

Tensor smooth(const Shape& shape, double seed) { return sin(arange(shape.numel()).to(DType::f32) * 0.37 + seed).reshape(shape); }

}  // namespace

TEST(ControllerMpi, WorkersAsProcesses) {
  if (!mpi::launched_by_mpirun()) GTEST_SKIP() << "run under mpirun";
  controller::register_remote("mpi_test.smooth", [](const DeviceMesh& mesh, const std::vector<DTensor>&) {
    Placements p(static_cast<size_t>(mesh.ndim()), Replicate{});
    p[0] = Shard{0};
    return std::vector<DTensor>{distribute_tensor(smooth({6, 4}, 0.5), mesh, p)};
  });
  stream_checks::register_remotes();
  failure_checks::register_remotes();
  monarch_checks::register_remotes();
  propagate_checks::register_remotes();
  char name[] = "controller_mpi_test";
  char* argv[] = {name, nullptr};
  bool ran = false;
  const int status = controller::run(1, argv, [&] {
    ran = true;
    const int workers = controller::num_workers();
    const controller::WorkerMesh mesh({workers}, {"x"});
    EXPECT_EQ(mesh.spec().ranks().front(), 1);  // rank 0 is the controller
    const auto x = controller::call_remote("mpi_test.smooth", mesh, {})[0];
    const auto w = controller::full({4, 3}, 0.25, mesh, {Replicate{}});
    const auto y = controller::relu(controller::matmul(x, w));
    const Tensor expected = relu(matmul(smooth({6, 4}, 0.5), full({4, 3}, 0.25)));
    EXPECT_TRUE(allclose(controller::fetch_full(y).get(), expected, 1e-6, 1e-6));
    EXPECT_EQ(y.shape(), (Shape{6, 3}));
    EXPECT_EQ(y.layout().placements(), (Placements{Shard{0}}));
    // The first worker's rows of x (6 rows over the workers, chunked).
    const Tensor first = controller::fetch_shard(x, {0}).get();
    EXPECT_TRUE(allclose(first, smooth({6, 4}, 0.5).narrow(0, 0, first.shape()[0]), 0, 0));
    // A worker's error surfaces at the future.
    const auto bad = controller::matmul(x, x);
    EXPECT_TRUE(throws_with<CommError>([&] { controller::fetch_full(bad).get(); }, {"worker rank 1", "matmul"}));
    // Mesh reduce of each worker's block: the sum over the workers.
    const auto ones = controller::ones({3}, mesh, {Replicate{}});
    EXPECT_TRUE(allclose(controller::fetch_full(controller::reduce(ones, {"x"})).get(), full({3}, workers), 0, 0));
    // The op table by name with typed arguments, and call()'s arguments checked at the call.
    op_checks::check_generated_ops(mesh);
    op_checks::check_call_arguments(mesh);
    // The structured ops by name, and training without remote functions, as on threads.
    training_checks::check_structured_ops(mesh);
    training_checks::check_structured_arguments(mesh);
    training_checks::check_training(mesh);
    training_checks::check_autograd_errors(mesh);
    propagate_checks::check_propagation(mesh);
    if (workers % 2 == 0) propagate_checks::check_propagation(controller::WorkerMesh({workers / 2, 2}, {"a", "b"}));
    if (workers % 2 == 0) monarch_checks::check_to_mesh(controller::WorkerMesh({workers / 2, 2}, {"host", "gpu"}));
    if (workers % 2 == 0) training_checks::check_training(controller::WorkerMesh({workers / 2, 2}, {"dp", "tp"}));
    // Monarch's reductions, fetch_shard's coordinates and drop(), on the line and a grid.
    monarch_checks::check_mesh_reductions(mesh);
    monarch_checks::check_fetch_shard_coordinates(mesh);
    monarch_checks::check_drop(mesh);
    // mesh.rank, mesh.ranks and per-worker seeds, the workers along each axis in turn.
    monarch_checks::check_per_worker_factories(controller::WorkerMesh({workers, 1}, {"host", "gpu"}));
    monarch_checks::check_per_worker_factories(controller::WorkerMesh({1, workers}, {"host", "gpu"}));
    monarch_checks::check_slice_mesh(controller::WorkerMesh({workers, 1}, {"host", "gpu"}));
    monarch_checks::check_slice_mesh(controller::WorkerMesh({1, workers}, {"host", "gpu"}));
    if (workers % 2 == 0) monarch_checks::check_mesh_reductions(controller::WorkerMesh({2, workers / 2}, {"a", "b"}));
    // A fetch never waited for is received at shutdown (the workers end cleanly).
    (void)controller::fetch_shard(y, {workers - 1});
    if (workers % 2 == 0) {
      const controller::WorkerMesh grid({2, workers / 2}, {"a", "b"});
      const auto half = grid.slice({{"a", 1}});
      const auto z = controller::full({2, 2}, 3.0, half, {Replicate{}});
      EXPECT_TRUE(allclose(controller::fetch_full(controller::add(z, z)).get(), full({2, 2}, 6.0), 0, 0));
    }
    // A remote function's failures: its results fail on every worker, the mesh keeps working.
    if (workers >= 2) {
      failure_checks::check_failures_keep_the_mesh(mesh);
      failure_checks::check_result_on_another_mesh(mesh);
    }
    // Streams run concurrently in every worker process (a latch one opens for the other).
    stream_checks::check_streams_run_concurrently();
    if (workers >= 2) {  // last: they spend the mesh on the main stream
      failure_checks::check_unpaired_calls_spend_the_mesh(mesh);
      stream_checks::check_partial_failure_releases_the_others();
    }
  });
  EXPECT_EQ(status, 0);
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (world_rank && std::string(world_rank) == "0") {
    EXPECT_TRUE(ran);
  }
}
