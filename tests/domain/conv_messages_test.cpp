// A sharded convolution's or pooling's bad arguments are reported on the global shapes and
// placements the user passed, not on one rank's halo-widened block.
#include <gtest/gtest.h>

#include <tessera/domain/spatial.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

TEST(ConvMessages, NameTheGlobalShapesAndPlacements) {
  for_each_world({4}, [] {
    if (world_size() != 4) GTEST_SKIP() << "the mesh below is 2x2";
    const DeviceMesh mesh({2, 2}, {"a", "b"});
    const Placements whole{Replicate{}, Replicate{}};
    const DTensor x = distribute_tensor(ones({2, 3, 8, 8}), mesh, {Shard{2}, Shard{3}});
    const DTensor five_channels = distribute_tensor(ones({4, 5, 3, 3}), mesh, whole);
    const DTensor three_channels = distribute_tensor(ones({4, 3, 3, 3}), mesh, whole);
    const std::string x_text = "input [2, 3, 8, 8] f32 on mesh[a=2, b=2] as (S(2), S(3))";
    EXPECT_TRUE(value_error([&] { (void)conv2d(x, five_channels, std::nullopt, {1}, {1}); },
                            {"[conv2d]", x_text + " has 3 channels",
                             "weight [4, 5, 3, 3] f32 on mesh[a=2, b=2] as (R, R)",
                             "expected weight.shape[1] * groups = 5"}));
    const DTensor bias = distribute_tensor(ones({5}), mesh, whole);
    EXPECT_TRUE(value_error([&] { (void)conv2d(x, three_channels, bias, {1}, {1}); },
                            {"[conv2d]", "bias [5] f32", "expected [4]"}));
    EXPECT_TRUE(value_error([&] { (void)conv2d(x, three_channels, std::nullopt, {1}, {1}, {1}, 2); },
                            {"[conv2d]", "groups 2 does not divide the 3 channels of " + x_text}));
    EXPECT_TRUE(value_error([&] { (void)conv2d(x, three_channels, std::nullopt, {0}); },
                            {"[conv2d]", x_text, "stride 0", "expected kernel >= 1, stride >= 1"}));
    EXPECT_TRUE(value_error([&] { (void)max_pool2d(x, {2}, {0}); }, {"[max_pool2d]", x_text, "stride 0"}));
  });
}

}  // namespace
