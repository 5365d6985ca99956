// Dispatch behaviour beyond equivalence: cheap cases move nothing (CommDebugMode), the chosen
// output placements, the cache, user rules (register_sharding, call_sharded, local_map), and one
// test per documented error.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/dispatch.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/dtensor/sharded_op.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

DTensor dist(const Tensor& global, const DeviceMesh& mesh, Placements p) { return distribute_tensor(global, mesh, p); }

Tensor seq(const Shape& shape) { return arange(0, static_cast<double>(shape.numel()), 1).reshape(shape); }

// Runs f with CommDebugMode and returns its result; `collectives` gets the number of calls.
template <class F>
DTensor counted(F&& f, int64_t& collectives) {
  CommDebugMode mode;
  DTensor out = f();
  collectives = mode.total_count();
  return out;
}

const Placements S0{Shard{0}}, S1{Shard{1}}, R{Replicate{}}, P{Partial{}};

}  // namespace

TEST(ShardedDispatch, CheapCasesNeedNoCommunication) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor a = dist(seq({8, 6}), mesh, S0), b = dist(seq({6, 4}), mesh, R);
    const DTensor a1 = dist(seq({8, 6}), mesh, S1), b0 = dist(seq({6, 4}), mesh, S0), b1 = dist(seq({6, 4}), mesh, S1);
    const DTensor ar = dist(seq({8, 6}), mesh, R);
    int64_t n = -1;
    EXPECT_EQ(counted([&] { return matmul(a, b); }, n).placements(), S0);
    EXPECT_EQ(n, 0) << "mm S(0) x R";
    EXPECT_EQ(counted([&] { return matmul(ar, b1); }, n).placements(), S1);
    EXPECT_EQ(n, 0) << "mm R x S(1)";
    EXPECT_EQ(counted([&] { return matmul(a1, b0); }, n).placements(), P);
    EXPECT_EQ(n, 0) << "mm S(1) x S(0) -> P(sum)";
    EXPECT_EQ(counted([&] { return add(a, ar); }, n).placements(), S0);
    EXPECT_EQ(n, 0) << "add S(0) + R";
    EXPECT_EQ(counted([&] { return softmax(a, 1); }, n).placements(), S0);
    EXPECT_EQ(n, 0) << "softmax on the unsharded dim";
    EXPECT_EQ(counted([&] { return sum(a, {0}); }, n).placements(), P);
    EXPECT_EQ(n, 0) << "sum over the sharded dim";
    EXPECT_EQ(counted([&] { return amax(a, {0}); }, n).placements(), (Placements{Partial{ReduceOp::max}}));
    EXPECT_EQ(n, 0) << "amax over the sharded dim";
    EXPECT_EQ(counted([&] { return reshape(a, {48}); }, n).placements(), S0);
    EXPECT_EQ(n, 0) << "flatten a sharded leading dim";
    EXPECT_EQ(counted([&] { return transpose(a, 0, 1); }, n).placements(), S1);
    EXPECT_EQ(n, 0) << "transpose";
    // Linearity: P(sum) + P(sum) stays Partial; P(sum) * R too; neg keeps it.
    const DTensor p = matmul(a1, b0);
    EXPECT_EQ(counted([&] { return neg(add(p, p) * 2.0); }, n).placements(), P);
    EXPECT_EQ(n, 0) << "linear ops on P(sum)";
    // ...but a scalar added to a Partial reduces first, so it is added once.
    EXPECT_FALSE(is_partial(counted([&] { return p + 1.0; }, n).placements()[0]));
    EXPECT_EQ(n, 1) << "P(sum) + scalar reduces once (reduce_scatter or all_reduce)";
    EXPECT_TRUE(allclose((p + 1.0).full_tensor(), add(matmul(seq({8, 6}), seq({6, 4})), 1.0)));
    // A softmax over the sharded dim gathers it (one collective), the result is right.
    EXPECT_TRUE(allclose(counted([&] { return softmax(a, 0); }, n).full_tensor(), softmax(seq({8, 6}), 0)));
    EXPECT_GE(n, 1);
  });
}

TEST(ShardedDispatch, MeanIsPartialAvgOnlyWhenEven) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    // Rows that split evenly over this world (8 on 4 ranks, 6 on 3 or 6, ...) and one fewer.
    const int64_t even = world_size() * (8 / world_size() > 0 ? 8 / world_size() : 1);
    EXPECT_EQ(mean(dist(seq({even, 3}), mesh, S0), {0}).placements(), (Placements{Partial{ReduceOp::avg}}));
    const DTensor uneven = mean(dist(seq({even - 1, 3}), mesh, S0), {0});
    EXPECT_EQ(uneven.placements(), P);
    EXPECT_TRUE(allclose(uneven.full_tensor(), mean(seq({even - 1, 3}), {0})));
  });
}

