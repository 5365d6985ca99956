#pragma once
// Derivatives of the op library, written once for Tensor and DTensor (T): each record_<op> is
// called by the op on both types after the forward result is computed, and records the op when an
// input requires a gradient. The formulas use only ops that both types provide, so on DTensor the
// backward pass is itself sharded and its redistributions are planned like the forward's.
// Saved operands are detached: the graph never references its own outputs (no cycles).
#include <cmath>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

#include <tessera/grad/engine.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/ops/einsum.hpp>
#include <tessera/ops/fused_backward.hpp>
#include <tessera/ops/indexing.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/ops/op_table.hpp>
#include <tessera/ops/shape_ops.hpp>

namespace tessera::derivatives {

using autograd::needs_grad;
using autograd::record;

// --- shape helpers ----------------------------------------------------------------------------

/// Sums `grad` over the dims that broadcasting added or stretched, back to `shape`.
template <class T>
T sum_to(const T& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.ndim() - shape.size();
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (int64_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1 && grad.shape()[lead + i] != 1) dims.push_back(lead + i);
  const T summed = dims.empty() ? grad : sum(grad, dims, true);
  return reshape(summed, shape);
}

/// A reduction's output (or its gradient) broadcast back over the reduced dims of `shape`.
template <class T>
T expand_reduced(const T& reduced, const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  T kept = reduced;
  if (!keepdim) {
    Shape with_ones = shape;
    for (int64_t d : dims) with_ones[d] = 1;
    kept = reshape(reduced, with_ones);
  }
  return expand(kept, shape);
}

inline int64_t count_of(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

/// The gradient of max-like selections: all of g where `wins`, half where `ties` (PyTorch's rule).
template <class T>
T share_of(const T& g, const T& wins, const T& ties) {
  return add(where(wins, g, Scalar(0.0)), where(ties, mul(g, Scalar(0.5)), Scalar(0.0)));
}

// --- elementwise: one derivative per row of the op table ---------------------------------------

/// gelu = x Phi(x): d/dx = Phi(x) + x phi(x), as one kernel (gelu_backward: Tensor's in
/// ops/fused_backward.hpp, DTensor's on each block), with Phi read off the output y.
template <class T>
T gelu_grad(const T& g, const T& x, const T& y) {
  return gelu_backward(g, x, y);
}

/// silu = x sigmoid(x): d/dx = s (1 + x (1 - s)).
template <class T>
T silu_grad(const T& g, const T& x) {
  const T s = sigmoid(x);
  return mul(g, mul(s, add(Scalar(1.0), mul(x, sub(Scalar(1.0), s)))));
}

/// The derivative of a unary op of the table: apply(g, x, y) = g * d(out)/dx.
template <OpId op>
struct UnaryGrad;
#define TESSERA_UNARY_GRAD(name, dtype, linearity, formula)                                          \
  template <>                                                                                       \
  struct UnaryGrad<OpId::name> {                                                                    \
    template <class T>                                                                              \
    static T apply([[maybe_unused]] const T& g, [[maybe_unused]] const T& x, [[maybe_unused]] const T& y) { \
      return formula;                                                                               \
    }                                                                                               \
  };
TESSERA_UNARY_OPS(TESSERA_UNARY_GRAD)
#undef TESSERA_UNARY_GRAD

/// The derivatives of a binary op of the table: a(...) and b(...) for two tensors; right(...)
/// for `x op s` and left(...) for `s op x`. Comparisons have none (differentiable = false).
template <OpId op>
struct BinaryGrad {
  static constexpr bool differentiable = false;
};
#define TESSERA_BINARY_GRAD(name, dtype, linearity, grad_a, grad_b, grad_right, grad_left)            \
  template <>                                                                                       \
  struct BinaryGrad<OpId::name> {                                                                   \
    static constexpr bool differentiable = true;                                                    \
    template <class T>                                                                              \
    static T a([[maybe_unused]] const T& g, [[maybe_unused]] const T& a, [[maybe_unused]] const T& b, \
               [[maybe_unused]] const T& y) {                                                       \
      return grad_a;                                                                                \
    }                                                                                               \
    template <class T>                                                                              \
    static T b([[maybe_unused]] const T& g, [[maybe_unused]] const T& a, [[maybe_unused]] const T& b, \
               [[maybe_unused]] const T& y) {                                                       \
      return grad_b;                                                                                \
    }                                                                                               \
    template <class T>                                                                              \
    static T right([[maybe_unused]] const T& g, [[maybe_unused]] const T& x, [[maybe_unused]] Scalar s, \
                   [[maybe_unused]] const T& y) {                                                   \
      return grad_right;                                                                            \
    }                                                                                               \
    template <class T>                                                                              \
    static T left([[maybe_unused]] const T& g, [[maybe_unused]] const T& x, [[maybe_unused]] Scalar s, \
                  [[maybe_unused]] const T& y) {                                                    \
      return grad_left;                                                                             \
    }                                                                                               \
  };
TESSERA_BINARY_OPS(TESSERA_BINARY_GRAD)
#undef TESSERA_BINARY_GRAD

/// Records unary op `op` (x -> out).
template <OpId op, class T>
void record_unary(T& out, const T& x) {
  if (!needs_grad<T>({&x})) return;
  record<T>(op_name(op), out, {&x}, [x = x.detach(), y = out.detach()](const T& g) {
    return std::vector<T>{UnaryGrad<op>::apply(g, x, y)};
  });
}

/// Records binary op `op` ((a, b) -> out); gradients are summed back over broadcast dims.
template <OpId op, class T>
void record_binary(T& out, const T& a, const T& b) {
  if constexpr (BinaryGrad<op>::differentiable) {
    if (!needs_grad<T>({&a, &b})) return;
    // Only the gradients an input takes: the other formula may cost work, and on DTensor
    // collectives (a Partial operand reduced again).
    record<T>(op_name(op), out, {&a, &b},
              [a = a.detach(), b = b.detach(), y = out.detach(), to_a = a.requires_grad(),
               to_b = b.requires_grad()](const T& g) {
                return std::vector<T>{to_a ? sum_to(BinaryGrad<op>::a(g, a, b, y), a.shape()) : T(),
                                      to_b ? sum_to(BinaryGrad<op>::b(g, a, b, y), b.shape()) : T()};
              });
  }
}

/// Records binary op `op` with a Scalar operand: `x op s`, or `s op x` when scalar_first.
template <OpId op, class T>
void record_scalar(T& out, const T& x, Scalar s, bool scalar_first) {
  if constexpr (BinaryGrad<op>::differentiable) {
    if (!needs_grad<T>({&x})) return;
    record<T>(op_name(op), out, {&x}, [x = x.detach(), y = out.detach(), s, scalar_first](const T& g) {
      return std::vector<T>{scalar_first ? BinaryGrad<op>::left(g, x, s, y) : BinaryGrad<op>::right(g, x, s, y)};
    });
  }
}

/// Unary ops outside the table (views, clamp): `derivative(g, x, y)` gives g * d(out)/dx.
template <class T, class Derivative>
void record_unary(const char* name, T& out, const T& x, Derivative derivative) {
  if (!needs_grad<T>({&x})) return;
  record<T>(name, out, {&x},
            [x = x.detach(), y = out.detach(), derivative](const T& g) { return std::vector<T>{derivative(g, x, y)}; });
}

template <class T>
void record_where(T& out, const T& cond, const T* a, const T* b) {
  if (!needs_grad<T>({a, b})) return;
  record<T>("where", out, {&cond, a, b},
            [c = cond.detach(), sa = a ? a->shape() : Shape(), sb = b ? b->shape() : Shape(), has_a = a != nullptr,
             has_b = b != nullptr](const T& g) {
              return std::vector<T>{T(), has_a ? sum_to(where(c, g, Scalar(0.0)), sa) : T(),
                                    has_b ? sum_to(where(c, Scalar(0.0), g), sb) : T()};
            });
}

template <class T>
void record_clamp(T& out, const T& x, Scalar lo, Scalar hi) {
  record_unary("clamp", out, x, [lo, hi](const T& g, const T& x, const T&) {
    return where(logical_and(ge(x, lo), le(x, hi)), g, Scalar(0.0));
  });
}

// --- reductions -------------------------------------------------------------------------------

template <class T>
void record_sum(T& out, const T& x, const std::vector<int64_t>& dims_in, bool keepdim, bool mean_of) {
  if (!needs_grad<T>({&x})) return;
  const auto dims = normalize_dims(dims_in, x.shape(), "backward").vec();
  record<T>(mean_of ? "mean" : "sum", out, {&x}, [shape = x.shape(), dims, keepdim, mean_of](const T& g) {
    const T spread = expand_reduced(g, shape, dims, keepdim);
    const int64_t n = count_of(shape, dims);
    return std::vector<T>{mean_of ? div(spread, Scalar(static_cast<double>(n))) : spread};
  });
}

template <class T>
void record_prod(T& out, const T& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (!needs_grad<T>({&x})) return;
  const auto dims = normalize_dims(dims_in, x.shape(), "backward").vec();
  // prod / x: exact where x != 0 (a zero factor would need the product of the others).
  record<T>("prod", out, {&x}, [x = x.detach(), y = out.detach(), dims, keepdim](const T& g) {
    const T gy = mul(expand_reduced(g, x.shape(), dims, keepdim), expand_reduced(y, x.shape(), dims, keepdim));
    return std::vector<T>{div(gy, x)};
  });
}

/// amax/amin: the gradient is shared evenly among the elements equal to the extremum.
template <class T>
void record_extreme_reduction(const char* name, T& out, const T& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (!needs_grad<T>({&x})) return;
  const auto dims = normalize_dims(dims_in, x.shape(), "backward").vec();
  record<T>(name, out, {&x}, [x = x.detach(), y = out.detach(), dims, keepdim](const T& g) {
    const T hit = eq(x, expand_reduced(y, x.shape(), dims, keepdim));
    const T ones = where(hit, Scalar(1.0), mul(x, Scalar(0.0)));
    const T count = sum(ones, dims, true);
    return std::vector<T>{where(hit, div(expand_reduced(g, x.shape(), dims, keepdim), count), Scalar(0.0))};
  });
}

template <class T>
void record_var(T& out, const T& x, const std::vector<int64_t>& dims_in, int64_t correction, bool keepdim) {
  if (!needs_grad<T>({&x})) return;
  const auto dims = normalize_dims(dims_in, x.shape(), "backward").vec();
  record<T>("var", out, {&x}, [x = x.detach(), dims, correction, keepdim](const T& g) {
    const double n = static_cast<double>(count_of(x.shape(), dims) - correction);
    const T centred = sub(x, mean(x, dims, true));
    return std::vector<T>{mul(expand_reduced(g, x.shape(), dims, keepdim), mul(centred, Scalar(2.0 / n)))};
  });
}

/// The reverse running sum of g along dim: sum_{j >= i} g_j (the adjoint of cumsum).
template <class T>
T reverse_cumsum(const T& g, int64_t dim) {
  return add(sub(sum(g, {dim}, true), cumsum(g, dim)), g);
}

template <class T>
void record_cumsum(T& out, const T& x, int64_t dim) {
  if (!needs_grad<T>({&x})) return;
  record<T>("cumsum", out, {&x}, [dim](const T& g) { return std::vector<T>{reverse_cumsum(g, dim)}; });
}

/// cumprod: d y_j / d x_i = y_j / x_i for j >= i; exact where x != 0 (as prod's).
template <class T>
void record_cumprod(T& out, const T& x, int64_t dim) {
  if (!needs_grad<T>({&x})) return;
  record<T>("cumprod", out, {&x}, [x = x.detach(), y = out.detach(), dim](const T& g) {
    return std::vector<T>{div(reverse_cumsum(mul(g, y), dim), x)};
  });
}

// --- indexing (index tensors carry no gradient) ----------------------------------------------

/// gather and scatter_add are adjoint; index_select and index_add too.
template <class T>
void record_gather(T& out, const T& x, int64_t dim, const T& index) {
  if (!needs_grad<T>({&x})) return;
  record<T>("gather", out, {&x}, [x = x.detach(), dim, index = index.detach()](const T& g) {
    return std::vector<T>{scatter_add(zeros_like(x).to(g.dtype()), dim, index, g)};
  });
}

/// scatter passes g except where it overwrote x; scatter_add passes all of it. src's gradient is g
/// gathered at the index, zero-padded where src is larger than index.
template <class T>
void record_scatter(T& out, const T& x, int64_t dim, const T& index, const T& src, bool adding) {
  if (!needs_grad<T>({&x, &src})) return;
  record<T>(adding ? "scatter_add" : "scatter", out, {&x, &index, &src},
            [dim, index = index.detach(), src_shape = src.shape(), adding](const T& g) {
              const T gx = adding ? g : scatter(g, dim, index, zeros_like(gather(g, dim, index)));
              T gsrc = gather(g, dim, index);
              if (gsrc.shape() != src_shape) {
                std::vector<int64_t> pads;
                for (int64_t k = src_shape.size() - 1; k >= 0; --k) pads.insert(pads.end(), {0, src_shape[k] - gsrc.shape()[k]});
                gsrc = pad(gsrc, pads);
              }
              return std::vector<T>{gx, T(), gsrc};
            });
}

template <class T>
void record_index_select(T& out, const T& x, int64_t dim, const T& index) {
  if (!needs_grad<T>({&x})) return;
  record<T>("index_select", out, {&x}, [x = x.detach(), dim, index = index.detach()](const T& g) {
    return std::vector<T>{index_add(zeros_like(x).to(g.dtype()), dim, index, g)};
  });
}

template <class T>
void record_index_add(T& out, const T& x, int64_t dim, const T& index, const T& src) {
  if (!needs_grad<T>({&x, &src})) return;
  record<T>("index_add", out, {&x, &index, &src}, [dim, index = index.detach()](const T& g) {
    return std::vector<T>{g, T(), index_select(g, dim, index)};
  });
}

// --- linear algebra ---------------------------------------------------------------------------

template <class T>
void record_matmul(const char* name, T& out, const T& a, const T& b) {
  if (!needs_grad<T>({&a, &b})) return;
  record<T>(name, out, {&a, &b}, [a = a.detach(), b = b.detach()](const T& g) {
    // 1-d operands as matrices: a [k] -> [1, k], b [k] -> [k, 1]; g gains the matching dims.
    const T a2 = a.ndim() == 1 ? unsqueeze(a, 0) : a, b2 = b.ndim() == 1 ? unsqueeze(b, 1) : b;
    T g2 = g;
    if (a.ndim() == 1 && b.ndim() == 1)
      g2 = reshape(g, {1, 1});
    else if (a.ndim() == 1)
      g2 = unsqueeze(g, g.ndim() - 1);
    else if (b.ndim() == 1)
      g2 = unsqueeze(g, g.ndim());
    const T ga = matmul(g2, transpose(b2, -1, -2)), gb = matmul(transpose(a2, -1, -2), g2);
    return std::vector<T>{reshape(sum_to(ga, a2.shape()), a.shape()), reshape(sum_to(gb, b2.shape()), b.shape())};
  });
}

template <class T>
void record_linear(T& out, const T& x, const T& w, const std::optional<T>& bias) {
  const T* b = bias ? &*bias : nullptr;
  if (!needs_grad<T>({&x, &w, b})) return;
  record<T>("linear", out, {&x, &w, b}, [x = x.detach(), w = w.detach(), has_bias = b != nullptr](const T& g) {
    const int64_t out_features = w.shape()[0], in_features = w.shape()[1];
    const T g2 = reshape(g, {-1, out_features}), x2 = reshape(x, {-1, in_features});
    return std::vector<T>{matmul(g, w), matmul(transpose(g2, 0, 1), x2), has_bias ? sum(g2, {0}) : T()};
  });
}

/// einsum (spec without repeated letters: diagonals are einsums of their own): the gradient of
/// operand i is the einsum of g with the other operands onto i's letters, broadcast over the
/// letters only i has (they were summed out). Operands that need none get none (a diagonal's
/// identity would cost a contraction as large as the operand).
template <class T>
void record_einsum(T& out, const std::vector<T>& operands, const EinsumSpec& spec) {
  if (!needs_grad(operands)) return;
  std::vector<const T*> pointers;
  std::vector<T> saved;
  std::vector<bool> wanted;
  for (const T& t : operands) {
    pointers.push_back(&t);
    saved.push_back(t.detach());
    wanted.push_back(needs_grad<T>({&t}));
  }
  record<T, T>("einsum", out, pointers, [saved, spec, wanted](const T& g) {
    std::vector<T> grads;
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!wanted[i]) {
        grads.push_back(T());
        continue;
      }
      std::string terms = spec.output, available = spec.output, target;
      std::vector<T> args{g};
      for (size_t j = 0; j < saved.size(); ++j) {
        if (j == i) continue;
        terms += "," + spec.inputs[j];
        available += spec.inputs[j];
        args.push_back(saved[j]);
      }
      Shape kept_shape;
      for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
        const bool present = available.find(spec.inputs[i][d]) != std::string::npos;
        if (present) target += spec.inputs[i][d];
        kept_shape.push_back(present ? saved[i].shape()[static_cast<int64_t>(d)] : 1);
      }
      T grad = einsum(terms + "->" + target, args);
      if (target.size() != spec.inputs[i].size()) grad = expand(reshape(grad, kept_shape), saved[i].shape());
      grads.push_back(grad);
    }
    return grads;
  });
}

