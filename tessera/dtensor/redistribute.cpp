// Running redistribute plans: each step becomes one collective over one mesh dim or over the
// group of several (DeviceMesh::comm_ptr(dims)), or one
// all_to_all_v (point-to-point when no communicator covers the ranks), moving exactly the pieces
// the planner costed. Buffers are packed only when the pieces are not already consecutive.
#include <tessera/dtensor/detail/redistribute.hpp>

#include <memory>
#include <optional>

#include <tessera/core/error.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::detail {

namespace {

Block empty_block(int64_t ndim) {
  const Shape zero = Shape::filled(ndim, 0);
  return Block{zero, zero};
}

Block relative(const Block& piece, const Block& whole) {
  Block out = piece;
  for (int64_t d = 0; d < piece.begin.size(); ++d) {
    out.begin[d] -= whole.begin[d];
    out.end[d] -= whole.begin[d];
  }
  return out;
}

// Where `piece` (inside `whole`) starts in a contiguous tensor holding `whole`, if it occupies
// one run of its memory: full extent on every dim after some d, extent 1 on every dim before.
std::optional<int64_t> contiguous_start(const Block& whole, const Block& piece) {
  const Block rel = relative(piece, whole);
  const Shape shape = whole.shape();
  int64_t d = shape.size() - 1;
  while (d >= 0 && rel.begin[d] == 0 && rel.end[d] == shape[d]) --d;
  for (int64_t i = 0; i < d; ++i)
    if (rel.end[i] - rel.begin[i] != 1) return std::nullopt;
  int64_t offset = 0, stride = 1;
  for (int64_t i = shape.size() - 1; i >= 0; --i) {
    offset += rel.begin[i] * stride;
    stride *= shape[i];
  }
  return offset;
}

// True if the non-empty pieces, in order, lie back to back in a contiguous tensor holding `whole`.
bool consecutive(const Block& whole, const std::vector<Block>& pieces) {
  int64_t next = -1;
  for (const Block& p : pieces) {
    if (p.numel() == 0) continue;
    const auto start = contiguous_start(whole, p);
    if (!start || (next >= 0 && *start != next)) return false;
    next = *start + p.numel();
  }
  return true;
}

int64_t first_start(const Block& whole, const std::vector<Block>& pieces) {
  for (const Block& p : pieces)
    if (p.numel() > 0) return *contiguous_start(whole, p);
  return 0;
}

std::vector<int64_t> counts_of(const std::vector<Block>& pieces) {
  std::vector<int64_t> counts;
  for (const Block& p : pieces) counts.push_back(p.numel());
  return counts;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total;
}

const char* byte_pointer(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }

// The pieces of `tensor` (holding `whole`) packed back to back: a pointer into tensor itself when
// they already are, else into `scratch`.
const void* packed(const Tensor& tensor, const Block& whole, const std::vector<Block>& pieces, Tensor& scratch) {
  if (tensor.is_contiguous() && consecutive(whole, pieces))
    return byte_pointer(tensor) + first_start(whole, pieces) * tensor.itemsize();
  scratch = empty(Shape{sum(counts_of(pieces))}, tensor.dtype());
  int64_t at = 0;
  for (const Block& p : pieces) {
    if (p.numel() == 0) continue;
    scratch.narrow(0, at, p.numel()).view(p.shape()).copy_(view_of(tensor, whole, p));
    at += p.numel();
  }
  return scratch.raw_data();
}

// Receives pieces back to back: straight into `out` when they lie so there; else into a scratch
// buffer that `finish` unpacks.
struct Landing {
  Tensor& out;
  const Block& whole;
  const std::vector<Block>& pieces;
  Tensor scratch;
  bool direct;
  Landing(Tensor& o, const Block& w, const std::vector<Block>& p)
      : out(o), whole(w), pieces(p), direct(consecutive(w, p)) {
    if (!direct) scratch = empty(Shape{sum(counts_of(p))}, o.dtype());
  }
  void* buffer() {
    if (!direct) return scratch.raw_data();
    return static_cast<char*>(out.raw_data()) + first_start(whole, pieces) * out.itemsize();
  }
  void finish() {
    if (direct) return;
    int64_t at = 0;
    for (const Block& p : pieces) {
      if (p.numel() == 0) continue;
      view_of(out, whole, p).copy_(scratch.narrow(0, at, p.numel()).view(p.shape()));
      at += p.numel();
    }
  }
};

// all_to_all_v of blocks over `comm`: send[j] (inside `held`, from `local`) goes to group rank j,
// recv[j] (inside `want`) comes from group rank j, self included.
Tensor all_to_all_blocks(Communicator& comm, const Tensor& local, const Block& held, const std::vector<Block>& send,
                         const Block& want, const std::vector<Block>& recv, DType dtype) {
  Tensor out = empty(want.shape(), dtype);
  Tensor scratch;
  const void* send_buffer = packed(local, held, send, scratch);
  Landing landing(out, want, recv);
  comm.all_to_all_v(send_buffer, counts_of(send), landing.buffer(), counts_of(recv), dtype);
  landing.finish();
  return out;
}

Tensor copy_step(const PlanStep& step, const DeviceMesh& mesh, const Tensor& local) {
  const auto coordinate = mesh.coordinate();
  const Block held = step.before.block(coordinate), want = step.after.block(coordinate);
  Communicator& comm = *mesh.comm_ptr(step.mesh_dims);
  std::vector<Block> send, recv;
  for (const auto& c : mesh.spec().group(coordinate, step.mesh_dims)) {
    send.push_back(held.intersect(step.after.block(c)));
    recv.push_back(want.intersect(step.before.block(c)));
  }
  if (step.kind == StepKind::all_gather) {
    // Every rank's whole block goes to every other: all_gather(_v) of the local as it is.
    Tensor out = empty(want.shape(), step.after.dtype());
    const Tensor source = local.contiguous();
    Landing landing(out, want, recv);
    const auto counts = counts_of(recv);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts.front(); });
    if (even) comm.all_gather(source.raw_data(), landing.buffer(), counts.front(), out.dtype());
    else comm.all_gather_v(source.raw_data(), landing.buffer(), counts, out.dtype());
    landing.finish();
    return out;
  }
  return all_to_all_blocks(comm, local, held, send, want, recv, step.after.dtype());
}

