// dropout on DTensor: each rank draws the mask of its own block of the global mask (the same one
// draw the Tensor dropout takes), so the result equals the unsharded dropout bit for bit on any
// mesh and placements, with no communication.
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/random.hpp>

namespace tessera {

DTensor dropout(const DTensor& x, double p, bool training) {
  TESSERA_CHECK(x.device_mesh().ndim() > 0, ShardingError, "dropout", "the input is an undefined DTensor");
  TESSERA_CHECK(p >= 0 && p < 1, ValueError, "dropout", "drop probability p = ", p,
                " is outside [0, 1); expected 0 <= p < 1");
  TESSERA_CHECK(is_floating(x.dtype()), ValueError, "dropout", "unsupported dtype ", name(x.dtype()),
                "; expected a floating dtype (f32, f64, f16, bf16)");
  if (p == 0 || !training) return x;
  // Every rank takes the draw (SPMD), members or not, so the generators stay in step.
  const RandomDraw draw = default_generator().next(Distribution::bernoulli, 1.0 - p, 0, DType::b8);
  // The mask is a value, not a pending reduction: Replicate where x is Partial (ranks along a
  // Partial mesh dim hold the same block, so they draw the same mask).
  Placements placements = x.placements();
  for (auto& placement : placements)
    if (is_partial(placement)) placement = Replicate{};
  const Layout mask_layout = x.layout().with_placements(placements).with_dtype(DType::b8);
  const DeviceMesh& mesh = x.device_mesh();
  Tensor local;
  if (mesh.is_member()) {
    const Block block = mask_layout.block(mesh.coordinate());
    local = random_block(draw, x.shape(), block.begin, block.shape());
  }
  const DTensor mask(local, mesh, mask_layout);
  // As the Tensor dropout computes it: x * (1 / (1 - p)) in x's compute type where kept, else 0.
  return where(mask, mul(x, Scalar(1.0 / (1.0 - p))), Scalar(0.0));
}

}  // namespace tessera
