// Ring attention (context parallelism; PhysicsNeMo ShardTensor's ring, DTensor's
// context_parallel): when q, k and v split the sequence over one mesh dim, each rank keeps its
// q rows and the k/v blocks travel around that mesh dim's ring; each step runs the fused kernel
// on (q, one k/v block) at the block's global origin (so the causal mask is the unsharded one,
// and blocks wholly in the future are skipped by the kernel), and the steps' results combine by
// their log-sum-exp (online softmax). The backward goes around the same ring: each block's dk/dv
// travel with it and arrive home after a full turn. No rank ever holds more than its own rows
// and one visiting block: the sequence is never gathered.
#include <tessera/dtensor/detail/ring_attention.hpp>

#include <cmath>
#include <limits>
#include <memory>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/dispatch.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/detail/attention_kernel.hpp>
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

// Everything a ring pass needs, shared by the forward and the backward.
struct Ring {
  DeviceMesh mesh;
  std::shared_ptr<const Layout> q, k, v, out;
  std::shared_ptr<Communicator> comm;
  int64_t seq = 0;
  int me = 0, n = 1;
  std::vector<int64_t> k_starts;  // per ring position: where its k block starts in the sequence
  AttentionCall call;

  // The block (of any of k, v, dk, dv) that position `owner` holds, shaped like `like` along
  // every dim but the sequence.
  Shape block_shape(const Tensor& like, int owner) const {
    Shape shape = like.shape();
    shape[seq] = k_starts[static_cast<size_t>(owner) + 1] - k_starts[static_cast<size_t>(owner)];
    return shape;
  }
  // Sends `block` (held for `owner`) to the next position and returns the previous position's
  // block (held for owner - 1): one all_to_all_v with one message each way.
  Tensor shift(const Tensor& block, int owner) const {
    const int next = (me + 1) % n, prev = (me + n - 1) % n, incoming = (owner + n - 1) % n;
    const Tensor send = block.contiguous();
    Tensor recv = empty(block_shape(block, incoming), block.dtype());
    std::vector<int64_t> send_counts(static_cast<size_t>(n), 0), recv_counts(static_cast<size_t>(n), 0);
    send_counts[static_cast<size_t>(next)] = send.numel();
    recv_counts[static_cast<size_t>(prev)] = recv.numel();
    comm->all_to_all_v(send.raw_data(), send_counts, recv.raw_data(), recv_counts, block.dtype());
    return recv;
  }
  AttentionCall at(int owner) const {
    AttentionCall c = call;
    c.origin[seq + 1] = k_starts[static_cast<size_t>(owner)];
    return c;
  }
};

