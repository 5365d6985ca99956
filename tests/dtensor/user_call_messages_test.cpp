// Errors of full_tensor, from_local and view name the user's call, not the internal one that
// found the problem (distribute_tensor, reshape).
#include <gtest/gtest.h>

#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

TEST(UserCallMessages, FullTensorAndFromLocalOnAnEmptyMesh) {
  for_each_world({2}, [] {
    EXPECT_TRUE(sharding_error([] { (void)DTensor().full_tensor(); },
                               {"[DTensor::full_tensor]", "empty mesh", "default-constructed DTensor or DeviceMesh"}));
    EXPECT_TRUE(sharding_error([] { (void)DTensor::from_local(ones({2}), DeviceMesh(), {}); },
                               {"[DTensor::from_local]", "the mesh is empty", "local [2]"}));
  });
}

TEST(UserCallMessages, ViewNamesView) {
  for_each_world({2, 4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = distribute_tensor(data({4, 3}, 1), mesh, {Shard{0}});
    EXPECT_TRUE(value_error([&] { (void)view(x, {5}); }, {"[view]", "shape [5] is invalid", "[4, 3]"}));
    EXPECT_TRUE(value_error([&] { (void)view(x, {-1, -1}); }, {"[view]", "only one dim can be -1"}));
    EXPECT_TRUE(sharding_error([] { (void)view(DTensor(), {2}); }, {"[view]", "undefined DTensor", "[2]"}));
    EXPECT_TRUE(value_error([&] { (void)reshape(x, {5}); }, {"[reshape]", "shape [5] is invalid"}));
    EXPECT_TRUE(same(view(x, {2, 6}).full_tensor(), data({4, 3}, 1).reshape({2, 6})));
  });
}

}  // namespace
