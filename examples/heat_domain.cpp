// heat_domain: domain parallelism (PhysicsNeMo ShardTensor) on a mesh of spatial tiles. On 4 ranks
// the mesh is 2 x 2 with axes ("y", "x"), and every grid below is sharded as (S(2), S(3)): rank
// (i, j) holds tile i of the rows and tile j of the columns, and no rank ever needs another's
// tile, only the halo rows and columns at its edges.
//
//   1. Heat: the 2-d heat equation u += alpha * laplacian(u) (explicit 5-point stencil, zero
//      Dirichlet boundary) on an uneven [1, 1, 515, 389] f64 grid, 20 steps, computed twice on
//      DTensors: with conv2d (a fixed 3x3 Laplacian kernel, padding 1: its halos bring the
//      corners too) and with halo_exchange directly (one row above and below, one column left and
//      right: no corners). Each step of both is checked against tessera::conv2d on the whole
//      Tensor, and the bytes each rank received per step (CommDebugMode) are printed next to the
//      halo lower bound: the grid points around its tile that the stencil reads (halo_exchange
//      must meet the 5-point bound exactly).
//   2. A small conv net, conv(1->4, 3x3) relu max_pool(2) conv(4->4, 3x3) relu interpolate(x2)
//      conv(4->1, 1x1), trained with SGD on an MSE loss on a domain-sharded [2, 1, 64, 48] input
//      (weights replicated), and trained identically on plain Tensors: every step the loss, the
//      gradients and the weights must match (f64, tolerance 1e-12).
//
// Exits 1 if a check fails. Run: heat_domain --ranks 4 [--mode nearest|bilinear] (threads), or
// mpirun -np 4 heat_domain. Another world size n gives the most square mesh (rows, cols) with
// rows * cols = n (1 x 1, 2 x 1, ...).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

using namespace tessera;

namespace {

// The heat grid: 515 x 389 splits unevenly over 2 x 2 (tiles of 258 or 257 rows, 195 or 194 columns).
constexpr int64_t kHeight = 515, kWidth = 389;
constexpr int kHeatSteps = 20;
constexpr double kAlpha = 0.2;  // explicit Euler on the 5-point Laplacian is stable for alpha <= 1/4

// The conv net: input [2, 1, 64, 48], 4 hidden channels.
constexpr int64_t kBatch = 2, kImageHeight = 64, kImageWidth = 48, kHidden = 4;
constexpr int kTrainSteps = 5;
constexpr double kLearningRate = 0.3;

// f64 and the same ops on both sides: only the order of some sums differs.
constexpr double kTolerance = 1e-12;

std::string parse_mode(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--mode")) return argv[i + 1];
  return "nearest";
}

// The most square mesh (rows, cols), rows * cols = world size, rows >= cols: 2 x 2 on 4 ranks.
DeviceMesh tile_mesh() {
  const int64_t n = world_size();
  int64_t cols = 1;
  for (int64_t c = 1; c * c <= n; ++c)
    if (n % c == 0) cols = c;
  return DeviceMesh({n / cols, cols}, {"y", "x"});
}

// --- 1. heat ------------------------------------------------------------------------------------

// The 5-point Laplacian as a 3x3 convolution kernel [1, 1, 3, 3].
Tensor laplacian_kernel() {
  return from_vector(std::vector<double>{0, 1, 0, 1, -4, 1, 0, 1, 0}, Shape{1, 1, 3, 3});
}

// One explicit step on the whole grid, the reference: zero padding is the Dirichlet boundary.
Tensor heat_step(const Tensor& u, const Tensor& kernel) {
  return add(u, mul(conv2d(u, kernel, std::nullopt, {1}, {1}), kAlpha));
}

// The same step on the tiles through the sharded conv2d (halos of the 3x3 window, corners included).
DTensor heat_step(const DTensor& u, const DTensor& kernel) {
  return add(u, mul(conv2d(u, kernel, std::nullopt, {1}, {1}), kAlpha));
}

// The same step with halo_exchange: the rows above and below and the columns left and right of
// this rank's tile (zeros beyond the grid), the 5-point stencil on them, no corners needed.
DTensor heat_step_halo(const DTensor& u) {
  const Tensor local = u.to_local();
  const int64_t rows = local.shape()[2], cols = local.shape()[3];
  const Tensor vertical = halo_exchange(u, 2, 1, 1);    // [1, 1, rows + 2, cols]
  const Tensor horizontal = halo_exchange(u, 3, 1, 1);  // [1, 1, rows, cols + 2]
  const Tensor laplacian = sub(add(add(vertical.narrow(2, 0, rows), vertical.narrow(2, 2, rows)),
                                   add(horizontal.narrow(3, 0, cols), horizontal.narrow(3, 2, cols))),
                               mul(local, 4.0));
  return DTensor(add(local, mul(laplacian, kAlpha)), u.device_mesh(), u.layout());
}

// What a tile [rb, re) x [cb, ce) of an H x W grid must receive for one stencil step: the grid
// points of its 1-wide ring that lie inside the grid, with the 4 corner points (3x3 window) or
// without them (5-point stencil).
struct HaloBound {
  int64_t window3x3 = 0, five_point = 0;
};
HaloBound halo_bound(const Block& tile, int64_t height, int64_t width) {
  const int64_t rows = tile.end[2] - tile.begin[2], cols = tile.end[3] - tile.begin[3];
  if (rows == 0 || cols == 0) return {};
  const int64_t ring_rows = std::min(tile.end[2] + 1, height) - std::max<int64_t>(tile.begin[2] - 1, 0);
  const int64_t ring_cols = std::min(tile.end[3] + 1, width) - std::max<int64_t>(tile.begin[3] - 1, 0);
  return {ring_rows * ring_cols - rows * cols, (ring_rows - rows) * cols + (ring_cols - cols) * rows};
}

// Per rank: bytes received and sent per step (the largest over the steps, and whether all steps
// moved the same), and calls per step.
struct StepBytes {
  int64_t received = 0, sent = 0, calls = 0;
  bool steady = true;
  void record(const CommDebugMode& mode, int step) {
    const int64_t r = mode.total_bytes_received(), s = mode.total_bytes_sent(), c = mode.total_count();
    if (step > 0 && (r != received || s != sent || c != calls)) steady = false;
    received = std::max(received, r), sent = std::max(sent, s), calls = std::max(calls, c);
  }
};

// Every rank's row of numbers, on every rank (a sum of one-hot rows: one small all_reduce).
std::vector<double> gather_rows(const std::vector<double>& mine) {
  const size_t width = mine.size();
  std::vector<double> all(width * static_cast<size_t>(world_size()), 0.0);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(width * static_cast<size_t>(rank())));
  world().all_reduce(all.data(), static_cast<int64_t>(all.size()), DType::f64, ReduceOp::sum);
  return all;
}

