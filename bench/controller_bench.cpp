// The single controller's per-op overhead against SPMD dispatch of the same op, in one run: a
// 4-worker mesh, `--ops` adds of a small sharded tensor. Controller: the time to enqueue each op
// (the controller's cost per call), and the time until the last one's result is fetched (the
// workers' throughput, per op). SPMD: the same adds called on every rank directly, per op (the
// slowest rank). Prints both and their ratios. Then streams: `--steps` steps of compute (matmuls
// on the main stream) and a transfer (an all-gather), both on the main stream one after the other,
// against the transfer on a second stream beside the compute. Nothing is asserted.
//
// Usage: tessera_controller_bench [--ops 20000] [--workers 4] [--steps 10] [--mib 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/tessera.hpp>

using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point start) { return std::chrono::duration<double, std::micro>(Clock::now() - start).count(); }

}  // namespace

int main(int argc, char** argv) {
  int ops = 20000, workers = 4, steps = 10, mib = 8;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--ops")) ops = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mib")) mib = std::atoi(argv[i + 1]);
  }
  // SPMD: every rank calls add directly.
  double spmd_us = 0;
  launch(workers, [&] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = ones({1024}, mesh, {Shard{0}});
    DTensor y;
    for (int i = 0; i < 100; ++i) y = add(x, x);  // warm-up (plans, caches)
    world().barrier();
    const auto start = Clock::now();
    for (int i = 0; i < ops; ++i) y = add(x, x);
    double us = us_since(start) / ops;
    world().all_reduce(&us, 1, DType::f64, ReduceOp::max);
    if (rank() == 0) spmd_us = us;
  });
  // Controller: the same adds issued as RemoteTensor ops.
  double enqueue_us = 0, complete_us = 0;
  std::string ranks = std::to_string(workers);
  char flag[] = "--ranks";
  char* worker_argv[] = {argv[0], flag, ranks.data(), nullptr};
  const int status = controller::run(3, worker_argv, [&] {
    const controller::WorkerMesh mesh({controller::num_workers()}, {"x"});
    const controller::RemoteTensor x = controller::ones({1024}, mesh, {Shard{0}});
    controller::RemoteTensor y;
    for (int i = 0; i < 100; ++i) y = controller::add(x, x);
    controller::fetch_shard(y, {0}).get();  // warm
    const auto start = Clock::now();
    for (int i = 0; i < ops; ++i) y = controller::add(x, x);
    enqueue_us = us_since(start) / ops;
    controller::fetch_shard(y, {0}).get();
    complete_us = us_since(start) / ops;
  });
  // Streams: compute and a transfer per step, on one stream or on two.
  double serial_ms = 0, overlapped_ms = 0;
  const int status_streams = controller::run(3, worker_argv, [&] {
    const int64_t n = controller::num_workers();
    const controller::WorkerMesh mesh({n}, {"x"});
    controller::Stream comm("comm");
    const auto w = controller::randn({256, 256}, mesh, {Replicate{}});
    const int64_t rows = int64_t{mib} * (1 << 20) / 4 / 1024;
    controller::RemoteTensor big_on_main = controller::randn({rows, 1024}, mesh, {Shard{0}}), big_on_comm;
    {
      auto on = comm.activate();
      big_on_comm = controller::randn({rows, 1024}, mesh, {Shard{0}});
    }
    const auto step = [&](bool two_streams) {
      controller::RemoteTensor moved;
      {
        auto on = two_streams ? comm.activate() : controller::Stream::main().activate();
        moved = controller::redistribute(two_streams ? big_on_comm : big_on_main, {Replicate{}});
      }
      controller::RemoteTensor y = w;
      for (int i = 0; i < 8; ++i) y = controller::tanh(controller::matmul(y, w));
      controller::fetch_shard(controller::sum(y), {0}).get();
      auto on = two_streams ? comm.activate() : controller::Stream::main().activate();
      controller::fetch_shard(controller::sum(moved), {0}).get();
    };
    for (const bool two : {false, true}) step(two);  // warm
    for (int round = 0; round < 2; ++round)
      for (const bool two : {false, true}) {
        const auto start = Clock::now();
        for (int s = 0; s < steps; ++s) step(two);
        (two ? overlapped_ms : serial_ms) += us_since(start) / 1000 / steps / 2;
      }
  });
  std::printf("%d adds of a [1024] f32 tensor sharded over %d workers / ranks (threads)\n\n", ops, workers);
  std::printf("%-40s %10s %14s\n", "", "us per op", "vs SPMD");
  std::printf("%-40s %10.2f %14s\n", "SPMD dispatch (slowest rank)", spmd_us, "1.00");
  std::printf("%-40s %10.2f %14.2f\n", "controller: enqueue (controller's cost)", enqueue_us, enqueue_us / spmd_us);
  std::printf("%-40s %10.2f %14.2f\n", "controller: issue to completion", complete_us, complete_us / spmd_us);
  std::printf("\nper step: 8 matmuls [256x256] on main and an all-gather of %d MiB, %d workers\n", mib, workers);
  std::printf("%-40s %10.2f %14s\n", "one stream (ms)", serial_ms, "1.00");
  std::printf("%-40s %10.2f %14.2f\n", "transfer on a second stream (ms)", overlapped_ms, overlapped_ms / serial_ms);
  return status != 0 ? status : status_streams;
}
