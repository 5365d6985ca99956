// shard_map and its collectives: each result against the same computation on full tensors, and
// each gradient against finite differences (gradcheck), on meshes of several sizes.
#include <gtest/gtest.h>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/ops/ops.hpp>
#include <tessera/spec/mark_sharding.hpp>
#include <tessera/spec/shard_map.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using P = PartitionSpec;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace {

DeviceMesh grid() {
  const int n = world_size();
  const int64_t dp = n > 2 && n % 2 == 0 ? 2 : 1;
  return DeviceMesh({dp, n / dp}, {"dp", "tp"});
}

// Smooth f64 values for finite differences.
Tensor smooth(const Shape& shape, double seed) { return sin(arange(shape.numel()).to(DType::f64) * 0.37 + seed).reshape(shape); }

DTensor replicated(const Tensor& x, const DeviceMesh& mesh) {
  return DTensor::from_local(x, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
}

// shard_map over full tensors: each input replicated onto the mesh first (differentiably), the
// result gathered back, so gradcheck can perturb the full inputs on every rank alike.
Tensor through(const Fn& fn, const DeviceMesh& mesh, const std::vector<P>& in_specs, const P& out_spec,
               const std::vector<Tensor>& inputs) {
  std::vector<DTensor> args;
  for (const Tensor& x : inputs) args.push_back(replicated(x, mesh));
  return shard_map(fn, mesh, in_specs, out_spec, args).full_tensor();
}

void expect_gradients(const Fn& fn, const DeviceMesh& mesh, const std::vector<P>& in_specs, const P& out_spec,
                      const std::vector<Tensor>& inputs, const std::string& what) {
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& xs) { return through(fn, mesh, in_specs, out_spec, xs); }, inputs);
  EXPECT_TRUE(result.ok) << what << ": " << result.message;
}

}  // namespace

TEST(ShardMap, RowShardedMatmulWithPsumEqualsMatmul) {
  for_each_world({2, 4, 6}, [] {
    const DeviceMesh mesh = grid();
    const int64_t tp = mesh.size("tp"), dp = mesh.size("dp");
    const Tensor x = smooth({2 * dp, 3 * tp}, 0.1), w = smooth({3 * tp, 5}, 0.7);
    const Fn fn = [](const std::vector<Tensor>& t) { return psum(matmul(t[0], t[1]), "tp"); };
    const DTensor y = shard_map(fn, mesh, {P{"dp", "tp"}, P{"tp"}}, P{"dp"},
                                {mark_sharding(x, mesh, P{}), mark_sharding(w, mesh, P{})});
    EXPECT_EQ(y.layout(), layout_from_spec({2 * dp, 5}, DType::f64, mesh.spec(), P{"dp"}));
    EXPECT_TRUE(allclose(clear_sharding(y), matmul(x, w), 1e-12, 1e-12));
    expect_gradients(fn, mesh, {P{"dp", "tp"}, P{"tp"}}, P{"dp"}, {x, w}, "psum of a row-sharded matmul");
    // A replicated output: every rank's copy is the result, and the gradient is not counted twice.
    expect_gradients(fn, mesh, {P{std::nullopt, "tp"}, P{"tp"}}, P{}, {x, w}, "psum, replicated output");
  });
}

TEST(ShardMap, ReductionsOverAnAxis) {
  for_each_world({2, 4, 6}, [] {
    const DeviceMesh mesh = grid();
    const int64_t n = mesh.size("tp");
    const Tensor x = smooth({2 * n, 3}, 0.3);
    const Tensor blocks = x.reshape({n, 2, 3});
    const auto run = [&](const Fn& fn) { return clear_sharding(shard_map(fn, mesh, {P{"tp"}}, P{}, {mark_sharding(x, mesh, P{})})); };
    EXPECT_TRUE(allclose(run([](const std::vector<Tensor>& t) { return psum(t[0], "tp"); }), sum(blocks, {0})));
    EXPECT_TRUE(allclose(run([](const std::vector<Tensor>& t) { return pmean(t[0], "tp"); }), mean(blocks, {0})));
    EXPECT_TRUE(equal(run([](const std::vector<Tensor>& t) { return pmax(t[0], "tp"); }), amax(blocks, {0})));
    for (const auto& [name, fn] : std::vector<std::pair<std::string, Fn>>{
             {"psum", [](const std::vector<Tensor>& t) { return psum(t[0] * t[0], "tp"); }},
             {"pmean", [](const std::vector<Tensor>& t) { return pmean(t[0], "tp"); }},
             {"pmax", [](const std::vector<Tensor>& t) { return pmax(t[0], "tp"); }}})
      expect_gradients(fn, mesh, {P{"tp"}}, P{}, {x}, name);
  });
}