double all_max(double value) {
  world().all_reduce(&value, 1, DType::f64, ReduceOp::max);
  return value;
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return amax(abs(sub(a, b))).item(); }

// This rank's tile of a whole grid.
Tensor tile_of(const Tensor& whole, const Block& tile) {
  Tensor t = whole;
  for (int64_t d = 0; d < whole.ndim(); ++d) t = t.narrow(d, tile.begin[d], tile.end[d] - tile.begin[d]);
  return t;
}

// Runs the heat equation three ways; returns false on a mismatch.
bool heat(const DeviceMesh& mesh, bool speaker) {
  autograd::NoGradGuard no_grad;
  const Placements tiles{Shard{2}, Shard{3}};
  const Tensor kernel = laplacian_kernel();
  // The initial temperature: random, held by rank 0 only and scattered (each rank gets its tile).
  manual_seed(11);
  const Tensor u0 = rand({1, 1, kHeight, kWidth}, DType::f64);
  DTensor u_conv = scatter_tensor(rank() == 0 ? u0 : Tensor{}, 0, mesh, tiles);
  DTensor u_halo = u_conv;
  const DTensor kernel_d = distribute_tensor(kernel, mesh, {Replicate{}, Replicate{}});
  const Block tile = u_conv.layout().block(mesh.coordinate());
  if (speaker)
    std::printf("1. heat: u += %g * laplacian(u), zero boundary, %d steps, on %s\n\n", kAlpha, kHeatSteps,
                u_conv.layout().to_string().c_str());

  Tensor reference = u0;
  StepBytes conv_bytes, halo_bytes;
  double conv_diff = 0, halo_diff = 0;
  for (int step = 0; step < kHeatSteps; ++step) {
    {
      CommDebugMode mode;
      u_conv = heat_step(u_conv, kernel_d);
      conv_bytes.record(mode, step);
    }
    {
      CommDebugMode mode;
      u_halo = heat_step_halo(u_halo);
      halo_bytes.record(mode, step);
    }
    // Every rank checks its own tiles against the same tile of the whole grid: no gathering.
    reference = heat_step(reference, kernel);
    const Tensor want = tile_of(reference, tile);
    conv_diff = std::max(conv_diff, max_abs_diff(u_conv.to_local(), want));
    halo_diff = std::max(halo_diff, max_abs_diff(u_halo.to_local(), want));
  }
  const bool layout_kept = u_conv.layout() == u_halo.layout() && u_conv.placements() == tiles;

  const HaloBound bound = halo_bound(tile, kHeight, kWidth);
  const std::vector<double> mine{static_cast<double>(tile.begin[2]), static_cast<double>(tile.end[2]),
                                 static_cast<double>(tile.begin[3]), static_cast<double>(tile.end[3]),
                                 static_cast<double>(conv_bytes.received), static_cast<double>(conv_bytes.sent),
                                 static_cast<double>(conv_bytes.calls), static_cast<double>(bound.window3x3 * 8),
                                 static_cast<double>(halo_bytes.received), static_cast<double>(halo_bytes.sent),
                                 static_cast<double>(halo_bytes.calls), static_cast<double>(bound.five_point * 8),
                                 conv_bytes.steady && halo_bytes.steady ? 1.0 : 0.0};
  const std::vector<double> rows = gather_rows(mine);
  conv_diff = all_max(conv_diff), halo_diff = all_max(halo_diff);
  // halo_exchange sends exactly the rows a neighbour needs: the 5-point bound, byte for byte.
  bool exact = true;
  for (int r = 0; r < world_size(); ++r)
    exact = exact && rows[static_cast<size_t>(r) * mine.size() + 8] == rows[static_cast<size_t>(r) * mine.size() + 11];
  const bool good = conv_diff <= kTolerance && halo_diff <= kTolerance && layout_kept && exact;
  if (!speaker) return good;

  // got / bound, and "-" where a tile needs nothing (a 1 x 1 mesh).
  const auto ratio = [](double got, double bound) { return bound > 0 ? got / bound : (got > 0 ? INFINITY : 1.0); };
  const auto ratio_text = [&](double got, double bound) {
    char text[16];
    if (bound == 0 && got == 0) return std::string("    -");
    std::snprintf(text, sizeof text, "%5.3f", ratio(got, bound));
    return std::string(text);
  };
  std::printf("bytes each rank received per step (CommDebugMode), next to the halo lower bound (f64 grid points\n"
              "around its tile that one step reads):\n\n");
  std::printf("                                       conv2d, 3x3 window                halo_exchange, 5-point\n");
  std::printf("rank  tile rows x cols          calls  received     bound  ratio   calls  received     bound  ratio\n");
  bool steady = true;
  double worst_conv = 0, worst_halo = 0, balance = 0;  // balance: bytes sent minus bytes received, all ranks
  for (int r = 0; r < world_size(); ++r) {
    const double* v = &rows[static_cast<size_t>(r) * mine.size()];
    char extent[64];
    std::snprintf(extent, sizeof extent, "[%lld, %lld) x [%lld, %lld)", static_cast<long long>(v[0]),
                  static_cast<long long>(v[1]), static_cast<long long>(v[2]), static_cast<long long>(v[3]));
    std::printf("%4d  %-24s %5lld  %8lld  %8lld  %s   %5lld  %8lld  %8lld  %s\n", r, extent,
                static_cast<long long>(v[6]), static_cast<long long>(v[4]), static_cast<long long>(v[7]),
                ratio_text(v[4], v[7]).c_str(), static_cast<long long>(v[10]), static_cast<long long>(v[8]),
                static_cast<long long>(v[11]), ratio_text(v[8], v[11]).c_str());
    steady = steady && v[12] == 1.0;
    worst_conv = std::max(worst_conv, ratio(v[4], v[7]));
    worst_halo = std::max(worst_halo, ratio(v[8], v[11]));
    balance += v[5] + v[9] - v[4] - v[8];
  }
  std::printf("\n%s; %s. Largest ratio: conv2d %.3f, halo_exchange %.3f.\n",
              steady ? "the same every step" : "NOT the same every step (the largest step shown)",
              balance == 0 ? "the ranks sent as many bytes as they received" : "sent and received DIFFER",
              worst_conv, worst_halo);
  std::printf("after %d steps, largest difference from the unsharded conv2d: %.1e (conv2d on tiles), %.1e "
              "(halo_exchange)%s%s\n\n",
              kHeatSteps, conv_diff, halo_diff, layout_kept ? "" : "; the layout CHANGED",
              exact ? "" : "; halo_exchange moved MORE than the 5-point bound");
  if (!good) std::printf("rank 0: MISMATCH in the heat equation\n");
  return good;
}

