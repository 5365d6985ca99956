// The layout codec every layer sends layouts with (a stage boundary's header, the controller's
// replies and commands): a layout survives the round trip on the receiver's mesh, orders and
// explicit sizes included; a truncated message and a layout for another mesh are named errors.
#include <gtest/gtest.h>

#include <tessera/sharding/layout_words.hpp>

#include "layout_sweep.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

TEST(LayoutWords, EveryLayoutOfTheSweepsSurvivesTheRoundTrip) {
  const std::vector<Placement> choices{Replicate{}, Shard{0}, Shard{1}, Partial{}, Partial{ReduceOp::max}};
  int64_t layouts = 0;
  for (const MeshSpec& mesh : {MeshSpec(Shape{3}, {"x"}), MeshSpec(Shape{2, 3}, {"a", "b"}),
                               MeshSpec(Shape{2, 1, 2}, {"a", "b", "c"})})
    for (const Shape& shape : {Shape{12, 6}, Shape{7, 5}, Shape{0, 3}}) {
      // The receiver's mesh: another with the same shape (other ranks, as a pipeline stage's).
      std::vector<int> ranks;
      for (int r : mesh.ranks()) ranks.push_back(r + 100);
      const MeshSpec there(mesh.shape(), mesh.names(), ranks);
      for (const Layout& layout : layout_sweep(mesh, shape, choices)) {
        SCOPED_TRACE(layout.to_string());
        const std::vector<int64_t> words = layout_words(layout);
        WordReader reader(words, "test");
        const Layout back = reader.layout(there);
        EXPECT_EQ(reader.left(), 0u);
        EXPECT_EQ(back, Layout(layout.global_shape(), layout.dtype(), there, layout.placements(), layout.shard_orders(),
                               layout.explicit_sizes()));
        ++layouts;
      }
    }
  EXPECT_GT(layouts, 500);
  // Placements alone, as the controller's commands carry them.
  std::vector<int64_t> words{7};
  const Placements placements{Shard{1}, Partial{ReduceOp::avg}, Replicate{}};
  append_placement_words(placements, words);
  WordReader reader(words, "test");
  EXPECT_EQ(reader.next(), 7);
  EXPECT_EQ(reader.placements(), placements);
}

TEST(LayoutWords, TruncatedMessagesAndOtherMeshesAreNamedErrors) {
  const MeshSpec mesh(Shape{2, 2}, {"dp", "tp"});
  const Layout layout(Shape{8, 4}, DType::f32, mesh, {Shard{0}, Shard{0}}, ShardOrder{{0, {1, 0}}});
  const std::vector<int64_t> words = layout_words(layout);
  for (size_t keep = 0; keep < words.size(); ++keep) {
    const std::vector<int64_t> cut(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(keep));
    EXPECT_TRUE(throws_with<CommError>([&] { WordReader(cut, "stage boundary").layout(mesh); },
                                       {"[stage boundary]", "truncated"}))
        << keep << " of " << words.size() << " words";
  }
  EXPECT_TRUE(throws_with<ShardingError>([&] { WordReader(words, "controller").layout(MeshSpec(Shape{4}, {"x"})); },
                                         {"[controller]", "2 mesh dims", "mesh[x=4]"}));
}