TEST(ShardMap, AllGatherConcatenatesAndPsumScatterSplits) {
  for_each_world({2, 4, 6}, [] {
    const DeviceMesh mesh = grid();
    const int64_t n = mesh.size("tp");
    const Tensor x = smooth({2 * n, 3 * n}, 0.5);
    const Fn gather0 = [](const std::vector<Tensor>& t) { return all_gather(t[0], "tp", 0); };
    const Fn gather1 = [](const std::vector<Tensor>& t) { return all_gather(t[0], "tp", -1); };
    EXPECT_TRUE(equal(through(gather0, mesh, {P{"tp"}}, P{}, {x}), x));
    EXPECT_TRUE(equal(through(gather1, mesh, {P{std::nullopt, "tp"}}, P{}, {x}), x));
    // psum_scatter of a replicated x: every rank adds its copy, rank i keeps the i-th piece.
    const Fn scatter0 = [](const std::vector<Tensor>& t) { return psum_scatter(t[0], "tp", 0); };
    const Fn scatter1 = [](const std::vector<Tensor>& t) { return psum_scatter(t[0] * t[0], "tp", 1); };
    EXPECT_TRUE(allclose(through(scatter0, mesh, {P{}}, P{"tp"}, {x}), x * static_cast<double>(n)));
    EXPECT_TRUE(allclose(through(scatter1, mesh, {P{}}, P{std::nullopt, "tp"}, {x}), x * x * static_cast<double>(n)));
    expect_gradients(gather0, mesh, {P{"tp"}}, P{}, {x}, "all_gather");
    expect_gradients(gather1, mesh, {P{std::nullopt, "tp"}}, P{}, {x}, "all_gather dim -1");
    expect_gradients(scatter0, mesh, {P{}}, P{"tp"}, {x}, "psum_scatter");
    expect_gradients(scatter1, mesh, {P{}}, P{std::nullopt, "tp"}, {x}, "psum_scatter dim 1");
  });
}

TEST(ShardMap, AllToAllMovesTheShardedDim) {
  for_each_world({2, 4, 6}, [] {
    const DeviceMesh mesh = grid();
    const int64_t n = mesh.size("tp");
    const Tensor x = smooth({2 * n, 3 * n, 2}, 0.9);
    // Rows sharded in, columns sharded out: the classic reshard.
    const Fn rows_to_cols = [](const std::vector<Tensor>& t) { return all_to_all(t[0], "tp", 1, 0); };
    EXPECT_TRUE(equal(through(rows_to_cols, mesh, {P{"tp"}}, P{std::nullopt, "tp"}, {x}), x));
    const Fn cols_to_last = [](const std::vector<Tensor>& t) { return all_to_all(t[0] * 3.0, "tp", 2, 1); };
    const Tensor y = smooth({n, 3 * n, 2 * n}, 0.2);
    EXPECT_TRUE(allclose(through(cols_to_last, mesh, {P{std::nullopt, "tp"}}, P{std::nullopt, std::nullopt, "tp"}, {y}),
                         y * 3.0));
    expect_gradients(rows_to_cols, mesh, {P{"tp"}}, P{std::nullopt, "tp"}, {x}, "all_to_all");
    expect_gradients(cols_to_last, mesh, {P{std::nullopt, "tp"}}, P{std::nullopt, std::nullopt, "tp"}, {y},
                     "all_to_all 2 -> 1");
  });
}

