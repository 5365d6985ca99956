// PartitionSpec and its translation to and from Layout (pure: no ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include <tessera/spec/partition_spec.hpp>

#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using P = PartitionSpec;

TEST(PartitionSpec, PrintsAsPythonWritesIt) {
  EXPECT_EQ((P{"dp", std::nullopt, {"tp", "ep"}}).to_string(), "P('dp', None, ('tp', 'ep'))");
  EXPECT_EQ((P{0, std::nullopt}).to_string(), "P(0, None)");
  EXPECT_EQ((P{{1, "tp"}}).to_string(), "P((1, 'tp'))");
  EXPECT_EQ(P{}.to_string(), "P()");
  const std::string dp = "dp";
  EXPECT_EQ((P{dp, std::string_view("tp")}).to_string(), "P('dp', 'tp')");
}

// Python's spellings, opted into as Python imports them: P("data", None) with parentheses, a
// tuple entry in braces, P(); beside the file's own alias P.
TEST(PartitionSpec, PythonSpellingsReadAsInPython) {
  using namespace tessera::spec_names;
  EXPECT_EQ(spec_names::P("data", None).to_string(), "P('data', None)");
  EXPECT_EQ(spec_names::P("data", None), (PartitionSpec{"data", std::nullopt}));
  EXPECT_EQ(spec_names::P({"dp", "tp"}, None, "ep").to_string(), "P(('dp', 'tp'), None, 'ep')");
  EXPECT_EQ(spec_names::P(None, 1).to_string(), "P(None, 1)");
  EXPECT_EQ(P("x").to_string(), "P('x')");  // unqualified: the file's alias and spec_names' are one type
  EXPECT_EQ(spec_names::P().to_string(), "P()");
  EXPECT_EQ(PartitionSpec("a", "b", "c", "d", "e", "f", "g", "h").size(), 8);
  const MeshSpec mesh(Shape{2, 2}, {"dp", "tp"});
  EXPECT_EQ(layout_from_spec({4, 6}, DType::f32, mesh, PartitionSpec(None, "tp")).placements(),
            (Placements{Replicate{}, Shard{1}}));
}

TEST(PartitionSpec, TrailingUnshardedEntriesMayBeOmitted) {
  EXPECT_EQ((P{"dp"}), (P{"dp", std::nullopt, std::nullopt}));
  EXPECT_EQ(P{}, (P{std::nullopt}));
  EXPECT_NE((P{"dp"}), (P{std::nullopt, "dp"}));
  EXPECT_NE((P{{"dp", "tp"}}), (P{{"tp", "dp"}}));
  EXPECT_EQ((P{{"dp"}}), (P{"dp"}));  // a tuple of one axis is that axis
  EXPECT_TRUE((P{"dp"}).entry(5).is_unsharded());
}

TEST(PartitionSpec, ATupleSplitsMajorToMinor) {
  const MeshSpec mesh({2, 3}, {"dp", "tp"});
  // Piece index = dp_index * size(tp) + tp_index: 12 rows in 6 pieces of 2.
  const Layout l = layout_from_spec({12, 5}, DType::f32, mesh, P{{"dp", "tp"}});
  EXPECT_EQ(l.block({1, 0}).begin[0], 6);
  EXPECT_EQ(l.block({0, 2}).begin[0], 4);
  // Minor to major is another layout: tp splits first.
  const Layout r = layout_from_spec({12, 5}, DType::f32, mesh, P{{"tp", "dp"}});
  EXPECT_EQ(r.block({1, 0}).begin[0], 2);
  EXPECT_EQ(r.block({0, 2}).begin[0], 8);
  // Uneven: nested chunk semantics (chunk semantics nested in the shard order: docs/reference.md, tessera/sharding),
  // not a flat split.
  EXPECT_EQ(layout_from_spec({4}, DType::f32, mesh, P{{"dp", "tp"}}).piece_sizes(0),
            (std::vector<int64_t>{1, 1, 0, 1, 1, 0}));
  // Axis indices mean the same axes as names.
  EXPECT_EQ(layout_from_spec({12, 5}, DType::f32, mesh, P{{0, 1}}), l);
  EXPECT_EQ(layout_from_spec({12, 5}, DType::f32, mesh, P{std::nullopt, 1}),
            layout_from_spec({12, 5}, DType::f32, mesh, P{std::nullopt, "tp"}));
}

namespace {

// Every spec of a rank-`ndim` tensor on `mesh`: each mesh axis unused or on one tensor dim, and
// the axes on a dim in every order.
std::vector<P> every_spec(const MeshSpec& mesh, int64_t ndim) {
  std::vector<P> specs;
  std::vector<int64_t> owner(static_cast<size_t>(mesh.ndim()), -1);
  std::function<void(int64_t)> assign = [&](int64_t m) {
    if (m == mesh.ndim()) {
      // The axes of each dim, then every ordering of each dim's axes.
      std::vector<std::vector<int64_t>> by_dim(static_cast<size_t>(ndim));
      for (int64_t k = 0; k < mesh.ndim(); ++k)
        if (owner[static_cast<size_t>(k)] >= 0) by_dim[static_cast<size_t>(owner[static_cast<size_t>(k)])].push_back(k);
      std::function<void(int64_t)> order = [&](int64_t d) {
        if (d == ndim) {
          std::vector<SpecEntry> entries;
          for (const auto& axes : by_dim) {
            std::vector<AxisRef> refs;
            for (int64_t k : axes) refs.emplace_back(mesh.names()[static_cast<size_t>(k)]);
            entries.emplace_back(std::move(refs));
          }
          specs.emplace_back(std::move(entries));
          return;
        }
        auto& axes = by_dim[static_cast<size_t>(d)];
        std::sort(axes.begin(), axes.end());
        do order(d + 1);
        while (std::next_permutation(axes.begin(), axes.end()));
      };
      order(0);
      return;
    }
    for (int64_t d = -1; d < ndim; ++d) {
      owner[static_cast<size_t>(m)] = d;
      assign(m + 1);
    }
  };
  assign(0);
  return specs;
}

}  // namespace