// --- nn ---------------------------------------------------------------------------------------

template <class T>
void record_softmax(T& out, const T& x, int64_t dim, bool log_of) {
  if (!needs_grad<T>({&x})) return;
  record<T>(log_of ? "log_softmax" : "softmax", out, {&x}, [y = out.detach(), dim, log_of](const T& g) {
    if (log_of) return std::vector<T>{sub(g, mul(exp(y), sum(g, {dim}, true)))};
    return std::vector<T>{mul(y, sub(g, sum(mul(g, y), {dim}, true)))};
  });
}

/// layer_norm (centred) and rms_norm over the trailing `count` dims, recomputing the statistics.
/// `x_as_computed` / `weight_as_computed`: the operands as the forward kernel saw them (a DTensor
/// op passes them in the layout its rule chose, normalised dims whole, so the backward runs where
/// the forward did instead of redistributing inside every op of the formula); default x / weight.
template <class T>
void record_norm(const char* name, T& out, const T& x, int64_t count, const std::optional<T>& weight,
                 const std::optional<T>& bias, double eps, bool centred, const T* x_as_computed = nullptr,
                 const std::optional<T>* weight_as_computed = nullptr) {
  const T* w = weight ? &*weight : nullptr;
  const T* b = bias ? &*bias : nullptr;
  if (!needs_grad<T>({&x, w, b})) return;
  const T& x_saved = x_as_computed ? *x_as_computed : x;
  const std::optional<T>& w_saved = weight_as_computed ? *weight_as_computed : weight;
  record<T>(name, out, {&x, w, b},
            [x = x_saved.detach(), w = w_saved ? std::optional<T>(w_saved->detach()) : std::nullopt,
             bias_shape = b ? b->shape() : Shape(), has_bias = b != nullptr, count, eps, centred](const T& g) {
              // One kernel for the rows (norm_backward: Tensor's in ops/fused_backward.hpp,
              // DTensor's on each block); the weight's and bias's sums over the rows after.
              const auto [dx, g_xhat] = norm_backward(g, x, w, count, eps, centred);
              return std::vector<T>{dx, w ? sum_to(g_xhat, w->shape()) : T(), has_bias ? sum_to(g, bias_shape) : T()};
            });
}

