#pragma once
// The time model the redistribute planner minimises. One communication step costs
//
//     call_us + message_us * messages + bytes the busiest rank receives / bytes_per_us
//
// (a step that moves nothing costs nothing). The constants are measured per backend by
// `tessera_cost_model_bench` (bench/cost_model_bench.cpp), which times real redistribute plans
// and fits the three by least squares; the fitted values are recorded in cost_model.cpp with the
// machine and the command. Pure: constants and arithmetic, no communication.
#include <string>
#include <string_view>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// Per-backend constants of the step-time model. Value type.
struct CostModel {
  double call_us = 0;       ///< fixed cost of one collective call (the group's rendezvous)
  double message_us = 0;    ///< each message one rank sends within a call
  double bytes_per_us = 1;  ///< bandwidth of the busiest rank's receives

  /// The latency terms as bytes moved in the same time: the planner scores in bytes, so that a
  /// model without latency (bytes_only) is exact.
  double call_bytes() const { return call_us * bytes_per_us; }
  double message_bytes() const { return message_us * bytes_per_us; }
  /// A planner score (bytes) as estimated microseconds.
  double microseconds(double score_bytes) const { return score_bytes / bytes_per_us; }

  /// The recorded constants of a backend ("threads", "mpi"). Throws ValueError for another name.
  static CostModel for_backend(std::string_view backend);
  /// The threads backend's: the default of PlanOptions.
  static CostModel threads();
  /// Bytes alone: no latency terms (the planner's byte-optimality tests use it).
  static CostModel bytes_only() { return CostModel{0, 0, 1}; }
  /// Between hosts (TCP between machines, Tessera's MPI point-to-point algorithms): what a step
  /// whose groups span hosts costs, whatever the backend within hosts (ranks simulated as hosts
  /// plan as a cluster's would).
  static CostModel across_hosts();
  /// The cheaper of two models in every term: a bound that holds for steps priced with either.
  static CostModel cheaper(const CostModel& a, const CostModel& b);

  /// "call 4.1 us + 0.3 us/msg + 1.9 GB/s".
  std::string to_string() const;
  friend bool operator==(const CostModel&, const CostModel&) = default;
};

}  // namespace tessera
