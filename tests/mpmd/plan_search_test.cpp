// parallelize's search as tables, without ranks: the candidate strategies and their names, each
// parameter's communication and memory under a strategy (closed forms of the ring collectives a
// plan takes), the FSDP units that fit a budget, and pipeline stage boundaries.
#include <gtest/gtest.h>

#include <tessera/mpmd/detail/plan_search.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::mpmd;
using namespace tessera::mpmd::detail;
using namespace tessera::testing;

namespace {

std::vector<std::string> names(const std::vector<ParallelStrategy>& strategies) {
  std::vector<std::string> out;
  for (const ParallelStrategy& s : strategies) out.push_back(s.to_string());
  return out;
}

ParallelStrategy ddp(std::vector<std::string> axes) {
  ParallelStrategy s;
  s.data.axes = std::move(axes);
  return s;
}

ParallelStrategy fsdp(std::string axis) {
  ParallelStrategy s = ddp({std::move(axis)});
  s.data.sharded = true;
  return s;
}

ParallelStrategy tp(std::string axis, bool sequence_parallel = false) {
  ParallelStrategy s;
  s.tensor = TensorParallel{std::move(axis), sequence_parallel};
  return s;
}

// A ring all-reduce receives 2 (n - 1) / n of the bytes on every rank, an all-gather or a
// reduce-scatter (n - 1) / n.
int64_t all_reduce_bytes(int64_t bytes, int64_t n) { return 2 * (n - 1) * bytes / n; }
int64_t gather_bytes(int64_t bytes, int64_t n) { return (n - 1) * bytes / n; }

}  // namespace

TEST(PlanSearch, CandidatesOnOneAndTwoAxes) {
  const MeshSpec line({4}, {"x"});
  EXPECT_EQ(names(candidate_strategies(line, true, true)),
            (std::vector<std::string>{"ddp(x)", "fsdp(x)", "tp(x)", "tp+sp(x)"}));
  EXPECT_EQ(names(candidate_strategies(line, true, false)), (std::vector<std::string>{"ddp(x)", "fsdp(x)", "tp(x)"}));
  EXPECT_EQ(names(candidate_strategies(line, false, false)), (std::vector<std::string>{"ddp(x)", "fsdp(x)"}));
  const MeshSpec grid({2, 4}, {"dp", "tp"});
  EXPECT_EQ(names(candidate_strategies(grid, true, true)),
            (std::vector<std::string>{"tp(dp) + ddp(tp)", "tp(dp) + fsdp(tp)", "tp+sp(dp) + ddp(tp)",
                                      "tp+sp(dp) + fsdp(tp)", "tp(tp) + ddp(dp)", "tp(tp) + fsdp(dp)",
                                      "tp+sp(tp) + ddp(dp)", "tp+sp(tp) + fsdp(dp)", "ddp(dp,tp)"}));
  EXPECT_EQ(names(candidate_strategies(grid, false, false)), (std::vector<std::string>{"ddp(dp,tp)"}));
  EXPECT_TRUE(sharding_error(
      [&] {
        candidate_strategies(MeshSpec({2, 2, 2}, {"a", "b", "c"}), true, true);
      },
      {"[parallelize]", "1 or 2 axes"}));
}

TEST(PlanSearch, ANameIsBuiltFromTheStrategyAlone) {
  ParallelStrategy mixed = tp("tp");
  mixed.data = {{"dp"}, true, {"blocks.0", "head"}, {"b0", "head"}};
  EXPECT_EQ(mixed.to_string(), "tp(tp) + fsdp(dp)[b0,head] + ddp(dp)");
  ParallelStrategy staged = fsdp("dp");
  staged.pipeline = PipelineStages{"pp", {{"tok", "pos", "blocks.0"}, {"norm", "head"}}, {"emb-b0", "head"}};
  EXPECT_EQ(staged.to_string(), "pp(pp)[emb-b0|head] + fsdp(dp)");
  ParallelStrategy sp = tp("x", true);
  sp.pipeline = PipelineStages{"pp", {{"tok"}, {"head"}}, {"emb", "head"}};
  EXPECT_EQ(sp.to_string(), "pp(pp)[emb|head] + tp+sp(x)");
  EXPECT_EQ(ddp({"a", "b"}).to_string(), "ddp(a,b)");
  EXPECT_NE(mixed, tp("tp"));
  EXPECT_EQ(PlanEstimate{staged}.name(), staged.to_string());
}