std::vector<DTensor> ring_backward(const Ring& ring, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const DTensor& g_in) {
  const Tensor g = g_in.redistribute(ring.mesh, *ring.out).to_local().contiguous();
  Tensor dq = zeros(q.shape(), q.dtype());
  Tensor kb = k, vb = v, dk = zeros(k.shape(), k.dtype()), dv = zeros(v.shape(), v.dtype());
  int owner = ring.me;
  for (int step = 0; step < ring.n; ++step) {
    const auto grads = attention_backward(g, q, kb, vb, out, lse, ring.at(owner));
    dq = dq + grads[0];
    dk = dk + grads[1];
    dv = dv + grads[2];
    // dk/dv travel with their block; after n shifts they are back with its owner.
    if (step + 1 < ring.n) {
      kb = ring.shift(kb, owner);
      vb = ring.shift(vb, owner);
    }
    if (ring.n > 1) {
      dk = ring.shift(dk, owner);
      dv = ring.shift(dv, owner);
    }
    owner = (owner + ring.n - 1) % ring.n;
  }
  return {DTensorAccess::make(dq, ring.mesh, ring.q), DTensorAccess::make(dk, ring.mesh, ring.k),
          DTensorAccess::make(dv, ring.mesh, ring.v)};
}

}  // namespace

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
  ring->k_starts.assign(pieces.size() + 1, 0);
  for (size_t p = 0; p < pieces.size(); ++p) ring->k_starts[p + 1] = ring->k_starts[p] + pieces[p];
  // This rank's q rows (and batch and head blocks) place every step's scores in the global ones.
  const Block q_block = q.layout().block(ring->mesh.coordinate());
  ring->call.origin = Shape::filled(q.ndim(), 0);
  for (int64_t d = 0; d < ring->seq + 1; ++d) ring->call.origin[d] = q_block.begin[d];
  ring->q = DTensorAccess::layout_ptr(q);
  ring->k = DTensorAccess::layout_ptr(k);
  ring->v = DTensorAccess::layout_ptr(v);

  const Tensor ql = DTensorAccess::local(q).contiguous(), kl = DTensorAccess::local(k).contiguous(),
               vl = DTensorAccess::local(v).contiguous();
  // Online softmax over the steps, in the kernel's compute dtype: out = sum_t w_t out_t with
  // w_t = exp(lse_t - lse), lse = log sum_t exp(lse_t). A row with no visible key in a block
  // has lse_t = -inf (and out_t NaN): it weighs nothing.
  Tensor out, lse;
  Tensor kb = kl, vb = vl;
  int owner = ring->me;
  for (int step = 0; step < ring->n; ++step) {
    Tensor lse_t;
    Tensor out_t = attention_forward(ql, kb, vb, ring->at(owner), lse_t);
    out_t = out_t.to(lse_t.dtype());
    if (!out.defined()) {
      out = out_t;
      lse = lse_t;
    } else {
      const double minus_inf = -std::numeric_limits<double>::infinity();
      const auto visible = [&](const Tensor& l) { return logical_not(eq(l, minus_inf)); };  // a key seen
      const auto rows = [](const Tensor& t) { return unsqueeze(t, -1); };
      const Tensor top = maximum(lse, lse_t), any = visible(top);
      const Tensor safe_top = where(any, top, zeros_like(top));
      const Tensor w_acc = exp(lse - safe_top), w_t = exp(lse_t - safe_top), total = w_acc + w_t;
      const Tensor zero = zeros_like(out_t);
      const Tensor weighted = where(rows(visible(lse)), out, zero) * rows(w_acc) +
                              where(rows(visible(lse_t)), out_t, zero) * rows(w_t);
      // Rows with no visible key anywhere yet keep the kernel's NaN and -inf, as unsharded.
      out = where(rows(any), weighted / rows(total), out_t);
      lse = where(any, safe_top + log(total), lse_t);
    }
    if (step + 1 < ring->n) {
      kb = ring->shift(kb, owner);
      vb = ring->shift(vb, owner);
    }
    owner = (owner + ring->n - 1) % ring->n;
  }
  const Tensor out_local = out.to(q.dtype());
  Shape out_shape = q.shape();
  out_shape[q.ndim() - 1] = v.shape()[v.ndim() - 1];
  ring->out = std::make_shared<const Layout>(out_shape, q.dtype(), q.layout().mesh(), q.placements(), [&] {
    ShardOrder order;
    for (int64_t d = 0; d < q.ndim(); ++d)
      if (q.layout().shard_order(d).size() > 1) order[d] = q.layout().shard_order(d);
    return order;
  }(), [&] {
    ShardSizes sizes;
    for (int64_t d = 0; d < q.ndim() - 1; ++d)
      if (q.layout().has_explicit_sizes(d)) sizes[d] = q.layout().piece_sizes(d);
    return sizes;
  }());
  DTensor result = DTensorAccess::make(out_local, ring->mesh, ring->out);
  if (autograd::needs_grad<DTensor>({&q, &k, &v})) {
    const Tensor lse_saved = lse, out_saved = out_local;
    autograd::record<DTensor>(kOp, result, {&q, &k, &v}, [ring, ql, kl, vl, out_saved, lse_saved](const DTensor& g) {
      return ring_backward(*ring, ql, kl, vl, out_saved, lse_saved, g);
    });
  }
  return result;
}

}  // namespace tessera::detail
