// Ring attention (context parallelism; PhysicsNeMo ShardTensor's ring, DTensor's
// context_parallel): when q, k and v split the sequence over one mesh dim, each rank keeps its
// q rows and the k/v blocks travel around that mesh dim's ring; each step runs the fused kernel
// on (q, one k/v block) at the block's global origin (so the causal mask is the unsharded one,
// and blocks wholly in the future are skipped by the kernel), and the steps' results combine by
// their log-sum-exp (online softmax). The backward goes around the same ring: each block's dk/dv
// travel with it and arrive home after a full turn. No rank ever holds more than its own rows
// and one visiting block: the sequence is never gathered.
#include <tessera/comm/tags.hpp>
#include <tessera/dtensor/internal/ring_attention.hpp>

#include <cmath>
#include <limits>
#include <memory>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/internal/attention_kernel.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera::detail {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// The mesh dim whose ring the blocks travel, when q, k and v split the sequence over exactly it
// (and agree on every other mesh dim, which splits only batch or head dims), or -1.
int64_t ring_dim(const Layout& q, const Layout& k, const Layout& v) {
  const int64_t nd = q.ndim(), seq = nd - 2;
  if (k.ndim() != nd || v.ndim() != nd || !(q.mesh() == k.mesh()) || !(k.mesh() == v.mesh())) return -1;
  if (q.shard_order(seq).size() != 1 || k.shard_order(seq) != q.shard_order(seq) ||
      v.shard_order(seq) != k.shard_order(seq) || v.piece_sizes(seq) != k.piece_sizes(seq))
    return -1;
  const int64_t ring = q.shard_order(seq).front();
  for (size_t m = 0; m < q.placements().size(); ++m) {
    if (static_cast<int64_t>(m) == ring) continue;
    const Placement& p = q.placements()[m];
    if (is_partial(p) || is_shard(p, seq) || is_shard(p, nd - 1)) return -1;
    if (!(k.placements()[m] == p) || !(v.placements()[m] == p)) return -1;
  }
  for (int64_t d = 0; d < seq; ++d)
    if (q.piece_sizes(d) != k.piece_sizes(d) || k.piece_sizes(d) != v.piece_sizes(d)) return -1;
  return ring;
}

// A contiguous run of sequence rows in a rank's block: `offset` rows into the local block,
// `length` rows, starting at global row `start` of the (unpermuted) sequence. A block is one
// chunk, or two under the load-balanced (zig-zag) order.
struct Chunk {
  int64_t offset, length, start;
};

// One block's send to the next ring position and receive from the previous, in flight: the
// buffers live here until finish(); an unfinished shift is finished by the destructor (its
// peers' transfers must land before the buffers go).
class Shift {
 public:
  Shift() = default;
  Shift(Shift&&) = default;
  Shift& operator=(Shift&& other) noexcept {
    settle();
    send_ = std::move(other.send_), recv_ = std::move(other.recv_), works_ = std::move(other.works_);
    return *this;
  }
  ~Shift() { settle(); }
  Shift(Communicator& comm, const Tensor& block, Tensor recv, int tag) : send_(block.contiguous()), recv_(std::move(recv)) {
    const int n = comm.size(), me = comm.rank();
    works_.push_back(comm.irecv(recv_.raw_data(), recv_.numel(), recv_.dtype(), (me + n - 1) % n, tag));
    works_.push_back(comm.isend(send_.raw_data(), send_.numel(), send_.dtype(), (me + 1) % n, tag));
  }
  Tensor finish() {
    for (const Work& w : works_) w.wait();
    works_.clear();
    return recv_;
  }

 private:
  void settle() noexcept {
    for (const Work& w : works_) {
      try {
        w.wait();
      } catch (...) {  // the error fails the group; a later call reports it
      }
    }
    works_.clear();
  }
  Tensor send_, recv_;
  std::vector<Work> works_;
};

// Tags of the four streams that travel the ring.
enum RingTag : int { kTagK = kRingAttentionTags.first, kTagV, kTagDK, kTagDV };
static_assert(kTagDV < kRingAttentionTags.end);

