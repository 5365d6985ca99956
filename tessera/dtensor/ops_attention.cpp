// scaled_dot_product_attention on DTensor: the rule (sharding/op_rules.cpp) brings q, k, v and the
// mask to layouts where each rank's block is a set of whole attention problems (batch and head
// dims) over some of q's rows; then the fused kernel runs on the blocks with their global origin,
// so causal masking and the dropout mask are the unsharded ones. The backward runs the fused
// backward on the same blocks: dq lands in q's block; dk and dv are sums over the rows, so where
// q's rows are sharded they are P(sum) over those mesh dims.
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/internal/ring_attention.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/internal/attention_kernel.hpp>

namespace tessera {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// What the backward needs: the operands in the layouts the kernel saw, and its out and lse.
struct Saved {
  DeviceMesh mesh;
  std::shared_ptr<const Layout> q, k, v, out;
  Tensor q_local, k_local, v_local, mask_local, out_local, lse, probs;
  detail::AttentionCall call;
};

// The layout of k's (v's) gradient: k's, with P(sum) on the mesh dims that shard q's rows.
std::shared_ptr<const Layout> summed_over_rows(const Layout& operand, const Layout& q) {
  Placements placements = operand.placements();
  const int64_t rows = q.ndim() - 2;
  bool changed = false;
  for (size_t m = 0; m < placements.size(); ++m) {
    if (is_shard(q.placements()[m], rows)) {
      placements[m] = Partial{ReduceOp::sum};
      changed = true;
    }
  }
  return std::make_shared<const Layout>(changed ? operand.with_placements(placements) : operand);
}

std::vector<DTensor> backward(const Saved& s, const DTensor& g) {
  const Tensor g_local = g.redistribute(s.mesh, *s.out).to_local();
  detail::AttentionCall call = s.call;
  call.mask = s.mask_local.defined() ? &s.mask_local : nullptr;
  const auto grads =
      detail::attention_backward(g_local, s.q_local, s.k_local, s.v_local, s.out_local, s.lse, call, s.probs);
  return {detail::DTensorAccess::make(grads[0], s.mesh, s.q),
          detail::DTensorAccess::make(grads[1], s.mesh, summed_over_rows(*s.k, *s.q)),
          detail::DTensorAccess::make(grads[2], s.mesh, summed_over_rows(*s.v, *s.q))};
}

}  // namespace

DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                     const std::optional<DTensor>& attn_mask, double dropout_p, bool is_causal,
                                     std::optional<double> scale) {
  TESSERA_CHECK(q.device_mesh().ndim() > 0 && k.device_mesh().ndim() > 0 && v.device_mesh().ndim() > 0 &&
                    (!attn_mask || attn_mask->device_mesh().ndim() > 0),
                ShardingError, kOp, "an operand is an undefined DTensor");
  // The sequence split over one mesh dim: the blocks travel a ring instead of being gathered.
  if (auto ring = detail::ring_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)) return *ring;
  const int64_t nd = q.ndim();
  auto saved = std::make_shared<Saved>();
  detail::AttentionCall& call = saved->call;
  call = detail::attention_call(detail::attention_operands(q, k, v, attn_mask, kOp), dropout_p, is_causal, scale, kOp);

  const bool grads = autograd::needs_grad<DTensor>({&q, &k, &v});
  std::vector<const DTensor*> inputs{&q, &k, &v};
  if (attn_mask) inputs.push_back(&*attn_mask);
  DTensor out = detail::dispatch(
      RuleRegistry::id(OpId::scaled_dot_product_attention), inputs, OpArgs{},
      [&](std::span<const Tensor> locals, const detail::Decision& d) {
        // The output block [batch..., L, Ev] starts where this rank's scores start; S is whole.
        call.origin = d.output_block.begin;
        call.origin[nd - 1] = 0;
        if (locals.size() == 4) saved->mask_local = locals[3];
        call.mask = saved->mask_local.defined() ? &saved->mask_local : nullptr;
        saved->q = d.targets[0];
        saved->k = d.targets[1];
        saved->v = d.targets[2];
        saved->q_local = locals[0];
        saved->k_local = locals[1];
        saved->v_local = locals[2];
        return detail::attention_forward(locals[0], locals[1], locals[2], call, saved->lse,
                                         grads ? &saved->probs : nullptr);
      });
  if (grads) {
    saved->mesh = q.device_mesh();
    saved->out = detail::DTensorAccess::layout_ptr(out);
    saved->out_local = detail::DTensorAccess::local(out);
    call.mask = nullptr;  // re-pointed at the saved block when the backward runs
    autograd::record<DTensor>(kOp, out, {&q, &k, &v}, [saved](const DTensor& g) { return backward(*saved, g); });
  }
  return out;
}

}  // namespace tessera
