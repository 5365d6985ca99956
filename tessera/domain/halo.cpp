// halo_exchange: every rank works out, from the layout alone, which global rows each piece's
// widened block needs and which piece holds each; then point-to-point messages between the pieces
// that share rows move exactly those rows.
#include <tessera/domain/halo.hpp>
#include <tessera/domain/detail/halo_local.hpp>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

constexpr int64_t kZeros = -1;  // a run of padding zeros
constexpr int kHaloTag = 7;     // the halo's point-to-point messages

// Output rows [out, out + length) of one piece's widened block come from global rows
// [row, row + length), held by `piece` (kZeros: padding).
struct Run {
  int64_t out, row, length, piece;
};

// Where the rows of every piece's widened block come from, and who talks to whom.
struct HaloPlan {
  std::vector<int64_t> starts;         // piece p holds global rows [starts[p], starts[p + 1])
  std::vector<std::vector<Run>> runs;  // per piece, its widened block's runs in output order
  std::vector<int> group_rank;         // per piece, its rank in the group communicator
  int64_t me = 0;                      // this rank's piece
  std::shared_ptr<Communicator> comm;  // over the mesh dims sharding the dim (null: unsharded)
};

// The global row that output position g (a global index, possibly outside [0, length)) reads,
// or kZeros.
int64_t source_row(int64_t g, int64_t length, HaloPadding pad) {
  if (g >= 0 && g < length) return g;
  if (length == 0 || pad == HaloPadding::zeros) return kZeros;
  if (pad == HaloPadding::periodic) return ((g % length) + length) % length;
  return std::clamp<int64_t>(g, 0, length - 1);
}

std::vector<Run> runs_of(const std::vector<int64_t>& starts, int64_t q, int64_t left, int64_t right, HaloPadding pad) {
  const int64_t length = starts.back(), begin = starts[static_cast<size_t>(q)], end = starts[static_cast<size_t>(q) + 1];
  std::vector<Run> runs;
  const auto add = [&](int64_t out, int64_t row, int64_t piece) {
    if (!runs.empty()) {
      Run& last = runs.back();
      const bool continues = last.piece == piece && (piece == kZeros || last.row + last.length == row);
      if (continues && last.out + last.length == out) {
        ++last.length;
        return;
      }
    }
    runs.push_back({out, row, 1, piece});
  };
  const auto halo_row = [&](int64_t out, int64_t g) {
    const int64_t row = source_row(g, length, pad);
    if (row == kZeros) return add(out, 0, kZeros);
    // The last piece starting at or before the row (empty pieces start where the next one does).
    const auto after = std::upper_bound(starts.begin(), starts.end(), row);
    add(out, row, static_cast<int64_t>(after - starts.begin()) - 1);
  };
  for (int64_t i = 0; i < left; ++i) halo_row(i, begin - left + i);
  if (end > begin) runs.push_back({left, begin, end - begin, q});
  for (int64_t i = 0; i < right; ++i) halo_row(left + (end - begin) + i, end + i);
  return runs;
}

HaloPlan plan_halo(const Layout& layout, const DeviceMesh& mesh, int64_t dim, int64_t left, int64_t right,
                   HaloPadding pad) {
  const MeshSpec& spec = mesh.spec();
  HaloPlan plan;
  const auto& pieces = layout.piece_sizes(dim);
  plan.starts.assign(pieces.size() + 1, 0);
  std::partial_sum(pieces.begin(), pieces.end(), plan.starts.begin() + 1);
  const auto& order = layout.shard_order(dim);
  std::vector<int64_t> dims(order.begin(), order.end());
  std::sort(dims.begin(), dims.end());
  plan.me = piece_of(spec, order, mesh.coordinate());
  for (size_t p = 0; p < pieces.size(); ++p) {
    // Piece p's rank in the group: row-major over the shard order's mesh dims in ascending order.
    const int64_t g = piece_of(spec, dims, piece_coordinate(spec, order, static_cast<int64_t>(p)));
    plan.group_rank.push_back(static_cast<int>(g));
    plan.runs.push_back(runs_of(plan.starts, static_cast<int64_t>(p), left, right, pad));
  }
  if (!dims.empty()) plan.comm = dims.size() == 1 ? mesh.comm_ptr(dims.front()) : mesh.comm_ptr(dims);
  return plan;
}

