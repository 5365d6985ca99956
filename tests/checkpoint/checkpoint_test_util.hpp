#pragma once
// What the checkpoint tests share: a scratch directory every rank names alike, and sample values
// of every dtype from one formula (tests/interop/check_checkpoint.py recomputes it).
#include <unistd.h>

#include <filesystem>
#include <string>

#include <tessera/ops/ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::testing {

/// "/tmp/tessera-<name>-<pid of rank 0>" (shared under MPI), absent. Collective.
inline std::string shared_dir(const std::string& name) {
  int64_t pid = getpid();
  world().broadcast(&pid, 1, DType::i64, 0);
  const std::string dir = "/tmp/tessera-" + name + "-" + std::to_string(pid);
  if (rank() == 0) std::filesystem::remove_all(dir);
  world().barrier();
  return dir;
}

/// Removes a shared_dir once every rank is done with it. Collective.
inline void remove_shared(const std::string& dir) {
  world().barrier();
  if (rank() == 0) std::filesystem::remove_all(dir);
}

/// sin(0.61 i + phase) over the flat index i, in `dtype` (integers: trunc((v + 1) * 50); bool: v > 0).
inline Tensor sample_values(const Shape& shape, double phase, DType dtype) {
  const Tensor x = sin(add(mul(arange(shape.numel()).to(DType::f64), Scalar(0.61)), Scalar(phase))).reshape(shape);
  if (dtype == DType::b8) return gt(x, Scalar(0.0));
  if (dtype == DType::i64 || dtype == DType::i32 || dtype == DType::u8) return mul(add(x, Scalar(1.0)), Scalar(50.0)).to(dtype);
  return x.to(dtype);
}

}  // namespace tessera::testing
