// matmul/bmm/linear and the nn ops on DTensor.
#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/ops/internal/composites.hpp>
#include <tessera/dtensor/detail/norm_sharded.hpp>
#include <tessera/dtensor/detail/op_call.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/internal/derivatives.hpp>
#include <tessera/ops/internal/einsum_diagonals.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/fused_backward.hpp>
#include <tessera/ops/linalg.hpp>
#include <tessera/ops/nn.hpp>
#include <tessera/ops/reduce.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera {

namespace detail {

// Throws ValueError on every rank when any index is outside [0, count) (and not `allowed`). A
// replicated tensor is checked where it lies; a sharded one with one sum over the mesh, so that
// every rank throws alike and none is left waiting in a later collective.
void check_index_range(const DTensor& indices, int64_t count, std::optional<int64_t> allowed, const char* op,
                       const char* what) {
  const auto bad_of = [&](const auto& t) {
    auto bad = logical_or(lt(t, Scalar(0)), ge(t, Scalar(count)));
    return allowed ? logical_and(bad, ne(t, Scalar(*allowed))) : bad;
  };
  int64_t found = 0;
  if (indices.layout().is_replicated()) {
    const Tensor local = indices.to_local();
    found = local.numel() == 0 ? 0 : sum(bad_of(local)).item<int64_t>();
  } else {
    found = sum(bad_of(indices)).full_tensor().item<int64_t>();
  }
  TESSERA_CHECK(found == 0, ValueError, op, found, " ", what, found == 1 ? " is" : "s are", " out of [0, ", count, ")",
                allowed ? " and not ignore_index " + std::to_string(*allowed) : std::string());
}

}  // namespace detail

using detail::check_index_range;

using detail::call_op;
using detail::Decision;
using detail::DTensorAccess;
using Locals = std::span<const Tensor>;

DTensor matmul(const DTensor& a, const DTensor& b) {
  return detail::recorded(call_op(OpId::matmul, {&a, &b}, OpArgs{}, [](Locals l) { return matmul(l[0], l[1]); }),
                          [&](DTensor& out) { derivatives::record_matmul("matmul", out, a, b); });
}

DTensor bmm(const DTensor& a, const DTensor& b) {
  TESSERA_CHECK(a.ndim() == 3 && b.ndim() == 3 && a.shape()[0] == b.shape()[0], ValueError, "bmm",
                "expected two 3-d tensors of equal batch size, got ", a.shape().to_string(), " and ",
                b.shape().to_string());
  return detail::recorded(call_op(OpId::bmm, {&a, &b}, OpArgs{}, [](Locals l) { return bmm(l[0], l[1]); }),
                          [&](DTensor& out) { derivatives::record_matmul("bmm", out, a, b); });
}

DTensor linear(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias) {
  TESSERA_CHECK(x.ndim() >= 1, ValueError, "linear", "input of shape ", x.shape().to_string(),
                " must have at least one dim");
  const auto kernel = [&](Locals l) { return linear(l[0], l[1], bias ? std::optional<Tensor>(l[2]) : std::nullopt); };
  if (bias)
    return detail::recorded(call_op(OpId::linear, {&x, &weight, &*bias}, OpArgs{}, kernel),
                            [&](DTensor& out) { derivatives::record_linear(out, x, weight, bias); });
  return detail::recorded(call_op(OpId::linear, {&x, &weight}, OpArgs{}, kernel),
                          [&](DTensor& out) { derivatives::record_linear(out, x, weight, bias); });
}

DTensor softmax(const DTensor& x, int64_t dim) {
  const int64_t d = normalize_dim(dim, x.ndim(), "softmax", x.shape());
  return detail::recorded(
      call_op(OpId::softmax, {&x}, DimArgs{x.ndim() == 0 ? -1 : d}, [&](Locals l) { return softmax(l[0], dim); }),
      [&](DTensor& out) { derivatives::record_softmax(out, x, dim, false); });
}

