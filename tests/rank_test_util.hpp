#pragma once
// Running a test body on ranks, the same way on both backends (tests/rank_main.cpp).
#include <gtest/gtest.h>

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

/// Runs body as every rank of a world of each size in `sizes`: with threads, launch(n) per
/// size; under MPI, once on the MPI world (whatever its size). Failures inside body are
/// reported by gtest on the rank that saw them; an exception fails the test on the caller.
inline void for_each_world(const std::vector<int>& sizes, const std::function<void()>& body) {
  if (under_mpi()) {
    body();
    world().barrier();
    return;
  }
  set_comm_timeout_seconds(60);  // a hang fails in a minute instead of five
  for (int n : sizes) {
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
