// Sharded op equivalence: for every op, every input placement combination (R, S(d) for each dim,
// P(sum)) on the meshes [4], 2x2 and 2x3, with even and uneven shapes (empty shards included),
// the result's full_tensor() equals the Tensor op on the unsharded inputs.
#include <gtest/gtest.h>

#include <functional>

#include <tessera/dtensor/dispatch.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/dtensor/redistribute.hpp>
#include <tessera/ops/ops.hpp>

#include "placement_sweep.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Integer-valued data in [-11, 11] (sums of parts stay exact); `positive` shifts it to [1, 23].
Tensor data(const Shape& shape, int seed, bool positive = false) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(static_cast<int64_t>((i + static_cast<size_t>(seed) * 5) * 7 % 23) - 11 + (positive ? 12 : 0));
  return from_vector(v, shape);
}

Tensor block_of(const Tensor& global, const Block& block) {
  const Block whole{Shape::filled(global.ndim(), 0), global.shape()};
  return detail::view_of(global, whole, block).clone();
}

// The DTensor of `global` with `placements`; a P(sum) mesh dim holds parts that sum to the block
// (rank 0 of the dim: block - k(k-1)/2, rank c: the constant c).
DTensor make_input(const Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  const Layout layout(global.shape(), global.dtype(), mesh.spec(), placements);
  const auto coordinate = mesh.coordinate();
  Tensor local = block_of(global, layout.block(coordinate));
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!is_partial(placements[static_cast<size_t>(m)])) continue;
    const int64_t k = mesh.size(m), c = coordinate[static_cast<size_t>(m)];
    local = c == 0 ? add(local, Scalar(static_cast<double>(-(k * (k - 1) / 2)))) : full(local.shape(), static_cast<double>(c));
  }
  return DTensor(local, mesh, layout);
}

struct Case {
  std::vector<Shape> shapes;
  bool partial = true;       // include P(sum) inputs
  bool positive = false;     // data in [1, 23]
  size_t max_combos = 4096;  // above this, every k-th combination (deterministic) is run
  double tolerance = 1e-4;
  std::vector<Tensor> given = {};  // per input: explicit data (integer indices) instead of data()
};

using DOp = std::function<DTensor(const std::vector<DTensor>&)>;
using LOp = std::function<Tensor(const std::vector<Tensor>&)>;

std::string describe(const std::vector<Placements>& combo) {
  std::string text;
  for (const auto& p : combo) text += (text.empty() ? "" : " ") + to_string(p);
  return text;
}

// Runs `dop` on every placement combination of the inputs and compares with `lop` on the globals.
void check_op(const std::string& name, const Case& c, const DOp& dop, const LOp& lop) {
  for (const auto& mesh_shape : sweep_meshes(world_size())) {
    const DeviceMesh mesh = sweep_mesh(mesh_shape);
    std::vector<Tensor> globals;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      const bool given = i < c.given.size() && c.given[i].defined();
      globals.push_back(given ? c.given[i] : data(c.shapes[i], static_cast<int>(i), c.positive));
    }
    const Tensor expected = lop(globals);
    std::vector<std::vector<Placements>> options;
    size_t combos = 1;
    for (size_t i = 0; i < globals.size(); ++i) {
      const bool partial_ok = c.partial && is_floating(globals[i].dtype());
      options.push_back(placement_combinations(globals[i].ndim(), mesh.ndim(), partial_ok));
      combos *= options.back().size();
    }
    // Sanitizer builds run a deterministic sample; the Release run covers every combination.
    const size_t limit = sample_limit(c.max_combos);
    const size_t stride = (combos + limit - 1) / limit;
    for (size_t index = 0; index < combos; index += stride) {
      std::vector<Placements> combo;
      std::vector<DTensor> inputs;
      for (size_t i = 0, rest = index; i < globals.size(); ++i, rest /= options[i - 1].size()) {
        combo.push_back(options[i][rest % options[i].size()]);
        inputs.push_back(make_input(globals[i], mesh, combo.back()));
      }
      const DTensor out = dop(inputs);
      const Tensor got = out.full_tensor();
      const bool ok = got.shape() == expected.shape() && got.dtype() == expected.dtype() &&
                      allclose(got.to(DType::f64), expected.to(DType::f64), c.tolerance, c.tolerance, true);
      EXPECT_TRUE(ok) << name << " on mesh " << mesh.to_string() << " with inputs " << describe(combo) << " -> "
                      << out.layout().to_string() << " (rank " << rank() << ")\ngot " << got << "\nexpected "
                      << expected;
      if (!ok) return;  // one report per op and mesh, not one per combination
    }
  }
}