Tensor reduce_scatter_step(const PlanStep& step, const DeviceMesh& mesh, const Tensor& local) {
  const auto coordinate = mesh.coordinate();
  const Block held = step.before.block(coordinate), want = step.after.block(coordinate);
  std::vector<Block> pieces;
  for (const auto& c : mesh.spec().group(coordinate, step.mesh_dims)) pieces.push_back(step.after.block(c));
  Tensor scratch;
  const void* send = packed(local, held, pieces, scratch);
  Tensor out = empty(want.shape(), step.after.dtype());
  const auto counts = counts_of(pieces);
  const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts.front(); });
  Communicator& comm = *mesh.comm_ptr(step.mesh_dims);
  if (even) comm.reduce_scatter(send, out.raw_data(), counts.front(), out.dtype(), step.op);
  else comm.reduce_scatter_v(send, out.raw_data(), counts, out.dtype(), step.op);
  return out;
}

Tensor to_partial_step(const PlanStep& step, const DeviceMesh& mesh, const Tensor& local) {
  // The reduction over the mesh dim must give back the replicated value: sum keeps it on the
  // first rank and adds zeros elsewhere; product multiplies by ones; avg/max/min keep it all.
  if (mesh.coordinate()[static_cast<size_t>(step.mesh_dim)] == 0) return local;
  if (step.op == ReduceOp::sum) return zeros(local.shape(), local.dtype());
  if (step.op == ReduceOp::product) return ones(local.shape(), local.dtype());
  return local;
}

// Point-to-point fallback: pairs meet in one global order (by the lower world rank, then the
// higher), so blocking sends cannot wait on each other in a cycle.
Tensor exchange_p2p(const std::vector<Transfer>& transfers, const Tensor& local, const Block& held,
                    const Block& want, DType dtype) {
  const int me = rank();
  Communicator& comm = world();
  Tensor out = empty(want.shape(), dtype);
  std::vector<const Transfer*> sends(static_cast<size_t>(comm.size()), nullptr);
  std::vector<const Transfer*> recvs(static_cast<size_t>(comm.size()), nullptr);
  for (const Transfer& t : transfers) {
    if (t.src_rank == me && t.dst_rank == me) view_of(out, want, t.block).copy_(view_of(local, held, t.block));
    else if (t.src_rank == me) sends[static_cast<size_t>(t.dst_rank)] = &t;
    else if (t.dst_rank == me) recvs[static_cast<size_t>(t.src_rank)] = &t;
  }
  const auto send_to = [&](int peer) {
    if (const Transfer* t = sends[static_cast<size_t>(peer)]) {
      const Tensor piece = view_of(local, held, t->block).contiguous();
      comm.send(piece.raw_data(), piece.numel(), dtype, peer);
    }
  };
  const auto recv_from = [&](int peer) {
    if (const Transfer* t = recvs[static_cast<size_t>(peer)]) {
      Tensor piece = empty(t->block.shape(), dtype);
      comm.recv(piece.raw_data(), piece.numel(), dtype, peer);
      view_of(out, want, t->block).copy_(piece);
    }
  };
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer == me) continue;
    if (peer < me) recv_from(peer), send_to(peer);
    else send_to(peer), recv_from(peer);
  }
  return out;
}