TEST(PlanSearch, WaysSplittingTheBatchAndTheCompute) {
  const MeshSpec grid({2, 4}, {"dp", "tp"});
  ParallelStrategy both = tp("tp");
  both.data.axes = {"dp"};
  EXPECT_EQ(data_parallel_ways(both, grid), 2);
  EXPECT_EQ(compute_ways(both, grid), 8);
  EXPECT_EQ(compute_ways(tp("tp"), grid), 4);
  EXPECT_EQ(data_parallel_ways(tp("tp"), grid), 1);
  EXPECT_EQ(compute_ways(ddp({"dp", "tp"}), grid), 8);
}

// One Linear "fc" (weight [8, 4], bias [8]) in unit 0 and a norm's weight [4] in unit 1, f32, on
// 4 ranks, a step of [4, 4] tokens.
class PriceUnits : public ::testing::Test {
 protected:
  using Owner = ParameterInfo::Owner;
  const MeshSpec spec{{4}, {"x"}};
  const CostModel cost = CostModel::threads();
  const std::vector<ParameterInfo> parameters{{"fc.weight", 0, Shape{8, 4}, DType::f32, Owner::linear},
                                              {"fc.bias", 0, Shape{8}, DType::f32, Owner::linear},
                                              {"norm.weight", 1, Shape{4}, DType::f32, Owner::norm}};
  static constexpr int64_t kTokens = 16, kF32 = 4;

  std::vector<UnitCost> price(const ParallelStrategy& s, const std::map<std::string, nn::ParallelStyle>& plan = {},
                              int64_t microbatches = 1) const {
    return price_units(s, parameters, 2, plan, spec, cost, StepShape{4, 4, microbatches});
  }
};

TEST_F(PriceUnits, DataParallelAllReducesEachGradientOnce) {
  for (int64_t microbatches : {1, 3}) {
    const std::vector<UnitCost> units = price(ddp({"x"}), {}, microbatches);
    ASSERT_EQ(units.size(), 2u);
    EXPECT_EQ(units[0].calls, 2);
    EXPECT_EQ(units[0].bytes, all_reduce_bytes(32 * kF32, 4) + all_reduce_bytes(8 * kF32, 4));
    EXPECT_EQ(units[0].state_bytes, 4 * (32 + 8) * kF32);  // parameter, gradient, two moments
    // The linear layer saves its input and output of a quarter of the tokens.
    EXPECT_EQ(units[0].activation_bytes, kTokens / 4 * (4 + 8) * kF32);
    EXPECT_EQ(units[0].gather_bytes, 0);
    EXPECT_EQ(units[1].calls, 1);
    EXPECT_EQ(units[1].bytes, all_reduce_bytes(4 * kF32, 4));
    EXPECT_EQ(units[1].activation_bytes, kTokens / 4 * 4 * kF32);
    EXPECT_GT(units[0].comm_us, units[1].comm_us);
  }
}

TEST_F(PriceUnits, FullyShardedGathersAndReduceScattersEveryMicrobatch) {
  const std::vector<UnitCost> one = price(fsdp("x"));
  EXPECT_EQ(one[0].calls, 4);
  EXPECT_EQ(one[0].bytes, 2 * gather_bytes(32 * kF32, 4) + 2 * gather_bytes(8 * kF32, 4));
  EXPECT_EQ(one[0].state_bytes, 4 * (8 + 2) * kF32);  // a quarter of each
  EXPECT_EQ(one[0].gather_bytes, 32 * kF32);          // the whole weight, materialised
  const std::vector<UnitCost> three = price(fsdp("x"), {}, 3);
  EXPECT_EQ(three[0].calls, 3 * one[0].calls);
  EXPECT_EQ(three[0].bytes, 3 * one[0].bytes);
  EXPECT_EQ(three[0].state_bytes, one[0].state_bytes);
}

