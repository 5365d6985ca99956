// conv2d forward throughput (f32) of the two algorithms of tessera/ops/convolution.cpp against the ceiling
// that matters, measured in the same run:
//
//  * im2col: unfold the input into [C/g * KH * KW, H_out * W_out] chunks and multiply each by the
//    group's [O/g, C/g * KH * KW] weight with cblas_sgemm;
//  * direct: the blocked loop (output channels in blocks, input rows streamed through them);
//  * sgemm: cblas_sgemm alone on preallocated buffers of the same matrix product (M = O/g,
//    N = H_out * W_out, K = C/g * KH * KW, once per group): what im2col would reach if unfolding
//    were free.
//  * sgemm/chunk: the same product in the column chunks im2col multiplies (about 2 MiB of the
//    [K, N] matrix each, stored contiguously): the ceiling of im2col itself. One sgemm over the
//    whole [K, N] matrix can be slower than the chunks: its rows are N floats apart, and for
//    N = 16384 (a 64 KiB, power-of-two stride) OpenBLAS packs them slowly.
// GFLOP/s count 2 * N * O * H_out * W_out * C/g * KH * KW flops (padding taps included, as every
// conv counts them); ratio = GFLOP/s(im2col) / GFLOP/s(sgemm), goal >= 0.8 on the first shape;
// ratio/chunk = GFLOP/s(im2col) / GFLOP/s(sgemm/chunk).
// "auto" is the algorithm ConvAlgorithm::automatic picks (detail::chosen_conv_algorithm).
//
// Everything runs on one thread (BLAS gets tessera::blas_threads(), 1 unless TESSERA_BLAS_THREADS
// says otherwise), and then the times are the thread's CPU time, which other jobs sharing the
// cores do not inflate; each number is the median of the repetitions.
// Usage: tessera_conv_bench [min seconds per measurement, default 0.3]
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tessera/ops/detail/conv_forward.hpp>
#include <tessera/tessera.hpp>
#include <vector>

using namespace tessera;