// Everything a ring pass needs, shared by the forward and the backward.
struct Ring {
  DeviceMesh mesh;
  std::shared_ptr<const Layout> q, k, v, out;
  std::shared_ptr<Communicator> comm;
  int64_t seq = 0;
  int me = 0, n = 1;
  std::vector<int64_t> k_starts;  // per ring position: where its k block starts in the local order
  std::vector<Chunk> q_chunks;              // this rank's q rows
  std::vector<std::vector<Chunk>> k_chunks;  // per ring position, its k rows
  // Per step, the (q chunk, k chunk) pairs the forward computed; the backward takes the same.
  std::vector<std::vector<std::pair<size_t, size_t>>> pairs;
  AttentionCall call;

  // The block (of any of k, v, dk, dv) that position `owner` holds, shaped like `like` along
  // every dim but the sequence.
  Shape block_shape(const Tensor& like, int owner) const {
    Shape shape = like.shape();
    shape[seq] = k_starts[static_cast<size_t>(owner) + 1] - k_starts[static_cast<size_t>(owner)];
    return shape;
  }
  // Starts sending `block` (held for `owner`) to the next position and receiving the previous
  // position's block (held for owner - 1).
  Shift shift(const Tensor& block, int owner, RingTag tag) const {
    return Shift(*comm, block, empty(block_shape(block, (owner + n - 1) % n), block.dtype()), tag);
  }
  AttentionCall at(const Chunk& q_chunk, const Chunk& k_chunk) const {
    AttentionCall c = call;
    c.origin[seq] = q_chunk.start;
    c.origin[seq + 1] = k_chunk.start;
    return c;
  }
  // A causal pair whose keys all lie after its last query row sees nothing.
  bool masked(const Chunk& q_chunk, const Chunk& k_chunk) const {
    return call.is_causal && k_chunk.start > q_chunk.start + q_chunk.length - 1;
  }
  Tensor rows(const Tensor& t, const Chunk& c) const { return t.narrow(seq, c.offset, c.length).contiguous(); }
};

// dst's rows of chunk c += add.
void add_rows(Tensor& dst, int64_t seq, const Chunk& c, const Tensor& add) {
  Tensor rows = dst.narrow(seq, c.offset, c.length);
  rows.copy_(rows + add);
}

std::vector<DTensor> ring_backward(const Ring& ring, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const DTensor& g_in) {
  const Tensor g = g_in.redistribute(ring.mesh, *ring.out).to_local().contiguous();
  Tensor dq = zeros(q.shape(), q.dtype());
  Tensor kb = k, vb = v, dk, dv;
  Shift dk_moving, dv_moving;  // the previous step's dk/dv on their way to the next position
  int owner = ring.me;
  for (int step = 0; step < ring.n; ++step) {
    Shift k_moving, v_moving;
    if (step + 1 < ring.n) k_moving = ring.shift(kb, owner, kTagK), v_moving = ring.shift(vb, owner, kTagV);
    Tensor dk_step = zeros(kb.shape(), k.dtype()), dv_step = zeros(vb.shape(), v.dtype());
    const auto& k_chunks = ring.k_chunks[static_cast<size_t>(owner)];
    for (const auto& [i, j] : ring.pairs[static_cast<size_t>(step)]) {
      const Chunk& qc = ring.q_chunks[i];
      const Chunk& kc = k_chunks[j];
      const auto grads = attention_backward(ring.rows(g, qc), ring.rows(q, qc), ring.rows(kb, kc), ring.rows(vb, kc),
                                            ring.rows(out, qc), lse.narrow(ring.seq, qc.offset, qc.length).contiguous(),
                                            ring.at(qc, kc));
      add_rows(dq, ring.seq, qc, grads[0]);
      add_rows(dk_step, ring.seq, kc, grads[1]);
      add_rows(dv_step, ring.seq, kc, grads[2]);
    }
    // dk/dv travel with their block, gathering each position's part; after n shifts they are
    // home. This step's arrive while the next step computes.
    dk = step == 0 ? dk_step : dk_moving.finish() + dk_step;
    dv = step == 0 ? dv_step : dv_moving.finish() + dv_step;
    if (ring.n > 1) dk_moving = ring.shift(dk, owner, kTagDK), dv_moving = ring.shift(dv, owner, kTagDV);
    if (step + 1 < ring.n) kb = k_moving.finish(), vb = v_moving.finish();
    owner = (owner + ring.n - 1) % ring.n;
  }
  if (ring.n > 1) dk = dk_moving.finish(), dv = dv_moving.finish();
  return {DTensorAccess::make(dq, ring.mesh, ring.q), DTensorAccess::make(dk, ring.mesh, ring.k),
          DTensorAccess::make(dv, ring.mesh, ring.v)};
}