void check_binary(const std::string& name, const DOp& dop, const LOp& lop, size_t max_combos = 4096) {
  for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 3}, {5, 3}}, {{4, 6}, {6}}, {{1, 3}, {5, 1}}})
    check_op(name, Case{shapes, true, false, max_combos}, dop, lop);
}

void check_unary(const std::string& name, const DOp& dop, const LOp& lop, bool positive = false) {
  for (const auto& shape : {Shape{5, 3}, Shape{4, 6}, Shape{2, 1}})
    check_op(name, Case{{shape}, true, positive}, dop, lop);
}

const std::vector<int> kWorlds = {4, 6};

}  // namespace

TEST(ShardedOps, ArithmeticOfTwoDTensors) {
  for_each_world(kWorlds, [] {
    check_binary("add", [](auto& x) { return x[0] + x[1]; }, [](auto& x) { return x[0] + x[1]; });
    check_binary("sub", [](auto& x) { return x[0] - x[1]; }, [](auto& x) { return x[0] - x[1]; });
    check_binary("mul", [](auto& x) { return x[0] * x[1]; }, [](auto& x) { return x[0] * x[1]; });
    check_binary("div", [](auto& x) { return div(x[0], add(abs(x[1]), 1.0)); },
                 [](auto& x) { return div(x[0], add(abs(x[1]), 1.0)); });
    check_binary("maximum", [](auto& x) { return maximum(x[0], x[1]); }, [](auto& x) { return maximum(x[0], x[1]); });
    check_binary("minimum", [](auto& x) { return minimum(x[0], x[1]); }, [](auto& x) { return minimum(x[0], x[1]); });
  });
}

TEST(ShardedOps, PowComparisonsAndLogicalOps) {
  for_each_world(kWorlds, [] {
    check_binary("pow", [](auto& x) { return pow(x[0], abs(x[1])); }, [](auto& x) { return pow(x[0], abs(x[1])); }, 64);
    check_binary("eq", [](auto& x) { return eq(x[0], x[1]); }, [](auto& x) { return eq(x[0], x[1]); }, 64);
    check_binary("ne", [](auto& x) { return ne(x[0], x[1]); }, [](auto& x) { return ne(x[0], x[1]); }, 64);
    check_binary("lt", [](auto& x) { return lt(x[0], x[1]); }, [](auto& x) { return lt(x[0], x[1]); }, 64);
    check_binary("le", [](auto& x) { return le(x[0], x[1]); }, [](auto& x) { return le(x[0], x[1]); }, 64);
    check_binary("gt", [](auto& x) { return gt(x[0], x[1]); }, [](auto& x) { return gt(x[0], x[1]); }, 64);
    check_binary("ge", [](auto& x) { return ge(x[0], x[1]); }, [](auto& x) { return ge(x[0], x[1]); }, 64);
    check_binary("logical_and", [](auto& x) { return logical_and(gt(x[0], 0.0), gt(x[1], 0.0)); },
                 [](auto& x) { return logical_and(gt(x[0], 0.0), gt(x[1], 0.0)); }, 64);
    check_binary("logical_or", [](auto& x) { return logical_or(gt(x[0], 0.0), gt(x[1], 0.0)); },
                 [](auto& x) { return logical_or(gt(x[0], 0.0), gt(x[1], 0.0)); }, 64);
  });
}

// A scalar beside a Partial(sum) is added once, not once per rank (PyTorch DTensor's known bug).
TEST(ShardedOps, ScalarOperandsOnEitherSide) {
  for_each_world(kWorlds, [] {
    check_unary("x + 2.5", [](auto& x) { return x[0] + 2.5; }, [](auto& x) { return x[0] + 2.5; });
    check_unary("3 - x", [](auto& x) { return 3 - x[0]; }, [](auto& x) { return 3 - x[0]; });
    check_unary("x * 3", [](auto& x) { return x[0] * 3; }, [](auto& x) { return x[0] * 3; });
    check_unary("x / 4", [](auto& x) { return x[0] / 4.0; }, [](auto& x) { return x[0] / 4.0; });
    check_unary("2 / x", [](auto& x) { return 2.0 / x[0]; }, [](auto& x) { return 2.0 / x[0]; }, true);
    check_unary("maximum(x, 1)", [](auto& x) { return maximum(x[0], 1.0); }, [](auto& x) { return maximum(x[0], 1.0); });
    check_unary("maximum(1, x)", [](auto& x) { return maximum(1.0, x[0]); }, [](auto& x) { return maximum(x[0], 1.0); });
    check_unary("lt(2, x)", [](auto& x) { return lt(2.0, x[0]); }, [](auto& x) { return gt(x[0], 2.0); });
    check_unary("pow(x, 2)", [](auto& x) { return pow(x[0], 2.0); }, [](auto& x) { return pow(x[0], 2.0); });
    check_unary("x + 0-d tensor", [](auto& x) { return add(x[0], full({}, 1.5)); }, [](auto& x) { return x[0] + 1.5; });
  });
}