TEST(PartitionSpec, RoundTripsThroughLayoutsOnMeshesOfOneToThreeDims) {
  const std::vector<MeshSpec> meshes{MeshSpec({3}, {"x"}), MeshSpec({2, 3}, {"dp", "tp"}),
                                     MeshSpec({2, 1, 3}, {"a", "b", "c"}), MeshSpec({2, 2, 2}, {"a", "b", "c"})};
  const std::vector<Shape> shapes{{7}, {6, 5}, {4, 0, 9}};
  int checked = 0;
  for (const MeshSpec& mesh : meshes)
    for (const Shape& shape : shapes)
      for (const P& spec : every_spec(mesh, shape.size())) {
        const Layout layout = layout_from_spec(shape, DType::f32, mesh, spec);
        EXPECT_EQ(spec_from_layout(layout), spec) << spec.to_string() << " on " << mesh.to_string();
        EXPECT_EQ(layout_from_spec(shape, DType::f32, mesh, spec_from_layout(layout)), layout) << layout.to_string();
        // Every dim the spec names is sharded by exactly those mesh dims, in that order.
        for (int64_t d = 0; d < shape.size(); ++d) {
          std::vector<int64_t> expected;
          for (const AxisRef& a : spec.entry(d).axes()) expected.push_back(a.resolve(mesh, "test", spec.to_string()));
          EXPECT_EQ(layout.shard_order(d), expected) << spec.to_string();
        }
        ++checked;
      }
  EXPECT_GT(checked, 300);
}

TEST(PartitionSpec, EveryLayoutWithoutPartialHasASpec) {
  // From the placements side: every assignment of Shard/Replicate with every shard order.
  const MeshSpec mesh({2, 3, 2}, {"a", "b", "c"});
  const Shape shape{5, 7};
  for (const P& spec : every_spec(mesh, 2)) {
    const Layout l = layout_from_spec(shape, DType::bf16, mesh, spec);
    const Layout rebuilt(shape, DType::bf16, mesh, l.placements(), [&] {
      ShardOrder order;
      for (int64_t d = 0; d < 2; ++d)
        if (!l.shard_order(d).empty()) order[d] = l.shard_order(d);
      return order;
    }());
    EXPECT_EQ(spec_from_layout(rebuilt), spec);
  }
}

TEST(PartitionSpec, ErrorsNameTheCallTheSpecAndTheMesh) {
  const MeshSpec mesh({2, 2}, {"dp", "tp"});
  EXPECT_TRUE(sharding_error([&] { layout_from_spec({4, 4}, DType::f32, mesh, P{"ep"}); },
                             {"[layout_from_spec]", "P('ep')", "'ep'", "mesh[dp=2, tp=2]", "'dp', 'tp'"}));
  EXPECT_TRUE(sharding_error([&] { layout_from_spec({4, 4}, DType::f32, mesh, P{2}); },
                             {"[layout_from_spec]", "P(2)", "mesh axis 2", "has 2 axes"}));
  EXPECT_TRUE(sharding_error([&] { layout_from_spec({4, 4}, DType::f32, mesh, P{"dp", "dp"}); },
                             {"[layout_from_spec]", "uses mesh axis 'dp' twice", "dims 0 and 1"}));
  EXPECT_TRUE(sharding_error([&] { layout_from_spec({4, 4}, DType::f32, mesh, P{{"tp", 1}}); },
                             {"[layout_from_spec]", "uses mesh axis 'tp' twice", "within dim 0"}));
  EXPECT_TRUE(sharding_error([&] { layout_from_spec({4}, DType::f32, mesh, P{"dp", "tp"}); },
                             {"[layout_from_spec]", "P('dp', 'tp') has 2 entries for a tensor of 1 dims"}));
  const Layout partial({4}, DType::f32, mesh, {Partial{}, Shard{0}});
  EXPECT_TRUE(sharding_error([&] { spec_from_layout(partial); },
                             {"[spec_from_layout]", partial.to_string(), "holds a Partial"}));
}

TEST(PartitionSpec, ExplicitSizesAreNotPartOfASpec) {
  const MeshSpec mesh({2}, {"x"});
  const Layout uneven({5, 2}, DType::f32, mesh, {Shard{0}}, {}, {{0, {4, 1}}});
  EXPECT_EQ(spec_from_layout(uneven), (P{"x"}));
  EXPECT_EQ(layout_from_spec({5, 2}, DType::f32, mesh, P{"x"}).piece_sizes(0), (std::vector<int64_t>{3, 2}));
}