// The last step of a plan, issued asynchronously. Everything the collective reads or writes is
// owned by the returned closure (and `local`, which the caller must leave untouched until then).
PendingLocal issue_async(const PlanStep& step, const Tensor& local, const DeviceMesh& mesh) {
  const auto coordinate = mesh.coordinate();
  const Block held = step.before.block(coordinate), want = step.after.block(coordinate);
  const DType dtype = step.after.dtype();
  Communicator& comm = *mesh.comm_ptr(step.mesh_dims);
  const auto group = mesh.spec().group(coordinate, step.mesh_dims);
  struct Buffers {
    Tensor source, scratch, out;
    Block want;  // the landing refers to it
    std::vector<Block> send, recv;
    std::optional<Landing> landing;
  };
  auto b = std::make_shared<Buffers>();
  b->source = local;
  b->want = want;
  if (step.kind == StepKind::all_reduce) {
    b->out = local.clone();
    Work work = comm.all_reduce_async(b->out.raw_data(), b->out.numel(), dtype, step.op);
    return {work, [b] { return b->out; }};
  }
  if (step.kind == StepKind::reduce_scatter) {
    for (const auto& c : group) b->send.push_back(step.after.block(c));
    const auto counts = counts_of(b->send);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts.front(); });
    const void* send = packed(local, held, b->send, b->scratch);
    if (even) {
      b->out = empty(want.shape(), dtype);
      Work work = comm.reduce_scatter_async(send, b->out.raw_data(), counts.front(), dtype, step.op);
      return {work, [b] { return b->out; }};
    }
    // Uneven pieces (no async reduce_scatter_v): every rank's partial of my block comes to me by
    // all_to_all_v, the same bytes, and I reduce them in group order, accumulating halves in f32.
    const int64_t k = static_cast<int64_t>(group.size());
    b->out = empty(Shape{k * want.numel()}, dtype);
    Work work = comm.all_to_all_v_async(send, counts, b->out.raw_data(),
                                        std::vector<int64_t>(static_cast<size_t>(k), want.numel()), dtype);
    const ReduceOp op = step.op;
    return {work, [b, k, want, op, dtype] {
              const DType wide = dtype == DType::f16 || dtype == DType::bf16 ? DType::f32 : dtype;
              Tensor total;
              for (int64_t j = 0; j < k; ++j) {
                const Tensor part = b->out.narrow(0, j * want.numel(), want.numel()).to(wide);
                if (j == 0) total = part.clone();
                else if (op == ReduceOp::sum || op == ReduceOp::avg) total = add(total, part);
                else if (op == ReduceOp::product) total = mul(total, part);
                else if (op == ReduceOp::max) total = maximum(total, part);
                else total = minimum(total, part);
              }
              if (op == ReduceOp::avg) total = div(total, Scalar(static_cast<double>(k)));
              return total.to(dtype).view(want.shape());
            }};
  }
  // all_gather and all_to_all: my block's piece of each peer's new block goes to it.
  for (const auto& c : group) {
    b->send.push_back(held.intersect(step.after.block(c)));
    b->recv.push_back(want.intersect(step.before.block(c)));
  }
  b->out = empty(want.shape(), dtype);
  const void* send = packed(local, held, b->send, b->scratch);
  b->landing.emplace(b->out, b->want, b->recv);
  Work work = comm.all_to_all_v_async(send, counts_of(b->send), b->landing->buffer(), counts_of(b->recv), dtype);
  return {work, [b] {
            b->landing->finish();
            return b->out;
          }};
}

}  // namespace

PendingLocal run_plan_async(const Plan& plan, const Tensor& local, const DeviceMesh& src_mesh,
                            const DeviceMesh& dst_mesh) {
  const auto done = [](Tensor t) { return PendingLocal{Work{}, [t] { return t; }}; };
  if (plan.steps.empty() || plan.src.global_shape().numel() == 0) return done(run_plan(plan, local, src_mesh, dst_mesh));
  const PlanStep& last = plan.steps.back();
  const DeviceMesh& mesh = last.before.mesh() == src_mesh.spec() ? src_mesh : dst_mesh;
  int64_t group_size = 1;
  for (int64_t m : last.mesh_dims) group_size *= mesh.spec().shape()[m];
  // Steps that move nothing, and exchanges (which may run point-to-point), finish at the call.
  const bool collective = last.kind == StepKind::all_reduce || last.kind == StepKind::reduce_scatter ||
                          last.kind == StepKind::all_gather || last.kind == StepKind::all_to_all;
  if (!collective || group_size == 1) return done(run_plan(plan, local, src_mesh, dst_mesh));
  Plan head = plan;
  head.steps.pop_back();
  head.dst = last.before;
  const Tensor before = run_plan(head, local, src_mesh, dst_mesh);
  if (!mesh.is_member()) return done(empty(Shape::filled(plan.dst.ndim(), 0), plan.dst.dtype()));
  return issue_async(last, before, mesh);
}

