// visualize_sharding: golden tables for pure layouts (no ranks, STYLE.md §8b), the documented
// error, and the DTensor overload on real ranks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/debug/visualize_sharding.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/runtime/runtime.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

MeshSpec mesh_x(int64_t n) { return MeshSpec(Shape{n}, {"x"}); }
MeshSpec mesh_ab(int64_t a, int64_t b) { return MeshSpec(Shape{a, b}, {"a", "b"}); }

}  // namespace

TEST(VisualizeSharding, OneDimShardedRow) {
  EXPECT_EQ(visualize_sharding(Layout(Shape{8}, DType::f32, mesh_x(4), {Shard{0}})),
            "[8] f32 on mesh[x=4] as (S(0)) = P('x')\n"
            "+--------+--------+--------+--------+\n"
            "| [0:2]  | [2:4]  | [4:6]  | [6:8]  |\n"
            "| rank 0 | rank 1 | rank 2 | rank 3 |\n"
            "+--------+--------+--------+--------+");
}

TEST(VisualizeSharding, TwoDimGrid) {
  EXPECT_EQ(visualize_sharding(Layout(Shape{4, 6}, DType::f32, mesh_ab(2, 2), {Shard{0}, Shard{1}})),
            "[4, 6] f32 on mesh[a=2, b=2] as (S(0), S(1)) = P('a', 'b')\n"
            "+------------+------------+\n"
            "| [0:2, 0:3] | [0:2, 3:6] |\n"
            "| rank 0     | rank 1     |\n"
            "+------------+------------+\n"
            "| [2:4, 0:3] | [2:4, 3:6] |\n"
            "| rank 2     | rank 3     |\n"
            "+------------+------------+");
}

TEST(VisualizeSharding, ReplicasShareACell) {
  EXPECT_EQ(visualize_sharding(Layout(Shape{4, 6}, DType::f32, mesh_ab(2, 2), {Shard{0}, Replicate{}})),
            "[4, 6] f32 on mesh[a=2, b=2] as (S(0), R) = P('a', None)\n"
            "+------------+\n"
            "| [0:2, 0:6] |\n"
            "| rank 0, 1  |\n"
            "+------------+\n"
            "| [2:4, 0:6] |\n"
            "| rank 2, 3  |\n"
            "+------------+");
  // Sharding the columns over the outer mesh dim: replicas are mesh neighbours 0, 1 and 2, 3.
  EXPECT_EQ(visualize_sharding(Layout(Shape{4, 6}, DType::f32, mesh_ab(2, 2), {Replicate{}, Shard{1}})),
            "[4, 6] f32 on mesh[a=2, b=2] as (R, S(1)) = P(None, 'b')\n"
            "+------------+------------+\n"
            "| [0:4, 0:3] | [0:4, 3:6] |\n"
            "| rank 0, 2  | rank 1, 3  |\n"
            "+------------+------------+");
}

TEST(VisualizeSharding, UnevenShardsListEmptyRanks) {
  EXPECT_EQ(visualize_sharding(Layout(Shape{5}, DType::f32, mesh_x(4), {Shard{0}})),
            "[5] f32 on mesh[x=4] as (S(0)) = P('x')\n"
            "+--------+--------+--------+\n"
            "| [0:2]  | [2:4]  | [4:5]  |\n"
            "| rank 0 | rank 1 | rank 2 |\n"
            "+--------+--------+--------+\n"
            "empty: rank 3");
  // Every block empty: no table, only the list.
  EXPECT_EQ(visualize_sharding(Layout(Shape{0}, DType::f32, mesh_x(2), {Shard{0}})),
            "[0] f32 on mesh[x=2] as (S(0)) = P('x')\n"
            "empty: rank 0, 1");
}

TEST(VisualizeSharding, PartialLine) {
  EXPECT_EQ(visualize_sharding(Layout(Shape{4, 6}, DType::f32, mesh_ab(2, 2), {Shard{1}, Partial{}})),
            "[4, 6] f32 on mesh[a=2, b=2] as (S(1), P(sum))\n"
            "+------------+------------+\n"
            "| [0:4, 0:3] | [0:4, 3:6] |\n"
            "| rank 0, 1  | rank 2, 3  |\n"
            "+------------+------------+\n"
            "P(sum) over mesh dim 1 (b): ranks in a cell hold partial values");
}

TEST(VisualizeSharding, LongReplicaListsWrapAndShowWorldRanks) {
  EXPECT_EQ(visualize_sharding(Layout(Shape{3}, DType::f32, mesh_x(10), {Replicate{}})),
            "[3] f32 on mesh[x=10] as (R) = P(None)\n"
            "+------------------------------+\n"
            "| [0:3]                        |\n"
            "| rank 0, 1, 2, 3, 4, 5, 6, 7, |\n"
            "|      8, 9                    |\n"
            "+------------------------------+");
  // Cells name world ranks, ascending, whatever the mesh's order.
  EXPECT_EQ(visualize_sharding(Layout(Shape{4}, DType::f32, MeshSpec(Shape{2}, {"tp"}, {6, 4}), {Shard{0}})),
            "[4] f32 on mesh[tp=2] ranks [6, 4] as (S(0)) = P('tp')\n"
            "+--------+--------+\n"
            "| [0:2]  | [2:4]  |\n"
            "| rank 6 | rank 4 |\n"
            "+--------+--------+");
}

TEST(VisualizeSharding, OnlyOneAndTwoDims) {
  EXPECT_TRUE(sharding_error([] { (void)visualize_sharding(Layout(Shape{2, 2, 2}, DType::f32, mesh_x(2), {Shard{0}})); },
                             {"[visualize_sharding]", "3-d tensor [2, 2, 2] f32 on mesh[x=2] as (S(0))",
                              "only 1-d and 2-d tensors are supported"}));
  EXPECT_TRUE(sharding_error([] { (void)visualize_sharding(Layout(Shape{}, DType::f32, mesh_x(2), {Replicate{}})); },
                             {"[visualize_sharding]", "0-d tensor [] f32", "only 1-d and 2-d"}));
}

TEST(VisualizeSharding, DTensorForwardsToItsLayoutWithoutCommunicating) {
  for_each_world({1, 2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor t = zeros(Shape{8, 3}, mesh, {Shard{0}});
    CommDebugMode mode;
    const std::string text = visualize_sharding(t);
    EXPECT_EQ(mode.total_count(), 0) << mode.to_string();
    EXPECT_EQ(text, visualize_sharding(t.layout()));
    if (world_size() == 2) {
      EXPECT_EQ(text,
                "[8, 3] f32 on mesh[x=2] as (S(0)) = P('x', None)\n"
                "+------------+\n"
                "| [0:4, 0:3] |\n"
                "| rank 0     |\n"
                "+------------+\n"
                "| [4:8, 0:3] |\n"
                "| rank 1     |\n"
                "+------------+");
    }
  });
}
