#pragma once
// The dispatcher's public face: the rule registry and the decision cache's counters. The
// dispatcher itself (dtensor/detail/dispatch.hpp) is internal; docs/architecture.md follows
// one DTensor op through it.
#include <cstdint>

#include <tessera/core/export.hpp>
#include <tessera/sharding/op_rules.hpp>

namespace tessera TESSERA_API {

/// The process-wide rule registry (built-in rules are added on first use, by one explicit call).
RuleRegistry& rule_registry();

/// Counters of the calling rank's dispatches since the last reset.
struct DispatchStats {
  uint64_t hits = 0;           ///< decisions found in the cache
  uint64_t misses = 0;         ///< decisions made (rule + planner)
  uint64_t planner_calls = 0;  ///< plan() calls made while dispatching (0 on a hit)
};
DispatchStats dispatch_stats();
void reset_dispatch_stats();
/// Drops the calling rank's cached decisions.
void clear_dispatch_cache();

}  // namespace tessera
