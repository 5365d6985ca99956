#pragma once
// Running a test body on ranks, the same way on both backends (tests/rank_main.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::testing {

/// True when this test binary runs as MPI processes (mpirun, or TESSERA_BACKEND=mpi).
inline bool under_mpi() {
  const char* forced = std::getenv("TESSERA_BACKEND");
  if (forced && *forced) return std::string_view(forced) == "mpi";
  return mpi::launched_by_mpirun();
}

/// The thread worlds a test runs of `sizes`: all of them, or with TESSERA_TEST_MAX_WORLD=N those
/// of at most N ranks (the smallest when none is that small). make sanitize sets it: a sanitizer
/// finds a bad access or a race in a world of 4 as well as in one of 8, at a fraction of the time;
/// the Release run keeps every world.
inline std::vector<int> worlds_to_run(const std::vector<int>& sizes) {
  const char* cap = std::getenv("TESSERA_TEST_MAX_WORLD");
  if (!cap || !*cap || sizes.empty()) return sizes;
  const int max_world = std::atoi(cap);
  std::vector<int> kept;
  for (int n : sizes)
    if (n <= max_world) kept.push_back(n);
  if (kept.empty()) kept.push_back(*std::min_element(sizes.begin(), sizes.end()));
  return kept;
}

/// Runs body as every rank of a world of each size in `sizes` (see worlds_to_run): with threads,
/// launch(n) per size; under MPI, once on the MPI world (whatever its size). Failures inside body
/// are reported by gtest on the rank that saw them; an exception fails the test on the caller.
inline void for_each_world(const std::vector<int>& sizes, const std::function<void()>& body) {
  if (under_mpi()) {
    body();
    world().barrier();
    return;
  }
  set_comm_timeout_seconds(60);  // a hang fails in a minute instead of five
  for (int n : worlds_to_run(sizes)) {
    SCOPED_TRACE(::testing::Message() << "world of " << n << " ranks");
    launch(n, body);
  }
}

/// Skips tests that only the threads backend can run (failure injection would abort an MPI job).
#define TESSERA_SKIP_UNDER_MPI()                                          \
  do {                                                                    \
    if (::tessera::testing::under_mpi()) GTEST_SKIP() << "threads backend only"; \
  } while (0)

}  // namespace tessera::testing