// x with dim `from` moved to the front (a view).
Tensor dim_first(const Tensor& x, int64_t dim) {
  std::vector<int64_t> order{dim};
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (d != dim) order.push_back(d);
  return x.permute(order);
}

// Shape of `rows` rows of x along dim, dim first.
Shape rows_shape(const Tensor& x, int64_t dim, int64_t rows) {
  std::vector<int64_t> shape{rows};
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (d != dim) shape.push_back(x.shape()[d]);
  return Shape(shape);
}

// dst[dim rows at] += src rows (both along dim) where `accumulate`, else dst = src.
void put_rows(Tensor dst, const Tensor& src, bool accumulate) {
  if (accumulate)
    dst.copy_(dst + src);
  else
    dst.copy_(src);
}

// Halo rows posted and not yet waited for: the packed buffers must live until the wait.
struct RowsInFlight {
  Tensor send, recv;
  std::vector<int64_t> recv_at;  // per group rank, where its rows land in recv
  std::vector<Work> works;

  // Waits for every transfer, even after one failed (so none is left using the buffers on the
  // threads backend); the first error wins. On MPI a failed group's receives stay posted and
  // cannot be cancelled: their buffers are let go of rather than freed.
  void wait() {
    std::exception_ptr failure;
    for (const Work& w : works) {
      try {
        w.wait();
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    works.clear();
    if (!failure) return;
    new Tensor(recv);  // NOLINT: deliberately leaked, see above
    std::rethrow_exception(failure);
  }
};

// Moves rows along the plan, in two halves (post_rows, then complete_rows) so a caller can
// compute between them: `from` is this rank's tensor of the sending side (forward: its block;
// backward: the gradient of its widened block) and `to` the receiving side's. Forward, each
// piece q's runs held by this rank are sent to q and land in q's widened block; backward, the
// same rows travel back and are added into the blocks they came from. post_rows fills what
// needs no communication (this rank's own rows, the padding) at once.
RowsInFlight post_rows(const HaloPlan& plan, const Tensor& from, Tensor& to, int64_t dim, bool backward) {
  const int64_t me = plan.me;
  const int64_t my_begin = plan.starts[static_cast<size_t>(me)];
  const auto& my_runs = plan.runs[static_cast<size_t>(me)];
  const int n = plan.comm ? plan.comm->size() : 1;
  const Tensor& block = backward ? to : from;      // this rank's piece (global rows)
  const Tensor& widened = backward ? from : to;    // this rank's widened block (output rows)
  // Forward: what others' widened blocks read from my piece (rows of `from`) / what mine reads
  // from others (rows of `to`). Backward: the same lists, the directions swapped.
  std::vector<int64_t> to_peer(static_cast<size_t>(n), 0), from_peer(static_cast<size_t>(n), 0);
  for (size_t q = 0; q < plan.runs.size(); ++q)
    if (static_cast<int64_t>(q) != me)
      for (const Run& r : plan.runs[q])
        if (r.piece == me) to_peer[static_cast<size_t>(plan.group_rank[q])] += r.length;
  for (const Run& r : my_runs)
    if (r.piece != kZeros && r.piece != me) from_peer[static_cast<size_t>(plan.group_rank[static_cast<size_t>(r.piece)])] += r.length;
  // Runs within this rank's own piece and the padding: no communication.
  for (const Run& r : my_runs) {
    if (r.piece == kZeros) {
      if (!backward) to.narrow(dim, r.out, r.length).fill_(0.0);
    } else if (r.piece == me) {
      Tensor dst = backward ? block.narrow(dim, r.row - my_begin, r.length) : widened.narrow(dim, r.out, r.length);
      const Tensor src = backward ? widened.narrow(dim, r.out, r.length) : block.narrow(dim, r.row - my_begin, r.length);
      put_rows(dst, src, backward);
    }
  }
  if (!plan.comm) return {};
  const std::vector<int64_t>& send_rows = backward ? from_peer : to_peer;
  const std::vector<int64_t>& recv_rows = backward ? to_peer : from_peer;
  const int64_t row_elements = rows_shape(block, dim, 1).numel();
  const int64_t total_send = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0});
  const int64_t total_recv = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  RowsInFlight flight;
  flight.send = empty(rows_shape(block, dim, total_send), block.dtype());
  flight.recv = empty(rows_shape(block, dim, total_recv), block.dtype());
  std::vector<int64_t> send_at(static_cast<size_t>(n), 0);
  flight.recv_at.assign(static_cast<size_t>(n), 0);
  for (int g = 1; g < n; ++g) {
    send_at[static_cast<size_t>(g)] = send_at[static_cast<size_t>(g) - 1] + send_rows[static_cast<size_t>(g) - 1];
    flight.recv_at[static_cast<size_t>(g)] =
        flight.recv_at[static_cast<size_t>(g) - 1] + recv_rows[static_cast<size_t>(g) - 1];
  }
  // Rows for peer q's widened block (forward) or back to piece p (backward), in run order.
  std::vector<int64_t> packed = send_at;
  Tensor& send = flight.send;
  if (!backward) {
    for (size_t q = 0; q < plan.runs.size(); ++q)
      if (static_cast<int64_t>(q) != me)
        for (const Run& r : plan.runs[q])
          if (r.piece == me) {
            int64_t& at = packed[static_cast<size_t>(plan.group_rank[q])];
            send.narrow(0, at, r.length).copy_(dim_first(block.narrow(dim, r.row - my_begin, r.length), dim));
            at += r.length;
          }
  } else {
    for (const Run& r : my_runs)
      if (r.piece != kZeros && r.piece != me) {
        int64_t& at = packed[static_cast<size_t>(plan.group_rank[static_cast<size_t>(r.piece)])];
        send.narrow(0, at, r.length).copy_(dim_first(widened.narrow(dim, r.out, r.length), dim));
        at += r.length;
      }
  }
  // Only the neighbours that share rows talk, each pair with one message per direction; every
  // transfer is posted before any is waited for, so no order of the ranks can deadlock.
  Communicator& comm = *plan.comm;
  const DType dtype = block.dtype();
  const int64_t item = itemsize(dtype);
  for (int g = 0; g < n; ++g)
    if (recv_rows[static_cast<size_t>(g)] > 0)
      flight.works.push_back(comm.irecv(static_cast<std::byte*>(flight.recv.raw_data()) +
                                            flight.recv_at[static_cast<size_t>(g)] * row_elements * item,
                                        recv_rows[static_cast<size_t>(g)] * row_elements, dtype, g, kHaloTag));
  for (int g = 0; g < n; ++g)
    if (send_rows[static_cast<size_t>(g)] > 0)
      flight.works.push_back(comm.isend(static_cast<const std::byte*>(send.raw_data()) +
                                            send_at[static_cast<size_t>(g)] * row_elements * item,
                                        send_rows[static_cast<size_t>(g)] * row_elements, dtype, g, kHaloTag));
  return flight;
}

