#include <tessera/comm/topology.hpp>

#include <cstdlib>
#include <functional>
#include <sstream>

#include <tessera/core/error.hpp>

namespace tessera {

HostTopology::HostTopology(std::vector<int> host_of, std::vector<std::string> names, bool simulated)
    : host_of_(std::move(host_of)), names_(std::move(names)), simulated_(simulated) {
  // Hosts are numbered by their lowest rank: host h first appears after hosts 0 .. h-1.
  int next = 0;
  for (size_t r = 0; r < host_of_.size(); ++r) {
    const int h = host_of_[r];
    TESSERA_CHECK(h >= 0 && h <= next && h < num_hosts(), ValueError, "HostTopology", "rank ", r, " is on host ", h,
                  "; hosts must be numbered 0 .. ", num_hosts() - 1, " in the order of their lowest rank");
    if (h == next) ++next;
  }
  TESSERA_CHECK(next == num_hosts(), ValueError, "HostTopology", num_hosts(), " host names for ", next,
                " hosts that hold ranks");
  hash_ = std::hash<size_t>{}(host_of_.size());
  for (int h : host_of_) hash_ = hash_ * 1000003 + static_cast<size_t>(h);
}

HostTopology HostTopology::simulated(int world_size, int hosts) {
  TESSERA_CHECK(hosts >= 1 && hosts <= world_size, ValueError, "HostTopology", "TESSERA_HOSTS=", hosts,
                " must be between 1 and the number of ranks, ", world_size);
  std::vector<int> host_of(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r)
    host_of[static_cast<size_t>(r)] = static_cast<int>(static_cast<int64_t>(r) * hosts / world_size);
  std::vector<std::string> names;
  for (int h = 0; h < hosts; ++h) names.push_back("host" + std::to_string(h));
  return HostTopology(std::move(host_of), std::move(names), /*simulated=*/true);
}

HostTopology HostTopology::from_environment(int world_size, const HostTopology& fallback) {
  const char* text = std::getenv("TESSERA_HOSTS");
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const long hosts = std::strtol(text, &end, 10);
  TESSERA_CHECK(end && *end == '\0', ValueError, "HostTopology", "TESSERA_HOSTS='", text, "' is not a number of hosts");
  return simulated(world_size, static_cast<int>(hosts));
}

int HostTopology::host_of(int world_rank) const {
  TESSERA_CHECK(world_rank >= 0 && world_rank < world_size(), ValueError, "host_of", "rank ", world_rank,
                " out of range for a world of ", world_size(), " ranks");
  return host_of_[static_cast<size_t>(world_rank)];
}

int HostTopology::rank_in_host(int world_rank) const {
  const int h = host_of(world_rank);
  int index = 0;
  for (int r = 0; r < world_rank; ++r) index += host_of_[static_cast<size_t>(r)] == h;
  return index;
}

std::vector<int> HostTopology::ranks_on(int host) const {
  TESSERA_CHECK(host >= 0 && host < num_hosts(), ValueError, "ranks_on", "host ", host, " out of range; there are ",
                num_hosts(), " hosts");
  std::vector<int> ranks;
  for (int r = 0; r < world_size(); ++r)
    if (host_of_[static_cast<size_t>(r)] == host) ranks.push_back(r);
  return ranks;
}

const std::string& HostTopology::host_name(int host) const {
  TESSERA_CHECK(host >= 0 && host < num_hosts(), ValueError, "host_name", "host ", host, " out of range; there are ",
                num_hosts(), " hosts");
  return names_[static_cast<size_t>(host)];
}

std::string HostTopology::to_string() const {
  std::ostringstream out;
  out << num_hosts() << (num_hosts() == 1 ? " host: " : " hosts: ");
  for (int h = 0; h < num_hosts(); ++h) {
    out << (h ? ", " : "") << names_[static_cast<size_t>(h)] << " [";
    const auto ranks = ranks_on(h);
    for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
    out << "]";
  }
  if (simulated_) out << " (simulated)";
  return out.str();
}

}  // namespace tessera
