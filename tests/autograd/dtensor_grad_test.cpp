// Distributed gradients equal single-device gradients: every differentiable op on DTensor leaves
// with placements from {R, S(d), P(sum)} on the meshes [4], 2x2 and 2x3 (even, uneven and empty
// shards) gives each leaf the gradient the Tensor op gives the unsharded input, in the leaf's
// layout (Partial -> Replicate). Each op on its input shapes is one value-parameterized test
// (DTensorGradOf) named from its canonical text, e.g.
// Reductions/DTensorGradOf.EqualsTheUnshardedGradient/sum_5_4_dims_0_keepdim_true. Then the
// adjoints of redistributions, counted with CommDebugMode, and grad_placements on to_local /
// full_tensor / from_local.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "placement_sweep.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Distinct values away from the kinks (as in tensor_grad_test), f64 for exact comparisons.
Tensor values(const Shape& shape, int seed, bool positive = false) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    const double k = static_cast<double>(i + static_cast<size_t>(seed) * 7 + 1);
    v[i] = (positive ? 0.3 : -1.1) + std::fmod(k * 0.37, positive ? 2.0 : 2.3) + 0.013 * k;
  }
  return from_vector(v, shape);
}

// A leaf DTensor holding `global` with `placements`; a P(sum) mesh dim splits the value into
// parts (rank 0 of the dim holds block - (k-1) * 0.25, the others 0.25).
DTensor leaf(const Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  const Layout layout(global.shape(), global.dtype(), mesh.spec(), placements);
  const auto coordinate = mesh.coordinate();
  const Block block = layout.block(coordinate);
  Tensor local = global;
  for (int64_t d = 0; d < global.ndim(); ++d) local = local.narrow(d, block.begin[d], block.end[d] - block.begin[d]);
  local = local.clone();
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!is_partial(placements[static_cast<size_t>(m)])) continue;
    const int64_t k = mesh.size(m), c = coordinate[static_cast<size_t>(m)];
    local = c == 0 ? sub(local, Scalar(0.25 * static_cast<double>(k - 1))) : full(local.shape(), 0.25, local.dtype());
  }
  DTensor out(local, mesh, layout);
  out.requires_grad_();
  return out;
}

