// The shape ops that copy on DTensor. Shapes and arguments are validated here with the pure
// functions the Tensor ops use (ops/shape_ops.hpp), so every rank throws the same ValueError; the
// rules (sharding/shape_rules.cpp) decide the layouts and the kernels run the Tensor ops on the
// shards.
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/detail/sharded_shape.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

using detail::call_op;
using detail::Decision;
using Locals = std::span<const Tensor>;

namespace {

std::vector<int64_t> every_dim(int64_t ndim) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  return dims;
}

DTensor triangle(const DTensor& x, int64_t diagonal, bool lower) {
  const char* name = lower ? "tril" : "triu";
  check_triangle_shape(x.shape(), name);
  const int64_t rows = x.ndim() - 2, cols = x.ndim() - 1;
  return detail::recorded(
      call_op(lower ? OpId::tril : OpId::triu, {&x}, DiagonalArgs{diagonal},
              [&](Locals l, const Decision& d) {
                // A local element (i, j) is the global (i + row0, j + col0): col - row <= k in global
                // terms is the local mask with the diagonal shifted by row0 - col0.
                const int64_t local = diagonal + d.blocks[0].begin[rows] - d.blocks[0].begin[cols];
                return lower ? tril(l[0], local) : triu(l[0], local);
              }),
      [&](DTensor& out) { derivatives::record_triangle(out, x, diagonal, lower); });
}

}  // namespace

DTensor flip(const DTensor& x, const std::vector<int64_t>& dims) {
  const DimVector flipped = flip_dims(dims, x.shape());
  return detail::recorded(
      call_op(OpId::flip, {&x}, ShapeArgs{flipped}, [&](Locals l) { return flip(l[0], flipped.vec()); }),
      [&](DTensor& out) { derivatives::record_flip(out, x, flipped); });
}

DTensor roll(const DTensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  const DimVector by = roll_shifts(shifts, dims, x.shape());
  if (dims.empty()) return reshape(roll(reshape(x, {x.numel()}), {by[0]}, {0}), x.shape());
  // A rolled sharded dim stays sharded: only the rows that change piece move.
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (by[d] != 0 && !x.layout().shard_order(d).empty()) return detail::roll_sharded(x, by);
  return detail::recorded(
      call_op(OpId::roll, {&x}, ShapeArgs{by}, [&](Locals l) { return roll(l[0], by.vec(), every_dim(x.ndim())); }),
      [&](DTensor& out) { derivatives::record_roll(out, x, by); });
}

DTensor tril(const DTensor& x, int64_t diagonal) { return triangle(x, diagonal, true); }
DTensor triu(const DTensor& x, int64_t diagonal) { return triangle(x, diagonal, false); }

DTensor repeat(const DTensor& x, const std::vector<int64_t>& repeats) {
  repeat_shape(x.shape(), repeats);
  return detail::recorded(
      call_op(OpId::repeat, {&x}, ShapeArgs{DimVector(repeats)}, [&](Locals l) { return repeat(l[0], repeats); }),
      [&](DTensor& out) { derivatives::record_repeat(out, x, repeats); });
}

DTensor tile(const DTensor& x, const std::vector<int64_t>& reps) {
  const auto repeats = tile_repeats(x.shape(), reps);
  repeat_shape(x.shape(), repeats, "tile");
  return repeat(x, repeats);
}

DTensor pad(const DTensor& x, const std::vector<int64_t>& pads, PadMode mode, Scalar value) {
  const PadSpec spec = pad_spec(x.shape(), pads, mode);
  const PadArgs args{spec.before, spec.after, static_cast<uint8_t>(mode), mode == PadMode::constant ? value : Scalar(0)};
  // A padded sharded dim stays sharded: its end pieces grow, and only the rows a reflect,
  // replicate or circular pad reads from another piece move. A non-zero fill is no longer a
  // P(sum) once added on every rank: those mesh dims reduce first.
  if (detail::touches_sharded_dim(x.layout(), spec.before, spec.after)) {
    Placements placements = x.placements();
    bool reduce = false;
    if (mode == PadMode::constant && value.to_double() != 0)
      for (auto& p : placements)
        if (is_partial(p) && std::get<Partial>(p).op == ReduceOp::sum) p = Replicate{}, reduce = true;
    return detail::pad_sharded(reduce ? x.redistribute(placements) : x, spec, mode, value);
  }
  return detail::recorded(
      call_op(OpId::pad, {&x}, args, [&](Locals l) { return pad(l[0], pads, mode, value); }),
      [&](DTensor& out) { derivatives::record_pad(out, x, spec.before, spec.after, mode); });
}

}  // namespace tessera