// Every unary row of the op table; ops defined on positive reals get data in [1, 23], the others
// data / 4 (exp and friends stay in range).
TEST(ShardedOps, UnaryOps) {
  for_each_world(kWorlds, [] {
    const std::vector<std::string> positive_only = {"log", "sqrt", "rsqrt", "log1p"};
#define TESSERA_CHECK_UNARY(name, ...)                                                                              \
  if (std::find(positive_only.begin(), positive_only.end(), #name) != positive_only.end())                          \
    check_unary(#name, [](auto& x) { return name(x[0]); }, [](auto& x) { return name(x[0]); }, true);                \
  else                                                                                                              \
    check_unary(#name, [](auto& x) { return name(x[0] / 4.0); }, [](auto& x) { return name(x[0] / 4.0); });
    TESSERA_UNARY_OPS(TESSERA_CHECK_UNARY)
#undef TESSERA_CHECK_UNARY
    check_unary("clamp", [](auto& x) { return clamp(x[0], -3, 4); }, [](auto& x) { return clamp(x[0], -3, 4); });
    check_unary("logical_not", [](auto& x) { return logical_not(gt(x[0], 0.0)); },
                [](auto& x) { return logical_not(gt(x[0], 0.0)); });
  });
}

TEST(ShardedOps, WhereAndMaskedFill) {
  for_each_world(kWorlds, [] {
    for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 3}, {5, 3}, {5, 3}}, {{5, 1}, {5, 3}, {3}}})
      check_op("where", Case{shapes, true, false, 600},
               [](auto& x) { return where(gt(x[0], 0.0), x[1], x[2]); },
               [](auto& x) { return where(gt(x[0], 0.0), x[1], x[2]); });
    check_op("where scalar", Case{{{5, 3}, {5, 3}}},
             [](auto& x) { return where(gt(x[0], 0.0), x[1], 7.0); }, [](auto& x) { return where(gt(x[0], 0.0), x[1], 7.0); });
    check_op("where scalar left", Case{{{5, 3}, {3}}},
             [](auto& x) { return where(gt(x[1], 0.0), -7.0, x[0]); }, [](auto& x) { return where(gt(x[1], 0.0), -7.0, x[0]); });
    check_op("masked_fill", Case{{{5, 3}, {3}}}, [](auto& x) { return masked_fill(x[0], gt(x[1], 0.0), 9.0); },
             [](auto& x) { return masked_fill(x[0], gt(x[1], 0.0), 9.0); });
  });
}

TEST(ShardedOps, Reductions) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : {Shape{5, 3}, Shape{4, 6}, Shape{2, 1}}) {
      for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {-1}}) {
        for (bool keep : {false, true}) {
          const Case c{{shape}};
          check_op("sum", c, [&](auto& x) { return sum(x[0], dims, keep); }, [&](auto& x) { return sum(x[0], dims, keep); });
          check_op("mean", c, [&](auto& x) { return mean(x[0], dims, keep); }, [&](auto& x) { return mean(x[0], dims, keep); });
          check_op("amax", c, [&](auto& x) { return amax(x[0], dims, keep); }, [&](auto& x) { return amax(x[0], dims, keep); });
          check_op("amin", c, [&](auto& x) { return amin(x[0], dims, keep); }, [&](auto& x) { return amin(x[0], dims, keep); });
          check_op("prod", c, [&](auto& x) { return prod(x[0] / 8.0, dims, keep); },
                   [&](auto& x) { return prod(x[0] / 8.0, dims, keep); });
          check_op("var", c, [&](auto& x) { return var(x[0], dims, 0, keep); }, [&](auto& x) { return var(x[0], dims, 0, keep); });
        }
      }
      for (std::optional<int64_t> dim : {std::optional<int64_t>{}, std::optional<int64_t>{0}, std::optional<int64_t>{1}}) {
        check_op("argmax", Case{{shape}}, [&](auto& x) { return argmax(x[0], dim); }, [&](auto& x) { return argmax(x[0], dim); });
        check_op("argmin", Case{{shape}}, [&](auto& x) { return argmin(x[0], dim, true); },
                 [&](auto& x) { return argmin(x[0], dim, true); });
      }
    }
  });
}

