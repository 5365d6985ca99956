// main() of the test binaries of the distributed layers (comm, runtime, mesh). With the threads
// backend the tests start their own ranks (for_each_world). Under mpirun every process runs
// every test inside its MPI rank; only rank 0 prints gtest's progress.
#include <gtest/gtest.h>

#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!tessera::testing::under_mpi()) return RUN_ALL_TESTS();
  int result = 1;
  const int status = tessera::run(argc, argv, [&] {
    if (tessera::rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    result = RUN_ALL_TESTS();
  });
  return status != 0 ? status : result;
}