// Online softmax: (out, lse) of the rows seen so far, merged with one more block's (out_t,
// lse_t), in the kernel's compute dtype: out = sum_t w_t out_t with w_t = exp(lse_t - lse), lse
// = log sum_t exp(lse_t). A row with no visible key in a block has lse_t = -inf (and out_t
// NaN): it weighs nothing.
void merge(Tensor& out, Tensor& lse, const Tensor& out_t, const Tensor& lse_t) {
  if (!out.defined()) {
    out = out_t;
    lse = lse_t;
    return;
  }
  const double minus_inf = -std::numeric_limits<double>::infinity();
  const auto visible = [&](const Tensor& l) { return logical_not(eq(l, minus_inf)); };  // a key seen
  const auto rows = [](const Tensor& t) { return unsqueeze(t, -1); };
  const Tensor top = maximum(lse, lse_t), any = visible(top);
  const Tensor safe_top = where(any, top, zeros_like(top));
  const Tensor w_acc = exp(lse - safe_top), w_t = exp(lse_t - safe_top), total = w_acc + w_t;
  const Tensor zero = zeros_like(out_t);
  const Tensor weighted =
      where(rows(visible(lse)), out, zero) * rows(w_acc) + where(rows(visible(lse_t)), out_t, zero) * rows(w_t);
  // Rows with no visible key anywhere yet keep the kernel's NaN and -inf, as unsharded.
  out = where(rows(any), weighted / rows(total), out_t);
  lse = where(any, safe_top + log(total), lse_t);
}

// The chunks of every ring position's block: one contiguous chunk, or, under a load-balanced
// context_parallel scope, chunks p and 2n-1-p of the sequence cut in 2n (zig-zag). Throws
// ShardingError when the block sizes are not the zig-zag ones the scope promised.
std::vector<std::vector<Chunk>> chunks_of(const std::vector<int64_t>& piece_sizes, bool zigzag, const Layout& layout,
                                          int64_t seq) {
  const int64_t n = static_cast<int64_t>(piece_sizes.size());
  std::vector<std::vector<Chunk>> chunks(static_cast<size_t>(n));
  if (!zigzag) {
    int64_t start = 0;
    for (int64_t p = 0; p < n; ++p) {
      chunks[static_cast<size_t>(p)].push_back({0, piece_sizes[static_cast<size_t>(p)], start});
      start += piece_sizes[static_cast<size_t>(p)];
    }
    return chunks;
  }
  int64_t length = 0;
  for (int64_t s : piece_sizes) length += s;
  const std::vector<int64_t> cut = zigzag_chunk_sizes(length, n);
  std::vector<int64_t> starts(cut.size() + 1, 0);
  for (size_t c = 0; c < cut.size(); ++c) starts[c + 1] = starts[c] + cut[c];
  for (int64_t p = 0; p < n; ++p) {
    const auto [a, b] = zigzag_chunks(p, n);
    TESSERA_CHECK(piece_sizes[a] == cut[a] + cut[b], ShardingError, kOp, "under load-balanced context_parallel, ",
                  layout.to_string(), " should hold ", cut[a] + cut[b], " rows of dim ", seq, " at ring position ", p,
                  " (sequence chunks ", a, " and ", b, "); it holds ", piece_sizes[a]);
    chunks[a] = {{0, cut[a], starts[a]}, {cut[a], cut[b], starts[b]}};
  }
  return chunks;
}