DTensor log_softmax(const DTensor& x, int64_t dim) {
  const int64_t d = normalize_dim(dim, x.ndim(), "log_softmax", x.shape());
  return detail::recorded(
      call_op(OpId::log_softmax, {&x}, DimArgs{x.ndim() == 0 ? -1 : d}, [&](Locals l) { return log_softmax(l[0], dim); }),
      [&](DTensor& out) { derivatives::record_softmax(out, x, dim, true); });
}

namespace {

void check_normalized_shape(const DTensor& x, const Shape& normalized_shape, const char* op) {
  const int64_t k = normalized_shape.size();
  bool trailing = k >= 1 && k <= x.ndim();
  for (int64_t i = 0; trailing && i < k; ++i) trailing = x.shape()[x.ndim() - k + i] == normalized_shape[i];
  TESSERA_CHECK(trailing, ValueError, op, "normalized_shape ", normalized_shape.to_string(),
                " is not a non-empty run of trailing dims of ", x.shape().to_string());
}

}  // namespace

DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight,
                   const std::optional<DTensor>& bias, double eps) {
  check_normalized_shape(x, normalized_shape, "layer_norm");
  if (detail::shards_normalized_dim(x, normalized_shape.size()))
    return detail::norm_over_sharded_dims("layer_norm", x, normalized_shape.size(), weight, bias, eps, true);
  std::vector<const DTensor*> inputs{&x};
  if (weight) inputs.push_back(&*weight);
  if (bias) inputs.push_back(&*bias);
  // The operands as the kernel sees them, for the backward (see record_norm).
  DTensor x_computed;
  std::optional<DTensor> w_computed;
  DTensor out = detail::dispatch(RuleRegistry::id(OpId::layer_norm), inputs, NormArgs{normalized_shape.size()},
                                 [&](Locals l, const Decision& d) {
                                   x_computed = DTensorAccess::make(l[0], x.device_mesh(), d.targets[0]);
                                   if (weight) w_computed = DTensorAccess::make(l[1], x.device_mesh(), d.targets[1]);
                                   size_t next = 1;
                                   std::optional<Tensor> w, b;
                                   if (weight) w = l[next++];
                                   if (bias) b = l[next++];
                                   return layer_norm(l[0], normalized_shape, w, b, eps);
                                 });
  derivatives::record_norm("layer_norm", out, x, normalized_shape.size(), weight, bias, eps, true, &x_computed,
                           &w_computed);
  return out;
}

DTensor rms_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight, double eps) {
  check_normalized_shape(x, normalized_shape, "rms_norm");
  if (detail::shards_normalized_dim(x, normalized_shape.size()))
    return detail::norm_over_sharded_dims("rms_norm", x, normalized_shape.size(), weight, std::nullopt, eps, false);
  std::vector<const DTensor*> inputs{&x};
  if (weight) inputs.push_back(&*weight);
  DTensor x_computed;
  std::optional<DTensor> w_computed;
  DTensor out = detail::dispatch(RuleRegistry::id(OpId::rms_norm), inputs, NormArgs{normalized_shape.size()},
                                 [&](Locals l, const Decision& d) {
                                   x_computed = DTensorAccess::make(l[0], x.device_mesh(), d.targets[0]);
                                   if (weight) w_computed = DTensorAccess::make(l[1], x.device_mesh(), d.targets[1]);
                                   return rms_norm(l[0], normalized_shape,
                                                   weight ? std::optional<Tensor>(l[1]) : std::nullopt, eps);
                                 });
  derivatives::record_norm("rms_norm", out, x, normalized_shape.size(), weight, std::optional<DTensor>(), eps, false,
                           &x_computed, &w_computed);
  return out;
}