TEST(ShardMap, PpermuteShiftsBlocksAndZerosTheUnreached) {
  for_each_world({2, 4, 6}, [] {
    const DeviceMesh mesh = grid();
    const int64_t n = mesh.size("tp");
    const Tensor x = smooth({2 * n, 3}, 0.4);
    std::vector<std::pair<int64_t, int64_t>> cycle, shift;
    for (int64_t i = 0; i < n; ++i) cycle.emplace_back(i, (i + 1) % n);
    for (int64_t i = 0; i + 1 < n; ++i) shift.emplace_back(i, i + 1);
    const Fn rotate = [cycle](const std::vector<Tensor>& t) { return ppermute(t[0], "tp", cycle); };
    const Fn push = [shift](const std::vector<Tensor>& t) { return ppermute(t[0], "tp", shift); };
    // Block i goes to rank i + 1: the rows roll by one block.
    const Tensor rolled = cat({x.narrow(0, 2 * n - 2, 2), x.narrow(0, 0, 2 * n - 2)}, 0);
    EXPECT_TRUE(equal(through(rotate, mesh, {P{"tp"}}, P{"tp"}, {x}), rolled));
    Tensor pushed = rolled.clone();
    pushed.narrow(0, 0, 2).fill_(0.0);  // rank 0 receives from nobody
    EXPECT_TRUE(equal(through(push, mesh, {P{"tp"}}, P{"tp"}, {x}), pushed));
    expect_gradients(rotate, mesh, {P{"tp"}}, P{"tp"}, {x}, "ppermute cycle");
    expect_gradients(push, mesh, {P{"tp"}}, P{"tp"}, {x}, "ppermute shift");
  });
}

TEST(ShardMap, AxisIndexAndAxesOfASecondMeshDim) {
  for_each_world({4, 6}, [] {
    const DeviceMesh mesh = grid();
    const Fn index = [](const std::vector<Tensor>& t) {
      return full({1, 1}, static_cast<double>(axis_index("dp") * 10 + axis_index("tp")), DType::f64) + t[0] * 0.0;
    };
    const Tensor got = through(index, mesh, {P{}}, P{"dp", "tp"}, {zeros({1, 1}, DType::f64)});
    for (int64_t d = 0; d < mesh.size("dp"); ++d)
      for (int64_t t = 0; t < mesh.size("tp"); ++t)
        EXPECT_EQ(got.to_vector<double>()[static_cast<size_t>(d * mesh.size("tp") + t)], static_cast<double>(d * 10 + t));
    // psum over dp of blocks sharded over both axes.
    const Tensor x = smooth({2 * mesh.size("dp"), mesh.size("tp")}, 0.6);
    const Fn over_dp = [](const std::vector<Tensor>& t) { return psum(t[0], "dp"); };
    const Tensor expected = sum(x.reshape({mesh.size("dp"), 2, mesh.size("tp")}), {0});
    EXPECT_TRUE(allclose(through(over_dp, mesh, {P{"dp", "tp"}}, P{std::nullopt, "tp"}, {x}), expected));
    expect_gradients(over_dp, mesh, {P{"dp", "tp"}}, P{std::nullopt, "tp"}, {x}, "psum over dp");
  });
}

TEST(ShardMap, UnevenBlocksMakeAnUnevenOutput) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = grid();
    const Tensor x = data({7, 3}, 1);  // 7 rows over tp = 2: pieces 4 and 3
    const DTensor y = shard_map([](const std::vector<Tensor>& t) { return t[0] * 2.0; }, mesh, {P{"tp"}}, P{"tp"},
                                {mark_sharding(x, mesh, P{})});
    EXPECT_TRUE(equal(clear_sharding(y), x * 2.0));
    // Blocks of any size: rank i along tp returns i + 1 rows.
    const DTensor z = shard_map(
        [](const std::vector<Tensor>&) { return full({axis_index("tp") + 1, 2}, 1.0); }, mesh, {}, P{"tp"}, {});
    EXPECT_EQ(z.shape(), (Shape{mesh.size("tp") * (mesh.size("tp") + 1) / 2, 2}));
  });
}