TEST_F(PriceUnits, TensorParallelMovesActivations) {
  // Column-parallel: weight and bias on row shards; the input's gradient all-reduced.
  const std::vector<UnitCost> col = price(tp("x"), {{"fc", nn::ColwiseParallel{}}});
  EXPECT_EQ(col[0].calls, 1);
  EXPECT_EQ(col[0].bytes, all_reduce_bytes(kTokens * 4 * kF32, 4));
  EXPECT_EQ(col[0].state_bytes, 4 * (8 + 2) * kF32);
  EXPECT_EQ(col[0].activation_bytes, kTokens * (4 + 8 / 4) * kF32);
  EXPECT_EQ(col[1].calls, 0);  // the norm is replicated and sees every token
  // Row-parallel: the weight on column shards, the bias whole; the output all-reduced.
  const std::vector<UnitCost> row = price(tp("x"), {{"fc", nn::RowwiseParallel{}}});
  EXPECT_EQ(row[0].calls, 1);
  EXPECT_EQ(row[0].bytes, all_reduce_bytes(kTokens * 8 * kF32, 4));
  EXPECT_EQ(row[0].state_bytes, 4 * (8 + 8) * kF32);
  EXPECT_EQ(row[0].activation_bytes, kTokens * (4 / 4 + 8) * kF32);
  // Sequence parallel: the output reduce-scattered and gathered back; the norm on a quarter of the
  // sequence, its gradient all-reduced over the tp axis.
  const std::vector<UnitCost> sp = price(tp("x", true), {{"fc", nn::RowwiseParallel{}}});
  EXPECT_EQ(sp[0].calls, 2);
  EXPECT_EQ(sp[0].bytes, 2 * gather_bytes(kTokens * 8 * kF32, 4));
  EXPECT_EQ(sp[1].calls, 1);
  EXPECT_EQ(sp[1].bytes, all_reduce_bytes(4 * kF32, 4));
  EXPECT_EQ(sp[1].activation_bytes, kTokens * 4 / 4 * kF32);
}

TEST_F(PriceUnits, RefusesAParameterOutsideTheUnits) {
  std::vector<ParameterInfo> stray = parameters;
  stray[2].unit = 2;
  EXPECT_TRUE(value_error(
      [&] {
        price_units(ddp({"x"}), stray, 2, {}, spec, cost, StepShape{4, 4, 1});
      },
      {"[parallelize]", "norm.weight", "unit 2 of 2"}));
}

TEST(PlanSearch, MemoryOfAStageCountsItsHeldMicrobatchesAndOneGather) {
  const std::vector<UnitCost> units{{0, 0, 0, 100, 10, 40}, {0, 0, 0, 200, 20, 60}, {0, 0, 0, 50, 5, 0}};
  EXPECT_EQ(memory_of(units, 0, 3, 1), 350 + 35 + 60);
  EXPECT_EQ(memory_of(units, 0, 1, 4), 100 + 40 + 40);
  EXPECT_EQ(memory_of(units, 1, 3, 2), 250 + 50 + 60);
}

