#pragma once
// The controller's op surface with gradients (shared by the threads and the MPI tests): the op
// table's nn, view, shape and index ops by name equal the same ops on the whole tensor; a
// controller program trains an MLP (linear, layer_norm, gelu, cross_entropy; SGD) without a
// remote function, and its losses, gradients and parameters equal the same training done on
// one device with Tensor's autograd; autograd's errors name the call.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

namespace training_checks {

inline tessera::Tensor fetched(const tessera::controller::RemoteTensor& t) {
  return tessera::controller::fetch_full(t).get();
}

inline bool close(const tessera::Tensor& a, const tessera::Tensor& b, double tol = 1e-5) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && tessera::allclose(a, b, tol, tol);
}

// Placements with Shard(dim) on the mesh's first dim, Replicate on the others.
inline tessera::Placements rows_on_first(const tessera::controller::WorkerMesh& mesh, int64_t dim = 0) {
  tessera::Placements p(static_cast<size_t>(mesh.spec().ndim()), tessera::Replicate{});
  p[0] = tessera::Shard{dim};
  return p;
}

/// Every op of the op table with structured arguments, by name (and the typed nn functions),
/// on tensors sharded over the mesh's first dim (uneven over 3 or 4 workers), equals the op on
/// the whole tensors.
inline void check_structured_ops(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  namespace c = tessera::controller;
  const Placements rows = rows_on_first(mesh);
  const Placements replicated(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  c::manual_seed(7, mesh);
  const c::RemoteTensor rx = c::randn({6, 5}, mesh, rows), ry = c::randn({6, 5}, mesh, rows);
  const c::RemoteTensor rw = c::randn({3, 5}, mesh, replicated), rb = c::randn({3}, mesh, replicated);
  // Class indices in [0, 5) and [0, 6): argmax over a last dim of that size.
  const c::RemoteTensor classes = c::call("argmax", {c::randn({6, 5}, mesh, rows)}, {}, {0, 1});
  const c::RemoteTensor index2 = c::call("argmax", {c::randn({6, 2, 5}, mesh, rows)}, {}, {0, 2});
  const c::RemoteTensor rows_index = c::call("argmax", {c::randn({4, 6}, mesh, replicated)}, {}, {0, 1});
  const Tensor x = fetched(rx), y = fetched(ry), w = fetched(rw), b = fetched(rb);
  const Tensor cls = fetched(classes), idx2 = fetched(index2), ridx = fetched(rows_index);
  const c::RemoteTensor mask = c::call("gt_scalar", {rx}, {0.0});
  const Tensor m = gt(x, Scalar(0.0));

  // Selection and linear algebra.
  EXPECT_TRUE(close(fetched(c::call("logical_not", {mask})), logical_not(m)));
  EXPECT_TRUE(close(fetched(c::call("where", {mask, rx, ry})), where(m, x, y)));
  EXPECT_TRUE(close(fetched(c::call("masked_fill", {rx, mask}, {-1.5})), masked_fill(x, m, Scalar(-1.5))));
  EXPECT_TRUE(close(fetched(c::call("clamp", {rx}, {-0.5, 0.5})), clamp(x, Scalar(-0.5), Scalar(0.5))));
  EXPECT_TRUE(close(fetched(c::linear(rx, rw, rb)), linear(x, w, b)));
  EXPECT_TRUE(close(fetched(c::call("linear", {rx, rw})), linear(x, w)));
  EXPECT_TRUE(close(fetched(c::einsum("ij,kj->ik", {rx, rw})), einsum("ij,kj->ik", {x, w})));
  const c::RemoteTensor rbatch = c::reshape(rx, {3, 2, 5}), rbatch_t = c::call("permute", {rbatch}, {}, {0, 2, 1});
  const Tensor batch = x.reshape({3, 2, 5});
  EXPECT_TRUE(close(fetched(c::call("bmm", {rbatch, rbatch_t})), bmm(batch, batch.permute({0, 2, 1}))));
  // nn.
  EXPECT_TRUE(close(fetched(c::log_softmax(rx, 1)), log_softmax(x, 1)));
  EXPECT_TRUE(
      close(fetched(c::layer_norm(rx, {5}, c::ones({5}, mesh, replicated), c::full({5}, 0.25, mesh, replicated))),
            layer_norm(x, {5}, ones({5}), full({5}, 0.25))));
  EXPECT_TRUE(
      close(fetched(c::call("rms_norm", {rx}, {1e-6}, {}, nullptr, {5})), rms_norm(x, {5}, std::nullopt, 1e-6)));
  EXPECT_TRUE(close(fetched(c::embedding(ry, rows_index)), embedding(y, ridx)));
  EXPECT_TRUE(close(fetched(c::cross_entropy(rx, classes)), cross_entropy(x, cls)));
  EXPECT_TRUE(close(fetched(c::call("cross_entropy", {rx, classes}, {}, {-100, 2})),
                    cross_entropy(x, cls, -100, Reduction::sum)));
  EXPECT_TRUE(close(fetched(c::call("nll_loss", {c::log_softmax(rx, 1), classes}, {}, {-100, 0})),
                    nll_loss(log_softmax(x, 1), cls, -100, Reduction::none)));
  EXPECT_TRUE(close(fetched(c::call("mse_loss", {rx, ry})), mse_loss(x, y)));
  EXPECT_TRUE(close(fetched(c::call("dropout", {rx}, {0.5}, {0})), x));  // not training: the identity
  const c::RemoteTensor rq = c::reshape(c::randn({6, 2, 4, 3}, mesh, rows), {6, 2, 4, 3});
  const Tensor q = fetched(rq);
  EXPECT_TRUE(close(fetched(c::scaled_dot_product_attention(rq, rq, rq, std::nullopt, 0.0, true)),
                    scaled_dot_product_attention(q, q, q, std::nullopt, 0.0, true)));
  const c::RemoteTensor rimage = c::randn({4, 2, 6, 5}, mesh, rows), rkernel = c::randn({3, 2, 3, 3}, mesh, replicated);
  const Tensor image = fetched(rimage), kernel = fetched(rkernel);
  EXPECT_TRUE(close(fetched(c::conv2d(rimage, rkernel, std::nullopt, {1, 1}, {1, 1})),
                    conv2d(image, kernel, std::nullopt, {1, 1}, {1, 1}), 1e-4));
  // Views and shape ops.
  EXPECT_TRUE(close(fetched(c::call("expand", {c::reshape(rb, {1, 3})}, {}, {}, nullptr, {4, 3})),
                    b.reshape({1, 3}).expand({4, 3})));
  EXPECT_TRUE(close(fetched(c::call("narrow", {rx}, {}, {1, 1, 3})), x.narrow(1, 1, 3)));
  EXPECT_TRUE(close(fetched(c::call("cat", {rx, ry, rx}, {}, {1})), cat({x, y, x}, 1)));
  EXPECT_TRUE(close(fetched(c::call("stack", {rx, ry})), stack({x, y})));
  EXPECT_TRUE(close(fetched(c::call("flip", {rx}, {}, {0, 1})), flip(x, {0, 1})));
  EXPECT_TRUE(close(fetched(c::call("roll", {rx}, {}, {2, -1, 0, 1})), roll(x, {2, -1}, {0, 1})));
  EXPECT_TRUE(close(fetched(c::call("roll", {rx}, {}, {4})), roll(x, {4})));
  EXPECT_TRUE(close(fetched(c::call("tril", {rx}, {}, {-1})), tril(x, -1)));
  EXPECT_TRUE(close(fetched(c::call("triu", {rx})), triu(x)));
  EXPECT_TRUE(close(fetched(c::call("repeat", {rx}, {}, {2, 1})), repeat(x, {2, 1})));
  EXPECT_TRUE(close(fetched(c::call("pad", {rx}, {0.5}, {1, 2})), pad(x, {1, 2}, PadMode::constant, Scalar(0.5))));
  // Indexing along a dim.
  EXPECT_TRUE(close(fetched(c::call("gather", {rx, index2}, {}, {1})), gather(x, 1, idx2)));
  EXPECT_TRUE(close(fetched(c::call("index_select", {rx, rows_index}, {}, {0})), index_select(x, 0, ridx)));
  const c::RemoteTensor rsrc = c::call("narrow", {ry}, {}, {1, 0, 2});
  const Tensor src = y.narrow(1, 0, 2);
  EXPECT_TRUE(close(fetched(c::call("scatter", {rx, index2, rsrc}, {}, {1})), scatter(x, 1, idx2, src)));
  EXPECT_TRUE(close(fetched(c::call("scatter_add", {rx, index2, rsrc}, {}, {1})), scatter_add(x, 1, idx2, src)));
  const c::RemoteTensor radd = c::randn({4, 5}, mesh, replicated);
  EXPECT_TRUE(close(fetched(c::call("index_add", {rx, rows_index, radd}, {2.0}, {0})),
                    index_add(x, 0, ridx, fetched(radd), Scalar(2.0))));
}

/// The arguments of the structured and autograd rows are checked at the call.
inline void check_structured_arguments(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  namespace c = tessera::controller;
  using tessera::testing::throws_with;
  const c::RemoteTensor a = c::ones({4, 4}, mesh, Placements(static_cast<size_t>(mesh.spec().ndim()), Replicate{}));
  EXPECT_TRUE(throws_with<ValueError>([&] { c::call("linear", {a}); },
                                      {"[controller::call]", "'linear' takes 2 to 3 input tensors; got 1"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] { c::call("layer_norm", {a}); },
      {"[controller::call]", "'layer_norm' takes a shape (normalized_shape)", "got 0 scalars, 0 integers"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        c::call("einsum", {a, a});
      },
      {"[controller::call]", "'einsum' takes its operands and a text"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        c::call("conv2d", {a, a}, {}, {1, 1, 1});
      },
      {"'conv2d' takes integers [stride h, w", "got 0 scalars, 3 integers"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        c::call("roll", {a}, {}, {1, 2, 3});
      },
      {"'roll' takes integers [shift] or [shifts..., dims...]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { c::call("sgd_step_", {a}); },
                                      {"'sgd_step_' takes one or two scalars [lr, weight_decay]"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        c::call_inplace("backward", a, {a, a});
      },
      {"[controller::call_inplace]", "'backward' takes 1 to 2 input tensors; got 3"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { c::SGD({a}, -0.1); }, {"[SGD]", "lr = -0.1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { c::conv2d(a, a, std::nullopt, {1}); }, {"[conv2d]", "two values each"}));
  // A reduction code out of range fails on the workers, at the future.
  EXPECT_TRUE(throws_with<CommError>(
      [&] {
        (void)fetched(c::call("mse_loss", {a, a}, {}, {3}));
      },
      {"worker rank", "[mse_loss] reduction 3 is not one of"}));
}

/// Autograd's errors surface at the futures of what reads the result, naming the call; the
/// workers carry on.
inline void check_autograd_errors(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  namespace c = tessera::controller;
  using tessera::testing::throws_with;
  const Placements replicated(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  const c::RemoteTensor plain = c::ones({3}, mesh, replicated);
  EXPECT_TRUE(throws_with<CommError>([&] { (void)fetched(c::grad(plain)); },
                                     {"worker rank", "[grad] the tensor", "does not require a gradient"}));
  const c::RemoteTensor leaf = c::ones({3}, mesh, replicated);
  c::requires_grad_(leaf);
  EXPECT_TRUE(throws_with<CommError>([&] { (void)fetched(c::grad(leaf)); },
                                     {"worker rank", "[grad] the tensor", "has no gradient yet"}));
  const c::RemoteTensor doubled = c::scale(leaf, 2.0);
  EXPECT_TRUE(throws_with<CommError>([&] { (void)fetched(c::grad(doubled)); },
                                     {"worker rank", "[grad] the tensor", "not a leaf"}));
  // backward from a tensor of three elements needs a gradient: the loss fails, and so does all
  // that reads it, while the leaf stays usable.
  c::backward(doubled);
  EXPECT_TRUE(throws_with<CommError>([&] { (void)fetched(doubled); }, {"backward"}));
  c::backward(c::sum(c::scale(leaf, 2.0)));
  EXPECT_TRUE(close(fetched(c::grad(leaf)), full({3}, 2.0)));
  c::SGD({leaf}, 0.5).step();
  EXPECT_TRUE(close(fetched(leaf), full({3}, 0.0)));
  c::SGD({leaf}, 0.5).zero_grad();
  EXPECT_TRUE(throws_with<CommError>([&] { (void)fetched(c::grad(leaf)); },
                                     {"worker rank", "[grad] the tensor", "has no gradient yet"}));
}

/// A two-layer MLP trained by the controller for `steps` SGD steps (the batch's rows sharded
/// over the mesh's first dim; on a 2-d mesh the first layer column-parallel and the second
/// row-parallel over the second dim) equals the same training on one device: each step's loss,
/// every gradient, and the final parameters.
inline void check_training(const tessera::controller::WorkerMesh& mesh, int steps = 3) {
  using namespace tessera;
  namespace c = tessera::controller;
  const int64_t nd = mesh.spec().ndim();
  const Placements replicated(static_cast<size_t>(nd), Replicate{});
  Placements colwise = replicated, rowwise = replicated, bias_colwise = replicated;
  if (nd > 1) {
    colwise[1] = Shard{0};
    bias_colwise[1] = Shard{0};
    rowwise[1] = Shard{1};
  }
  c::manual_seed(11, mesh);
  const c::RemoteTensor x = c::randn({10, 6}, mesh, rows_on_first(mesh));
  const c::RemoteTensor target = c::call("argmax", {c::randn({10, 4}, mesh, rows_on_first(mesh))}, {}, {0, 1});
  const c::RemoteTensor w1 = c::scale(c::randn({8, 6}, mesh, colwise), 0.4), b1 = c::zeros({8}, mesh, bias_colwise);
  const c::RemoteTensor w2 = c::scale(c::randn({4, 8}, mesh, rowwise), 0.4);
  const c::RemoteTensor gamma = c::ones({8}, mesh, replicated), beta = c::zeros({8}, mesh, replicated);
  const std::vector<c::RemoteTensor> params{w1, b1, w2, gamma, beta};
  for (const c::RemoteTensor& p : params) c::requires_grad_(p);
  const c::SGD optimizer(params, 0.2, 0.01);

  // The same on one device.
  const Tensor X = fetched(x), T = fetched(target);
  std::vector<Tensor> local;
  for (const c::RemoteTensor& p : params) local.push_back(fetched(p).requires_grad_());
  const auto forward = [](const auto& in, const auto& ps, const auto& labels, auto&& lin, auto&& norm, auto&& act,
                          auto&& loss) {
    return loss(lin(act(norm(lin(in, ps[0], ps[1]), ps[3], ps[4])), ps[2]), labels);
  };
  for (int step = 0; step < steps; ++step) {
    const c::RemoteTensor loss = forward(
        x, params, target, [](const auto& a, const auto& w, auto&&... b) { return c::linear(a, w, b...); },
        [](const auto& h, const auto& g, const auto& bb) { return c::layer_norm(h, {8}, g, bb); },
        [](const auto& h) { return c::gelu(h); }, [](const auto& l, const auto& t) { return c::cross_entropy(l, t); });
    c::backward(loss);
    const Tensor expected_loss = forward(
        X, local, T, [](const auto& a, const auto& w, auto&&... b) { return linear(a, w, b...); },
        [](const auto& h, const auto& g, const auto& bb) { return layer_norm(h, {8}, g, bb); },
        [](const auto& h) { return gelu(h); }, [](const auto& l, const auto& t) { return cross_entropy(l, t); });
    expected_loss.backward();
    EXPECT_TRUE(close(fetched(loss), expected_loss.detach(), 1e-5)) << "step " << step;
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(close(fetched(c::grad(params[i])), local[i].grad(), 1e-5)) << "step " << step << " parameter " << i;
    optimizer.step();
    optimizer.zero_grad();
    const autograd::NoGradGuard no_grad;
    for (Tensor& p : local) p = (p.detach() - (p.grad() + p.detach() * 0.01) * 0.2).requires_grad_();
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(close(fetched(params[i]), local[i].detach(), 1e-5)) << "parameter " << i;
}

}  // namespace training_checks
