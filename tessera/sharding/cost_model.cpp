#include <tessera/sharding/cost_model.hpp>

#include <algorithm>
#include <cstdio>

#include <tessera/core/error.hpp>

namespace tessera {

// Recorded by `tessera_cost_model_bench` on the project's reference machine (2 cores, 4 ranks;
// 2026-11-24). Rerun it after changing a backend's collectives and record what it prints.
//
// threads (`build/bench/tessera_cost_model_bench --iters 60 --no-message-term`, three runs):
// every collective is one rendezvous of the group's threads whatever the algorithm, so the model
// is call + bytes: 8.1 to 13.0 us per call and 6.2 to 7.4 GB/s (rms relative error 0.61 to 0.69;
// four rank threads share two cores, so small calls are noisy). With a message term the fit puts
// the call at 0 and 4 to 10 us on each message, the rendezvous cost spread over log2(k) rounds.
CostModel CostModel::threads() { return CostModel{11.0, 0.0, 7000.0}; }

CostModel CostModel::for_backend(std::string_view backend) {
  if (backend == "threads") return threads();
  // mpi (`mpirun -np 4 build/bench/tessera_cost_model_bench --iters 30`, OpenMPI 4.1, shared
  // memory, Tessera's own algorithms): the medians of 6 fits, call 12.8 us + 6.7 us/msg +
  // 2.25 GB/s (fits: 9.2-15.3 us, 5.7-10 us/msg, 1.9-2.9 GB/s; rms relative error 0.36-0.44).
  if (backend == "mpi") return CostModel{12.8, 6.7, 2250.0};
  throw ValueError(detail::concat("[CostModel::for_backend] no recorded cost model for backend '", backend,
                                  "' (known: threads, mpi)"));
}

// Across hosts: `scripts/multihost.sh run --hosts 4 --ranks-per-host 1 -- build/bench/
// tessera_cost_model_bench --iters 30` (four network namespaces of this machine joined by a
// bridge, TCP only, so every group spans hosts; OpenMPI's TCP transport, Tessera's algorithms),
// the medians of 3 fits: call 53.5 us + 57.6 us/msg + 0.303 GB/s (fits: 38.5-66.8 us, 55.4-67.2
// us/msg, 0.301-0.319 GB/s; rms relative error 0.19-0.22). Slower than a datacenter network, but
// its ratio to the shared-memory figures is what makes plans keep bytes inside hosts.
CostModel CostModel::across_hosts() { return CostModel{53.5, 57.6, 303.0}; }

CostModel CostModel::cheaper(const CostModel& a, const CostModel& b) {
  return CostModel{std::min(a.call_us, b.call_us), std::min(a.message_us, b.message_us),
                   std::max(a.bytes_per_us, b.bytes_per_us)};
}

std::string CostModel::to_string() const {
  char text[96];
  std::snprintf(text, sizeof text, "call %.3g us + %.3g us/msg + %.3g GB/s", call_us, message_us,
                bytes_per_us * 1e-3);
  return text;
}

}  // namespace tessera