// Two units, each 100 bytes under DDP (communication 1) and 25 under FSDP (gathering 50,
// communication 4 and 2): the budget decides how many are sharded, the communication which.
TEST(PlanSearch, ShardedUnitsFitTheBudgetWithTheLeastCommunication) {
  const std::vector<UnitCost> ddp_units{{1, 1, 0, 100, 0, 0}, {1, 1, 0, 100, 0, 0}};
  const std::vector<UnitCost> fsdp_units{{4, 2, 0, 25, 0, 50}, {2, 2, 0, 25, 0, 50}};
  struct Case {
    int64_t budget;
    std::vector<int64_t> sharded;
  };
  for (const Case& c : {Case{1000, {1}}, Case{175, {1}}, Case{174, {0, 1}}, Case{100, {0, 1}}, Case{99, {}}})
    EXPECT_EQ(choose_sharded_units(ddp_units, fsdp_units, c.budget), c.sharded) << "budget " << c.budget;
  // A unit whose gather alone overflows the budget stays DDP.
  const std::vector<UnitCost> huge{{4, 2, 0, 25, 0, 50}, {2, 2, 0, 25, 0, 500}};
  EXPECT_EQ(choose_sharded_units(ddp_units, huge, 180), (std::vector<int64_t>{0}));
}

TEST(PlanSearch, StageBoundariesBalanceTheSlowestStageWithinTheBudget) {
  const auto pricing = [](std::vector<double> compute, std::vector<int64_t> state, int64_t stages) {
    PipelinePricing p;
    for (int64_t s : state) p.units.push_back(UnitCost{0, 0, 0, s, 0, 0});
    p.compute_us = std::move(compute);
    p.stages = stages;
    p.microbatches = 4;
    return p;
  };
  struct Case {
    std::vector<double> compute;
    std::vector<int64_t> state;
    int64_t stages, budget;
    std::vector<int64_t> bounds;
  };
  const std::vector<Case> cases{
      {{1, 1, 1, 1}, {5, 5, 5, 5}, 2, 0, {0, 2, 4}},
      {{1, 1, 1, 3}, {5, 5, 5, 5}, 2, 0, {0, 3, 4}},
      {{1, 1, 1, 3}, {30, 5, 5, 5}, 2, 36, {0, 2, 4}},  // three units would hold 40
      {{1, 1, 1, 3}, {30, 5, 5, 5}, 2, 29, {}},         // unit 0 alone holds 30
      {{1, 2, 3, 4, 5, 6}, {1, 1, 1, 1, 1, 1}, 3, 0, {0, 3, 5, 6}},
      {{1, 1}, {1, 1}, 3, 0, {}},  // more stages than units
      {{7}, {1}, 1, 0, {0, 1}},
  };
  for (const Case& c : cases)
    EXPECT_EQ(choose_boundaries(pricing(c.compute, c.state, c.stages), c.budget), c.bounds)
        << c.stages << " stages, budget " << c.budget;
  // A boundary costs a stage its receive: of five equal units the middle stage, which receives
  // twice (the activation and the gradient), takes one.
  PipelinePricing p = pricing({1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}, 3);
  EXPECT_EQ(p.boundaries(0), 1);
  EXPECT_EQ(p.boundaries(1), 2);
  p.boundary_us = 0.75;
  EXPECT_EQ(choose_boundaries(p, 0), (std::vector<int64_t>{0, 2, 3, 5}));
}

TEST(PlanSearch, OneFOneBHoldsFewerMicrobatchesThanGPipe) {
  PipelinePricing p;
  p.units = {UnitCost{0, 0, 0, 0, 10, 0}, UnitCost{0, 0, 0, 0, 10, 0}};
  p.compute_us = {1, 1};
  p.stages = 2;
  p.microbatches = 4;
  EXPECT_EQ(p.held(0), 2);
  EXPECT_EQ(p.held(1), 1);
  EXPECT_EQ(p.memory_bytes(0, 0, 1), 20);
  p.schedule = Schedule::gpipe;
  EXPECT_EQ(p.held(0), 4);
  EXPECT_EQ(p.held(1), 4);
  EXPECT_EQ(choose_boundaries(p, 39), (std::vector<int64_t>{}));
  EXPECT_EQ(choose_boundaries(p, 40), (std::vector<int64_t>{0, 1, 2}));
}
