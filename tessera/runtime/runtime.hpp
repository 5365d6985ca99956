#pragma once
// Runtime: starts one user program as N ranks and gives each rank its context.
//
// Backends: by default (the embedded default) N in-process threads; under mpirun/mpiexec each
// process is one rank. TESSERA_BACKEND=threads|mpi forces a backend.
#include <functional>
#include <memory>
#include <string_view>
#include <thread>

#include <tessera/core/export.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/comm/topology.hpp>

namespace tessera TESSERA_API {

/// Runs body as N ranks and returns the process exit status (0 on success). Threads backend:
/// N from `--ranks N` in argv or TESSERA_RANKS (default 4). MPI backend (under mpirun, or
/// TESSERA_BACKEND=mpi): this process is one rank of the MPI job. A failure on any rank is
/// printed (naming the rank) and gives status 1; under MPI it aborts the whole job, since a
/// failed process cannot otherwise unblock its peers.
///
/// One program, two backends: the one difference user code can see is state outside body.
/// On threads every rank runs body in one process, so what body captures by reference, and
/// globals and statics, are shared by all ranks (a write races with the other ranks); under
/// MPI each process has its own copy. The safe pattern: per-rank state inside body (locals),
/// or rank_local<T>(key) below; shared read-only data built before run() is fine on both.
///   int steps = 0;                        // shared by thread ranks: do not write it in body
///   run(argc, argv, [&] {
///     int mine = 0;                       // per rank on both backends
///     auto& count = rank_local<int>("app.count");  // per rank on both backends
///   });
int run(int argc, char** argv, std::function<void()> body);

/// The number of in-process ranks run() starts on the threads backend: `--ranks N` (or
/// `--ranks=N`) in argv, else TESSERA_RANKS, else 4. Throws ValueError for fewer than 1.
int ranks_from_args(int argc, char** argv);

/// Runs body on `nranks` in-process ranks (threads) and returns when all finished. If body
/// throws on any rank, the others are unblocked with a CommError and launch rethrows the
/// first failure on the caller, with the same exception kind (ValueError, CommError, ...) and
/// a message naming the rank ("rank 2 failed: ..."), or, when every rank threw the same
/// message, saying so ("every rank (4 of 4) failed alike: ..."). Throws ValueError if
/// nranks < 1 or if called from inside a rank.
void launch(int nranks, std::function<void()> body);

/// This rank's index in the world, from 0. Throws ValueError outside launch/run.
int rank();
/// Number of ranks in the world. Throws ValueError outside launch/run.
int world_size();
/// True inside a rank started by launch or run.
bool in_rank();
/// This rank's world communicator. Throws ValueError outside launch/run.
Communicator& world();
std::shared_ptr<Communicator> world_ptr();

/// A slot of per-rank state, by key, owned by the rank: released when the rank's body ends,
/// before its backend shuts down (under MPI before MPI_Finalize, which a thread_local would
/// outlive). Front ends keep their per-rank defaults here (tessera/spec's global mesh). Throws
/// ValueError outside a rank.
std::shared_ptr<void>& rank_state(std::string_view key);
/// The slot under `key`, filled by `make` if empty, both under the rank's lock (the rank's
/// threads may ask first at once). Throws ValueError outside a rank.
std::shared_ptr<void> rank_state(std::string_view key, const std::function<std::shared_ptr<void>()>& make);
/// The rank's T under `key`, value-initialised on first use: per-rank state of a front end
/// without a slot's casts. Throws ValueError outside a rank.
/// Example: `auto& scopes = rank_local<std::vector<LogicalRules>>("tessera.mpmd.logical_axes");`
template <class T>
T& rank_local(std::string_view key) {
  return *std::static_pointer_cast<T>(rank_state(key, [] { return std::static_pointer_cast<void>(std::make_shared<T>()); }));
}

/// A second thread of the calling rank: `body` runs on it as this rank (the same rank(),
/// world(), hosts and rank_state). For work beside the rank's own, such as the controller's
/// worker streams. A communicator is used by one thread at a time, so the new thread
/// communicates on communicators handed to it (DeviceMesh::duplicate), not on ones the rank's
/// thread uses. body must not throw (an escaping exception ends the process); join the thread
/// before the rank's body returns. Throws ValueError outside a rank.
std::thread rank_thread(std::function<void()> body);

/// The hosts of this world's ranks: under MPI the machines (or TESSERA_HOSTS=N simulated
/// hosts); on threads one host, or TESSERA_HOSTS=N simulated hosts of consecutive ranks, so
/// topology-aware code (hybrid meshes) runs in one process. Throws ValueError outside a rank.
const HostTopology& host_topology();
/// The host of a world rank (host_topology().host_of).
int host_of(int world_rank);
/// Number of hosts.
int num_hosts();
/// This rank's index among the ranks of its host.
int rank_in_host();

}  // namespace tessera
