#pragma once
// Which host each world rank runs on: what hybrid meshes (dcn axes across hosts, ici axes
// within one) and topology-aware code build on. MPI: the hosts MPI_Comm_split_type(
// MPI_COMM_TYPE_SHARED) finds, named by MPI_Get_processor_name. Threads (or to simulate hosts
// under mpirun on one machine): TESSERA_HOSTS=N groups consecutive ranks into N hosts.
#include <string>
#include <vector>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// Hosts of a world of ranks, numbered in the order of their lowest world rank. Value type.
/// Example: 4 ranks, TESSERA_HOSTS=2: host_of = {0, 0, 1, 1}, names = {"host0", "host1"}.
class HostTopology {
 public:
  HostTopology() = default;
  /// host_of[r]: the host of world rank r; names[h]: host h's name. Throws ValueError unless
  /// every host in [0, names.size()) holds a rank and hosts are numbered by their lowest rank.
  HostTopology(std::vector<int> host_of, std::vector<std::string> names, bool simulated);
  /// `hosts` simulated hosts of consecutive, near-equal blocks of `world_size` ranks ("host0",
  /// ...). Throws ValueError unless 1 <= hosts <= world_size.
  static HostTopology simulated(int world_size, int hosts);
  /// TESSERA_HOSTS when set (simulated), else `fallback`. Throws ValueError on a bad value.
  static HostTopology from_environment(int world_size, const HostTopology& fallback);

  int num_hosts() const { return static_cast<int>(names_.size()); }
  int world_size() const { return static_cast<int>(host_of_.size()); }
  /// The host of a world rank. Throws ValueError if the rank is out of range.
  int host_of(int world_rank) const;
  /// The rank's index among the ranks of its host (by world rank).
  int rank_in_host(int world_rank) const;
  /// The world ranks on a host, ascending.
  std::vector<int> ranks_on(int host) const;
  const std::string& host_name(int host) const;
  /// True when the hosts come from TESSERA_HOSTS rather than the machines.
  bool is_simulated() const { return simulated_; }
  /// "2 hosts: host0 [0, 1], host1 [2, 3] (simulated)".
  std::string to_string() const;
  /// A hash of which rank is on which host, computed once (caches of plans priced by host key on it).
  size_t hash() const { return hash_; }

 private:
  std::vector<int> host_of_;
  std::vector<std::string> names_;
  bool simulated_ = false;
  size_t hash_ = 0;
};

}  // namespace tessera
