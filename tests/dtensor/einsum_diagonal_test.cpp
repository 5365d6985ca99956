// einsum's diagonals and "..." and index_add's alpha on DTensor: for placement combinations of the
// operands (R, S(d), P(sum)) on the meshes [4] and 2x2, with uneven shapes, the sharded result
// equals the Tensor op on the unsharded operands, and the leaves' gradients equal the Tensor
// gradients. A diagonal dim sharded on one side or both costs no more than the diagonal's size.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "placement_sweep.hpp"
#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Distinct f64 values, the same on every rank.
Tensor values(const Shape& shape, int seed) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = 0.25 * static_cast<double>((i * 7 + static_cast<size_t>(seed) * 5) % 23) - 2.5 + 0.001 * static_cast<double>(i);
  return from_vector(v, shape);
}

std::string describe(const std::vector<Placements>& combo) {
  std::string text;
  for (const auto& p : combo) {
    if (!text.empty()) text += ' ';
    text += to_string(p);
  }
  return text;
}

using DOp = std::function<DTensor(const std::vector<DTensor>&)>;
using LOp = std::function<Tensor(const std::vector<Tensor>&)>;

// Every `stride`-th placement combination of the operands (deterministic), on each sweep mesh.
void for_each_combination(const std::vector<Tensor>& globals, bool partial, size_t max_combos,
                          const std::function<void(const DeviceMesh&, const std::vector<Placements>&)>& body) {
  for (const auto& mesh_shape : sweep_meshes(world_size())) {
    const DeviceMesh mesh = sweep_mesh(mesh_shape);
    std::vector<std::vector<Placements>> options;
    size_t combos = 1;
    for (const Tensor& g : globals) {
      options.push_back(placement_combinations(g.ndim(), mesh.ndim(), partial && is_floating(g.dtype())));
      combos *= options.back().size();
    }
    const size_t limit = sample_limit(max_combos);
    const size_t stride = (combos + limit - 1) / limit;
    for (size_t index = 0; index < combos; index += stride) {
      std::vector<Placements> combo;
      for (size_t i = 0, rest = index; i < globals.size(); ++i) {
        combo.push_back(options[i][rest % options[i].size()]);
        rest /= options[i].size();
      }
      body(mesh, combo);
    }
  }
}

// op(sharded operands).full_tensor() == op(unsharded operands), for every sampled combination.
void check_values(const std::string& name, const std::vector<Tensor>& globals, const DOp& dop, const LOp& lop,
                  size_t max_combos = 60) {
  const Tensor expected = lop(globals);
  for_each_combination(globals, true, max_combos, [&](const DeviceMesh& mesh, const std::vector<Placements>& combo) {
    std::vector<DTensor> inputs;
    for (size_t i = 0; i < globals.size(); ++i) inputs.push_back(make_input(globals[i], mesh, combo[i]));
    const Tensor got = dop(inputs).full_tensor();
    ASSERT_TRUE(got.shape() == expected.shape() && allclose(got, expected, 1e-10, 1e-10))
        << name << " on " << mesh.to_string() << " with " << describe(combo) << "\ngot " << got << "\nexpected "
        << expected;
  });
}

// The leaves' gradients of sum(op(leaves) * w) equal the Tensor gradients (R and S(d) leaves).
void check_grads(const std::string& name, const std::vector<Tensor>& globals, const DOp& dop, const LOp& lop,
                 size_t max_combos = 30) {
  std::vector<Tensor> leaves;
  for (const Tensor& g : globals) {
    leaves.push_back(g.clone());
    if (is_floating(g.dtype())) leaves.back().requires_grad_();
  }
  const Tensor out = lop(leaves);
  const Tensor weights = add(values(out.shape(), 99), Scalar(3.0));
  sum(mul(out, weights)).backward();
  for_each_combination(globals, false, max_combos, [&](const DeviceMesh& mesh, const std::vector<Placements>& combo) {
    std::vector<DTensor> inputs;
    for (size_t i = 0; i < globals.size(); ++i) {
      inputs.push_back(make_input(globals[i], mesh, combo[i]));
      if (is_floating(globals[i].dtype())) inputs.back().requires_grad_();
    }
    const DTensor w = distribute_tensor(weights, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
    sum(mul(dop(inputs), w)).backward();
    for (size_t i = 0; i < globals.size(); ++i) {
      if (!is_floating(globals[i].dtype())) continue;
      const Tensor got = inputs[i].grad().full_tensor();
      ASSERT_TRUE(allclose(got, leaves[i].grad(), 1e-10, 1e-10))
          << name << " on " << mesh.to_string() << " with " << describe(combo) << ": gradient of operand " << i
          << "\ngot " << got << "\nexpected " << leaves[i].grad();
    }
  });
}

struct EinsumCase {
  std::string equation;
  std::vector<Shape> shapes;
};

// Uneven on 4 ranks (5 over 4 pieces), with a diagonal in one or two operands, and "..." broadcasting.
const std::vector<EinsumCase> kCases = {
    {"ii->i", {{5, 5}}},
    {"ii->", {{5, 5}}},
    {"bii->bi", {{3, 5, 5}}},
    {"ij,jj->i", {{3, 5}, {5, 5}}},
    {"bii,bij->bj", {{2, 5, 5}, {2, 5, 3}}},
    {"...ij,...jk->...ik", {{3, 1, 2, 5}, {4, 5, 3}}},
    {"...ii->...i", {{3, 5, 5}}},
    {"i...->...", {{5, 3, 2}}},
};

}  // namespace