/// The gradients norm_backward computes, op by op (the DTensor form's fallback where a block
/// lacks whole rows): {d loss / dx, grad * xhat}.
template <class T>
std::pair<T, T> norm_backward_by_ops(const T& g, const T& x, const std::optional<T>& w, int64_t count, double eps,
                                     bool centred) {
  std::vector<int64_t> dims;
  for (int64_t d = x.ndim() - count; d < x.ndim(); ++d) dims.push_back(d);
  const T xc = centred ? sub(x, mean(x, dims, true)) : x;
  const T rstd = rsqrt(add(mean(mul(xc, xc), dims, true), Scalar(eps)));
  const T xhat = mul(xc, rstd);
  const T gxhat = w ? mul(g, *w) : g;
  T inner = sub(gxhat, mul(xhat, mean(mul(gxhat, xhat), dims, true)));
  if (centred) inner = sub(inner, mean(gxhat, dims, true));
  return {mul(rstd, inner), mul(g, xhat)};
}

template <class T>
void record_cat(T& out, const std::vector<T>& inputs, int64_t dim) {
  if (!needs_grad(inputs)) return;
  std::vector<const T*> pointers;
  std::vector<int64_t> sizes;
  for (const T& t : inputs) {
    pointers.push_back(&t);
    sizes.push_back(t.shape()[dim]);
  }
  record<T, T>("cat", out, pointers, [sizes, dim](const T& g) {
    std::vector<T> grads;
    int64_t start = 0;
    for (int64_t size : sizes) {
      grads.push_back(narrow(g, dim, start, size));
      start += size;
    }
    return grads;
  });
}