// --- 2. conv net -----------------------------------------------------------------------------------

// The parameters, as Tensors (the reference) or DTensors (replicated, for the sharded model).
template <class T>
struct ConvNet {
  T w1, b1, w2, b2, w3, b3;  // [4, 1, 3, 3] [4], [4, 4, 3, 3] [4], [1, 4, 1, 1] [1]
  std::vector<T*> parameters() { return {&w1, &b1, &w2, &b2, &w3, &b3}; }
};
const char* const kNames[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "conv3.weight", "conv3.bias"};

// The forward, the same code for Tensor and DTensor. `trace` (if given) gets each stage's value.
template <class T>
T forward(const T& x, const ConvNet<T>& m, std::string_view mode, std::vector<T>* trace = nullptr) {
  const auto keep = [&](T v) {
    if (trace) trace->push_back(v);
    return v;
  };
  T h = keep(relu(conv2d(x, m.w1, m.b1, {1}, {1})));
  h = keep(max_pool2d(h, {2}));
  h = keep(relu(conv2d(h, m.w2, m.b2, {1}, {1})));
  h = keep(interpolate(h, {kImageHeight, kImageWidth}, mode));
  return keep(conv2d(h, m.w3, m.b3));
}
const char* const kStages[] = {"conv1+relu", "max_pool2d", "conv2+relu", "interpolate", "conv3"};