TEST(ShardedOps, MatmulBmmLinear) {
  for_each_world(kWorlds, [] {
    for (const auto& shapes : std::vector<std::vector<Shape>>{{{5, 3}, {3, 4}}, {{4, 6}, {6, 2}}, {{3}, {3, 4}},
                                                               {{5, 3}, {3}}, {{4}, {4}}, {{2, 5, 3}, {3, 4}}})
      check_op("matmul", Case{shapes, true, false, 1024}, [](auto& x) { return matmul(x[0], x[1]); },
               [](auto& x) { return matmul(x[0], x[1]); });
    check_op("matmul batch broadcast", Case{{{2, 1, 3, 2}, {3, 2, 4}}, true, false, 512},
             [](auto& x) { return matmul(x[0], x[1]); }, [](auto& x) { return matmul(x[0], x[1]); });
    check_op("bmm", Case{{{3, 5, 2}, {3, 2, 4}}, true, false, 1024}, [](auto& x) { return bmm(x[0], x[1]); },
             [](auto& x) { return bmm(x[0], x[1]); });
    check_op("linear", Case{{{5, 3}, {4, 3}, {4}}, true, false, 1024},
             [](auto& x) { return linear(x[0], x[1], x[2]); }, [](auto& x) { return linear(x[0], x[1], x[2]); });
    check_op("linear no bias", Case{{{2, 5, 3}, {4, 3}}, true, false, 1024},
             [](auto& x) { return linear(x[0], x[1]); }, [](auto& x) { return linear(x[0], x[1]); });
  });
}

TEST(ShardedOps, SoftmaxAndNorms) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : {Shape{5, 3}, Shape{4, 6}}) {
      for (int64_t dim : {0, 1, -1}) {
        check_op("softmax", Case{{shape}}, [&](auto& x) { return softmax(x[0] / 4.0, dim); },
                 [&](auto& x) { return softmax(x[0] / 4.0, dim); });
        check_op("log_softmax", Case{{shape}}, [&](auto& x) { return log_softmax(x[0] / 4.0, dim); },
                 [&](auto& x) { return log_softmax(x[0] / 4.0, dim); });
      }
    }
    check_op("layer_norm", Case{{{5, 3}, {3}, {3}}, true, false, 512},
             [](auto& x) { return layer_norm(x[0], {3}, x[1], x[2]); },
             [](auto& x) { return layer_norm(x[0], {3}, x[1], x[2]); });
    check_op("layer_norm 2 dims", Case{{{2, 3, 4}}}, [](auto& x) { return layer_norm(x[0], {3, 4}); },
             [](auto& x) { return layer_norm(x[0], {3, 4}); });
    check_op("rms_norm", Case{{{5, 4}, {4}}}, [](auto& x) { return rms_norm(x[0], {4}, x[1]); },
             [](auto& x) { return rms_norm(x[0], {4}, x[1]); });
  });
}

Tensor indices(const Shape& shape, int64_t count, std::optional<int64_t> ignored = std::nullopt) {
  std::vector<int64_t> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * 5 + 3) % count;
  if (ignored && !v.empty()) v[1 % v.size()] = *ignored;
  return from_vector(v, shape);
}

TEST(ShardedOps, EmbeddingVocabularyAndDimSharded) {
  for_each_world(kWorlds, [] {
    for (const Shape& weight : {Shape{7, 3}, Shape{12, 4}, Shape{2, 5}}) {
      for (const Shape& ids : {Shape{2, 5}, Shape{3}}) {
        check_op("embedding", Case{{weight, ids}, true, false, 4096, 1e-4, {Tensor(), indices(ids, weight[0])}},
                 [](auto& x) { return embedding(x[0], x[1]); }, [](auto& x) { return embedding(x[0], x[1]); });
      }
    }
  });
}

TEST(ShardedOps, CrossEntropyWithTheClassDimSharded) {
  for_each_world(kWorlds, [] {
    for (Reduction reduction : {Reduction::none, Reduction::sum, Reduction::mean}) {
      for (const auto& [logits, target] : std::vector<std::pair<Shape, Shape>>{{{6, 7}, {6}}, {{4, 5, 3}, {4, 3}}, {{5}, {}}}) {
        const int64_t classes = logits.size() == 1 ? logits[0] : logits[1];
        const Tensor t = indices(target, classes, target.numel() > 1 ? std::optional<int64_t>(-100) : std::nullopt);
        check_op("cross_entropy", Case{{logits, target}, true, false, 4096, 1e-4, {Tensor(), t}},
                 [&](auto& x) { return cross_entropy(x[0] / 4.0, x[1], -100, reduction); },
                 [&](auto& x) { return cross_entropy(x[0] / 4.0, x[1], -100, reduction); });
      }
    }
  });
}

