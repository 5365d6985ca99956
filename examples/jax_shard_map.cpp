// jax_shard_map: the matmul examples of JAX's shard_map guide, translated. On a 1-d mesh over
// every rank with the axis "x" (jax.make_mesh((n,), ('x',))):
//
//   1. psum:       x [M, K] sharded P(None, 'x') over K, w [K, N] sharded P('x'); each rank
//                  multiplies its blocks (a partial sum of x @ w), psum over 'x' adds them up;
//                  out_specs P(): the result is replicated.
//   2. all_gather: x sharded P('x') by rows, w sharded P('x'); each rank gathers w whole
//                  (all_gather(w_block, 'x', tiled=True)) and multiplies its rows; out P('x').
//   3. ppermute:   the same product as the guide's matmul_allgather_overlapped: w's blocks travel
//                  around a ring, one ppermute per step, each rank multiplying the matching
//                  columns of its x rows as they pass (here each ppermute completes before the
//                  matmul, so this shows the data movement of the overlapped form, not the overlap).
//
// Each result, and the gradients shard_map's backward gives x and w, is compared with the
// unsharded x @ w and its gradients (f64, tolerance 1e-12). Exits 1 on a mismatch.
// Run: jax_shard_map --ranks 4 (any number of ranks), or mpirun -np 4 jax_shard_map.
#include <atomic>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <tessera/tessera.hpp>

using namespace tessera;
using P = PartitionSpec;
using Blocks = std::vector<Tensor>;

namespace {

constexpr double kTolerance = 1e-12;

// Distinct smooth values, the same on every rank.
Tensor values(const Shape& shape, double seed) {
  return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape);
}

std::string shape_of(const Tensor& t) { return t.shape().to_string(); }

}  // namespace

int main(int argc, char** argv) {
  std::atomic<bool> ok{true};
  const int status = run(argc, argv, [&] {
    const DeviceMesh mesh = get_1d_mesh("x");
    const int64_t n = mesh.size(0);
    const bool speaker = rank() == 0;
    const auto check = [&](bool good, const std::string& what) {
      if (speaker) std::printf("  %s: %s\n", what.c_str(), good ? "equals the unsharded result" : "MISMATCH");
      if (!good) {
        ok = false;
        if (!speaker) std::printf("rank %d: MISMATCH: %s\n", rank(), what.c_str());
      }
    };

    const int64_t m = 2 * n, k = 3 * n, cols = 5;
    const Tensor x = values({m, k}, 0.1), w = values({k, cols}, 0.7);
    // The unsharded reference, and its gradients for the cotangent g: those of sum(x @ w * g).
    const Tensor g = values({m, cols}, 1.3);
    const Tensor x_ref = x.clone().requires_grad_(), w_ref = w.clone().requires_grad_();
    const Tensor expected = matmul(x_ref, w_ref);
    sum(mul(expected, g)).backward();
    if (speaker)
      std::printf("mesh %s; x %s, w %s, f64\n", mesh.to_string().c_str(), shape_of(x).c_str(), shape_of(w).c_str());

    // Runs shard_map(fn) on x and w annotated by the in_specs, checks the result and (shard_map
    // is differentiable) the gradients of sum(result * g) that reach the sharded inputs.
    const auto check_matmul = [&](const std::function<Tensor(const Blocks&)>& fn, const std::string& call,
                                  const P& x_spec, const P& w_spec, const P& out_spec, const std::string& how) {
      DTensor xs = mark_sharding(x, mesh, x_spec), ws = mark_sharding(w, mesh, w_spec);
      xs.requires_grad_();
      ws.requires_grad_();
      const DTensor y = shard_map(fn, mesh, {x_spec, w_spec}, out_spec, {xs, ws});
      sum(mul(y, mark_sharding(g, mesh, out_spec))).backward();
      if (speaker)
        std::printf("\n%s\n  in_specs=(%s, %s), out_specs=%s\n  %s @ %s -> %s; %s\n", call.c_str(),
                    x_spec.to_string().c_str(), w_spec.to_string().c_str(), out_spec.to_string().c_str(),
                    type_string(xs).c_str(), type_string(ws).c_str(), type_string(y).c_str(), how.c_str());
      check(allclose(clear_sharding(y.detach()), expected.detach(), kTolerance, kTolerance), "x @ w");
      check(allclose(clear_sharding(xs.grad()), x_ref.grad(), kTolerance, kTolerance),
            "gradient of x (" + type_string(xs.grad()) + ")");
      check(allclose(clear_sharding(ws.grad()), w_ref.grad(), kTolerance, kTolerance),
            "gradient of w (" + type_string(ws.grad()) + ")");
    };
    const std::string local_x = Shape{m, k / n}.to_string(), local_w = Shape{k / n, cols}.to_string();

    // 1. psum of the blocks' products: K sharded, the partial sums added over "x".
    check_matmul([](const Blocks& t) { return psum(matmul(t[0], t[1]), "x"); },
                 "1. shard_map(lambda a, b: psum(a @ b, 'x'))", P{std::nullopt, "x"}, P{"x"}, P{},
                 "each rank multiplies its " + local_x + " by its " + local_w + ", psum adds them up");

    // 2. all_gather: rows of x sharded, w gathered whole on every rank, rows of the result sharded.
    check_matmul([](const Blocks& t) { return matmul(t[0], all_gather(t[1], "x", 0)); },
                 "2. shard_map(lambda a, b: a @ all_gather(b, 'x', tiled=True))", P{"x"}, P{"x"}, P{"x"},
                 "each rank gathers w's " + local_w + " blocks into " + w.shape().to_string());

    // 3. ppermute: the all_gather of step 2 as a ring, one block of w moving per step.
    // After s shifts (i -> i+1), rank i holds w's block (i - s) mod n, which multiplies the
    // columns of the same index of its x rows.
    const auto ring_matmul = [n](const Blocks& t) {
      const int64_t block = t[1].size(0), me = axis_index("x");
      std::vector<std::pair<int64_t, int64_t>> ring;
      for (int64_t i = 0; i < n; ++i) ring.emplace_back(i, (i + 1) % n);
      Tensor w_block = t[1];
      Tensor out = matmul(t[0].narrow(1, me * block, block), w_block);
      for (int64_t s = 1; s < n; ++s) {
        w_block = ppermute(w_block, "x", ring);
        out = add(out, matmul(t[0].narrow(1, ((me - s + n) % n) * block, block), w_block));
      }
      return out;
    };
    check_matmul(ring_matmul, "3. shard_map(matmul_allgather_overlapped)", P{"x"}, P{"x"}, P{"x"},
                 std::to_string(n - 1) + " ppermute shift(s) of w's blocks around the ring (i -> i+1 mod " +
                     std::to_string(n) + ")");
  });
  if (status == 0)
    std::cout << (ok ? "\njax_shard_map: every shard_map equals the unsharded matmul\n"
                     : "\njax_shard_map: MISMATCH\n");
  return status != 0 ? status : (ok ? 0 : 1);
}