// p -= lr * p.grad, then the gradient cleared.
template <class T>
void sgd_step(ConvNet<T>& m) {
  autograd::NoGradGuard no_grad;
  for (T* p : m.parameters()) {
    p->copy_(sub(*p, mul(p->grad(), kLearningRate)));
    p->set_grad(T{});
  }
}

// nn.Conv2d's initial weights (uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))), the same on every rank.
ConvNet<Tensor> initial_weights() {
  manual_seed(2025);
  const auto uniform = [](const Shape& shape, int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return sub(mul(rand(shape, DType::f64), 2 * bound), bound);
  };
  return {uniform({kHidden, 1, 3, 3}, 9),       uniform({kHidden}, 9), uniform({kHidden, kHidden, 3, 3}, kHidden * 9),
          uniform({kHidden}, kHidden * 9), uniform({1, kHidden, 1, 1}, kHidden), uniform({1}, kHidden)};
}

// The batch of a step, the same on every rank: random images, and as targets a fixed blur of
// them (a 3x3 binomial filter) that the net can learn.
std::pair<Tensor, Tensor> batch(int step) {
  manual_seed(900 + static_cast<uint64_t>(step));
  const Tensor x = randn({kBatch, 1, kImageHeight, kImageWidth}, DType::f64);
  const Tensor blur = from_vector(std::vector<double>{1, 2, 1, 2, 4, 2, 1, 2, 1}, Shape{1, 1, 3, 3});
  return {x, conv2d(x, mul(blur, 1.0 / 16), std::nullopt, {1}, {1})};
}

