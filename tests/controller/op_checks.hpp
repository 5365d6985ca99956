#pragma once
// The controller's op table (shared by the threads and the MPI tests): the ops generated from
// the op table's families run by name with typed arguments and equal the same ops on the whole
// tensor; call()'s arguments are checked at the call against what the op takes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

namespace op_checks {

/// Every reduction of the op table's family, by call() with integers [keepdim, dims...] and by
/// the typed sum/mean, equals the op on the whole tensor; so do ops with other typed arguments.
inline void check_generated_ops(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  Placements p(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  p[0] = Shard{0};
  // Rows sharded on the first mesh dim (uneven over 4 workers), the other dims replicated.
  const controller::RemoteTensor rows = controller::randn({6, 5}, mesh, p);
  const Tensor x = controller::fetch_full(rows).get();
  const auto fetched = [](const controller::RemoteTensor& t) { return controller::fetch_full(t).get(); };
  const auto close = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() && allclose(a, b, 1e-5, 1e-5);
  };
  EXPECT_TRUE(close(fetched(controller::call("sum", {rows}, {}, {1, 0})), sum(x, {0}, true)));
  EXPECT_TRUE(close(fetched(controller::call("prod", {rows}, {}, {0, 1})), prod(x, {1})));
  EXPECT_TRUE(close(fetched(controller::call("amax", {rows}, {}, {0, 0})), amax(x, {0})));
  EXPECT_TRUE(close(fetched(controller::call("amin", {rows})), amin(x)));
  EXPECT_TRUE(close(fetched(controller::call("var", {rows}, {}, {1, 1})), var(x, {1}, 1, true)));
  EXPECT_TRUE(close(fetched(controller::call("argmax", {rows}, {}, {0, 1})), argmax(x, 1)));
  EXPECT_TRUE(close(fetched(controller::call("argmin", {rows}, {}, {1, 0})), argmin(x, 0, true)));
  EXPECT_TRUE(close(fetched(controller::mean(rows, {1}, true)), mean(x, {1}, true)));
  EXPECT_TRUE(close(fetched(controller::sum(rows)), sum(x)));
  EXPECT_TRUE(close(fetched(controller::call("maximum_scalar", {rows}, {0.25})), maximum(x, Scalar(0.25))));
  EXPECT_TRUE(close(fetched(controller::call("sigmoid", {rows})), sigmoid(x)));
  EXPECT_TRUE(close(fetched(controller::softmax(controller::transpose(rows, 0, 1), 0)), softmax(x.transpose(0, 1), 0)));
  EXPECT_TRUE(close(fetched(controller::reshape(rows, {5, 6})), x.reshape({5, 6})));
  // An arg-reduction over two dims fails on the workers, at the future.
  EXPECT_TRUE(tessera::testing::throws_with<CommError>(
      [&] {
        (void)fetched(controller::call("argmax", {rows}, {}, {0, 0, 1}));
      },
      {"argmax", "one dim or all"}));
}

/// call()'s arguments are checked at the call: the op's input count and argument kinds.
inline void check_call_arguments(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  using tessera::testing::throws_with;
  const controller::RemoteTensor a =
      controller::ones({4, 4}, mesh, Placements(static_cast<size_t>(mesh.spec().ndim()), Replicate{}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::call("add", {a}); },
                                      {"[controller::call]", "'add' takes 2 input tensors; got 1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::call("softmax", {a}); },
                                      {"[controller::call]", "'softmax' takes one dim"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::call("relu", {a}, {2.0}); },
                                      {"'relu' takes no arguments besides its inputs; got 1 scalars"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::call("add_scalar", {a}); }, {"'add_scalar' takes one scalar"}));
  EXPECT_TRUE(
      throws_with<ValueError>([&] { controller::call("redistribute", {a}); }, {"'redistribute' takes placements"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::call_inplace("mul", a, {}); },
                                      {"[controller::call_inplace]", "'mul' takes 2 input tensors; got 1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::call("mesh_reduce", {a}, {}, {0}); },
                                      {"'mesh_reduce' takes integers [mesh reduction"}));
  // By name, a mesh reduce and an in-place op with their integer arguments run as the typed calls.
  const controller::RemoteTensor b = controller::call("mesh_reduce", {a}, {}, {0, 0, 0});
  controller::call_inplace("mul_scalar", b, {}, {0.5});
  const int64_t over = mesh.spec().size(0);
  EXPECT_TRUE(allclose(controller::fetch_full(b).get(), full({4, 4}, 0.5 * static_cast<double>(over)), 0, 0));
}

}  // namespace op_checks