TEST(ShardedDispatch, CacheHitsPlanNothing) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor a = dist(seq({8, 6}), mesh, S0), b = dist(seq({6, 4}), mesh, R);
    (void)matmul(a, b);
    (void)add(a, a);
    reset_dispatch_stats();
    for (int i = 0; i < 10; ++i) {
      (void)matmul(a, b);
      (void)add(a, a);
    }
    const DispatchStats s = dispatch_stats();
    EXPECT_EQ(s.hits, 20u);
    EXPECT_EQ(s.misses, 0u);
    EXPECT_EQ(s.planner_calls, 0u);
    // An output's layout is the cached one: chaining hits too.
    const DTensor c = add(a, a);
    reset_dispatch_stats();
    (void)add(c, c);
    (void)add(add(a, a), add(a, a));
    EXPECT_EQ(dispatch_stats().misses, 0u);
  });
}

TEST(ShardedDispatch, UserRulesAndLocalMap) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    // A user op in factor notation: row-wise scaled add, sharded freely on rows.
    register_sharding("scaled_add", "ab,ab->ab");
    const Tensor x = seq({8, 6}), y = seq({8, 6}) * 2.0;
    const auto kernel = [](const std::vector<Tensor>& l) { return l[0] + l[1] * 3.0; };
    int64_t n = -1;
    const DTensor xs = dist(x, mesh, S0), ys = dist(y, mesh, S0);
    const DTensor z = counted([&] { return call_sharded("scaled_add", {xs, ys}, kernel); }, n);
    EXPECT_EQ(z.placements(), S0);
    EXPECT_EQ(n, 0);
    EXPECT_TRUE(allclose(z.full_tensor(), x + y * 3.0));
    // Rows: only replicated inputs (the all-R row) -> the sharded input is gathered.
    register_sharding("whole_only", [](const std::vector<Layout>&) { return std::vector<ShardingRow>{}; });
    const DTensor w = call_sharded("whole_only", {dist(x, mesh, S1)}, [](const std::vector<Tensor>& l) { return l[0] * 2.0; });
    EXPECT_EQ(w.placements(), R);
    EXPECT_TRUE(allclose(w.full_tensor(), x * 2.0));
    // local_map: run local code on the shards with declared placements.
    const auto row_sums = local_map([](const std::vector<Tensor>& l) { return sum(l[0], {1}); }, {S0}, S0);
    EXPECT_TRUE(allclose(row_sums({dist(x, mesh, S0)}).full_tensor(), sum(x, {1})));
    const auto moved = local_map([](const std::vector<Tensor>& l) { return sum(l[0], {1}); }, {S0}, S0, true);
    EXPECT_TRUE(allclose(moved({dist(x, mesh, R)}).full_tensor(), sum(x, {1})));
  });
}

TEST(ShardedDispatch, Errors) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DeviceMesh other({world_size()}, {"y"});
    const DTensor a = dist(seq({8, 6}), mesh, S0);
    EXPECT_TRUE(throws_with<ShardingError>([&] { (void)call_sharded("no_such_op", {a}, [](auto& l) { return l[0]; }); },
                                           {"[no_such_op]", "no sharding rule", "register_sharding"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { (void)add(a, dist(seq({8, 6}), other, R)); },
                                           {"[add]", "different meshes"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { (void)add(a, seq({8, 6})); }, {"[add]", "plain Tensor", "[8, 6]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)add(a, dist(seq({5, 6}), mesh, S0)); }, {"do not broadcast", "[8, 6]", "[5, 6]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)matmul(a, dist(seq({5, 6}), mesh, R)); }, {"[matmul]", "inner dims"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)sum(a, {2}); }, {"[sum]", "out of range", "[8, 6]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)reshape(a, {7, 7}); }, {"[reshape]", "[8, 6]", "[7, 7]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)permute(a, {0, 0}); }, {"[permute]", "permutation"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)narrow(a, 0, 6, 3); }, {"[narrow]", "out of dim"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)cat(std::vector<DTensor>{}, 0); }, {"[cat]", "at least one"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)layer_norm(a, {5}); }, {"[layer_norm]", "normalized_shape"}));
    EXPECT_TRUE(throws_with<ValueError>(
        [&] { (void)cross_entropy(a, dist(from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 9}, {8}), mesh, S0)); },
        {"[cross_entropy]", "2 targets are out of [0, 6)"}));
    EXPECT_TRUE(throws_with<ValueError>([] { register_sharding("bad", "ab,bc"); }, {"[register_sharding]", "op 'bad'", "->"}));
    EXPECT_TRUE(throws_with<ShardingError>(
        [&] { (void)local_map([](const std::vector<Tensor>& l) { return l[0]; }, {R}, R)({a}); },
        {"[local_map]", "redistribute_inputs"}));
    EXPECT_TRUE(throws_with<ShardingError>(
        [&] { (void)local_map([](const std::vector<Tensor>& l) { return l[0]; }, {R, R}, R)({a}); },
        {"[local_map]", "1 inputs for 2"}));
    register_sharding("wrong_kernel", "ab->ab");
    EXPECT_TRUE(throws_with<ShardingError>(
        [&] { (void)call_sharded("wrong_kernel", {a}, [](const std::vector<Tensor>&) { return zeros({1, 7}); }); },
        {"[wrong_kernel]", "returned [1, 7]"}));  // a wrong shape on every rank, empty shards included
  });
}
