// Checkpoint throughput per rank: checkpoint::save and checkpoint::load of sharded tensors, as a
// ratio of the same bytes written (read) by each rank with one write(2) (read(2)) to a file of its
// own, measured in the same run (the goal: >= 0.7). Two shapes of state: one big tensor
// per rank, and a model-like map of many smaller ones (per-file and metadata costs show there).
//
//   tessera_checkpoint_bench [--ranks 4] [--mib 256] [--tensors 1,8,64] [--zstd 0] [--no-sync] [--dir /tmp/...]
//   mpirun -np 4 tessera_checkpoint_bench
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <tessera/checkpoint/checkpoint.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/runtime/runtime.hpp>

#include "bench_util.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct Options {
  int64_t mib = 256;                       // bytes per rank, all tensors together
  std::vector<int64_t> tensors{1, 8, 64};  // how many tensors share them
  int iters = 5;
  int zstd = 0;
  bool sync = true;  // save's sync_files, and an fsync after the baseline's write
  std::string dir = "/tmp/tessera-checkpoint-bench";
  std::string json;
  int ranks = 0;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Seconds `body` takes on the slowest rank (barriers around it).
template <class F>
double timed(F&& body) {
  world().barrier();
  const double start = now();
  body();
  world().barrier();
  double elapsed = now() - start;
  world().all_reduce(&elapsed, 1, DType::f64, ReduceOp::max);
  return elapsed;
}

// The baseline: this rank's bytes in one write(2) to a new file of its own (and one fsync when
// save syncs too), and back in one read(2).
void write_once(const std::string& path, const void* data, size_t bytes, bool sync) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  TESSERA_CHECK(fd >= 0 && ::write(fd, data, bytes) == static_cast<ssize_t>(bytes) && (!sync || ::fsync(fd) == 0),
                Error, "checkpoint_bench", "cannot write ", path);
  ::close(fd);
}
void read_once(const std::string& path, void* data, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  TESSERA_CHECK(fd >= 0 && ::read(fd, data, bytes) == static_cast<ssize_t>(bytes), Error, "checkpoint_bench",
                "cannot read ", path);
  ::close(fd);
}

