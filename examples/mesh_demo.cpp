// mesh_demo: one program, run as N ranks (threads by default; `--ranks N`, or under mpirun one
// rank per process). Builds a 2-d device mesh, and sums values along each mesh axis with the
// communicator of that axis. Exits 1 if a result is wrong.
#include <iostream>
#include <mutex>
#include <sstream>
#include <vector>

#include <tessera/mesh/device_mesh.hpp>
#include <tessera/runtime/runtime.hpp>

int main(int argc, char** argv) {
  using namespace tessera;
  std::mutex print;
  bool ok = true;
  const int status = run(argc, argv, [&] {
    const int n = world_size();
    const int64_t cols = n % 2 == 0 ? 2 : 1;
    const DeviceMesh mesh({n / cols, cols}, {"dp", "tp"});
    const auto at = mesh.coordinate();

    // Every rank contributes its world rank; all_reduce over one axis sums its line.
    int along_tp = rank(), along_dp = rank();
    mesh.comm("tp").all_reduce(&along_tp, 1, DType::i32, ReduceOp::sum);
    mesh.comm("dp").all_reduce(&along_dp, 1, DType::i32, ReduceOp::sum);

    // The same through a flattened axis: the whole mesh.
    int everyone = rank();
    mesh.flatten({"dp", "tp"}).comm(0).all_reduce(&everyone, 1, DType::i32, ReduceOp::sum);

    std::ostringstream line;
    line << "rank " << rank() << " at (dp=" << at[0] << ", tp=" << at[1] << ") of " << mesh.to_string()
         << ": sum over tp = " << along_tp << ", over dp = " << along_dp << ", over all = " << everyone;
    std::lock_guard lock(print);
    std::cout << line.str() << "\n";
    if (everyone != n * (n - 1) / 2) ok = false;
  });
  if (status == 0) std::cout << (ok ? "mesh_demo: all sums correct\n" : "mesh_demo: WRONG sums\n");
  return status != 0 ? status : (ok ? 0 : 1);
}
