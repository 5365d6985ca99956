#include <tessera/dtensor/explicit_redistribution.hpp>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>

namespace tessera {

namespace {
// The innermost open scope of this thread (rank), or null.
thread_local const ExplicitRedistributionContext* innermost = nullptr;
}  // namespace

struct ExplicitRedistributionAccess {
  static bool enabled(const ExplicitRedistributionContext& c) { return c.enable_; }
  static bool strict(const ExplicitRedistributionContext& c) { return c.strict_; }
};

ExplicitRedistributionContext::ExplicitRedistributionContext(bool enable, bool strict)
    : previous_(innermost), enable_(enable), strict_(strict) {
  innermost = this;
}

ExplicitRedistributionContext::~ExplicitRedistributionContext() { innermost = previous_; }

bool ExplicitRedistributionContext::active() {
  return innermost != nullptr && ExplicitRedistributionAccess::enabled(*innermost);
}

namespace detail {

void check_implicit_redistribution(std::string_view op, size_t input, const Plan& plan) {
  if (!ExplicitRedistributionContext::active()) return;
  const bool moves = plan.messages() > 0 || plan.total_bytes_received() > 0;
  if (!moves && !ExplicitRedistributionAccess::strict(*innermost)) return;
  TESSERA_CHECK(false, ShardingError, op, "input ", input, " must be redistributed from ",
                to_string(plan.src.placements()), " to ", to_string(plan.dst.placements()), " (",
                plan.src.global_shape().to_string(), " on ", plan.src.mesh().to_string(),
                ") inside an ExplicitRedistributionContext", moves ? "" : " (strict: even a local move)",
                "; redistribute it first with x.redistribute(", to_string(plan.dst.placements()), "). The plan:\n",
                explain(plan));
}

DTensor implicit_redistribute(const DTensor& x, const DeviceMesh& mesh, const Layout& to, std::string_view op,
                              size_t input) {
  if (x.layout() == to) return x;
  if (ExplicitRedistributionContext::active()) check_implicit_redistribution(op, input, *cached_plan(x.layout(), to));
  return x.redistribute(mesh, to);
}

}  // namespace detail
}  // namespace tessera
