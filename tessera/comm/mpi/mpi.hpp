#pragma once
// The MPI backend: one rank per process, started by mpirun/mpiexec. Built when
// TESSERA_WITH_MPI=ON (mpi.cpp); otherwise a stub (mpi_stub.cpp) whose is_available() is false.
#include <memory>
#include <string>

#include <tessera/core/export.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/topology.hpp>

namespace tessera TESSERA_API {
namespace mpi {

/// True when Tessera was built with MPI.
bool is_available();
/// True when this process was started by an MPI launcher (mpirun/mpiexec/srun environment).
bool launched_by_mpirun();
/// Initialises MPI once (thread level MPI_THREAD_SERIALIZED or better) and returns this
/// process's world communicator. Throws CommError if MPI is unavailable or fails.
std::shared_ptr<Communicator> init(int* argc, char*** argv);
/// The end of a rank's program, before finalize(): waits until every rank of the world ended
/// its program. Past the desync grace period it tells the world's other ranks that this one
/// ended, so a rank still waiting in a call on the world fails at once naming it (instead of
/// waiting for the timeout). Throws CommError if the others do not end within the timeout.
void end_of_program(Communicator& world);
/// The hosts of the job's ranks, found at init(): MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
/// groups the ranks of one machine, MPI_Get_processor_name names it (TESSERA_HOSTS=N
/// simulates N hosts instead). Throws CommError before init().
HostTopology host_topology();
/// Finalises MPI if init() initialised it. Idempotent.
void finalize();
/// Ends every process of the job (MPI_Abort) after printing reason: a failed rank cannot
/// unblock its peers otherwise.
[[noreturn]] void abort(int code, const std::string& reason);

}  // namespace mpi
}  // namespace tessera
