// main() of the test binaries of the distributed layers (comm, runtime, mesh). With the threads
// backend the tests start their own ranks (for_each_world). Under mpirun every process runs
// every test inside its MPI rank; only rank 0 prints gtest's progress.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"

namespace {

// On ranks other than 0 gtest's printer is removed (one copy of the progress is enough), but a
// failure seen only there must still be shown: this prints its test, place and message.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s failed at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!tessera::testing::under_mpi()) return RUN_ALL_TESTS();
  int result = 1;
  const int status = tessera::run(argc, argv, [&] {
    if (tessera::rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(tessera::rank()));
    }
    result = RUN_ALL_TESTS();
  });
  return status != 0 ? status : result;
}