template <class T>
void record_stack(T& out, const std::vector<T>& inputs, int64_t dim) {
  if (!needs_grad(inputs)) return;
  std::vector<const T*> pointers;
  for (const T& t : inputs) pointers.push_back(&t);
  record<T, T>("stack", out, pointers, [n = static_cast<int64_t>(inputs.size()), dim](const T& g) {
    std::vector<T> grads;
    for (int64_t i = 0; i < n; ++i) grads.push_back(select(g, dim, i));
    return grads;
  });
}

// --- shape ops ----------------------------------------------------------------------------------

/// flip over normalised `dims`: its own adjoint.
template <class T>
void record_flip(T& out, const T& x, const DimVector& dims) {
  record_unary("flip", out, x, [dims = dims.vec()](const T& g, const T&, const T&) { return flip(g, dims); });
}

/// roll by per-dim shifts (roll_shifts): the adjoint rolls back.
template <class T>
void record_roll(T& out, const T& x, const DimVector& shifts) {
  record_unary("roll", out, x, [shifts](const T& g, const T&, const T&) {
    std::vector<int64_t> back, dims;
    for (int64_t d = 0; d < shifts.size(); ++d) {
      back.push_back(-shifts[d]);
      dims.push_back(d);
    }
    return roll(g, back, dims);
  });
}

