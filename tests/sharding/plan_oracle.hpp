#pragma once
// The planner as it was before plans at scale (issue 34): costs per world rank, exchanges listed
// for every rank. Test-only: the oracle the scale-independent planner is checked against.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tessera/sharding/block_exchange.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera::oracle {

/// A step priced per world rank (index = world rank), as PlanStep was.
struct OracleStep {
  StepKind kind = StepKind::exchange;
  std::vector<int64_t> mesh_dims;
  int64_t mesh_dim = -1;
  ReduceOp op = ReduceOp::sum;
  Layout before;
  Layout after;
  std::vector<Transfer> transfers;
  std::vector<int64_t> bytes_sent;
  std::vector<int64_t> bytes_received;
  int64_t messages = 0;
  int64_t calls = 0;

  int64_t max_bytes_sent() const;
  int64_t max_bytes_received() const;
  std::string to_string() const;
};

struct OraclePlan {
  Layout src;
  Layout dst;
  std::vector<OracleStep> steps;
  double cost = 0;
  double estimated_us = 0;

  int64_t bytes_received(int world_rank) const;
  int64_t bytes_sent(int world_rank) const;
  int64_t max_bytes_received() const;
  int64_t total_bytes_received() const;
  int64_t calls() const;
  int64_t messages() const;
  std::string to_string() const;
};

/// The old planner's search and costs.
OraclePlan plan(const Layout& src, const Layout& dst, const PlanOptions& options = {});
int64_t plan_lower_bound(const Layout& src, const Layout& dst);
double plan_cost_lower_bound(const Layout& src, const Layout& dst, const PlanOptions& options = {});
/// One step priced rank by rank (nullopt: no single collective does it).
std::optional<OracleStep> oracle_mesh_dim_step(const Layout& before, const Layout& after);
OracleStep oracle_exchange_step(const Layout& before, const Layout& after);
int64_t oracle_most_lacking(const Layout& at, const Layout& dst);

}  // namespace tessera::oracle