TEST(ShardedOps, Views) {
  for_each_world(kWorlds, [] {
    const Case c6x4{{{6, 4}}}, c5x3{{{5, 3}}}, c2x3x4{{{2, 3, 4}}};
    for (const Shape& to : {Shape{24}, Shape{4, 6}, Shape{3, 2, 4}, Shape{6, 2, 2}, Shape{1, 24}, Shape{-1, 8}})
      check_op("reshape " + to.to_string(), c6x4, [&](auto& x) { return reshape(x[0], to); },
               [&](auto& x) { return reshape(x[0], to); });
    check_op("reshape uneven", c5x3, [](auto& x) { return reshape(x[0], {15}); }, [](auto& x) { return reshape(x[0], {15}); });
    check_op("reshape split", Case{{{12, 2}}}, [](auto& x) { return reshape(x[0], {3, 4, 2}); },
             [](auto& x) { return reshape(x[0], {3, 4, 2}); });
    check_op("view", c2x3x4, [](auto& x) { return view(x[0], {6, 4}); }, [](auto& x) { return x[0].view({6, 4}); });
    check_op("flatten", c2x3x4, [](auto& x) { return flatten(x[0], 1); }, [](auto& x) { return x[0].flatten(1); });
    check_op("unsqueeze", c5x3, [](auto& x) { return unsqueeze(x[0], 1); }, [](auto& x) { return x[0].unsqueeze(1); });
    check_op("squeeze", Case{{{5, 1, 3}}}, [](auto& x) { return squeeze(x[0]); }, [](auto& x) { return x[0].squeeze(); });
    check_op("squeeze dim", Case{{{1, 3}}}, [](auto& x) { return squeeze(x[0], 0); }, [](auto& x) { return x[0].squeeze(0); });
    check_op("transpose", c5x3, [](auto& x) { return transpose(x[0], 0, 1); }, [](auto& x) { return x[0].transpose(0, 1); });
    check_op("permute", c2x3x4, [](auto& x) { return permute(x[0], {2, 0, 1}); },
             [](auto& x) { return x[0].permute({2, 0, 1}); });
    check_op("expand", Case{{{5, 1}}}, [](auto& x) { return expand(x[0], {2, 5, 3}); },
             [](auto& x) { return x[0].expand({2, 5, 3}); });
  });
}

TEST(ShardedOps, NarrowSelectCatStackSplitChunk) {
  for_each_world(kWorlds, [] {
    const Case c{{{7, 5}}};
    for (int64_t dim : {0, 1})
      for (const auto& [start, length] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 3}, {2, 0}, {0, 5}}) {
        check_op("narrow", c, [&](auto& x) { return narrow(x[0], dim, start, length); },
                 [&](auto& x) { return x[0].narrow(dim, start, length); });
        check_op("narrow then add", c, [&](auto& x) { return narrow(x[0], dim, start, length) * 2; },
                 [&](auto& x) { return x[0].narrow(dim, start, length) * 2; });
      }
    for (int64_t dim : {0, 1, -1})
      check_op("select", c, [&](auto& x) { return select(x[0], dim, 3); }, [&](auto& x) { return x[0].select(dim, 3); });
    for (int64_t dim : {0, 1}) {
      check_op("cat", Case{{{4, 3}, {4, 3}}, true, false, 512}, [&](auto& x) { return cat({x[0], x[1]}, dim); },
               [&](auto& x) { return cat({x[0], x[1]}, dim); });
      check_op("stack", Case{{{4, 3}, {4, 3}}, true, false, 512}, [&](auto& x) { return stack({x[0], x[1]}, dim); },
               [&](auto& x) { return stack({x[0], x[1]}, dim); });
      check_op("split", c, [&](auto& x) { return split(x[0], 2, dim).back() + split(x[0], 2, dim).front(); },
               [&](auto& x) { return split(x[0], 2, dim).back() + split(x[0], 2, dim).front(); });
    }
    check_op("cat uneven", Case{{{4, 3}, {2, 3}}, true, false, 512}, [](auto& x) { return cat({x[0], x[1]}, 0); },
             [](auto& x) { return cat({x[0], x[1]}, 0); });
    check_op("chunk", c, [](auto& x) { return chunk(x[0], 3, 0)[1]; }, [](auto& x) { return chunk(x[0], 3, 0)[1]; });
    check_op("split sizes", c, [](auto& x) { return split(x[0], std::vector<int64_t>{1, 4}, 1)[1]; },
             [](auto& x) { return split(x[0], std::vector<int64_t>{1, 4}, 1)[1]; });
  });
}
