// The MPI process's lifecycle: init (MPI_Init_thread at MPI_THREAD_MULTIPLE, or SERIALIZED with a
// lock around each call; the reduction ops, the tag bound, the hosts, the world), finalize and
// abort. The world's communicator itself is mpi.cpp's.
#include <tessera/comm/mpi/mpi.hpp>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include <tessera/comm/mpi/detail/mpi_impl.hpp>
#include <tessera/comm/mpi/detail/process.hpp>
#include <tessera/core/error.hpp>

namespace tessera::mpi {

using namespace detail;
using tessera::detail::concat;

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

}  // namespace

bool is_available() { return true; }

HostTopology host_topology() {
  Process& p = process();
  std::lock_guard lock(p.mutex);
  if (!p.hosts_known) throw CommError("[mpi::host_topology] MPI is not initialised; call it inside a rank of run()");
  return p.hosts;
}

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::shared_ptr<Communicator> init(int* argc, char*** argv) {
  Process& p = process();
  std::lock_guard lock(p.mutex);
  if (auto world = p.world.lock()) return world;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw CommError("[mpi::init] MPI was finalized in this process and cannot start again");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) throw CommError("[mpi::init] MPI_Init_thread failed: " + detail::error_string(rc));
    p.initialized_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    if (p.initialized_here) {
      MPI_Finalize();
      p.finalized_here = true;
    }
    throw CommError(concat("[mpi::init] MPI provides ", thread_level_name(provided),
                           "; Tessera needs MPI_THREAD_SERIALIZED or better (async calls run on worker threads), "
                           "preferably MPI_THREAD_MULTIPLE"));
  }
  detail::serialize_calls.store(provided < MPI_THREAD_MULTIPLE);

  create_reduction_ops(p);
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub) p.tag_ub = *tag_ub;
  detail::tag_upper_bound.store(p.tag_ub);
  // Errors raised on the world's own handles (OpenMPI reports some request errors there)
  // come back as codes too, so they become CommErrors instead of ending the process.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);

  // The hosts, and whether this one runs more ranks than it has cores (then waits yield at once
  // instead of spinning first).
  int local_ranks = 1;
  if (!p.hosts_known) {
    p.hosts = find_hosts(local_ranks);
    p.hosts_known = true;
  } else {
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    local_ranks = static_cast<int>(p.hosts.ranks_on(p.hosts.host_of(me)).size());
  }
  const unsigned cores = std::thread::hardware_concurrency();
  detail::oversubscribed.store(cores > 0 && static_cast<unsigned>(local_ranks) > cores);

  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc == MPI_SUCCESS && p.end_of_program == MPI_COMM_NULL) rc = MPI_Comm_dup(MPI_COMM_WORLD, &p.end_of_program);
  if (rc != MPI_SUCCESS) throw CommError("[mpi::init] MPI_Comm_dup failed: " + detail::error_string(rc));
  set_errors_return(p.end_of_program);
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<int> world(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) world[static_cast<size_t>(r)] = r;
  auto communicator = make_world_communicator(comm, rank, std::move(world));
  p.world = communicator;
  return communicator;
}

void finalize() {
  Process& p = process();
  std::lock_guard lock(p.mutex);
  if (!p.initialized_here || p.finalized_here) return;
  p.finalized_here = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  free_reduction_ops(p);
  if (p.end_of_program != MPI_COMM_NULL) MPI_Comm_free(&p.end_of_program);
  MPI_Finalize();
}

void abort(int code, const std::string& reason) {
  std::fprintf(stderr, "tessera: %s\n", reason.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace tessera::mpi
