#pragma once
// Halo exchange (PhysicsNeMo ShardTensor's domain parallelism): a rank's block of a tensor
// sharded along a spatial dim, widened by its neighbours' rows, as a stencil, convolution or
// pooling window at the block's edge needs them. Only the halo rows move.
#include <cstdint>
#include <memory>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {

/// What lies beyond the domain's edges: zeros, the other edge's rows (periodic), or the edge row
/// repeated (replicate), as torch's padding modes "constant" (0), "circular" and "replicate".
enum class HaloPadding : uint8_t { zeros, periodic, replicate };

/// This rank's block of `x` along `dim` with `left` rows before it and `right` rows after it
/// from the pieces around it: global rows [begin - left, end + right) of the block's range
/// [begin, end), the rows beyond the domain's edges given by `pad`. The result always has
/// left + length + right rows along dim (the other dims are the block's). Works for any layout
/// whose dim is sharded, over one mesh dim or several (shard order), with uneven and empty
/// pieces: a halo wider than a neighbour's piece reaches the pieces beyond it. An unsharded dim
/// only pads. Non-blocking point-to-point messages (isend/irecv) between the pieces that share
/// rows, one per pair and direction carrying exactly the rows needed, all posted before any is
/// waited for, so no ordering of the ranks can deadlock.
/// Differentiable: the backward adds each halo row's gradient back into the row it came from.
/// Communicates. Throws ShardingError naming the layout for a Partial, a negative width or a dim
/// out of range.
/// Example: rows 0..9 over 2 ranks as S(0), left = right = 1, zeros: rank 0 gets rows
/// [0, 0..4, 5] (a zero row first), rank 1 gets [4, 5..9, 0].
Tensor halo_exchange(const DTensor& x, int64_t dim, int64_t left, int64_t right, HaloPadding pad = HaloPadding::zeros);

class HaloExchange;
namespace detail {
HaloExchange halo_exchange_start_local(const Tensor& local, const Layout& layout, const DeviceMesh& mesh, int64_t dim,
                                       int64_t left, int64_t right, HaloPadding pad, const char* op);
}

/// A halo exchange in flight, from halo_exchange_start: the halo rows are on their way and the
/// rank may compute meanwhile on what needs no halo (the interior of x.to_local()). Move-only.
class HaloExchange {
 public:
  HaloExchange();
  HaloExchange(HaloExchange&&) noexcept;
  HaloExchange& operator=(HaloExchange&&) noexcept;
  /// An exchange never finished is finished here (its rows must land before its buffers go).
  ~HaloExchange();

  /// Waits for the halo rows and returns the widened block: what halo_exchange returns, with
  /// its gradient. Throws ValueError when called twice.
  Tensor finish();
  /// True once finish() ran (and for a default-constructed exchange).
  bool finished() const;

 private:
  friend HaloExchange detail::halo_exchange_start_local(const Tensor&, const Layout&, const DeviceMesh&, int64_t,
                                                        int64_t, int64_t, HaloPadding, const char*);
  struct State;
  std::shared_ptr<State> state_;
};

/// halo_exchange in two halves, to overlap the exchange with compute: posts the transfers and
/// returns at once; finish() waits and returns the widened block.
/// Example (a 3-point stencil): start, compute the interior rows from x.to_local(), then the two
/// border rows from finish()'s widened block.
HaloExchange halo_exchange_start(const DTensor& x, int64_t dim, int64_t left, int64_t right,
                                 HaloPadding pad = HaloPadding::zeros);

}  // namespace tessera