bool conv_net(const DeviceMesh& mesh, bool speaker, std::string_view mode) {
  const Placements tiles{Shard{2}, Shard{3}};
  bool good = true;
  const auto check = [&](bool ok, const std::string& what) {
    if (ok) return;
    good = false;
    std::printf("rank %d: MISMATCH: %s\n", rank(), what.c_str());
  };

  ConvNet<Tensor> reference = initial_weights();
  for (Tensor* p : reference.parameters()) *p = p->clone().requires_grad_();
  const ConvNet<Tensor> initial = initial_weights();
  ConvNet<DTensor> sharded;
  {
    ConvNet<Tensor> copy = initial;
    std::vector<Tensor*> from = copy.parameters();
    std::vector<DTensor*> to = sharded.parameters();
    for (size_t i = 0; i < from.size(); ++i)
      *to[i] = distribute_tensor(*from[i], mesh, {Replicate{}, Replicate{}}).requires_grad_();
  }
  if (speaker)
    std::printf("2. conv net: conv2d 1->%lld 3x3, relu, max_pool2d 2, conv2d %lld->%lld 3x3, relu, interpolate [%lld, "
                "%lld] %s, conv2d %lld->1 1x1;\n   MSE against a blur of the input, SGD lr %g, %d steps, f64\n\n",
                static_cast<long long>(kHidden), static_cast<long long>(kHidden), static_cast<long long>(kHidden),
                static_cast<long long>(kImageHeight), static_cast<long long>(kImageWidth), std::string(mode).c_str(),
                static_cast<long long>(kHidden), kLearningRate, kTrainSteps);

  for (int step = 0; step < kTrainSteps; ++step) {
    const auto [x, y] = batch(step);
    const DTensor xs = distribute_tensor(x, mesh, tiles), ys = distribute_tensor(y, mesh, tiles);

    std::vector<DTensor> trace;
    std::optional<CommDebugMode> comm;
    comm.emplace();
    const DTensor out = forward(xs, sharded, mode, &trace);
    const DTensor loss = mse_loss(out, ys);
    loss.backward();
    const int64_t received = comm->total_bytes_received(), calls = comm->total_count();
    const std::string table = comm->to_string();
    comm.reset();

    std::vector<Tensor> ref_trace;
    const Tensor ref_loss = mse_loss(forward(x, reference, mode, &ref_trace), y);
    ref_loss.backward();

    if (step == 0) {
      // Each stage's tiles against the same tiles of the unsharded stage (no gathering).
      for (size_t s = 0; s < trace.size(); ++s) {
        const Tensor want = tile_of(ref_trace[s], trace[s].layout().block(mesh.coordinate()));
        check(allclose(trace[s].to_local(), want, kTolerance, kTolerance), std::string("forward stage ") + kStages[s]);
      }
      if (speaker) {
        std::printf("layouts of the forward (step 0):\n  %-12s %s\n", "input", xs.layout().to_string().c_str());
        for (size_t s = 0; s < trace.size(); ++s)
          std::printf("  %-12s %s\n", kStages[s], trace[s].layout().to_string().c_str());
        std::printf("  %-12s %s\n\n", "loss", loss.layout().to_string().c_str());
        std::printf("rank 0's communication in one training step (forward and backward):\n%s\n\n", table.c_str());
      }
    }

    const double sharded_value = loss.full_tensor().item(), reference_value = ref_loss.item();
    check(std::abs(sharded_value - reference_value) <= kTolerance * (1 + std::abs(reference_value)),
          "step " + std::to_string(step) + " loss " + std::to_string(sharded_value) + " vs " +
              std::to_string(reference_value));
    double grad_diff = 0;
    for (size_t i = 0; i < 6; ++i) {
      const Tensor got = sharded.parameters()[i]->grad().full_tensor();
      const Tensor want = reference.parameters()[i]->grad();
      grad_diff = std::max(grad_diff, max_abs_diff(got, want));
      check(allclose(got, want, kTolerance, kTolerance), "step " + std::to_string(step) + " gradient of " + kNames[i]);
    }

    sgd_step(sharded);
    sgd_step(reference);

    double weight_diff = 0;
    for (size_t i = 0; i < 6; ++i) {
      const DTensor& p = *sharded.parameters()[i];
      const Tensor got = p.detach().full_tensor(), want = reference.parameters()[i]->detach();
      weight_diff = std::max(weight_diff, max_abs_diff(got, want));
      check(allclose(got, want, kTolerance, kTolerance) && p.layout().is_replicated(),
            "step " + std::to_string(step) + " weight " + kNames[i] + " (" + p.layout().to_string() + ")");
    }
    grad_diff = all_max(grad_diff), weight_diff = all_max(weight_diff);
    const double most_received = all_max(static_cast<double>(received));
    if (speaker)
      std::printf("step %d: loss %.12f (sharded) %.12f (unsharded); largest difference: gradients %.1e, weights "
                  "%.1e; %lld calls, at most %.0f bytes received by a rank\n",
                  step, sharded_value, reference_value, grad_diff, weight_diff, static_cast<long long>(calls),
                  most_received);
  }
  if (speaker) std::printf("\n");
  return good;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = parse_mode(argc, argv);
  std::atomic<bool> ok{true};
  const int status = run(argc, argv, [&] {
    const DeviceMesh mesh = tile_mesh();
    const bool speaker = rank() == 0;
    if (speaker) std::printf("mesh %s, every grid sharded as (S(2), S(3)): one spatial tile per rank\n\n",
                             mesh.to_string().c_str());
    if (!heat(mesh, speaker)) ok = false;
    if (!conv_net(mesh, speaker, mode)) ok = false;
  });
  if (status == 0)
    std::cout << (ok ? "heat_domain: the tiled heat equation and conv net equal the unsharded ones\n"
                     : "heat_domain: MISMATCH\n");
  return status != 0 ? status : (ok ? 0 : 1);
}