/// tril / triu: the same mask on the gradient.
template <class T>
void record_triangle(T& out, const T& x, int64_t diagonal, bool lower) {
  record_unary(lower ? "tril" : "triu", out, x, [diagonal, lower](const T& g, const T&, const T&) {
    return lower ? tril(g, diagonal) : triu(g, diagonal);
  });
}

/// repeat: the gradient of every tile summed, g seen as [r0, s0, r1, s1, ...] summed over the r's.
template <class T>
void record_repeat(T& out, const T& x, const std::vector<int64_t>& repeats) {
  record_unary("repeat", out, x, [shape = x.shape(), repeats](const T& g, const T&, const T&) {
    const int64_t n = static_cast<int64_t>(repeats.size()), lead = n - shape.size();
    Shape tiles;
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < n; ++i) {
      tiles.push_back(repeats[static_cast<size_t>(i)]);
      tiles.push_back(i < lead ? 1 : shape[i - lead]);
      dims.push_back(2 * i);
    }
    if (dims.empty()) return reshape(g, shape);
    return reshape(sum(reshape(g, tiles), dims), shape);
  });
}

/// g zero-padded along one dim of an n-dim tensor (pad's pairs run from the last dim backwards).
template <class T>
T pad_dim(const T& g, int64_t dim, int64_t before, int64_t after) {
  std::vector<int64_t> pads(static_cast<size_t>(2 * (g.ndim() - dim)), 0);
  pads[pads.size() - 2] = before;
  pads[pads.size() - 1] = after;
  return pad(g, pads, PadMode::constant, Scalar(0.0));
}