// The second half: waits for the rows posted by post_rows and puts them in place.
void complete_rows(const HaloPlan& plan, RowsInFlight& flight, Tensor& to, int64_t dim, bool backward) {
  if (!plan.comm) return;
  flight.wait();
  const int64_t me = plan.me;
  const int64_t my_begin = plan.starts[static_cast<size_t>(me)];
  std::vector<int64_t> unpacked = flight.recv_at;
  const Tensor& recv = flight.recv;
  if (!backward) {
    for (const Run& r : plan.runs[static_cast<size_t>(me)])
      if (r.piece != kZeros && r.piece != me) {
        int64_t& at = unpacked[static_cast<size_t>(plan.group_rank[static_cast<size_t>(r.piece)])];
        dim_first(to.narrow(dim, r.out, r.length), dim).copy_(recv.narrow(0, at, r.length));
        at += r.length;
      }
  } else {
    for (size_t q = 0; q < plan.runs.size(); ++q)
      if (static_cast<int64_t>(q) != me)
        for (const Run& r : plan.runs[q])
          if (r.piece == me) {
            int64_t& at = unpacked[static_cast<size_t>(plan.group_rank[q])];
            put_rows(dim_first(to.narrow(dim, r.row - my_begin, r.length), dim), recv.narrow(0, at, r.length), true);
            at += r.length;
          }
  }
}

