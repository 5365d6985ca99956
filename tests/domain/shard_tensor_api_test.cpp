// ShardTensor's API beside the halos: scatter_tensor from one rank, DTensor::offsets.
#include <gtest/gtest.h>

#include <tessera/domain/scatter.hpp>
#include <tessera/dtensor/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST(ScatterTensor, OnlyTheSourceHoldsTheData) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    const Tensor full = data({2 * n + 1, 3}, 4);
    for (int src = 0; src < n; ++src)
      for (const Placements& placements : {Placements{Shard{0}}, Placements{Shard{-1}}, Placements{Replicate{}}}) {
        const DTensor x = scatter_tensor(rank() == src ? full : Tensor(), src, mesh, placements);
        EXPECT_EQ(x.shape(), full.shape());
        EXPECT_TRUE(equal(x.to_local(), my_block(full, x))) << "from rank " << src << " as " << to_string(placements);
      }
    EXPECT_TRUE(sharding_error([&] { scatter_tensor(full, n, mesh, {Shard{0}}); }, {"[scatter_tensor]", "source rank"}));
    EXPECT_TRUE(sharding_error([&] { scatter_tensor(Tensor(), 0, mesh, {Shard{0}}); },
                               {"[scatter_tensor]", "the source rank 0 passed an undefined tensor"}));
    EXPECT_TRUE(sharding_error([&] { scatter_tensor(rank() == 0 ? full : Tensor(), 0, mesh, {Shard{2}}); },
                               {"[scatter_tensor]", "shard dim 2 is out of range"}));
  });
}

TEST(DTensorOffsets, StartOfEveryPieceAlongAMeshDim) {
  for_each_world({4}, [] {
    if (world_size() != 4) return;  // the expected offsets are for 4 ranks
    const DeviceMesh mesh({2, 2}, {"a", "b"});
    // Pieces of 3, 1, 4 and 0 rows on a 1-d mesh, as explicit sizes.
    const DeviceMesh line = line_mesh();
    const Layout uneven({8, 2}, DType::f32, line.spec(), {Shard{0}}, {}, {{0, {3, 1, 4, 0}}});
    const DTensor x = zeros({uneven.global_shape()}, line, {Replicate{}}).redistribute(line, uneven);
    EXPECT_EQ(x.offsets(0), (std::vector<int64_t>{0, 3, 4, 8}));
    // Nested: mesh dim b splits each of a's pieces; the calling rank's a-piece is the parent.
    const DTensor y = zeros({10, 3}, mesh, {Shard{0}, Shard{0}});
    const int64_t a = mesh.coordinate("a");
    EXPECT_EQ(y.offsets(1), a == 0 ? (std::vector<int64_t>{0, 3}) : (std::vector<int64_t>{5, 8}));
    EXPECT_EQ(y.offsets(0), mesh.coordinate("b") == 0 ? (std::vector<int64_t>{0, 5}) : (std::vector<int64_t>{3, 8}));
    const DTensor z = zeros({10, 3}, mesh, {Replicate{}, Shard{1}});
    EXPECT_EQ(z.offsets(1), (std::vector<int64_t>{0, 2}));
    EXPECT_TRUE(sharding_error([&] { z.offsets(0); }, {"[DTensor::offsets]", "mesh dim 0", "shards no tensor dim"}));
    EXPECT_TRUE(sharding_error([&] { z.offsets(2); }, {"[DTensor::offsets]", "out of range"}));
  });
}
