// The job's hosts, found once at init (detail::find_hosts).
#include <tessera/comm/mpi/detail/process.hpp>

#include <algorithm>
#include <string>

namespace tessera::mpi::detail {

HostTopology find_hosts(int& local_ranks) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int leader = rank;  // the lowest world rank of this rank's host
  MPI_Comm node = MPI_COMM_NULL;
  local_ranks = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &local_ranks);
    MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
  }
  std::vector<int> leaders(static_cast<size_t>(size));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  std::vector<char> names(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<int> host_of(static_cast<size_t>(size));
  std::vector<std::string> host_names;
  std::vector<int> host_leader;
  for (int r = 0; r < size; ++r) {
    const int l = leaders[static_cast<size_t>(r)];
    auto it = std::find(host_leader.begin(), host_leader.end(), l);
    if (it == host_leader.end()) {
      host_leader.push_back(l);
      std::string n(names.data() + static_cast<size_t>(l) * MPI_MAX_PROCESSOR_NAME);
      // Hosts that share a name (network namespaces of one machine) stay distinguishable.
      if (std::find(host_names.begin(), host_names.end(), n) != host_names.end())
        n.append("#").append(std::to_string(host_leader.size() - 1));
      host_names.push_back(n);
      it = host_leader.end() - 1;
    }
    host_of[static_cast<size_t>(r)] = static_cast<int>(it - host_leader.begin());
  }
  const HostTopology machines(std::move(host_of), std::move(host_names), /*simulated=*/false);
  return HostTopology::from_environment(size, machines);
}

}  // namespace tessera::mpi::detail
