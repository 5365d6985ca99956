// MultiMesh's and TaskMesh's errors name the user's call (MultiMesh::split, TaskMesh, ...), not
// the DeviceMesh calls underneath.
#include <gtest/gtest.h>

#include <tessera/mpmd/multimesh.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using namespace tessera::mpmd;

namespace {

TEST(MultiMeshMessages, NameTheUsersCall) {
  for_each_world({4}, [] {
    if (world_size() != 4) GTEST_SKIP() << "the meshes below cover 4 ranks";
    const MultiMesh mm({2, 2}, {"a", "b"});
    EXPECT_TRUE(sharding_error([&] { (void)mm.split("zz"); }, {"[MultiMesh::split]", "unknown axis 'zz'", "'a', 'b'"}));
    EXPECT_TRUE(sharding_error([&] { (void)mm.slice({{"zz", 0}}); }, {"[MultiMesh::slice]", "unknown axis 'zz'"}));
    EXPECT_TRUE(sharding_error([&] { (void)mm.slice({{"a", 2}}); }, {"[MultiMesh::slice]", "index 2 out of range"}));
    EXPECT_TRUE(sharding_error([] { MultiMesh({2, 3}, {"a", "b"}); }, {"[MultiMesh]", "holds 6 ranks but 4"}));
    EXPECT_TRUE(sharding_error([] { TaskMesh({0, 1, 2}, {2, 2}, {"a", "b"}); },
                               {"[TaskMesh]", "shape [2, 2] holds 4 ranks but 3 devices were given"}));
    EXPECT_TRUE(sharding_error([] { TaskMesh({0, 1}, {2}, {"a", "b"}); }, {"[TaskMesh]", "2 axis names"}));
    EXPECT_TRUE(sharding_error([] { TaskMesh({0, 1, 2, 3}, {2, 2}, {"a", "a"}); },
                               {"[TaskMesh]", "axis name 'a' appears twice"}));
    const TaskMesh pair({0, 1}, {2}, {"dp"});
    EXPECT_TRUE(sharding_error([&] { (void)pair.place({2}); }, {"[TaskMesh::place]", "holds 2 ranks but 1 devices"}));
    EXPECT_EQ(pair.place({2, 3}).mesh().spec().ranks(), (std::vector<int>{2, 3}));
  });
}

}  // namespace
