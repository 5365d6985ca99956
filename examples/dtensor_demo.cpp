// dtensor_demo: a global tensor on a 2-d mesh, written as if for one device. Distributes a
// random matrix, shows where its blocks live, asks the planner why a redistribution moves what it
// moves (the DTensor trap [S(0), S(1)] -> [S(1), S(0)]), runs it under CommDebugMode, and checks
// every result against the unsharded tensor. Exits 1 if a check fails.
// Run: dtensor_demo --ranks 4 (threads), or mpirun -np 4 dtensor_demo.
#include <iostream>

#include <tessera/tessera.hpp>

int main(int argc, char** argv) {
  using namespace tessera;
  bool ok = true;
  const int status = run(argc, argv, [&] {
    const int n = world_size();
    const int64_t cols = n % 2 == 0 ? 2 : 1;
    const DeviceMesh mesh({n / cols, cols}, {"dp", "tp"});
    const bool speaker = rank() == 0;

    // rand of any layout equals the unsharded rand with the same seed, bit for bit.
    manual_seed(42);
    const DTensor x = tessera::rand(Shape{6, 5}, mesh, {Shard{0}, Shard{1}});
    manual_seed(42);
    const Tensor reference = tessera::rand(Shape{6, 5});
    const Tensor whole = x.full_tensor();
    if (!equal(whole, reference)) ok = false;
    if (speaker) std::cout << visualize_sharding(x) << "\n\n";

    // The planner's dry run, then the move itself, counted.
    const Layout target = x.layout().with_placements({Shard{1}, Shard{0}});
    if (speaker) std::cout << explain(*cached_plan(x.layout(), target)) << "\n";
    CommDebugMode comm;
    const DTensor y = x.redistribute({Shard{1}, Shard{0}});
    if (speaker) std::cout << "rank 0 communication:\n" << comm.to_string() << "\n\n";
    if (!equal(y.full_tensor(), reference)) ok = false;

    // A Partial value (each rank holds a part of a sum), reduced on demand.
    const DTensor parts = DTensor::from_local(ones(Shape{2, 3}), mesh, {Partial{}, Replicate{}});
    const Tensor total = parts.full_tensor();
    if (!equal(total, full(Shape{2, 3}, static_cast<double>(mesh.size(0))))) ok = false;

    // Monarch's mesh reduce: sum each rank's value over tp, scattering the result.
    const DTensor mine = DTensor::from_local(full(Shape{4}, rank() + 1.0), mesh, {Replicate{}, Replicate{}});
    const DTensor summed = mine.reduce({"tp"}, MeshReduction::sum, /*scatter=*/true);
    if (speaker) std::cout << "reduce over tp with scatter: " << summed.to_string() << "\n";
  });
  if (status == 0) std::cout << (ok ? "dtensor_demo: every result equals the unsharded tensor\n" : "dtensor_demo: WRONG\n");
  return status != 0 ? status : (ok ? 0 : 1);
}