// Output weights (a fixed vector-Jacobian product), the same on every rank.
Tensor weights_like(const Shape& shape) {
  std::vector<double> w(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + static_cast<double>((i * 37 + 11) % 64) / 64.0;
  return from_vector(w, shape);
}

using DOp = std::function<DTensor(const std::vector<DTensor>&)>;
using LOp = std::function<Tensor(const std::vector<Tensor>&)>;

// One op on one set of unsharded inputs. A case is made before any rank starts (only local Tensors
// then; whatever needs a mesh or a rank happens inside dop, on the ranks) and outlives the loop
// that made it: its lambdas hold what they use by value.
struct GradCase {
  std::string op;               // the op(s) under test, e.g. "amax amin"
  std::vector<Tensor> globals;  // the unsharded inputs (integer ones stay Replicate, no gradient)
  DOp dop;
  LOp lop;
  std::string args;        // what tells cases of one op apart, e.g. "dims=[0] keepdim=true"
  bool partial = true;     // P(sum) among the leaves' placements
  size_t max_combos = 40;  // a deterministic sample of the placement combinations per mesh
  std::string name;        // the canonical text: op, input shapes, args (set by named())
};

// What gtest prints for a parameter (instead of the bytes of the struct).
void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

GradCase grad_case(std::string op, std::vector<Tensor> globals, DOp dop, LOp lop, std::string args = "") {
  GradCase c;
  c.op = std::move(op);
  c.globals = std::move(globals);
  c.dop = std::move(dop);
  c.lop = std::move(lop);
  c.args = std::move(args);
  return c;
}

// A case whose DTensor and Tensor functions are the same expression: `f` is a generic lambda.
template <class F>
GradCase same_op(std::string op, std::vector<Tensor> globals, F f, std::string args = "") {
  return grad_case(std::move(op), std::move(globals), DOp(f), LOp(f), std::move(args));
}

// Every run of characters outside [A-Za-z0-9] becomes one '_', none at either end.
std::string identifier(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      out += ch;
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? std::string("case") : out;
}

// Sets each case's canonical text, "op [5, 3] [3] args". Should two cases of one list still give
// the same test name, the later ones get " 2", " 3" (the lists below keep their names distinct).
std::vector<GradCase> named(std::vector<GradCase> cases) {
  std::map<std::string, int> seen;
  for (GradCase& c : cases) {
    c.name = c.op;
    for (const Tensor& g : c.globals) c.name.append(" ").append(g.shape().to_string());
    if (!c.args.empty()) c.name.append(" ").append(c.args);
    if (const int n = ++seen[identifier(c.name)]; n > 1) c.name.append(" ").append(std::to_string(n));
  }
  return cases;
}

// The test name: the canonical text as an identifier, "sum [5, 4] dims=[0] keepdim=true" ->
// sum_5_4_dims_0_keepdim_true.
std::string case_name(const ::testing::TestParamInfo<GradCase>& info) { return identifier(info.param.name); }

// loss = sum(op(leaves) * w): the leaves' gradients (full_tensor) equal the Tensor gradients.
void check_grads(const GradCase& c) {
  const std::string& name = c.name;
  const DOp& dop = c.dop;
  const LOp& lop = c.lop;
  std::vector<Tensor> expected;
  {
    std::vector<Tensor> inputs;
    for (const Tensor& g : c.globals) {
      Tensor t = g.clone();
      if (is_floating(t.dtype())) t.requires_grad_();
      inputs.push_back(t);
    }
    const Tensor out = lop(inputs);
    sum(mul(out, weights_like(out.shape()))).backward();
    for (const Tensor& t : inputs) expected.push_back(t.requires_grad() ? t.grad() : Tensor());
  }
  for (const auto& mesh_shape : sweep_meshes(world_size())) {
    const DeviceMesh mesh = sweep_mesh(mesh_shape);
    std::vector<std::vector<Placements>> options;
    size_t combos = 1;
    for (const Tensor& g : c.globals) {
      options.push_back(is_floating(g.dtype())
                            ? placement_combinations(g.ndim(), mesh.ndim(), c.partial)
                            : std::vector<Placements>{Placements(static_cast<size_t>(mesh.ndim()), Replicate{})});
      combos *= options.back().size();
    }
    const size_t limit = sample_limit(c.max_combos);
    const size_t stride = std::max<size_t>(1, (combos + limit - 1) / limit);
    for (size_t index = 0; index < combos; index += stride) {
      std::vector<DTensor> leaves;
      std::string text;
      for (size_t i = 0, rest = index; i < c.globals.size(); ++i) {
        const Placements& p = options[i][rest % options[i].size()];
        rest /= options[i].size();
        text.append(text.empty() ? "" : " ").append(to_string(p));
        if (is_floating(c.globals[i].dtype())) {
          leaves.push_back(leaf(c.globals[i], mesh, p));
        } else {
          leaves.push_back(distribute_tensor(c.globals[i], mesh, p));
        }
      }
      const DTensor out = dop(leaves);
      const DTensor w =
          distribute_tensor(weights_like(out.shape()), mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
      sum(mul(out, w)).backward();
      for (size_t i = 0; i < leaves.size(); ++i) {
        if (!expected[i].defined()) continue;
        const DTensor grad = leaves[i].grad();
        const bool present = grad.defined();
        const bool layout_ok = present && grad.layout() == gradient_layout(leaves[i].layout());
        const Tensor got = present ? grad.full_tensor() : Tensor();
        const bool ok = layout_ok && allclose(got, expected[i], 1e-9, 1e-9);
        EXPECT_TRUE(ok) << name << " on mesh " << mesh.to_string() << " with inputs " << text << ": gradient of input "
                        << i << (present ? " in " + grad.layout().to_string() : std::string(" missing")) << " (rank "
                        << rank() << ")\ngot " << (present ? got.to_string() : "-") << "\nexpected " << expected[i];
        if (!ok) return;  // one report per case: the first failing leaf, placements and mesh
      }
    }
  }
}

const std::vector<int> kWorlds = {4, 6};

}  // namespace

class DTensorGradOf : public ::testing::TestWithParam<GradCase> {};

TEST_P(DTensorGradOf, EqualsTheUnshardedGradient) {
  const GradCase& c = GetParam();
  for_each_world(kWorlds, [&c] { check_grads(c); });
}

namespace {

std::vector<GradCase> elementwise_cases() {
  const Tensor a = values({5, 3}, 1), b = values({5, 3}, 2), row = values({3}, 3), p = values({5, 3}, 4, true);
  std::vector<GradCase> cases{
      same_op("add", {a, b}, [](auto& x) { return add(x[0], x[1]); }),
      same_op("sub bcast", {a, row}, [](auto& x) { return sub(x[0], x[1]); }),
      same_op("mul", {a, b}, [](auto& x) { return mul(x[0], x[1]); }),
      same_op("div", {a, p}, [](auto& x) { return div(x[0], x[1]); }),
      same_op("pow", {p, row}, [](auto& x) { return pow(x[0], x[1]); }),
      same_op("maximum", {a, b}, [](auto& x) { return maximum(x[0], x[1]); }),
      same_op("scalars", {a},
              [](auto& x) { return 2.0 - x[0] * 3.0 + pow(x[0], 2.0) / 4.0 + maximum(x[0], 0.1); }),
      same_op("rdiv rpow", {p}, [](auto& x) { return div(1.5, x[0]) + pow(1.3, x[0]); }),
  };
  for (const auto& [name, d, l] : std::vector<
           std::tuple<std::string, std::function<DTensor(const DTensor&)>, std::function<Tensor(const Tensor&)>>>{
           {"exp tanh", [](const DTensor& x) { return exp(x) * tanh(x); },
            [](const Tensor& x) { return exp(x) * tanh(x); }},
           {"gelu silu", [](const DTensor& x) { return gelu(x) + silu(x); },
            [](const Tensor& x) { return gelu(x) + silu(x); }},
           {"sigmoid relu abs", [](const DTensor& x) { return sigmoid(x) * relu(x) + abs(x); },
            [](const Tensor& x) { return sigmoid(x) * relu(x) + abs(x); }},
           {"sin cos neg clamp", [](const DTensor& x) { return sin(x) - cos(neg(x)) + clamp(x, -0.5, 0.5); },
            [](const Tensor& x) { return sin(x) - cos(neg(x)) + clamp(x, -0.5, 0.5); }}})
    cases.push_back(grad_case(
        name, {a}, [d = d](auto& x) { return d(x[0]); }, [l = l](auto& x) { return l(x[0]); }));
  cases.push_back(same_op("log sqrt rsqrt log1p", {p},
                          [](auto& x) { return log(x[0]) + sqrt(x[0]) + rsqrt(x[0]) + log1p(x[0]); }));
  cases.push_back(same_op("expm1 erf", {a}, [](auto& x) { return expm1(x[0]) * erf(x[0]); }));
  const Tensor cond = gt(values({5, 3}, 5), Scalar(0.0));
  cases.push_back(same_op("where masked_fill", {a, b, cond},
                          [](auto& x) { return where(x[2], x[0], x[1]) + masked_fill(x[0], x[2], 1.0); }));
  return named(std::move(cases));
}

// "dims=all" or "dims=[0]", and keepdim.
std::string reduction_args(const std::vector<int64_t>& dims, bool keep) {
  return (dims.empty() ? std::string("dims=all") : "dims=" + Shape(dims).to_string()) +
         (keep ? " keepdim=true" : " keepdim=false");
}

std::vector<GradCase> reduction_cases() {
  const Tensor x = values({5, 4}, 6), p = values({5, 4}, 7, true);
  std::vector<GradCase> cases;
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}}) {
    for (bool keep : {false, true}) {
      const std::string args = reduction_args(dims, keep);
      cases.push_back(same_op("sum", {x}, [dims, keep](auto& t) { return sum(t[0], dims, keep); }, args));
      cases.push_back(same_op("mean", {x}, [dims, keep](auto& t) { return mean(t[0], dims, keep); }, args));
      cases.push_back(same_op(
          "amax amin", {x}, [dims, keep](auto& t) { return amax(t[0], dims, keep) + amin(t[0], dims, keep); }, args));
      cases.push_back(same_op("prod", {p}, [dims, keep](auto& t) { return prod(t[0], dims, keep); }, args));
      cases.push_back(same_op("var", {x}, [dims, keep](auto& t) { return var(t[0], dims, 1, keep); }, args));
    }
  }
  return named(std::move(cases));
}

