// One fault injected into an SPMD run, for the failure matrix (failure_matrix_test.cpp). Runs on
// rank threads (--ranks N) or under mpirun like any Tessera program. Every rank but the last
// calls the same collective; the last rank injects the scenario's fault:
//
//   none    no fault: every rank completes (the matrix's control)
//   throw   throws a ValueError instead of calling
//   skip    skips the call and ends its program
//   kind    calls all_gather where the others call all_reduce
//   count   calls all_reduce with 5 elements where the others pass 4
//   dtype   calls all_reduce on i32 where the others use f32
//   p2p     receives 5 elements where rank 0 sends it 4
//
// The faulty rank prints "tessera-fault: injecting <scenario> at <unix seconds>" just before the
// fault; a rank that returns from the faulty call prints "tessera-fault: rank r completed"
// (with a fault, none should: returning would hand the program a result that is not one).
#include <time.h>

#include <cstdio>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

namespace {

double unix_seconds() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

void inject(const std::string& scenario) {
  using namespace tessera;
  const int me = rank(), last = world_size() - 1;
  const bool faulty = me == last && scenario != "none";
  world().barrier();  // every rank is up before the fault
  if (faulty) {
    std::fprintf(stderr, "tessera-fault: injecting %s at %.6f\n", scenario.c_str(), unix_seconds());
    std::fflush(stderr);
  }
  std::vector<float> f(64, 1.0f);
  std::vector<int32_t> i(64, 1);
  if (scenario == "p2p") {
    if (me == 0) world().send(f.data(), 4, DType::f32, last, 7);
    if (me == last) world().recv(f.data(), 5, DType::f32, 0, 7);
  } else if (!faulty) {
    world().all_reduce(f.data(), 4, DType::f32, ReduceOp::sum);
  } else if (scenario == "throw") {
    throw ValueError("[fault] injected failure on rank " + std::to_string(me));
  } else if (scenario == "skip") {
    return;
  } else if (scenario == "kind") {
    world().all_gather(f.data(), f.data() + 8, 4, DType::f32);
  } else if (scenario == "count") {
    world().all_reduce(f.data(), 5, DType::f32, ReduceOp::sum);
  } else if (scenario == "dtype") {
    world().all_reduce(i.data(), 4, DType::i32, ReduceOp::sum);
  } else {
    throw ValueError("[fault] unknown scenario '" + scenario + "'");
  }
  std::fprintf(stderr, "tessera-fault: rank %d completed\n", me);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "none";
  return tessera::run(argc, argv, [&] { inject(scenario); });
}