namespace {

bool is_index_dtype(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::u8; }

// Indices in [begin, end) shifted to local rows, the rest sent to row 0; and the mask of the kept.
std::pair<Tensor, Tensor> local_rows(const Tensor& indices, int64_t begin, int64_t end) {
  const Tensor mask = logical_and(ge(indices, Scalar(begin)), lt(indices, Scalar(end)));
  const Tensor shifted = where(mask, sub(indices.to(DType::i64), Scalar(begin)), Scalar(int64_t{0}));
  return {shifted, mask};
}


// Backward of embedding: the gradient rows added into the weight rows they came from, in the
// weight's sharding (a vocabulary shard adds the rows it holds; sharded indices give P(sum)).
// padding_idx (normalised): the rank whose block holds that row skips it (local row
// padding_idx - block begin), so its gradient stays zero; no rank gathers the weight.
void record_embedding(DTensor& out, const DTensor& weight, const DTensor& indices,
                      std::optional<int64_t> padding_idx) {
  if (!autograd::needs_grad<DTensor>({&weight})) return;
  autograd::record<DTensor>("embedding", out, {&weight}, [w = weight.detach(), indices, padding_idx](const DTensor& g) {
    DTensor grad = call_op(OpId::embedding_backward, {&w, &g, &indices}, OpArgs{}, [&](Locals l, const Decision& d) {
      const Block& rows = d.blocks[0];
      const auto [shifted, mask] = local_rows(l[2], rows.begin[0], rows.end[0]);
      // Indices outside the block were sent to row 0 by local_rows: send them out of range instead.
      const Tensor ids = where(mask, shifted, Scalar(int64_t{-1}));
      const bool holds_pad = padding_idx && *padding_idx >= rows.begin[0] && *padding_idx < rows.end[0];
      const std::optional<int64_t> local_pad =
          holds_pad ? std::optional<int64_t>(*padding_idx - rows.begin[0]) : std::nullopt;
      return detail::embedding_backward(l[1], ids, l[0].shape()[0], l[1].dtype(), local_pad)
          .reshape(d.output_local_shape);
    });
    return std::vector<DTensor>{grad};
  });
}

}  // namespace

DTensor embedding(const DTensor& weight, const DTensor& indices, std::optional<int64_t> padding_idx) {
  TESSERA_CHECK(weight.ndim() == 2, ValueError, "embedding", "weight of shape ", weight.shape().to_string(),
                " must be 2-d [num_embeddings, dim]");
  TESSERA_CHECK(is_index_dtype(indices.dtype()), ValueError, "embedding", "indices must be integers (i32, i64, u8), got ",
                name(indices.dtype()));
  const std::optional<int64_t> pad = embedding_padding_index(padding_idx, weight.shape());
  const int64_t vocab = weight.shape()[0];
  check_index_range(indices, vocab, std::nullopt, "embedding", "index");
  return detail::recorded(call_op(OpId::embedding, {&weight, &indices}, OpArgs{},
                                  [&](Locals l, const Decision& d) {
                                    const Block& rows = d.blocks[0];
                                    if (rows.begin[0] == 0 && rows.end[0] == vocab) return embedding(l[0], l[1]);
                                    // Vocabulary-sharded: look up the rows this rank holds, zeros elsewhere (a
                                    // Partial(sum)).
                                    if (l[0].shape()[0] == 0) return zeros(d.output_local_shape, l[0].dtype());
                                    const auto [shifted, mask] = local_rows(l[1], rows.begin[0], rows.end[0]);
                                    return where(unsqueeze(mask, -1), embedding(l[0], shifted), Scalar(0));
                                  }),
                          [&](DTensor& out) { record_embedding(out, weight, indices, pad); });
}