std::vector<GradCase> composite_reduction_scan_sorting_cases() {
  const Tensor a = values({5, 3}, 31), p = values({5, 3}, 32, true);
  const Tensor index = from_vector<int64_t>({2, 0, 1, 1, 0, 2, 2, 2, 0, 1, 0, 0, 1, 2, 0}, {5, 3});
  const Tensor rows = from_vector<int64_t>({4, 0, 4});
  return named({
      same_op("logsumexp", {a}, [](auto& x) { return logsumexp(x[0], {0}); }),
      same_op("std", {a}, [](auto& x) { return tessera::std(x[0], {1}); }),
      same_op("vector_norm", {a}, [](auto& x) { return vector_norm(x[0], 2, {0}) + vector_norm(x[0], 1, {0}); }),
      same_op("cumsum", {a}, [](auto& x) { return cumsum(x[0], 0) + cumsum(x[0], 1); }),
      same_op("cumprod", {p}, [](auto& x) { return cumprod(x[0], 0); }),
      same_op("sort", {a}, [](auto& x) { return sort(x[0], 0).values; }),
      same_op("topk", {a}, [](auto& x) { return topk(x[0], 2, 0).values; }),
      same_op("einsum", {a, values({3, 4}, 33)}, [](auto& x) { return einsum("ij,jk->ik", x); }, "ij,jk->ik"),
      // "k" is summed away: its gradient is a broadcast.
      same_op("einsum", {a, values({4}, 34)}, [](auto& x) { return einsum("ij,k->ik", x); }, "ij,k->ik"),
      same_op("gather scatter_add", {a, index, values({5, 3}, 36)},
              [](auto& x) { return gather(x[0], 1, x[1]) + scatter_add(x[0], 1, x[1], x[2]); }),
      same_op("index_select index_add", {a, rows, values({3, 3}, 37)},
              [](auto& x) { return index_add(x[0], 0, x[1], x[2]) * 2.0 + sum(index_select(x[0], 0, x[1])); }),
      same_op("dropout", {a},
              [](auto& x) {
                manual_seed(3);
                return dropout(x[0], 0.4);
              }),
      same_op("mse_loss logsumexp", {a, values({5, 3}, 35)},
              [](auto& x) { return mse_loss(x[0], x[1]) + logsumexp(x[0]); }),
  });
}

