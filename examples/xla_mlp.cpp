// xla_mlp: torch_xla's SPMD MLP example, translated. On 8 ranks a mesh of shape (4, 2) with axes
// ("data", "model") is built from device ids, as torch_xla's
//
//   mesh = Mesh(np.arange(8), (4, 2), ('data', 'model'))
//   xs.mark_sharding(fc1.weight, mesh, ('model', None))   # column parallel: hidden split
//   xs.mark_sharding(fc2.weight, mesh, (None, 'model'))   # row parallel: contraction split
//   xs.mark_sharding(data, mesh, ('data', None))           # batch split
//
// and a two-layer MLP, relu(x W1^T + b1) W2^T + b2, written with plain ops on DTensors, is trained
// with SGD on an MSE loss. Weights follow torch.nn.Linear: [out, in], sharded as above; b1 [hidden]
// is sharded ('model') like W1's rows, b2 replicated. The same model (same initial weights, same
// batches) is trained unsharded on plain Tensors; every step the loss, the gradients and the
// updated weights must equal it (f64, tolerance 1e-12). Prints the losses and the JAX-style type
// of every sharded value (type_string: f64[16@data,8]). Exits 1 if a check fails.
//
// Run: xla_mlp --ranks 8 [--steps 10] (threads), or mpirun -np 8 xla_mlp. Another even world size
// gives the mesh (n/2, 2); an odd one (n, 1).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

using namespace tessera;
using P = PartitionSpec;

namespace {

constexpr int64_t kBatch = 16, kIn = 8, kHidden = 12, kOut = 4;
constexpr double kLearningRate = 0.5;
// f64 and the same ops on both sides: only the order of the sharded sums differs.
constexpr double kTolerance = 1e-12;

int parse_steps(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--steps")) return std::atoi(argv[i + 1]);
  return 10;
}

// The model's parameters, as Tensors (the reference) or DTensors (the sharded model).
template <class T>
struct Mlp {
  T w1, b1, w2, b2;  // w1 [hidden, in], b1 [hidden], w2 [out, hidden], b2 [out]
  std::vector<T*> parameters() { return {&w1, &b1, &w2, &b2}; }
};

const char* const kNames[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};

// One forward, the same code for Tensor and DTensor: Linear, relu, Linear (x W^T + b).
template <class T>
T hidden_of(const T& x, const Mlp<T>& m) {
  return relu(add(matmul(x, transpose(m.w1, 0, 1)), m.b1));
}
template <class T>
T output_of(const T& h, const Mlp<T>& m) {
  return add(matmul(h, transpose(m.w2, 0, 1)), m.b2);
}

// optimizer.step(); optimizer.zero_grad(): p -= lr * p.grad, then the gradient cleared.
template <class T>
void sgd_step(Mlp<T>& m) {
  autograd::NoGradGuard no_grad;
  for (T* p : m.parameters()) {
    p->copy_(sub(*p, mul(p->grad(), kLearningRate)));
    p->set_grad(T{});
  }
}

// The initial weights (nn.Linear's uniform(-1/sqrt(in), 1/sqrt(in))), the same on every rank.
Mlp<Tensor> initial_weights() {
  manual_seed(2024);
  const auto uniform = [](const Shape& shape, int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return sub(mul(rand(shape, DType::f64), 2 * bound), bound);
  };
  return {uniform({kHidden, kIn}, kIn), uniform({kHidden}, kIn), uniform({kOut, kHidden}, kHidden),
          uniform({kOut}, kHidden)};
}

// The batch of a step, the same on every rank: random inputs, and as targets a fixed function of
// them that the MLP can learn (a linear map through tanh), so the loss goes down.
std::pair<Tensor, Tensor> batch(int step) {
  manual_seed(7);
  const Tensor teacher = randn({kIn, kOut}, DType::f64);
  manual_seed(7000 + static_cast<uint64_t>(step));
  Tensor x = randn({kBatch, kIn}, DType::f64);
  return {x, tanh(matmul(x, teacher) * 0.5)};
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return amax(abs(sub(a, b))).item(); }

}  // namespace