TEST(EinsumDiagonalSharded, EqualsTheUnshardedEinsum) {
  for_each_world({4}, [] {
    for (const EinsumCase& c : kCases) {
      std::vector<Tensor> globals;
      for (size_t i = 0; i < c.shapes.size(); ++i) globals.push_back(values(c.shapes[i], static_cast<int>(i) + 1));
      check_values(c.equation, globals, [&](const std::vector<DTensor>& x) { return einsum(c.equation, x); },
                   [&](const std::vector<Tensor>& x) { return einsum(c.equation, x); });
    }
  });
}

TEST(EinsumDiagonalSharded, GradientsEqualTheUnshardedGradients) {
  for_each_world({4}, [] {
    for (const EinsumCase& c : kCases) {
      std::vector<Tensor> globals;
      for (size_t i = 0; i < c.shapes.size(); ++i) globals.push_back(values(c.shapes[i], static_cast<int>(i) + 1));
      check_grads(c.equation, globals, [&](const std::vector<DTensor>& x) { return einsum(c.equation, x); },
                  [&](const std::vector<Tensor>& x) { return einsum(c.equation, x); });
    }
  });
}

// The diagonal of a sharded [n, n] moves nothing: the identity it is contracted with is sliced
// where it lies; rows sharded give the diagonal sharded, columns sharded a Partial(sum) of it.
TEST(EinsumDiagonalSharded, ADiagonalOfAShardedMatrixMovesNothing) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor global = values({9, 9}, 1);  // uneven: pieces 3, 3, 3, 0
    for (int64_t dim : {0, 1}) {
      const DTensor x = distribute_tensor(global, mesh, {Shard{dim}});
      CommDebugMode mode;
      const DTensor diagonal = einsum("ii->i", {x});
      EXPECT_EQ(mode.total_count(), 0) << "S(" << dim << "): " << mode.to_string();
      EXPECT_EQ(diagonal.placements(), dim == 0 ? Placements{Shard{0}} : Placements{Partial{}});
      EXPECT_TRUE(allclose(diagonal.full_tensor(), einsum("ii->i", {global})));
    }
  });
}

TEST(IndexAddAlphaSharded, EqualsTheUnshardedIndexAdd) {
  for_each_world({4}, [] {
    const Tensor rows = from_vector<int64_t>({4, 0, 4, 2});
    for (double alpha : {1.0, 2.5, -0.5}) {
      const std::vector<Tensor> globals{values({5, 3}, 1), rows, values({4, 3}, 2)};
      const auto dop = [alpha](const std::vector<DTensor>& x) { return index_add(x[0], 0, x[1], x[2], alpha); };
      const auto lop = [alpha](const std::vector<Tensor>& x) { return index_add(x[0], 0, x[1], x[2], alpha); };
      check_values("index_add alpha " + std::to_string(alpha), globals, dop, lop, 80);
      check_grads("index_add alpha " + std::to_string(alpha), globals, dop, lop, 30);
    }
    // An integer input takes an integer alpha only, as in torch.
    const DeviceMesh mesh = line_mesh();
    const DTensor xi = distribute_tensor(arange(15).reshape({5, 3}), mesh, {Shard{1}});
    const DTensor ri = distribute_tensor(rows, mesh, {Replicate{}});
    const DTensor si = distribute_tensor(arange(12).reshape({4, 3}), mesh, {Shard{1}});
    EXPECT_TRUE(equal(index_add(xi, 0, ri, si, 3).full_tensor(),
                      index_add(arange(15).reshape({5, 3}), 0, rows, arange(12).reshape({4, 3}), 3)));
    EXPECT_TRUE(value_error([&] { (void)index_add(xi, 0, ri, si, 0.5); },
                            {"[index_add]", "alpha 0.5 is floating for an input of dtype i64"}));
  });
}