// The calling thread's load-balanced context_parallel scopes, innermost last.
thread_local std::vector<std::pair<DeviceMesh, int64_t>> load_balanced_scopes;

}  // namespace

std::vector<int64_t> zigzag_chunk_sizes(int64_t length, int64_t n) {
  std::vector<int64_t> sizes(static_cast<size_t>(2 * n), length / (2 * n));
  for (int64_t c = 0; c < length % (2 * n); ++c) ++sizes[static_cast<size_t>(c)];
  return sizes;
}

std::vector<size_t> zigzag_order(int64_t n) {
  std::vector<size_t> order;
  for (int64_t p = 0; p < n; ++p) {
    const auto [a, b] = zigzag_chunks(p, n);
    order.push_back(a), order.push_back(b);
  }
  return order;
}

std::vector<int64_t> zigzag_piece_sizes(int64_t length, int64_t n) {
  const std::vector<int64_t> cut = zigzag_chunk_sizes(length, n);
  std::vector<int64_t> sizes;
  for (int64_t p = 0; p < n; ++p) {
    const auto [a, b] = zigzag_chunks(p, n);
    sizes.push_back(cut[a] + cut[b]);
  }
  return sizes;
}

void push_load_balanced_sequence(const DeviceMesh& mesh, int64_t mesh_dim) {
  load_balanced_scopes.emplace_back(mesh, mesh_dim);
}

void pop_load_balanced_sequence() {
  TESSERA_ASSERT(!load_balanced_scopes.empty(), "no load-balanced context_parallel scope to leave");
  load_balanced_scopes.pop_back();
}

bool ring_load_balanced(const DeviceMesh& mesh, int64_t mesh_dim) {
  for (const auto& [m, d] : load_balanced_scopes)
    if (d == mesh_dim && m.spec() == mesh.spec()) return true;
  return false;
}