std::vector<GradCase> matmul_linear_nn_cases() {
  const Tensor ids = from_vector(std::vector<int64_t>{2, 0, 6, 4, 1, 2, 6}, Shape{7});
  const Tensor target = from_vector(std::vector<int64_t>{1, 4, -100, 0, 5}, Shape{5});
  return named({
      same_op("matmul", {values({5, 3}, 8), values({3, 4}, 9)}, [](auto& x) { return matmul(x[0], x[1]); }),
      same_op("matmul", {values({2, 5, 3}, 10), values({3, 4}, 11)}, [](auto& x) { return matmul(x[0], x[1]); }),
      same_op("matmul", {values({3}, 12), values({3, 4}, 13)}, [](auto& x) { return matmul(x[0], x[1]); }),
      same_op("bmm", {values({3, 5, 2}, 14), values({3, 2, 4}, 15)}, [](auto& x) { return bmm(x[0], x[1]); }),
      same_op("linear", {values({5, 3}, 16), values({4, 3}, 17), values({4}, 18)},
              [](auto& x) { return linear(x[0], x[1], x[2]); }),
      same_op("softmax log_softmax", {values({5, 6}, 19)},
              [](auto& x) { return softmax(x[0], 1) + log_softmax(x[0], 0); }),
      same_op("layer_norm", {values({5, 6}, 20), values({6}, 21), values({6}, 22)},
              [](auto& x) { return layer_norm(x[0], {6}, x[1], x[2]); }),
      same_op("rms_norm", {values({5, 6}, 23), values({6}, 24)}, [](auto& x) { return rms_norm(x[0], {6}, x[1]); }),
      same_op("embedding", {values({7, 3}, 25), ids}, [](auto& x) { return embedding(x[0], x[1]); }),
      same_op("cross_entropy", {values({5, 6}, 26), target}, [](auto& x) { return cross_entropy(x[0], x[1]); }),
  });
}