namespace {

struct ConvShape {
  const char* label;
  int64_t batch, in_channels, height, width, out_channels, kernel, stride, padding, groups;
};

const std::vector<ConvShape> kShapes = {
    {"64->64 3x3 128x128", 1, 64, 128, 128, 64, 3, 1, 1, 1},
    {"128->128 3x3 32x32", 1, 128, 32, 32, 128, 3, 1, 1, 1},
    {"256->256 1x1 28x28", 1, 256, 28, 28, 256, 1, 1, 0, 1},
    {"3->32 3x3 s2 224x224", 1, 3, 224, 224, 32, 3, 2, 1, 1},
    {"16->16 3x3 64x64", 1, 16, 64, 64, 16, 3, 1, 1, 1},
    {"64->64 3x3 g8 56x56", 1, 64, 56, 56, 64, 3, 1, 1, 8},
    {"32->32 3x3 g16 28x28", 1, 32, 28, 28, 32, 3, 1, 1, 16},
    {"1->1 3x3 32x32", 1, 1, 32, 32, 1, 3, 1, 1, 1},
    {"depthwise 64 3x3 56x56", 1, 64, 56, 56, 64, 3, 1, 1, 64},
    {"depthwise 128 3x3 14x14", 1, 128, 14, 14, 128, 3, 1, 1, 128},
    {"depthwise 32 3x3 s2 64x64", 1, 32, 64, 64, 32, 3, 2, 1, 32},
    {"depthwise 32 5x5 64x64", 1, 32, 64, 64, 32, 5, 1, 2, 32},
    {"depthwise 32 5x5 s2 64x64", 1, 32, 64, 64, 32, 5, 2, 2, 32},
    {"depthwise 32 7x7 112x112", 1, 32, 112, 112, 32, 7, 1, 3, 32},
};

// Columns per GEMM when im2col unfolds in chunks: about 2 MiB of f32 [K, cols] (kColBytes and
// kMinChunkCols in tessera/ops/convolution.cpp), for the chunked sgemm baseline.
int64_t chunk_cols(int64_t k, int64_t n) { return std::min(std::max<int64_t>((int64_t{1} << 21) / 4 / k, 256), n); }

double seconds_now(bool cpu_time) {
  if (cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of one call of f: one warm-up call, then repetitions of batches of calls until
// min_seconds have passed (at least 5 repetitions).
double measure(const std::function<void()>& f, double min_seconds, bool cpu_time) {
  f();
  double t0 = seconds_now(cpu_time);
  f();
  const double once = std::max(seconds_now(cpu_time) - t0, 1e-7);
  const int per_rep = std::max(1, static_cast<int>(min_seconds / 5 / once));
  std::vector<double> reps;
  const double start = seconds_now(cpu_time);
  while (reps.size() < 5 || seconds_now(cpu_time) - start < min_seconds) {
    t0 = seconds_now(cpu_time);
    for (int i = 0; i < per_rep; ++i) f();
    reps.push_back((seconds_now(cpu_time) - t0) / per_rep);
  }
  std::sort(reps.begin(), reps.end());
  return reps[reps.size() / 2];
}

Tensor random(const Shape& shape, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return from_vector(v, shape);
}

const char* algorithm_name(ConvAlgorithm a) {
  return a == ConvAlgorithm::im2col ? "im2col" : a == ConvAlgorithm::direct ? "direct" : "auto";
}

}  // namespace

int main(int argc, char** argv) {
  const double min_seconds = argc > 1 ? std::atof(argv[1]) : 0.3;
  const int threads = blas_threads();
  openblas_set_num_threads(threads);
  const bool cpu_time = threads == 1;
  std::printf("conv2d forward f32, batch 1, %d BLAS thread(s), %s time, median of repetitions\n", threads,
              cpu_time ? "thread CPU" : "wall-clock");
  std::printf("ratio = GFLOP/s(im2col) / GFLOP/s(cblas_sgemm of the same [O/g, K] x [K, P] product); goal >= 0.8\n\n");
  std::printf("%-26s %5s %5s %6s %7s %8s %8s %8s %8s %6s %7s %7s\n", "shape", "M=O/g", "K", "N=P", "GFLOP", "im2col",
              "direct", "sgemm", "sgemm/ch", "ratio", "ratio/ch", "auto");
  for (const ConvShape& s : kShapes) {
    const Tensor x = random({s.batch, s.in_channels, s.height, s.width}, 1);
    const Tensor w = random({s.out_channels, s.in_channels / s.groups, s.kernel, s.kernel}, 2);
    const int64_t oh = (s.height + 2 * s.padding - s.kernel) / s.stride + 1;
    const int64_t ow = (s.width + 2 * s.padding - s.kernel) / s.stride + 1;
    const int64_t m = s.out_channels / s.groups, k = s.in_channels / s.groups * s.kernel * s.kernel, n = oh * ow;
    const double flops = 2.0 * static_cast<double>(s.batch * s.groups * m * k * n);
    const auto conv = [&](ConvAlgorithm a) {
      return [&, a] { detail::conv_forward(x, w, std::nullopt, {s.stride}, {s.padding}, {1}, s.groups, a); };
    };
    const double t_im2col = measure(conv(ConvAlgorithm::im2col), min_seconds, cpu_time);
    const double t_direct = measure(conv(ConvAlgorithm::direct), min_seconds, cpu_time);
    // The same products on preallocated buffers: weight [O/g, K], unfolded input [K, N], out [O/g, N].
    std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
        c(static_cast<size_t>(m * n));
    const auto sgemm = [&](int64_t cols, const float* bp, int64_t ldb, float* cp) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(cols),
                  static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), bp, static_cast<int>(ldb), 0.0f, cp,
                  static_cast<int>(n));
    };
    const double t_gemm = measure(
        [&] {
          for (int64_t g = 0; g < s.batch * s.groups; ++g) sgemm(n, b.data(), n, c.data());
        },
        min_seconds, cpu_time);
    const int64_t chunk = chunk_cols(k, n);
    const double t_chunks = measure(
        [&] {
          for (int64_t g = 0; g < s.batch * s.groups; ++g)
            for (int64_t p0 = 0; p0 < n; p0 += chunk) {
              const int64_t cols = std::min(chunk, n - p0);
              sgemm(cols, b.data() + p0 * k, cols, c.data() + p0);
            }
        },
        min_seconds, cpu_time);
    const ConvAlgorithm chosen = detail::chosen_conv_algorithm(w.shape(), {s.stride}, s.groups);
    std::printf("%-26s %5lld %5lld %6lld %7.4f %8.1f %8.1f %8.1f %8.1f %6.2f %7.2f %7s\n", s.label,
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), flops * 1e-9,
                flops / t_im2col * 1e-9, flops / t_direct * 1e-9, flops / t_gemm * 1e-9, flops / t_chunks * 1e-9,
                t_gemm / t_im2col, t_chunks / t_im2col, algorithm_name(chosen));
  }
  return 0;
}
