#include <tessera/dtensor/explicit_redistribution.hpp>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>

namespace tessera {

namespace {
// The innermost open scope of this thread (rank), or null.
thread_local const ExplicitRedistributionContext* open_scope = nullptr;
}  // namespace

ExplicitRedistributionContext::ExplicitRedistributionContext(bool enable, bool strict)
    : previous_(open_scope), enable_(enable), strict_(strict) {
  open_scope = this;
}

ExplicitRedistributionContext::~ExplicitRedistributionContext() { open_scope = previous_; }

const ExplicitRedistributionContext* ExplicitRedistributionContext::innermost() { return open_scope; }

namespace detail {

void check_implicit_redistribution(std::string_view op, size_t input, const Plan& plan) {
  if (!ExplicitRedistributionContext::active()) return;
  const bool moves = plan.messages() > 0 || plan.total_bytes_received() > 0;
  if (!moves && !ExplicitRedistributionContext::innermost()->strict()) return;
  TESSERA_CHECK(false, ShardingError, op, "input ", input, " must be redistributed from ",
                to_string(plan.src.placements()), " to ", to_string(plan.dst.placements()), " (",
                plan.src.global_shape().to_string(), " on ", plan.src.mesh().to_string(),
                ") inside an ExplicitRedistributionContext", moves ? "" : " (strict: even a local move)",
                "; redistribute it first with x.redistribute(", to_string(plan.dst.placements()), "). The plan:\n",
                explain(plan));
}

DTensor implicit_redistribute(const DTensor& x, Placements placements, std::string_view op) {
  const Layout to = x.layout().with_placements(std::move(placements));
  if (x.layout() == to) return x;
  if (ExplicitRedistributionContext::active()) check_implicit_redistribution(op, 0, *cached_plan(x.layout(), to));
  return x.redistribute(x.device_mesh(), to);
}

}  // namespace detail
}  // namespace tessera