std::vector<GradCase> view_join_cases() {
  const Tensor x = values({4, 6}, 27), y = values({4, 6}, 28);
  return named({
      same_op("reshape", {x}, [](auto& t) { return reshape(t[0], {2, 12}); }, "to [2, 12]"),
      same_op("transpose", {x}, [](auto& t) { return transpose(t[0], 0, 1); }),
      same_op("narrow", {x}, [](auto& t) { return narrow(t[0], 1, 1, 3); }),
      same_op("select", {x}, [](auto& t) { return select(t[0], 0, 2); }),
      same_op("expand", {values({1, 6}, 29)}, [](auto& t) { return expand(t[0], {4, 6}); }, "to [4, 6]"),
      same_op("cat", {x, y}, [](auto& t) { return cat({t[0], t[1]}, 1) + cat({t[1], t[0]}, 1); }),
      same_op("stack", {x, y}, [](auto& t) { return stack({t[0], t[1]}, 0); }),
      same_op("split", {x},
              [](auto& t) {
                const auto p = split(t[0], 4, 1);
                return mul(narrow(p[0], 1, 0, 2), p[1]);
              }),
  });
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(ElementwiseOps, DTensorGradOf, ::testing::ValuesIn(elementwise_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Reductions, DTensorGradOf, ::testing::ValuesIn(reduction_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(CompositeReductionsScansAndSorting, DTensorGradOf,
                         ::testing::ValuesIn(composite_reduction_scan_sorting_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(MatmulLinearAndNn, DTensorGradOf, ::testing::ValuesIn(matmul_linear_nn_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(ViewsAndJoins, DTensorGradOf, ::testing::ValuesIn(view_join_cases()), case_name);

namespace {

const Placements S0{Shard{0}}, R{Replicate{}}, P{Partial{}};

// Runs the backward of `loss` under CommDebugMode and returns the collective counts.
std::map<CollectiveKind, int64_t> backward_counts(const DTensor& loss) {
  CommDebugMode mode;
  loss.backward();
  return mode.counts();
}

int64_t count_of(const std::map<CollectiveKind, int64_t>& counts, CollectiveKind kind) {
  const auto it = counts.find(kind);
  return it == counts.end() ? 0 : it->second;
}

}  // namespace

TEST(DTensorGrad, RedistributionAdjoints) {
  for_each_world({4}, [] {
    const int n = world_size();
    const DeviceMesh mesh({n}, {"x"});
    const Tensor global = values({8, 3}, 30), w = weights_like({8, 3});
    const DTensor wr = distribute_tensor(w, mesh, R);
    {  // Shard -> Replicate (all_gather) <-> reduce_scatter of the Partial gradient.
      DTensor x = distribute_tensor(global, mesh, S0);
      x.requires_grad_();
      // Each rank's local loss differs: its gradient is a Partial contribution.
      const Tensor local = x.redistribute(R).to_local({P});
      const Tensor mine = mul(local, Scalar(static_cast<double>(rank() + 1)));
      const Tensor loss = sum(mul(mine, w));
      CommDebugMode mode;
      loss.backward();
      EXPECT_EQ(mode.count(CollectiveKind::reduce_scatter) + mode.count(CollectiveKind::reduce_scatter_v), 1);
      EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 0);
      EXPECT_EQ(x.grad().placements(), S0);
      EXPECT_TRUE(allclose(x.grad().full_tensor(), mul(w, Scalar(n * (n + 1) / 2.0))));  // 1 + 2 + ... + n
    }
    {  // Replicate -> Shard (local chunk) <-> all_gather.
      DTensor x = distribute_tensor(global, mesh, R);
      x.requires_grad_();
      // With the weights sharded, the gradient arrives as Shard(0): its adjoint gathers it.
      const auto counts = backward_counts(sum(mul(x.redistribute(S0), distribute_tensor(w, mesh, S0))));
      EXPECT_EQ(count_of(counts, CollectiveKind::all_gather) + count_of(counts, CollectiveKind::all_gather_v), 1);
      EXPECT_EQ(x.grad().placements(), R);
      EXPECT_TRUE(allclose(x.grad().to_local(), w));
    }
    {  // Partial -> Replicate (all_reduce) <-> identity into Replicate: no collective for it.
      DTensor x = DTensor::from_local(full({8, 3}, 1.0 / n, DType::f64), mesh, P);
      x.requires_grad_();
      const DTensor y = x.redistribute(R);
      EXPECT_TRUE(allclose(y.to_local(), full({8, 3}, 1.0, DType::f64)));
      const auto counts = backward_counts(sum(mul(y, wr)));
      EXPECT_EQ(count_of(counts, CollectiveKind::all_reduce) + count_of(counts, CollectiveKind::reduce_scatter) +
                    count_of(counts, CollectiveKind::all_gather),
                0);
      EXPECT_EQ(x.grad().placements(), R);
      EXPECT_TRUE(allclose(x.grad().to_local(), w));
    }
  });
}

TEST(DTensorGrad, GradPlacementsOfToLocalFullTensorAndFromLocal) {
  for_each_world({4}, [] {
    const int n = world_size();
    const int64_t rows = 8 / n;
    const DeviceMesh mesh({n}, {"x"});
    const Tensor global = values({8, 2}, 31), w = weights_like({8, 2});
    {  // full_tensor: by default every rank computes the same loss (Replicate gradient).
      DTensor x = distribute_tensor(global, mesh, S0);
      x.requires_grad_();
      sum(mul(x.full_tensor(), w)).backward();
      EXPECT_TRUE(allclose(x.grad().full_tensor(), w));
      EXPECT_EQ(x.grad().placements(), S0);
    }
    {  // full_tensor with Partial grad_placements: the ranks' gradients add up.
      DTensor x = distribute_tensor(global, mesh, S0);
      x.requires_grad_();
      sum(mul(x.full_tensor({P}), w)).backward();
      EXPECT_TRUE(allclose(x.grad().full_tensor(), mul(w, Scalar(static_cast<double>(n)))));
    }
    {  // from_local: a local Tensor leaf gets its piece of the DTensor's gradient.
      Tensor local = values({rows, 2}, 32 + rank()).requires_grad_();
      const DTensor x = DTensor::from_local(local, mesh, S0);
      EXPECT_TRUE(x.requires_grad());
      EXPECT_EQ(x.grad_fn_name(), "from_local");
      const DTensor wd = distribute_tensor(w, mesh, R);
      sum(mul(x, wd)).backward();
      EXPECT_TRUE(allclose(local.grad(), w.narrow(0, rows * rank(), rows)));
    }
    {  // from_local of a Replicate local: the gradient of the global value, on every rank.
      Tensor local = values({8, 2}, 40).requires_grad_();
      const DTensor x = DTensor::from_local(local, mesh, R);
      sum(mul(x.redistribute(S0), distribute_tensor(w, mesh, S0))).backward();
      EXPECT_TRUE(allclose(local.grad(), w));
    }
    {  // to_local with the default grad_placements: the local's gradient is this rank's piece.
      DTensor x = distribute_tensor(global, mesh, S0);
      x.requires_grad_();
      sum(mul(x.to_local(), w.narrow(0, rows * rank(), rows))).backward();
      EXPECT_TRUE(allclose(x.grad().full_tensor(), w));
    }
  });
}

TEST(DTensorGrad, LeavesAndErrors) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({2, world_size() / 2}, {"dp", "tp"});
    DTensor x = distribute_tensor(values({4, 4}, 33), mesh, {Shard{0}, Replicate{}});
    EXPECT_FALSE(x.requires_grad());
    x.requires_grad_();
    EXPECT_TRUE(x.is_leaf());
    const DTensor y = mul(x, x);
    EXPECT_EQ(y.grad_fn_name(), "mul");
    EXPECT_FALSE(x.grad().defined());
    sum(y).backward();
    sum(y).backward();  // accumulates
    EXPECT_TRUE(allclose(x.grad().full_tensor(), mul(values({4, 4}, 33), Scalar(4.0))));
    x.set_grad(DTensor());
    EXPECT_FALSE(x.grad().defined());
    EXPECT_FALSE(x.detach().requires_grad());
    {
      autograd::NoGradGuard no_grad;
      EXPECT_FALSE(mul(x, x).requires_grad());
    }
    // distribute_tensor of a Tensor that requires a gradient is a leaf that requires one.
    Tensor t = values({4, 4}, 34).requires_grad_();
    const DTensor d = distribute_tensor(t, mesh, {Replicate{}, Shard{1}});
    EXPECT_TRUE(d.requires_grad());
    EXPECT_TRUE(d.is_leaf());
    DTensor ints = distribute_tensor(arange(4), mesh, {Replicate{}, Replicate{}});
    EXPECT_TRUE(throws_with<ShardingError>([&] { ints.requires_grad_(); }, {"[DTensor::requires_grad_]", "floating"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { y.backward(); }, {"[DTensor::backward]", "one-element"}));
    EXPECT_TRUE(
        throws_with<ShardingError>([&] { x.detach().backward(); }, {"[DTensor::backward]", "does not require"}));
    EXPECT_TRUE(throws_with<ShardingError>(
        [&] {
          (void)x.full_tensor({Shard{0}, Replicate{}});
        },
        {"[DTensor::full_tensor]", "grad_placements", "Replicate or Partial"}));
    EXPECT_TRUE(
        throws_with<ShardingError>([&] { (void)y.reduce({"dp"}); }, {"[DTensor::reduce]", "not differentiable"}));
  });
}

namespace {

std::vector<GradCase> copying_shape_op_cases() {
  const Tensor x = values({5, 3}, 42), b = values({2, 5, 3}, 43);
  std::vector<GradCase> cases{
      same_op("flip", {x}, [](auto& t) { return flip(t[0], {0, 1}); }),
      same_op("roll", {x}, [](auto& t) { return roll(t[0], {2, -1}, {0, 1}) + roll(t[0], {4}); }),
      same_op("tril", {b}, [](auto& t) { return tril(t[0], -1); }),
      same_op("triu", {b}, [](auto& t) { return triu(t[0], 1); }),
      same_op("repeat", {x}, [](auto& t) { return repeat(t[0], {2, 1, 3}); }),
      same_op("tile", {b}, [](auto& t) { return tile(t[0], {2, 1}); }),
      same_op("pad", {x}, [](auto& t) { return pad(t[0], {1, -1, 2, 0}, PadMode::constant, 0.5); }, "constant"),
  };
  for (PadMode mode : {PadMode::reflect, PadMode::replicate, PadMode::circular})
    cases.push_back(same_op("pad", {x}, [mode](auto& t) { return pad(t[0], {2, 1, 1, 3}, mode); }, to_string(mode)));
  return named(std::move(cases));
}

// Over the sweep (the weight R, S(0) vocabulary-sharded, S(1), P): the gradient with padding_idx
// equals the Tensor gradient, whose padding row is zero. Rows 0, 4 and 6 sit on different shards.
std::vector<GradCase> embedding_padding_idx_cases() {
  const Tensor ids = from_vector(std::vector<int64_t>{2, 0, 6, 4, 1, 2, 6}, Shape{7});
  std::vector<GradCase> cases;
  for (int64_t pad : {int64_t{0}, int64_t{4}, int64_t{-1}, int64_t{-5}})
    cases.push_back(same_op("embedding", {values({7, 3}, 25), ids},
                            [pad](auto& x) { return embedding(x[0], x[1], pad); },
                            "padding_idx=" + std::to_string(pad)));
  return named(std::move(cases));
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(ShapeOpsThatCopy, DTensorGradOf, ::testing::ValuesIn(copying_shape_op_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(EmbeddingPaddingIdx, DTensorGradOf, ::testing::ValuesIn(embedding_padding_idx_cases()),
                         case_name);

// The rest of padding_idx (its sweep is EmbeddingPaddingIdx/DTensorGradOf above).
TEST(DTensorGrad, EmbeddingPaddingIdx) {
  for_each_world(kWorlds, [] {
    // Vocabulary-sharded: the weight is never gathered, and the rank holding the padding row zeroes it.
    const DeviceMesh mesh({world_size()}, {"x"});
    const Tensor w = values({9, 3}, 26);
    const Tensor idx = from_vector(std::vector<int64_t>{8, 3, 3, 0, 8, 5}, Shape{2, 3});
    const Tensor up = weights_like({2, 3, 3});
    Tensor expected_w = w.clone().requires_grad_();
    sum(mul(embedding(expected_w, idx, 8), up)).backward();
    EXPECT_TRUE(allclose(expected_w.grad().select(0, 8), zeros({3}, DType::f64)));
    for (const Placements& ip : {Placements{Replicate{}}, Placements{Shard{0}}}) {
      DTensor weight = distribute_tensor(w, mesh, {Shard{0}});
      weight.requires_grad_();
      const DTensor out = embedding(weight, distribute_tensor(idx, mesh, ip), -1);
      EXPECT_TRUE(allclose(out.full_tensor(), embedding(w, idx)));
      const DTensor loss = sum(mul(out, distribute_tensor(up, mesh, {Replicate{}})));
      CommDebugMode mode;
      loss.backward();
      if (ip == Placements{Replicate{}}) {  // sharded indices leave the choice of plan to the planner
        EXPECT_EQ(mode.count(CollectiveKind::all_gather) + mode.count(CollectiveKind::all_gather_v), 0);
        EXPECT_EQ(weight.grad().placements(), (Placements{Shard{0}}));
      }
      EXPECT_TRUE(allclose(weight.grad().full_tensor(), expected_w.grad(), 1e-9, 1e-9)) << to_string(ip);
    }

    // Out of range: the Tensor text, on every rank.
    const auto message = [](const auto& f) {
      try {
        f();
      } catch (const ValueError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const DTensor dw = distribute_tensor(w, mesh, {Shard{0}}), di = distribute_tensor(idx, mesh, {Replicate{}});
    for (int64_t bad : {int64_t{9}, int64_t{-10}}) {
      const std::string local = message([&] { (void)embedding(w, idx, bad); });
      EXPECT_NE(local.find("[embedding]"), std::string::npos) << local;
      EXPECT_NE(local.find("padding_idx " + std::to_string(bad)), std::string::npos) << local;
      EXPECT_NE(local.find("[9, 3]"), std::string::npos) << local;
      EXPECT_EQ(message([&] { (void)embedding(dw, di, bad); }), local);
    }
  });
}