namespace {

// Backward of class_pick: the gradient placed at each target class, zeros elsewhere.
void record_class_pick(DTensor& out, const DTensor& logits, const DTensor& target, int64_t class_dim) {
  if (!autograd::needs_grad<DTensor>({&logits})) return;
  autograd::record<DTensor>(
      "class_pick", out, {&logits, &target}, [x = logits.detach(), target, class_dim](const DTensor& g) {
        DTensor grad = call_op(OpId::class_pick_backward, {&x, &g, &target}, DimArgs{class_dim}, [&](Locals l, const Decision& d) {
          const int64_t begin = d.blocks[0].begin[class_dim], count = l[0].shape()[class_dim];
          Shape along = Shape::filled(l[0].ndim(), 1);
          along[class_dim] = count;
          const Tensor classes = add(arange(count), Scalar(begin)).reshape(along);
          const Tensor hit = eq(classes, unsqueeze(l[2].to(DType::i64), class_dim));
          return where(hit, unsqueeze(l[1], class_dim), Scalar(0)).expand(d.output_local_shape).contiguous();
        });
        return std::vector<DTensor>{grad, DTensor()};
      });
}

// logits' value at each target class along class_dim; with the class dim sharded each rank picks
// what it holds (zero elsewhere), a Partial(sum). Targets outside the block (ignore_index) give 0.
DTensor class_pick(const DTensor& logits, const DTensor& target, int64_t class_dim) {
  return detail::recorded(call_op(OpId::class_pick, {&logits, &target}, DimArgs{class_dim},
                                  [&](Locals l, const Decision& d) {
                                    const int64_t begin = d.blocks[0].begin[class_dim], count = l[0].shape()[class_dim];
                                    Shape along = Shape::filled(l[0].ndim(), 1);
                                    along[class_dim] = count;
                                    const Tensor classes = add(arange(count), Scalar(begin)).reshape(along);
                                    const Tensor hit = eq(classes, unsqueeze(l[1].to(DType::i64), class_dim));
                                    return sum(where(hit, l[0], Scalar(0)), {class_dim});
                                  }),
                          [&](DTensor& out) { record_class_pick(out, logits, target, class_dim); });
}

// Per-target losses (0 at ignore_index) with the class dim whole on every rank: the local fused
// kernel (log-sum-exp and the target's logit in one pass), and its fused backward.
DTensor cross_entropy_losses(const DTensor& logits, const DTensor& target, int64_t ignore_index, int64_t class_dim) {
  DTensor out = call_op(OpId::cross_entropy, {&logits, &target}, DimArgs{class_dim}, [&](Locals l) {
    return cross_entropy(l[0], l[1], ignore_index, Reduction::none);
  });
  if (!autograd::needs_grad<DTensor>({&logits})) return out;
  autograd::record<DTensor>(
      "cross_entropy", out, {&logits}, [x = logits.detach(), target, ignore_index, class_dim](const DTensor& g) {
        DTensor grad = call_op(OpId::cross_entropy_backward, {&x, &g, &target}, DimArgs{class_dim}, [&](Locals l) {
          return cross_entropy_backward(l[1], l[0], l[2], ignore_index);
        });
        return std::vector<DTensor>{grad};
      });
  return out;
}

}  // namespace

DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index, Reduction reduction) {
  const int64_t nd = logits.ndim();
  const int64_t class_dim = nd == 1 ? 0 : 1;
  Shape expected = logits.shape();
  bool shapes_ok = nd >= 1;
  if (shapes_ok) {
    expected.erase(class_dim);
    shapes_ok = target.shape() == expected;
  }
  TESSERA_CHECK(shapes_ok, ValueError, "cross_entropy", "logits ", logits.shape().to_string(), " and target ",
                target.shape().to_string(), " do not match; expected logits [N, C, ...] with target [N, ...] or [C] with []");
  TESSERA_CHECK(is_floating(logits.dtype()), ValueError, "cross_entropy", "logits must be floating, got ",
                name(logits.dtype()));
  TESSERA_CHECK(is_index_dtype(target.dtype()), ValueError, "cross_entropy", "targets must be integers, got ",
                name(target.dtype()));
  const int64_t classes = logits.shape()[class_dim];
  check_index_range(target, classes, ignore_index, "cross_entropy", "target");
  // loss = logsumexp(logits) - logits[target], with the max subtracted for stability. With the
  // class dim whole on every rank, one fused local kernel. Across class shards (vocabulary
  // parallel) op by op: amax -> P(max) reduced by the subtraction; the sum of exps -> P(sum)
  // reduced by log; the picked logit -> P(sum). Nothing of the logits' size moves.
  DTensor loss;
  if (logits.layout().shard_order(class_dim).empty()) {
    loss = cross_entropy_losses(logits, target, ignore_index, class_dim);
  } else {
    const DTensor shifted = sub(logits, amax(logits.detach(), {class_dim}, true));  // a constant shift
    loss = sub(log(sum(exp(shifted), {class_dim})), class_pick(shifted, target, class_dim));
  }
  const DTensor valid = ne(target, Scalar(ignore_index));
  const DTensor kept = where(valid, loss, Scalar(0));
  switch (reduction) {
    case Reduction::none: return kept;
    case Reduction::sum: return sum(kept);
    case Reduction::mean: break;
  }
  // The count reduced once here: div's backward then divides by a replicated count instead of
  // reducing the Partial one again.
  const DTensor count = sum(valid);
  return div(sum(kept), count.redistribute(count.device_mesh(), gradient_layout(count.layout())));
}

