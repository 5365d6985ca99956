// halo_exchange: every rank works out, from the layout alone, which global rows each piece's
// widened block needs and which piece holds each; then point-to-point messages between the pieces
// that share rows move exactly those rows.
#include <tessera/domain/halo.hpp>
#include <tessera/domain/detail/halo_local.hpp>

#include <algorithm>
#include <memory>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/internal/row_exchange.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

// Every piece's widened block: `left` rows before its own, its own rows, `right` rows after;
// beyond the domain's edges, zeros or the rows a periodic or replicate pad reads.
std::shared_ptr<const detail::RowPlan> plan_halo(const Layout& layout, const DeviceMesh& mesh, int64_t dim,
                                                 int64_t left, int64_t right, HaloPadding pad) {
  const PadMode mode = pad == HaloPadding::periodic    ? PadMode::circular
                       : pad == HaloPadding::replicate ? PadMode::replicate
                                                       : PadMode::constant;
  const int64_t length = layout.global_shape()[dim];
  return detail::row_plan(layout, mesh, dim, [&](size_t q, detail::RowRunBuilder& runs) {
    const int64_t begin = runs.starts()[q], end = runs.starts()[q + 1];
    for (int64_t i = 0; i < left; ++i) runs.row(detail::pad_source_row(begin - left + i, length, mode));
    runs.rows(begin, end - begin);
    for (int64_t i = 0; i < right; ++i) runs.row(detail::pad_source_row(end + i, length, mode));
  });
}

}  // namespace

// An exchange between halo_exchange_start and finish: the rows in flight, or (no halo asked
// for) the input itself.
struct HaloExchange::State {
  detail::RowExchange rows;
  Tensor local;
  bool no_halo = false;
  bool finished = false;
};

// The rows in flight finish when the RowExchange goes (its destructor waits for them).
HaloExchange::HaloExchange() = default;
HaloExchange::HaloExchange(HaloExchange&&) noexcept = default;
HaloExchange& HaloExchange::operator=(HaloExchange&&) noexcept = default;
HaloExchange::~HaloExchange() = default;

bool HaloExchange::finished() const { return !state_ || state_->finished; }

Tensor HaloExchange::finish() {
  TESSERA_CHECK(state_ && !state_->finished, ValueError, "HaloExchange::finish",
                state_ ? "the exchange was already finished" : "no exchange was started");
  state_->finished = true;
  return state_->no_halo ? state_->local : state_->rows.finish("halo_exchange");
}

HaloExchange halo_exchange_start(const DTensor& x, int64_t dim, int64_t left, int64_t right, HaloPadding pad) {
  TESSERA_CHECK(x.defined(), ShardingError, "halo_exchange_start", "undefined DTensor");
  return detail::halo_exchange_start_local(x.to_local(), x.layout(), x.device_mesh(), dim, left, right, pad);
}

Tensor halo_exchange(const DTensor& x, int64_t dim, int64_t left, int64_t right, HaloPadding pad) {
  TESSERA_CHECK(x.defined(), ShardingError, "halo_exchange", "undefined DTensor");
  return detail::halo_exchange_local(x.to_local(), x.layout(), x.device_mesh(), dim, left, right, pad);
}

namespace detail {

Tensor halo_exchange_local(const Tensor& local, const Layout& layout, const DeviceMesh& mesh, int64_t dim, int64_t left,
                           int64_t right, HaloPadding pad) {
  return halo_exchange_start_local(local, layout, mesh, dim, left, right, pad, "halo_exchange").finish();
}

HaloExchange halo_exchange_start_local(const Tensor& local, const Layout& layout, const DeviceMesh& mesh, int64_t dim,
                                       int64_t left, int64_t right, HaloPadding pad, const char* op) {
  TESSERA_CHECK(dim >= -layout.ndim() && dim < layout.ndim(), ShardingError, op, "dim ", dim,
                " is out of range for ", layout.to_string());
  if (dim < 0) dim += layout.ndim();
  TESSERA_CHECK(left >= 0 && right >= 0, ShardingError, op, "halo widths left ", left, " and right ", right,
                " must be >= 0 (", layout.to_string(), ")");
  TESSERA_CHECK(!layout.has_partial(), ShardingError, op, layout.to_string(),
                " holds a Partial: its rows are not values yet; redistribute the Partial mesh dims first");
  TESSERA_CHECK(mesh.is_member(), ShardingError, op, "world rank ", rank(), " is not in ", mesh.to_string(),
                " holding ", layout.to_string());
  TESSERA_CHECK(local.defined() && local.ndim() == layout.ndim() &&
                    local.shape()[dim] == layout.local_shape(mesh.coordinate())[dim],
                ShardingError, op, "the local ", local.defined() ? local.shape().to_string() : "(undefined)",
                " is not this rank's rows along dim ", dim, " of ", layout.to_string());
  HaloExchange exchange;
  exchange.state_ = std::make_shared<HaloExchange::State>();
  HaloExchange::State& s = *exchange.state_;
  // No halo: nothing to move, and every rank knows it from the same arguments, so all skip the
  // exchange together.
  if (left == 0 && right == 0) {
    s.local = local;
    s.no_halo = true;
    return exchange;
  }
  s.rows = detail::RowExchange(plan_halo(layout, mesh, dim, left, right, pad), local, 0.0, detail::kRowExchangeTag);
  return exchange;
}

}  // namespace detail

}  // namespace tessera