void move_rows(const HaloPlan& plan, const Tensor& from, Tensor& to, int64_t dim, bool backward) {
  RowsInFlight flight = post_rows(plan, from, to, dim, backward);
  complete_rows(plan, flight, to, dim, backward);
}

}  // namespace

// An exchange between halo_exchange_start and finish: its plan, its input and its output
// (own rows and padding in place, halo rows in flight).
struct HaloExchange::State {
  std::shared_ptr<const HaloPlan> plan;  // null: no halo asked for, nothing moves
  Tensor local;                          // the input, for autograd
  Tensor out;
  int64_t dim = 0;
  RowsInFlight flight;
  bool finished = false;
};

HaloExchange::HaloExchange() = default;
HaloExchange::HaloExchange(HaloExchange&&) noexcept = default;
HaloExchange& HaloExchange::operator=(HaloExchange&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}
HaloExchange::~HaloExchange() { finish_quietly(); }

void HaloExchange::finish_quietly() noexcept {
  if (!state_ || state_->finished) return;
  try {
    finish();
  } catch (...) {  // a destructor must not throw; the error already failed the group
  }
}

bool HaloExchange::finished() const { return !state_ || state_->finished; }

Tensor HaloExchange::finish() {
  TESSERA_CHECK(state_ && !state_->finished, ValueError, "HaloExchange::finish",
                state_ ? "the exchange was already finished" : "no exchange was started");
  State& s = *state_;
  s.finished = true;
  if (!s.plan) return s.local;
  {
    autograd::NoGradGuard no_grad;
    complete_rows(*s.plan, s.flight, s.out, s.dim, /*backward=*/false);
  }
  if (autograd::needs_grad<Tensor>({&s.local})) {
    autograd::record<Tensor>("halo_exchange", s.out, {&s.local},
                             [plan = s.plan, dim = s.dim, local_shape = s.local.shape()](const Tensor& g) {
                               Tensor grad = zeros(local_shape, g.dtype());
                               move_rows(*plan, g.contiguous(), grad, dim, /*backward=*/true);
                               return std::vector<Tensor>{grad};
                             });
    // Every rank's backward exchanges halo rows: it must run even where no gradient arrives.
    s.out.autograd_meta()->grad_fn->zero_gradient = [shape = s.out.shape(), dtype = s.out.dtype()] {
      return std::any(zeros(shape, dtype));
    };
  }
  return s.out;
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
  s.local = local;
  s.dim = dim;
  // No halo: nothing to move, and every rank knows it from the same arguments, so all skip the
  // exchange together.
  if (left == 0 && right == 0) return exchange;
  s.plan = std::make_shared<const HaloPlan>(plan_halo(layout, mesh, dim, left, right, pad));
  autograd::NoGradGuard no_grad;
  const Tensor block = local.detach().contiguous();
  std::vector<int64_t> shape(block.shape().begin(), block.shape().end());
  shape[static_cast<size_t>(dim)] += left + right;
  s.out = empty(Shape(shape), block.dtype());
  s.flight = post_rows(*s.plan, block, s.out, dim, /*backward=*/false);
  return exchange;
}

}  // namespace detail

}  // namespace tessera
