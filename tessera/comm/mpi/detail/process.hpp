#pragma once
// The MPI backend's process-wide state, apart from any communicator: whether Tessera initialised
// MPI, the world, the end-of-program communicator, the job's hosts, and the reduction ops. The
// process's lifecycle (mpi/lifecycle.cpp: init, finalize, abort) writes it; the communicator
// (mpi/mpi.cpp) reads its reduction ops.
#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/mpi/detail/mpi_impl.hpp>  // mpi.h, its C API only
#include <tessera/comm/topology.hpp>
#include <tessera/core/dtype.hpp>
#include <tessera/core/reduce_op.hpp>

namespace tessera::mpi::detail {

inline constexpr int kNumReduceOps = 5;
static_assert(static_cast<int>(ReduceOp::min) == kNumReduceOps - 1);

struct Process {
  std::mutex mutex;
  bool initialized_here = false;
  bool finalized_here = false;
  int tag_ub = 32767;
  std::weak_ptr<Communicator> world;
  // The end-of-program barrier's own communicator (a duplicate of the world made at init), so
  // it can never meet a call of the program's.
  MPI_Comm end_of_program = MPI_COMM_NULL;
  HostTopology hosts;
  bool hosts_known = false;
  // User ops (MPI_OP_NULL where a builtin op has Tessera's semantics), by dtype and op.
  std::array<std::array<MPI_Op, kNumReduceOps>, kNumDTypes> ops{};
  bool ops_created = false;
};

Process& process();

/// Creates the user ops once (max/min of the floating dtypes: MPI_MAX/MPI_MIN do not propagate
/// NaN); frees them.
void create_reduction_ops(Process& p);
void free_reduction_ops(Process& p);
/// The MPI op that folds `dtype` with `op` (avg folds as sum; the caller scales). f16/bf16
/// sum/avg/product are staged in f32 by the caller and never come here.
MPI_Op reduction(DType dtype, ReduceOp op);

/// Errors on `comm` come back as codes (CommErrors), instead of ending the process.
void set_errors_return(MPI_Comm comm);

/// The machines of the job (at init, every rank at once): the ranks MPI_Comm_split_type puts in
/// one shared-memory group are one host, numbered by its lowest world rank; `local_ranks` gets
/// the size of this rank's group (of the real machines, even when TESSERA_HOSTS simulates others).
HostTopology find_hosts(int& local_ranks);

/// The world's communicator over `comm` (a duplicate of MPI_COMM_WORLD, owned from here on).
std::shared_ptr<Communicator> make_world_communicator(MPI_Comm comm, int rank, std::vector<int> world);

}  // namespace tessera::mpi::detail