int main(int argc, char** argv) {
  const int steps = parse_steps(argc, argv);
  std::atomic<bool> ok{true};
  const int status = run(argc, argv, [&] {
    const int n = world_size();
    const int64_t model_axis = n % 2 == 0 ? 2 : 1;
    std::vector<int> device_ids(static_cast<size_t>(n));
    std::iota(device_ids.begin(), device_ids.end(), 0);
    const DeviceMesh mesh = mesh_from_device_ids(device_ids, {n / model_axis, model_axis}, {"data", "model"});
    const bool speaker = rank() == 0;
    // Every rank checks the same full tensors; any failure fails the program.
    const auto check = [&](bool good, const std::string& what) {
      if (good) return;
      ok = false;
      std::printf("rank %d: MISMATCH: %s\n", rank(), what.c_str());
    };

    if (speaker) {
      std::printf("mesh %s, logical mesh (torch_xla get_logical_mesh):", mesh.to_string().c_str());
      for (const auto& row : logical_mesh(mesh)) {
        std::printf(" [");
        for (size_t i = 0; i < row.size(); ++i) std::printf("%s%d", i ? " " : "", row[i]);
        std::printf("]");
      }
      std::printf("\nMLP %lld -> %lld -> %lld, SGD lr %g, %d steps, f64\n\n", static_cast<long long>(kIn),
                  static_cast<long long>(kHidden), static_cast<long long>(kOut), kLearningRate, steps);
    }

    // The reference: plain Tensors, every rank computing the whole model alone.
    Mlp<Tensor> reference = initial_weights();
    for (Tensor* p : reference.parameters()) *p = p->clone().requires_grad_();

    // The sharded model: the same initial weights, annotated as torch_xla's example does. The
    // convention is nn.Linear's, weight [out, in]: fc1's rows (hidden) split over "model" (column
    // parallel), fc2's columns (hidden again, its contraction) split over "model" (row parallel).
    const Mlp<Tensor> initial = initial_weights();
    Mlp<DTensor> sharded{mark_sharding(initial.w1, mesh, P{"model", std::nullopt}),
                         mark_sharding(initial.b1, mesh, P{"model"}),
                         mark_sharding(initial.w2, mesh, P{std::nullopt, "model"}),
                         mark_sharding(initial.b2, mesh, P{})};
    for (DTensor* p : sharded.parameters()) p->requires_grad_();

    for (int step = 0; step < steps; ++step) {
      const auto [x, y] = batch(step);

      // Sharded: the batch split over "data"; the ops' sharding rules decide the rest.
      const DTensor xs = mark_sharding(x, mesh, P{"data", std::nullopt});
      const DTensor ys = mark_sharding(y, mesh, P{"data", std::nullopt});
      const DTensor h = hidden_of(xs, sharded);
      const DTensor out = output_of(h, sharded);
      const DTensor loss = mse_loss(out, ys);
      loss.backward();

      // Unsharded.
      const Tensor ref_loss = mse_loss(output_of(hidden_of(x, reference), reference), y);
      ref_loss.backward();

      if (speaker && step == 0) {
        std::printf("type_string of the sharded values (step 0):\n");
        std::printf("  %-12s %s\n", "input", type_string(xs).c_str());
        std::printf("  %-12s %s\n", "target", type_string(ys).c_str());
        for (size_t i = 0; i < 4; ++i)
          std::printf("  %-12s %s\n", kNames[i], type_string(*sharded.parameters()[i]).c_str());
        std::printf("  %-12s %s\n", "hidden", type_string(h).c_str());
        std::printf("  %-12s %s\n", "output", type_string(out).c_str());
        std::printf("  %-12s %s\n", "loss", type_string(loss).c_str());
        std::printf("  %-12s %s\n", "fc1 grad", type_string(sharded.w1.grad()).c_str());
        std::printf("  %-12s %s\n\n", "fc2 grad", type_string(sharded.w2.grad()).c_str());
      }

      // Loss and gradients against the reference.
      const double sharded_value = clear_sharding(loss.detach()).item(), reference_value = ref_loss.item();
      check(std::abs(sharded_value - reference_value) <= kTolerance * (1 + std::abs(reference_value)),
            "step " + std::to_string(step) + " loss " + std::to_string(sharded_value) + " vs " +
                std::to_string(reference_value));
      double grad_diff = 0;
      for (size_t i = 0; i < 4; ++i) {
        const Tensor got = clear_sharding(sharded.parameters()[i]->grad());
        const Tensor want = reference.parameters()[i]->grad();
        grad_diff = std::max(grad_diff, max_abs_diff(got, want));
        check(allclose(got, want, kTolerance, kTolerance),
              "step " + std::to_string(step) + " gradient of " + kNames[i]);
      }

      sgd_step(sharded);
      sgd_step(reference);

      // The updated weights, still laid out as annotated, against the reference.
      double weight_diff = 0;
      for (size_t i = 0; i < 4; ++i) {
        const DTensor& p = *sharded.parameters()[i];
        const Tensor got = clear_sharding(p.detach()), want = reference.parameters()[i]->detach();
        weight_diff = std::max(weight_diff, max_abs_diff(got, want));
        check(allclose(got, want, kTolerance, kTolerance),
              "step " + std::to_string(step) + " weight " + kNames[i] + " (" + type_string(p) + ")");
      }
      if (speaker)
        std::printf("step %d: loss %.12f (sharded) %.12f (unsharded); largest difference: gradients %.1e, "
                    "weights %.1e\n",
                    step, sharded_value, reference_value, grad_diff, weight_diff);
    }
    if (speaker) {
      std::printf("\nafter training, the weights are still laid out as annotated:\n");
      for (size_t i = 0; i < 4; ++i)
        std::printf("  %-12s %s\n", kNames[i], type_string(*sharded.parameters()[i]).c_str());
    }
  });
  if (status == 0)
    std::cout << (ok ? "xla_mlp: the sharded MLP trains exactly as the unsharded one\n" : "xla_mlp: MISMATCH\n");
  return status != 0 ? status : (ok ? 0 : 1);
}