void bench(const Options& options, const char* argv0) {
  const int n = world_size();
  const DeviceMesh mesh({n}, {"dp"});
  nlohmann::json results = nlohmann::json::array();
  if (rank() == 0) {
    std::printf("checkpoint throughput per rank, %d ranks (%s), %lld MiB per rank, zstd level %d, %s, dir %s\n", n,
                bench_util::backend_name(), static_cast<long long>(options.mib), options.zstd,
                options.sync ? "fsync (save and baseline)" : "no fsync", options.dir.c_str());
    std::printf("%-9s %12s %12s %12s %12s %8s %8s\n", "tensors", "write MiB/s", "save MiB/s", "read MiB/s",
                "load MiB/s", "save/w", "load/r");
  }
  for (const int64_t count : options.tensors) {
    // `count` tensors [rows * n, 256] f32, Shard(0): each rank holds mib / count MiB of each.
    const int64_t cols = 256;
    const int64_t rows = std::max<int64_t>(1, (options.mib << 20) / count / (cols * 4));
    std::map<std::string, DTensor> state;
    for (int64_t t = 0; t < count; ++t) {
      const Tensor local = full({rows, cols}, Scalar(static_cast<double>(t + rank())), DType::f32);
      state.emplace("layer" + std::to_string(t) + ".weight", DTensor::from_local(local, mesh, {Shard{0}}));
    }
    const int64_t bytes = count * rows * cols * 4;  // per rank
    std::vector<char> buffer(static_cast<size_t>(bytes));
    size_t offset = 0;  // the baseline writes the same bytes
    for (const auto& [name, value] : state) {
      const Tensor local = value.to_local();
      std::memcpy(buffer.data() + offset, local.raw_data(), static_cast<size_t>(local.nbytes()));
      offset += static_cast<size_t>(local.nbytes());
    }

    // As a training run saves: each iteration into a new directory (step<i>), the baseline into a
    // new file; everything removed after the case, untimed. (Saving over one directory again and
    // again would time ext4 freeing and reallocating inodes more than writing.) Interleaved (write,
    // save, read, load) per iteration, so that drifts of the page cache weigh on both; medians.
    const std::string raw_dir = options.dir + "/raw";
    if (rank() == 0) fs::create_directories(raw_dir);
    world().barrier();
    checkpoint::SaveOptions save_options;
    save_options.zstd_level = options.zstd;
    save_options.sync_files = options.sync;
    std::vector<double> writes, saves, reads, loads, save_ratios, load_ratios;
    for (int i = -1; i < options.iters; ++i) {  // -1: a warm-up round, not counted
      const std::string path = raw_dir + "/rank" + std::to_string(rank()) + "." + std::to_string(i + 1);
      const std::string step = options.dir + "/step" + std::to_string(i + 1);
      writes.push_back(timed([&] { write_once(path, buffer.data(), buffer.size(), options.sync); }));
      saves.push_back(timed([&] { checkpoint::save(step, state, save_options); }));
      reads.push_back(timed([&] { read_once(path, buffer.data(), buffer.size()); }));
      loads.push_back(timed([&] { checkpoint::load(step, state); }));
      save_ratios.push_back(writes.back() / saves.back());
      load_ratios.push_back(reads.back() / loads.back());
      if (i < 0) writes.clear(), saves.clear(), reads.clear(), loads.clear(), save_ratios.clear(), load_ratios.clear();
    }
    const double write_s = bench_util::median(writes), save_s = bench_util::median(saves);
    const double read_s = bench_util::median(reads), load_s = bench_util::median(loads);
    const double save_ratio = bench_util::median(save_ratios), load_ratio = bench_util::median(load_ratios);
    world().barrier();
    if (rank() == 0) fs::remove_all(options.dir);
    const double mib = static_cast<double>(bytes) / (1 << 20);
    if (rank() == 0) {
      std::printf("%-9lld %12.0f %12.0f %12.0f %12.0f %8.2f %8.2f\n", static_cast<long long>(count), mib / write_s,
                  mib / save_s, mib / read_s, mib / load_s, save_ratio, load_ratio);
      results.push_back({{"tensors", count},
                         {"mib_per_rank", mib},
                         {"write_s", write_s},
                         {"save_s", save_s},
                         {"read_s", read_s},
                         {"load_s", load_s},
                         {"save_over_write", save_ratio},
                         {"load_over_read", load_ratio}});
    }
  }
  if (rank() == 0)
    bench_util::write_json({{"ranks", n}, {"backend", bench_util::backend_name()}, {"zstd", options.zstd}, {"sync", options.sync}, {"results", results}},
                           options.json, argv0, "checkpoint_bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Tessera checkpoints: save / load throughput per rank against one write / read per rank"};
  app.add_option("--mib", options.mib, "bytes per rank, in MiB")->check(CLI::PositiveNumber);
  app.add_option("--tensors", options.tensors, "numbers of tensors sharing those bytes (comma separated)")->delimiter(',');
  app.add_option("--iters", options.iters, "timed iterations per case (median)")->check(CLI::PositiveNumber);
  app.add_option("--zstd", options.zstd, "zstd level of the chunks (0: raw)");
  app.add_flag("!--no-sync", options.sync, "neither save nor the baseline fsyncs");
  app.add_option("--dir", options.dir, "where the checkpoint goes (a file system every rank sees)");
  app.add_option("--json", options.json, "JSON output (default: next to the binary)");
  app.add_option("--ranks", options.ranks, "threads backend: number of ranks (read by tessera::run)");
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tessera::run(argc, argv, [&] { bench(options, argv[0]); });
}
