// The row exchange: post_rows fills what needs no communication (this rank's own rows, the fill)
// and posts every isend/irecv; complete_rows waits and puts the received rows in place. Between
// the two halves a caller can compute (halo_exchange_start / finish).
#include <tessera/dtensor/internal/row_exchange.hpp>

#include <algorithm>
#include <exception>
#include <numeric>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>

namespace tessera::detail {

void RowPlan::set_runs(int64_t p, std::vector<RowRun> piece_runs) {
  int64_t rows = 0;
  for (const RowRun& r : piece_runs) rows += r.length;
  runs[static_cast<size_t>(p)] = std::move(piece_runs);
  out_rows[static_cast<size_t>(p)] = rows;
}

RowPlan row_plan(const Layout& layout, const DeviceMesh& mesh, int64_t dim) {
  const MeshSpec& spec = mesh.spec();
  RowPlan plan;
  plan.dim = dim;
  const auto& pieces = layout.piece_sizes(dim);
  plan.starts.assign(pieces.size() + 1, 0);
  std::partial_sum(pieces.begin(), pieces.end(), plan.starts.begin() + 1);
  plan.runs.resize(pieces.size());
  plan.out_rows.assign(pieces.size(), 0);
  const auto& order = layout.shard_order(dim);
  std::vector<int64_t> dims(order.begin(), order.end());
  std::sort(dims.begin(), dims.end());
  plan.me = piece_of(spec, order, mesh.coordinate());
  for (size_t p = 0; p < pieces.size(); ++p) {
    // Piece p's rank in the group: row-major over the shard order's mesh dims in ascending order.
    const int64_t g = piece_of(spec, dims, piece_coordinate(spec, order, static_cast<int64_t>(p)));
    plan.group_rank.push_back(static_cast<int>(g));
  }
  if (!dims.empty()) plan.comm = dims.size() == 1 ? mesh.comm_ptr(dims.front()) : mesh.comm_ptr(dims);
  return plan;
}

void RowRunBuilder::add(int64_t row, int64_t length, int64_t piece) {
  if (length <= 0) return;
  if (!runs_.empty()) {
    RowRun& last = runs_.back();
    const bool continues = last.piece == piece && (piece == kFillRows || last.row + last.length == row);
    if (continues) {
      last.length += length;
      out_ += length;
      return;
    }
  }
  runs_.push_back({out_, row, length, piece});
  out_ += length;
}

void RowRunBuilder::fill(int64_t count) { add(0, count, kFillRows); }

void RowRunBuilder::rows(int64_t row, int64_t count) {
  const std::vector<int64_t>& starts = *starts_;
  while (count > 0) {
    // The last piece starting at or before the row (empty pieces start where the next one does).
    const auto after = std::upper_bound(starts.begin(), starts.end(), row);
    const int64_t piece = static_cast<int64_t>(after - starts.begin()) - 1;
    const int64_t take = std::min(count, starts[static_cast<size_t>(piece) + 1] - row);
    add(row, take, piece);
    row += take;
    count -= take;
  }
}

int64_t pad_source_row(int64_t i, int64_t length, PadMode mode) {
  if (i >= 0 && i < length) return i;
  if (length == 0) return -1;
  switch (mode) {
    case PadMode::reflect: return i < 0 ? -i : 2 * (length - 1) - i;
    case PadMode::replicate: return std::clamp<int64_t>(i, 0, length - 1);
    case PadMode::circular: return ((i % length) + length) % length;
    default: return -1;
  }
}

namespace {

// x with `dim` moved to the front (a view).
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

// dst += src where `accumulate`, else dst = src.
void put_rows(Tensor dst, const Tensor& src, bool accumulate) {
  if (accumulate)
    dst.copy_(dst + src);
  else
    dst.copy_(src);
}

// Rows posted and not yet waited for: the packed buffers must live until the wait.
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

// The first half of moving rows along the plan. `from` is this rank's tensor of the sending side
// (forward: its piece; backward: the gradient of its output block) and `to` the receiving
// side's. Forward, piece q's runs held by this rank are sent to q and land in q's output block;
// backward, the same rows travel back and are added into the rows they came from.
RowsInFlight post_rows(const RowPlan& plan, const Tensor& from, Tensor& to, bool backward, double fill, int tag) {
  const int64_t dim = plan.dim, me = plan.me;
  const int64_t my_begin = plan.starts[static_cast<size_t>(me)];
  const auto& my_runs = plan.runs[static_cast<size_t>(me)];
  const int n = plan.comm ? plan.comm->size() : 1;
  const Tensor& block = backward ? to : from;  // this rank's piece (global rows)
  const Tensor& output = backward ? from : to;  // this rank's output block
  // Forward: what others' blocks read from my piece / what mine reads from others. Backward: the
  // same lists, the directions swapped.
  std::vector<int64_t> to_peer(static_cast<size_t>(n), 0), from_peer(static_cast<size_t>(n), 0);
  for (size_t q = 0; q < plan.runs.size(); ++q)
    if (static_cast<int64_t>(q) != me)
      for (const RowRun& r : plan.runs[q])
        if (r.piece == me) to_peer[static_cast<size_t>(plan.group_rank[q])] += r.length;
  for (const RowRun& r : my_runs)
    if (r.piece != kFillRows && r.piece != me)
      from_peer[static_cast<size_t>(plan.group_rank[static_cast<size_t>(r.piece)])] += r.length;
  // Runs of this rank's own rows and of the fill: no communication.
  for (const RowRun& r : my_runs) {
    if (r.piece == kFillRows) {
      if (!backward) to.narrow(dim, r.out, r.length).fill_(fill);
    } else if (r.piece == me) {
      Tensor dst = backward ? block.narrow(dim, r.row - my_begin, r.length) : output.narrow(dim, r.out, r.length);
      const Tensor src = backward ? output.narrow(dim, r.out, r.length) : block.narrow(dim, r.row - my_begin, r.length);
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
  // Pack, in run order, the rows for each peer.
  std::vector<int64_t> packed = send_at;
  Tensor& send = flight.send;
  if (!backward) {
    for (size_t q = 0; q < plan.runs.size(); ++q)
      if (static_cast<int64_t>(q) != me)
        for (const RowRun& r : plan.runs[q])
          if (r.piece == me) {
            int64_t& at = packed[static_cast<size_t>(plan.group_rank[q])];
            send.narrow(0, at, r.length).copy_(dim_first(block.narrow(dim, r.row - my_begin, r.length), dim));
            at += r.length;
          }
  } else {
    for (const RowRun& r : my_runs)
      if (r.piece != kFillRows && r.piece != me) {
        int64_t& at = packed[static_cast<size_t>(plan.group_rank[static_cast<size_t>(r.piece)])];
        send.narrow(0, at, r.length).copy_(dim_first(output.narrow(dim, r.out, r.length), dim));
        at += r.length;
      }
  }
  // Only the pieces that share rows talk, each pair with one message per direction; every
  // transfer is posted before any is waited for, so no order of the ranks can deadlock.
  Communicator& comm = *plan.comm;
  const DType dtype = block.dtype();
  const int64_t item = itemsize(dtype);
  for (int g = 0; g < n; ++g)
    if (recv_rows[static_cast<size_t>(g)] > 0)
      flight.works.push_back(comm.irecv(static_cast<std::byte*>(flight.recv.raw_data()) +
                                            flight.recv_at[static_cast<size_t>(g)] * row_elements * item,
                                        recv_rows[static_cast<size_t>(g)] * row_elements, dtype, g, tag));
  for (int g = 0; g < n; ++g)
    if (send_rows[static_cast<size_t>(g)] > 0)
      flight.works.push_back(comm.isend(static_cast<const std::byte*>(send.raw_data()) +
                                            send_at[static_cast<size_t>(g)] * row_elements * item,
                                        send_rows[static_cast<size_t>(g)] * row_elements, dtype, g, tag));
  return flight;
}

// The second half: waits for the rows posted by post_rows and puts them in place.
void complete_rows(const RowPlan& plan, RowsInFlight& flight, Tensor& to, bool backward) {
  if (!plan.comm) return;
  flight.wait();
  const int64_t dim = plan.dim, me = plan.me;
  const int64_t my_begin = plan.starts[static_cast<size_t>(me)];
  std::vector<int64_t> unpacked = flight.recv_at;
  const Tensor& recv = flight.recv;
  if (!backward) {
    for (const RowRun& r : plan.runs[static_cast<size_t>(me)])
      if (r.piece != kFillRows && r.piece != me) {
        int64_t& at = unpacked[static_cast<size_t>(plan.group_rank[static_cast<size_t>(r.piece)])];
        dim_first(to.narrow(dim, r.out, r.length), dim).copy_(recv.narrow(0, at, r.length));
        at += r.length;
      }
  } else {
    for (size_t q = 0; q < plan.runs.size(); ++q)
      if (static_cast<int64_t>(q) != me)
        for (const RowRun& r : plan.runs[q])
          if (r.piece == me) {
            int64_t& at = unpacked[static_cast<size_t>(plan.group_rank[q])];
            put_rows(dim_first(to.narrow(dim, r.row - my_begin, r.length), dim), recv.narrow(0, at, r.length), true);
            at += r.length;
          }
  }
}

}  // namespace

struct RowExchange::State {
  std::shared_ptr<const RowPlan> plan;
  Tensor local;  // the input, for autograd
  Tensor out;
  int tag = kRowExchangeTag;
  RowsInFlight flight;
  bool finished = false;
};

RowExchange::RowExchange(std::shared_ptr<const RowPlan> plan, const Tensor& local, double fill, int tag)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  const int64_t dim = plan->dim;
  TESSERA_CHECK(local.defined() && dim < local.ndim() &&
                    local.shape()[dim] == plan->starts[static_cast<size_t>(plan->me) + 1] -
                                              plan->starts[static_cast<size_t>(plan->me)],
                ShardingError, "row exchange", "the local ", local.defined() ? local.shape().to_string() : "(undefined)",
                " does not hold this rank's ",
                plan->starts[static_cast<size_t>(plan->me) + 1] - plan->starts[static_cast<size_t>(plan->me)],
                " rows along dim ", dim);
  s.plan = std::move(plan);
  s.local = local;
  s.tag = tag;
  autograd::NoGradGuard no_grad;
  const Tensor block = local.detach().contiguous();
  std::vector<int64_t> shape(block.shape().begin(), block.shape().end());
  shape[static_cast<size_t>(dim)] = s.plan->out_rows[static_cast<size_t>(s.plan->me)];
  s.out = empty(Shape(shape), block.dtype());
  s.flight = post_rows(*s.plan, block, s.out, /*backward=*/false, fill, tag);
}

RowExchange::RowExchange(RowExchange&&) noexcept = default;
RowExchange& RowExchange::operator=(RowExchange&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}
RowExchange::~RowExchange() { finish_quietly(); }

void RowExchange::finish_quietly() noexcept {
  if (finished()) return;
  try {
    finish("row exchange");
  } catch (...) {  // a destructor must not throw; the error already failed the group
  }
}

bool RowExchange::finished() const { return !state_ || state_->finished; }

Tensor RowExchange::finish(const char* op) {
  TESSERA_CHECK(state_ && !state_->finished, ValueError, op,
                state_ ? "the exchange was already finished" : "no exchange was started");
  State& s = *state_;
  s.finished = true;
  {
    autograd::NoGradGuard no_grad;
    complete_rows(*s.plan, s.flight, s.out, /*backward=*/false);
  }
  if (autograd::needs_grad<Tensor>({&s.local})) {
    autograd::record<Tensor>(op, s.out, {&s.local}, [plan = s.plan, tag = s.tag, shape = s.local.shape()](const Tensor& g) {
      Tensor grad = zeros(shape, g.dtype());
      RowsInFlight flight = post_rows(*plan, g.contiguous(), grad, /*backward=*/true, 0.0, tag);
      complete_rows(*plan, flight, grad, /*backward=*/true);
      return std::vector<Tensor>{grad};
    });
    // Every rank's backward exchanges rows: it must run even where no gradient arrives.
    s.out.autograd_meta()->grad_fn->zero_gradient = [shape = s.out.shape(), dtype = s.out.dtype()] {
      return std::any(zeros(shape, dtype));
    };
  }
  return s.out;
}

Tensor exchange_rows(std::shared_ptr<const RowPlan> plan, const Tensor& local, double fill, const char* op, int tag) {
  return RowExchange(std::move(plan), local, fill, tag).finish(op);
}

}  // namespace tessera::detail