TEST(ShardMap, CheckVmaRefusesAClaimOfReplicationOverAVaryingAxis) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = grid();
    const DTensor x = mark_sharding(data({12, 12}, 1), mesh, P{});  // divisible by every axis size
    const auto identity = [](const std::vector<Tensor>& t) { return t[0]; };
    EXPECT_TRUE(sharding_error([&] { shard_map(identity, mesh, {P{"tp"}}, P{}, {x}); },
                               {"[shard_map]", "out_spec P() claims the output is replicated over axis 'tp'",
                                "psum it over 'tp'"}));
    EXPECT_TRUE(sharding_error(
        [&] { shard_map([](const std::vector<Tensor>& t) { return psum_scatter(t[0], "dp", 0); }, mesh, {P{}}, P{}, {x}); },
        {"[shard_map]", "replicated over axis 'dp'"}));
    // psum ends the variation over its axis only.
    EXPECT_TRUE(sharding_error(
        [&] { shard_map([](const std::vector<Tensor>& t) { return psum(t[0], "tp"); }, mesh, {P{"dp", "tp"}}, P{}, {x}); },
        {"[shard_map]", "replicated over axis 'dp'"}));
    EXPECT_NO_THROW(
        shard_map([](const std::vector<Tensor>& t) { return psum(t[0], "tp"); }, mesh, {P{"dp", "tp"}}, P{"dp"}, {x}));
    // Opting out, as JAX's check_vma=False.
    EXPECT_NO_THROW(shard_map(identity, mesh, {P{}}, P{}, {x}, {.check_vma = false}));
  });
}

TEST(ShardMap, ErrorsNameTheCall) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = grid();
    const Tensor t = data({12, 4}, 1);
    EXPECT_TRUE(sharding_error([&] { psum(t, "tp"); }, {"[psum]", "outside shard_map"}));
    EXPECT_TRUE(sharding_error([&] { axis_index("tp"); }, {"[axis_index]", "outside shard_map"}));
    const DTensor x = mark_sharding(t, mesh, P{});
    const auto in_region = [&](const std::function<void(const Tensor&)>& body) {
      shard_map([&](const std::vector<Tensor>& ts) { body(ts[0]); return ts[0]; }, mesh, {P{}}, P{}, {x});
    };
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { psum(l, "ep"); }); }, {"[psum]", "'ep'"}));
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { psum_scatter(l.narrow(0, 0, 1), "tp", 0); }); },
                               {"[psum_scatter]", "does not split into " + std::to_string(mesh.size("tp")) +
                                                      " equal pieces over axis 'tp'"}));
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { all_gather(l, "tp", 2); }); },
                               {"[all_gather]", "dim 2 is out of range"}));
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { ppermute(l, "tp", {{0, 1}, {0, 0}}); }); },
                               {"[ppermute]", "axis index 0 sends twice"}));
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { ppermute(l, "tp", {{0, 1}, {1, 1}}); }); },
                               {"[ppermute]", "axis index 1 receives twice"}));
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { all_to_all(l.narrow(1, 0, 1), "tp", 1, 0); }); },
                               {"[all_to_all]", "dim 1 of [12, 1] does not split into"}));
    EXPECT_TRUE(sharding_error([&] { in_region([](const Tensor& l) { ppermute(l, "tp", {{0, 9}}); }); },
                               {"[ppermute]", "out of range for axis 'tp' of size " + std::to_string(mesh.size("tp"))}));
    EXPECT_TRUE(sharding_error([&] { shard_map([](const std::vector<Tensor>& ts) { return ts[0]; }, mesh, {}, P{}, {x}); },
                               {"[shard_map]", "0 in_specs for 1 arguments"}));
    const DTensor elsewhere = mark_sharding(t, DeviceMesh({world_size()}, {"x"}), P{});
    EXPECT_TRUE(sharding_error(
        [&] { shard_map([](const std::vector<Tensor>& ts) { return ts[0]; }, mesh, {P{}}, P{}, {elsewhere}); },
        {"[shard_map]", "argument 0", "is not on " + mesh.to_string()}));
    // A mesh over part of the world: its ranks run fn, the others are told why they may not.
    const DeviceMesh half({world_size() / 2}, {"x"}, [] {
      std::vector<int> ranks;
      for (int r = 0; r < world_size() / 2; ++r) ranks.push_back(r);
      return ranks;
    }());
    const DTensor on_half = mark_sharding(t, half, P{});
    const auto run_on_half = [&] {
      return shard_map([](const std::vector<Tensor>& ts) { return psum(ts[0], "x"); }, half, {P{"x"}}, P{}, {on_half});
    };
    const int64_t n = half.size(), rows = 12 / n;
    if (half.is_member())
      EXPECT_TRUE(allclose(clear_sharding(run_on_half()), sum(t.reshape({n, rows, 4}), {0})));
    else
      EXPECT_TRUE(sharding_error(run_on_half, {"[shard_map]", "world rank " + std::to_string(rank()) + " is not in"}));
  });
}
