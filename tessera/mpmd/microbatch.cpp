#include <tessera/mpmd/microbatch.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/contexts.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::mpmd {

namespace {

// Part i of n of `rows` rows (the larger parts first): [begin, begin + length).
std::pair<int64_t, int64_t> part(int64_t rows, int64_t n, int64_t i) {
  const int64_t base = rows / n, extra = rows % n;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

}  // namespace

std::vector<int64_t> microbatch_rows(const std::vector<int64_t>& pieces, int64_t n, int64_t i) {
  std::vector<int64_t> rows;
  int64_t start = 0;
  for (int64_t size : pieces) {
    const auto [begin, length] = part(size, n, i);
    for (int64_t r = 0; r < length; ++r) rows.push_back(start + begin + r);
    start += size;
  }
  return rows;
}

std::vector<DTensor> split_microbatches(const DTensor& x, int64_t dim, int64_t n) {
  TESSERA_CHECK(x.defined(), ValueError, "split_microbatches", "undefined DTensor");
  TESSERA_CHECK(n >= 1, ValueError, "split_microbatches", "n = ", n, " microbatches; need at least 1");
  TESSERA_CHECK(dim >= -x.ndim() && dim < x.ndim(), ValueError, "split_microbatches", "dim ", dim,
                " is out of range for ", x.layout().to_string());
  if (dim < 0) dim += x.ndim();
  const Layout& layout = x.layout();
  const DeviceMesh& mesh = x.device_mesh();
  const std::vector<int64_t> pieces = layout.piece_sizes(dim);
  Tensor local;
  int64_t mine = 0;
  if (mesh.is_member()) {
    // A Partial's local gradient is the whole gradient (Replicate), not a share of it.
    local = x.to_local(gradient_layout(layout).placements());
    mine = local.shape()[dim];
  }
  std::vector<DTensor> parts;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (int64_t rows : pieces) {
      sizes.push_back(part(rows, n, i).second);
      total += sizes.back();
    }
    Shape shape = layout.global_shape();
    shape[dim] = total;
    ShardSizes explicit_sizes = layout.explicit_sizes();
    if (!layout.shard_order(dim).empty())
      explicit_sizes[dim] = sizes;
    else
      explicit_sizes.erase(dim);
    const Layout part_layout(shape, layout.dtype(), layout.mesh(), layout.placements(), layout.shard_orders(),
                             explicit_sizes);
    const auto [begin, length] = part(mine, n, i);
    parts.push_back(mesh.is_member() ? DTensor(local.narrow(dim, begin, length), mesh, part_layout)
                                     : DTensor(Tensor(), mesh, part_layout));
  }
  return parts;
}

namespace {

// The inputs microbatch splits: those `argnums` names (all when it is empty). ValueError for an
// index out of range or named twice.
std::vector<bool> split_flags(const std::vector<int64_t>& argnums, size_t inputs) {
  std::vector<bool> split(inputs, argnums.empty());
  for (int64_t a : argnums) {
    TESSERA_CHECK(a >= 0 && a < static_cast<int64_t>(inputs), ValueError, "microbatch", "argnum ", a,
                  " is out of range for ", inputs, " inputs");
    TESSERA_CHECK(!split[static_cast<size_t>(a)], ValueError, "microbatch", "argnum ", a, " is named twice");
    split[static_cast<size_t>(a)] = true;
  }
  return split;
}

}  // namespace

DTensor microbatch(const std::function<DTensor(const std::vector<DTensor>&)>& step, const std::vector<DTensor>& inputs,
                   int64_t dim, int64_t n, MicrobatchLoss loss) {
  return microbatch(step, inputs, dim, n, std::vector<int64_t>{}, loss);
}

DTensor microbatch(const std::function<DTensor(const std::vector<DTensor>&)>& step, const std::vector<DTensor>& inputs,
                   int64_t dim, int64_t n, const std::vector<int64_t>& argnums, MicrobatchLoss loss) {
  TESSERA_CHECK(!inputs.empty(), ValueError, "microbatch", "no inputs to split");
  const std::vector<bool> split = split_flags(argnums, inputs.size());
  if (transforms_ignored()) {
    // The step unsplit: its loss is the mean (or sum) the microbatches' shares add up to.
    const DTensor whole = step(inputs);
    whole.backward();
    return whole.detach();
  }
  const size_t reference = static_cast<size_t>(std::find(split.begin(), split.end(), true) - split.begin());
  const Layout& first = inputs[reference].layout();
  const int64_t d = dim < 0 ? dim + first.ndim() : dim;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!split[k]) continue;
    const DTensor& x = inputs[k];
    TESSERA_CHECK(x.defined() && d >= 0 && d < x.ndim() && x.layout().mesh() == first.mesh() &&
                      x.layout().piece_sizes(d) == first.piece_sizes(d) &&
                      x.layout().shard_order(d) == first.shard_order(d),
                  ShardingError, "microbatch", "every input needs the first input's layout along dim ", dim,
                  " (of the inputs it splits) so their microbatches hold the same rows: ", first.to_string(), " and ",
                  x.defined() ? x.layout().to_string() : "(undefined)");
  }
  // Inputs not split (argnums leaves them out) are passed whole to every microbatch.
  std::vector<std::vector<DTensor>> slices;
  for (size_t k = 0; k < inputs.size(); ++k)
    slices.push_back(split[k] ? split_microbatches(inputs[k], d, n)
                              : std::vector<DTensor>(static_cast<size_t>(n), inputs[k]));
  const double rows = static_cast<double>(first.global_shape()[d]);
  DTensor total;
  // The gradients owed over the batch's ranks are reduced once, after the last microbatch.
  const NoSync once;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<DTensor> args;
    for (const auto& s : slices) args.push_back(s[static_cast<size_t>(i)]);
    const int64_t held = args[reference].shape()[d];
    if (held == 0) continue;  // fewer rows than microbatches: nothing to add
    const double share = loss == MicrobatchLoss::sum || rows == 0 ? 1.0 : static_cast<double>(held) / rows;
    const DTensor scaled = step(args) * Scalar(share);
    scaled.backward();
    total = total.defined() ? total + scaled.detach() : scaled.detach();
  }
  TESSERA_CHECK(total.defined(), ValueError, "microbatch", "the inputs have no rows along dim ", dim, " (",
                first.to_string(), ")");
  return total;
}

std::function<DTensor(const std::vector<DTensor>&)> microbatch(std::function<DTensor(const std::vector<DTensor>&)> step,
                                                               int64_t dim, int64_t n, MicrobatchLoss loss) {
  return microbatch(std::move(step), dim, n, std::vector<int64_t>{}, loss);
}

std::function<DTensor(const std::vector<DTensor>&)> microbatch(std::function<DTensor(const std::vector<DTensor>&)> step,
                                                               int64_t dim, int64_t n, std::vector<int64_t> argnums,
                                                               MicrobatchLoss loss) {
  TESSERA_CHECK(n >= 1, ValueError, "microbatch", "n = ", n, " microbatches; need at least 1");
  return [step = std::move(step), dim, n, argnums = std::move(argnums), loss](const std::vector<DTensor>& inputs) {
    return microbatch(step, inputs, dim, n, argnums, loss);
  };
}

}  // namespace tessera::mpmd