/// The adjoint of pad: constant crops what was added (and zero-pads what was cropped); the other
/// modes, separable over dims, add each padded border back onto the elements it copies.
template <class T>
T pad_backward(const T& g, const Shape& shape, const DimVector& before, const DimVector& after, PadMode mode) {
  const int64_t nd = shape.size();
  if (mode == PadMode::constant) {
    std::vector<int64_t> pads;
    for (int64_t d = nd - 1; d >= 0; --d) {
      pads.push_back(-before[d]);
      pads.push_back(-after[d]);
    }
    return pad(g, pads, PadMode::constant, Scalar(0.0));
  }
  T grad = g;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t b = before[d], a = after[d], n = shape[d];
    if (b == 0 && a == 0) continue;
    T folded = narrow(grad, d, b, n);
    if (b > 0) {
      const T left = narrow(grad, d, 0, b);
      switch (mode) {
        case PadMode::reflect: folded = add(folded, pad_dim(flip(left, {d}), d, 1, n - 1 - b)); break;
        case PadMode::replicate: folded = add(folded, pad_dim(sum(left, {d}, true), d, 0, n - 1)); break;
        default: folded = add(folded, pad_dim(left, d, n - b, 0)); break;
      }
    }
    if (a > 0) {
      const T right = narrow(grad, d, b + n, a);
      switch (mode) {
        case PadMode::reflect: folded = add(folded, pad_dim(flip(right, {d}), d, n - 1 - a, 1)); break;
        case PadMode::replicate: folded = add(folded, pad_dim(sum(right, {d}, true), d, n - 1, 0)); break;
        default: folded = add(folded, pad_dim(right, d, 0, n - a)); break;
      }
    }
    grad = folded;
  }
  return grad;
}

/// pad with per-dim (before, after) from pad_spec.
template <class T>
void record_pad(T& out, const T& x, const DimVector& before, const DimVector& after, PadMode mode) {
  record_unary("pad", out, x, [shape = x.shape(), before, after, mode](const T& g, const T&, const T&) {
    return pad_backward(g, shape, before, after, mode);
  });
}

}  // namespace tessera::derivatives