std::optional<DTensor> ring_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                      const std::optional<DTensor>& attn_mask, double dropout_p, bool is_causal,
                                      std::optional<double> scale) {
  if (attn_mask || dropout_p > 0 || !q.defined() || !k.defined() || !v.defined()) return std::nullopt;
  if (q.ndim() < 2 || !q.device_mesh().is_member()) return std::nullopt;
  const int64_t ring_mesh_dim = ring_dim(q.layout(), k.layout(), v.layout());
  if (ring_mesh_dim < 0) return std::nullopt;
  auto ring = std::make_shared<Ring>();
  ring->call = attention_call(attention_operands(q, k, v, std::optional<DTensor>{}, kOp), 0.0, is_causal, scale, kOp);
  ring->mesh = q.device_mesh();
  ring->seq = q.ndim() - 2;
  ring->comm = ring->mesh.comm_ptr(ring_mesh_dim);
  ring->me = ring->comm->rank();
  ring->n = ring->comm->size();
  const auto& pieces = k.layout().piece_sizes(ring->seq);
  ring->k_starts.assign(pieces.size() + 1, 0);  // the blocks' extents in the local (held) order
  for (size_t p = 0; p < pieces.size(); ++p) ring->k_starts[p + 1] = ring->k_starts[p] + pieces[p];
  // This rank's q rows (and batch and head blocks) place every step's scores in the global ones.
  const Block q_block = q.layout().block(ring->mesh.coordinate());
  ring->call.origin = Shape::filled(q.ndim(), 0);
  for (int64_t d = 0; d < ring->seq; ++d) ring->call.origin[d] = q_block.begin[d];
  ring->q = DTensorAccess::layout_ptr(q);
  ring->k = DTensorAccess::layout_ptr(k);
  ring->v = DTensorAccess::layout_ptr(v);

  const Tensor ql = DTensorAccess::local(q).contiguous(), kl = DTensorAccess::local(k).contiguous(),
               vl = DTensorAccess::local(v).contiguous();
  // Where every block's rows lie in the sequence. Only a causal mask cares; without one the
  // result does not depend on the order.
  const bool zigzag = is_causal && ring_load_balanced(ring->mesh, ring_mesh_dim);
  ring->k_chunks = chunks_of(k.layout().piece_sizes(ring->seq), zigzag, k.layout(), ring->seq);
  ring->q_chunks = chunks_of(q.layout().piece_sizes(ring->seq), zigzag, q.layout(), ring->seq)[static_cast<size_t>(ring->me)];
  // One (out, lse) per q chunk, merged over the steps; the k/v blocks of the next step travel
  // while this one computes.
  std::vector<Tensor> outs(ring->q_chunks.size()), lses(ring->q_chunks.size());
  Tensor kb = kl, vb = vl;
  int owner = ring->me;
  ring->pairs.resize(static_cast<size_t>(ring->n));
  for (int step = 0; step < ring->n; ++step) {
    Shift k_moving, v_moving;
    if (step + 1 < ring->n) k_moving = ring->shift(kb, owner, kTagK), v_moving = ring->shift(vb, owner, kTagV);
    const auto& k_chunks = ring->k_chunks[static_cast<size_t>(owner)];
    for (size_t i = 0; i < ring->q_chunks.size(); ++i)
      for (size_t j = 0; j < k_chunks.size(); ++j) {
        const Chunk& qc = ring->q_chunks[i];
        const Chunk& kc = k_chunks[j];
        // A wholly masked pair is skipped, unless its rows have no result yet (the kernel then
        // gives the unsharded NaN rows, and the merge keeps later blocks' values).
        if (qc.length == 0 || kc.length == 0 || (ring->masked(qc, kc) && outs[i].defined())) continue;
        Tensor lse_t;
        const Tensor out_t =
            attention_forward(ring->rows(ql, qc), ring->rows(kb, kc), ring->rows(vb, kc), ring->at(qc, kc), lse_t);
        merge(outs[i], lses[i], out_t.to(lse_t.dtype()), lse_t);
        ring->pairs[static_cast<size_t>(step)].emplace_back(i, j);
      }
    if (step + 1 < ring->n) kb = k_moving.finish(), vb = v_moving.finish();
    owner = (owner + ring->n - 1) % ring->n;
  }
  std::vector<Tensor> defined_outs, defined_lses;
  for (size_t i = 0; i < outs.size(); ++i)
    if (outs[i].defined()) defined_outs.push_back(outs[i]), defined_lses.push_back(lses[i]);
  Tensor out, lse;
  if (defined_outs.empty()) {  // no q rows here: an empty block of the compute dtype
    Tensor lse_t;
    out = attention_forward(ql, kl, vl, ring->at({0, 0, 0}, {0, 0, 0}), lse_t);
    lse = lse_t;
    out = out.to(lse.dtype());
  } else {
    out = defined_outs.size() == 1 ? defined_outs[0] : cat(defined_outs, ring->seq);
    lse = defined_lses.size() == 1 ? defined_lses[0] : cat(defined_lses, ring->seq);
  }
  const Tensor out_local = out.to(q.dtype());
  Shape out_shape = q.shape();
  out_shape[q.ndim() - 1] = v.shape()[v.ndim() - 1];
  ShardSizes out_sizes = q.layout().explicit_sizes();
  out_sizes.erase(q.ndim() - 1);  // the features become v's, never split
  ring->out = std::make_shared<const Layout>(out_shape, q.dtype(), q.layout().mesh(), q.placements(),
                                             q.layout().shard_orders(), out_sizes);
  DTensor result = DTensorAccess::make(out_local, ring->mesh, ring->out);
  if (autograd::needs_grad<DTensor>({&q, &k, &v})) {
    const Tensor lse_saved = lse, out_saved = out_local;
    autograd::record<DTensor>(kOp, result, {&q, &k, &v}, [ring, ql, kl, vl, out_saved, lse_saved](const DTensor& g) {
      return ring_backward(*ring, ql, kl, vl, out_saved, lse_saved, g);
    });
    // Every rank's backward passes blocks around the ring: it runs even where no gradient arrives.
    result.autograd_meta()->grad_fn->zero_gradient = [ring, shape = out_local.shape(),
                                                      dtype = out_local.dtype()] {
      return std::any(DTensorAccess::make(zeros(shape, dtype), ring->mesh, ring->out));
    };
  }
  return result;
}

}  // namespace tessera::detail
