// The fused backward kernels on DTensors: each rank runs the Tensor kernel on its block, once
// the operands share a layout in which every block is self-contained.
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/fused_backward.hpp>

namespace tessera {

namespace {

// x with its Partial mesh dims reduced (an elementwise kernel needs the values themselves).
DTensor without_partial(const DTensor& x) {
  Placements placements = x.placements();
  bool partial = false;
  for (Placement& p : placements)
    if (is_partial(p)) p = Replicate{}, partial = true;
  return partial ? x.redistribute(x.device_mesh(), placements) : x;
}

// grad in x's layout.
DTensor like(const DTensor& grad, const DTensor& x) {
  return grad.layout() == x.layout() ? grad : grad.redistribute(x.device_mesh(), x.layout());
}

}  // namespace

DTensor gelu_backward(const DTensor& grad, const DTensor& x_in) {
  const DTensor x = without_partial(x_in);
  const DTensor g = like(grad, x);
  return DTensor(gelu_backward(g.to_local(), x.to_local()), x.device_mesh(), x.layout());
}

DTensor gelu_backward(const DTensor& grad, const DTensor& x_in, const DTensor& y) {
  const DTensor x = without_partial(x_in);
  const DTensor g = like(grad, x), out = like(y, x);
  return DTensor(gelu_backward(g.to_local(), x.to_local(), out.to_local()), x.device_mesh(), x.layout());
}

std::pair<DTensor, DTensor> norm_backward(const DTensor& grad, const DTensor& x, const std::optional<DTensor>& weight,
                                          int64_t count, double eps, bool centred) {
  // Every block must hold whole rows (no shard of a normalised dim, no Partial) and every rank
  // the whole weight.
  bool blockwise = true;
  for (const Placement& p : x.placements()) {
    if (is_partial(p)) blockwise = false;
    if (const auto* s = std::get_if<Shard>(&p); s && s->dim >= x.ndim() - count) blockwise = false;
  }
  if (weight)
    for (const Placement& p : weight->placements()) blockwise = blockwise && is_replicate(p);
  if (!blockwise) return derivatives::norm_backward_by_ops(grad, x, weight, count, eps, centred);
  const DTensor g = like(grad, x);
  auto [dx, g_xhat] = norm_backward(g.to_local(), x.to_local(),
                                    weight ? std::optional<Tensor>(weight->to_local()) : std::nullopt, count, eps, centred);
  return {DTensor(std::move(dx), x.device_mesh(), x.layout()), DTensor(std::move(g_xhat), x.device_mesh(), x.layout())};
}

}  // namespace tessera