Tensor view_of(const Tensor& tensor, const Block& whole, const Block& piece) {
  Tensor out = tensor;
  for (int64_t d = 0; d < piece.begin.size(); ++d)
    out = out.narrow(d, piece.begin[d] - whole.begin[d], piece.end[d] - piece.begin[d]);
  return out;
}

Tensor run_exchange(const std::vector<Transfer>& transfers, const Tensor& local, const Block& held, const Block& want,
                    DType dtype, const std::shared_ptr<Communicator>& group) {
  if (!group) return exchange_p2p(transfers, local, held, want, dtype);
  // A 0-d block always holds its one element, so a peer with no transfer would still count one:
  // exchange 0-d tensors as [1], where "nothing" is the empty block.
  if (want.begin.size() == 0) {
    const Block one{Shape{0}, Shape{1}};
    std::vector<Transfer> lifted = transfers;
    for (Transfer& t : lifted) t.block = one;
    return run_exchange(lifted, local.reshape({1}), one, one, dtype, group).reshape({});
  }
  const int me = rank();
  const auto& ranks = group->world_ranks();
  const auto index_of = [&](int world_rank) {
    const auto it = std::find(ranks.begin(), ranks.end(), world_rank);
    TESSERA_ASSERT(it != ranks.end(), "exchange transfer names world rank ", world_rank, " outside ",
                   group->to_string());
    return static_cast<size_t>(it - ranks.begin());
  };
  const int64_t ndim = want.begin.size();
  std::vector<Block> send(ranks.size(), empty_block(ndim)), recv(ranks.size(), empty_block(ndim));
  for (const Transfer& t : transfers) {
    if (t.src_rank == me) send[index_of(t.dst_rank)] = t.block;
    if (t.dst_rank == me) recv[index_of(t.src_rank)] = t.block;
  }
  return all_to_all_blocks(*group, local, held, send, want, recv, dtype);
}

Tensor run_plan(const Plan& plan, const Tensor& local, const DeviceMesh& src_mesh, const DeviceMesh& dst_mesh) {
  Tensor current = local;
  const int me = rank();
  // No elements, nothing to move: every rank makes its (empty) block of dst alone. Every rank
  // takes this branch alike (the global shape is the same on all), so none waits on another.
  if (plan.src.global_shape().numel() == 0) {
    const bool member = plan.dst.mesh().contains(me);
    return empty(member ? plan.dst.block_of_rank(me).shape() : Shape::filled(plan.dst.ndim(), 0), plan.dst.dtype());
  }
  for (const PlanStep& step : plan.steps) {
    if (step.kind == StepKind::exchange) {
      const bool sends = step.before.mesh().contains(me), receives = step.after.mesh().contains(me);
      if (!sends && !receives) continue;
      const Block held = sends ? step.before.block_of_rank(me) : empty_block(plan.src.ndim());
      const Block want = receives ? step.after.block_of_rank(me) : empty_block(plan.src.ndim());
      std::shared_ptr<Communicator> group;
      if (step.before.mesh() == step.after.mesh())
        group = (step.before.mesh() == src_mesh.spec() ? src_mesh : dst_mesh).mesh_comm_ptr();
      current = run_exchange(exchange_transfers(step.before, step.after, me), current, held, want, plan.src.dtype(), group);
      continue;
    }
    const DeviceMesh& mesh = step.before.mesh() == src_mesh.spec() ? src_mesh : dst_mesh;
    if (!mesh.is_member()) continue;
    // Over mesh dims of one rank every placement holds the same block with the same values
    // (that rank is the whole group): the step is a relabelling, with no call to make.
    int64_t group_size = 1;
    for (int64_t m : step.mesh_dims) group_size *= mesh.size(m);
    if (group_size == 1) continue;
    switch (step.kind) {
      case StepKind::local_chunk: {
        // A view, as DTensor's chunk: no copy (later steps pack what they send anyway).
        const auto c = mesh.coordinate();
        current = view_of(current, step.before.block(c), step.after.block(c));
        break;
      }
      case StepKind::to_partial:
        current = to_partial_step(step, mesh, current);
        break;
      case StepKind::all_gather:
      case StepKind::all_to_all:
        current = copy_step(step, mesh, current);
        break;
      case StepKind::reduce_scatter:
        current = reduce_scatter_step(step, mesh, current);
        break;
      case StepKind::all_reduce: {
        current = current.clone();
        mesh.comm_ptr(step.mesh_dims)->all_reduce(current.raw_data(), current.numel(), current.dtype(), step.op);
        break;
      }
      case StepKind::exchange:
        break;
    }
  }
  if (!plan.dst.mesh().contains(me)) return empty(Shape::filled(plan.dst.ndim(), 0), plan.dst.dtype());
  return current;
}

}  // namespace tessera::detail