DTensor nll_loss(const DTensor& log_probs, const DTensor& target, int64_t ignore_index, Reduction reduction) {
  const int64_t class_dim = class_dim_of(log_probs.shape(), log_probs.dtype(), target.shape(), target.dtype(), "nll_loss");
  check_index_range(target, log_probs.shape()[class_dim], ignore_index, "nll_loss", "target");
  return composites::masked_nll(class_pick(log_probs, target, class_dim), target, ignore_index, reduction);
}

DTensor mse_loss(const DTensor& input, const DTensor& target, Reduction reduction) {
  return composites::mse_loss(input, target, reduction);
}

DTensor addmm(const DTensor& input, const DTensor& mat1, const DTensor& mat2, double beta, double alpha) {
  return composites::add_product(input, mat1, mat2, beta, alpha, false);
}

DTensor baddbmm(const DTensor& input, const DTensor& batch1, const DTensor& batch2, double beta, double alpha) {
  return composites::add_product(input, batch1, batch2, beta, alpha, true);
}

DTensor einsum(std::string_view equation, const std::vector<DTensor>& operands) {
  TESSERA_CHECK(!operands.empty(), ValueError, "einsum", "expects at least one operand");
  std::vector<Shape> shapes;
  std::vector<const DTensor*> inputs;
  for (const DTensor& t : operands) {
    TESSERA_CHECK(t.dtype() == operands.front().dtype(), ValueError, "einsum", "operands of dtypes ",
                  name(operands.front().dtype()), " and ", name(t.dtype()), "; convert them to one dtype");
    shapes.push_back(t.shape());
    inputs.push_back(&t);
  }
  const EinsumSpec spec = parse_einsum(equation, shapes);
  if (std::any_of(spec.inputs.begin(), spec.inputs.end(), detail::has_repeated_letter)) {
    std::vector<DTensor> diagonals = operands;
    const EinsumSpec flat = detail::take_diagonals(spec, diagonals, [](int64_t n, const DTensor& operand) {
      // Replicated, built where it is used: no data moves, and the planner slices it to match a
      // sharded diagonal dim.
      const DeviceMesh& mesh = operand.device_mesh();
      Layout layout(Shape{n, n}, operand.dtype(), mesh.spec(), Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
      return DTensor(mesh.is_member() ? eye(n, n, operand.dtype()) : Tensor(), mesh, std::move(layout));
    });
    return einsum(flat.equation, diagonals);
  }
  DTensor out = detail::dispatch(RuleRegistry::id(OpId::einsum), inputs, EquationArgs{spec.equation},
                                 [&](Locals l, const Decision&) {
                                   return einsum(spec.equation, std::vector<Tensor>(l.begin(), l.end()));
                                 });
  derivatives::record_einsum(out, operands, spec);
  return out;
}

}  // namespace tessera
