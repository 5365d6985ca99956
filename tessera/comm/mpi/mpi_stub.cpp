// Built when TESSERA_WITH_MPI=OFF: the backend reports itself unavailable.
#include <tessera/comm/mpi/mpi.hpp>

#include <cstdio>
#include <cstdlib>

#include <tessera/core/error.hpp>

namespace tessera::mpi {

bool is_available() { return false; }

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::shared_ptr<Communicator> init(int*, char***) {
  throw CommError("[mpi::init] this Tessera was built without MPI (TESSERA_WITH_MPI=OFF); rebuild with it or use "
                  "TESSERA_BACKEND=threads");
}

void end_of_program(Communicator&) {}

HostTopology host_topology() {
  throw CommError("[mpi::host_topology] this Tessera was built without MPI (TESSERA_WITH_MPI=OFF)");
}

void finalize() {}

void abort(int code, const std::string& reason) {
  std::fprintf(stderr, "tessera: %s\n", reason.c_str());
  std::exit(code);
}

}  // namespace tessera::mpi
