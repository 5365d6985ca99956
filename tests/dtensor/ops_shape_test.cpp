// The shape ops that copy on DTensor: for every input placement combination (R, S(d) for each dim,
// P(sum)) on the meshes of worlds 4 and 6, with uneven shapes (empty shards included), the
// result's full_tensor() equals the Tensor op on the unsharded input; tril/triu and ops on
// untouched sharded dims move nothing (CommDebugMode); errors match the Tensor ops'.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/dispatch.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/ops/ops.hpp>

#include "placement_sweep.hpp"
#include "sharded_inputs.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {


using DOp = std::function<DTensor(const DTensor&)>;
using LOp = std::function<Tensor(const Tensor&)>;

// Runs `dop` on every placement combination of one input of `shape` and compares with `lop` on
// the global. With `silent`, the op must not communicate (CommDebugMode counts nothing).
void check_op(const std::string& name, const Shape& shape, const DOp& dop, const LOp& lop, bool silent = false) {
  const Tensor global = data(shape, 1);
  const Tensor expected = lop(global);
  for (const auto& mesh_shape : sweep_meshes(world_size())) {
    const DeviceMesh mesh = sweep_mesh(mesh_shape);
    for (const Placements& placements : placement_combinations(global.ndim(), mesh.ndim(), true)) {
      const DTensor input = make_input(global, mesh, placements);
      int64_t calls = 0;
      DTensor out;
      {
        CommDebugMode mode;
        out = dop(input);
        calls = mode.total_count();
      }
      const Tensor got = out.full_tensor();
      const bool ok = got.shape() == expected.shape() && got.dtype() == expected.dtype() &&
                      allclose(got.to(DType::f64), expected.to(DType::f64), 1e-5, 1e-5, true);
      EXPECT_TRUE(ok) << name << " of " << shape << " on mesh " << mesh.to_string() << " with input "
                      << to_string(placements) << " -> " << out.layout().to_string() << " (rank " << rank()
                      << ")\ngot " << got << "\nexpected " << expected;
      if (silent) {
        EXPECT_EQ(calls, 0) << name << " of " << shape << " on mesh " << mesh.to_string() << " with input "
                            << to_string(placements) << " communicated";
        EXPECT_EQ(out.layout().placements(), placements) << name << " changed the placements";
      }
      if (!ok) return;  // one report per op and mesh
    }
  }
}

const std::vector<int> kWorlds = {4, 6};
const std::vector<Shape> kShapes = {{5, 3}, {2, 5, 3}};

}  // namespace

TEST(ShardedShapeOps, Flip) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : kShapes)
      for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {-1}, {0, 1}, {}})
        check_op("flip " + Shape(dims).to_string(), shape, [&](const DTensor& x) { return flip(x, dims); },
                 [&](const Tensor& x) { return flip(x, dims); });
  });
}

TEST(ShardedShapeOps, Roll) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : kShapes) {
      check_op("roll dim 0", shape, [](const DTensor& x) { return roll(x, {2}, {0}); },
               [](const Tensor& x) { return roll(x, {2}, {0}); });
      check_op("roll dims 0, -1", shape, [](const DTensor& x) { return roll(x, {-1, 4}, {0, -1}); },
               [](const Tensor& x) { return roll(x, {-1, 4}, {0, -1}); });
      check_op("roll flattened", shape, [](const DTensor& x) { return roll(x, {7}); },
               [](const Tensor& x) { return roll(x, {7}); });
    }
  });
}

TEST(ShardedShapeOps, TrilTriuMoveNothing) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : {Shape{5, 3}, Shape{2, 5, 3}, Shape{3, 7}})
      for (int64_t diagonal : {-2, 0, 1}) {
        check_op("tril " + std::to_string(diagonal), shape, [&](const DTensor& x) { return tril(x, diagonal); },
                 [&](const Tensor& x) { return tril(x, diagonal); }, true);
        check_op("triu " + std::to_string(diagonal), shape, [&](const DTensor& x) { return triu(x, diagonal); },
                 [&](const Tensor& x) { return triu(x, diagonal); }, true);
      }
  });
}

TEST(ShardedShapeOps, RepeatAndTile) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : kShapes) {
      const int64_t nd = shape.size();
      const std::vector<int64_t> once(static_cast<size_t>(nd), 1);
      std::vector<int64_t> lead = once, last = once;
      lead.insert(lead.begin(), 2);
      last.back() = 3;
      for (const auto& repeats : {once, lead, last}) {
        check_op("repeat " + Shape(repeats).to_string(), shape, [&](const DTensor& x) { return repeat(x, repeats); },
                 [&](const Tensor& x) { return repeat(x, repeats); });
      }
      check_op("tile [2]", shape, [](const DTensor& x) { return tile(x, {2}); }, [](const Tensor& x) { return tile(x, {2}); });
      check_op("tile [2, 1, 1, 1]", shape, [](const DTensor& x) { return tile(x, {2, 1, 1, 1}); },
               [](const Tensor& x) { return tile(x, {2, 1, 1, 1}); });
    }
  });
}

TEST(ShardedShapeOps, PadEveryMode) {
  for_each_world(kWorlds, [] {
    for (const Shape& shape : kShapes) {
      check_op("pad constant 0", shape, [](const DTensor& x) { return pad(x, {1, 2}); },
               [](const Tensor& x) { return pad(x, {1, 2}); });
      check_op("pad constant 2.5", shape, [](const DTensor& x) { return pad(x, {0, 1, 2, 0}, PadMode::constant, 2.5); },
               [](const Tensor& x) { return pad(x, {0, 1, 2, 0}, PadMode::constant, 2.5); });
      check_op("pad crop", shape, [](const DTensor& x) { return pad(x, {-1, 1, 0, -2}); },
               [](const Tensor& x) { return pad(x, {-1, 1, 0, -2}); });
      for (PadMode mode : {PadMode::reflect, PadMode::replicate, PadMode::circular}) {
        check_op(std::string("pad ") + to_string(mode), shape, [&](const DTensor& x) { return pad(x, {2, 1, 1, 2}, mode); },
                 [&](const Tensor& x) { return pad(x, {2, 1, 1, 2}, mode); });
        check_op(std::string("pad last dim ") + to_string(mode), shape,
                 [&](const DTensor& x) { return pad(x, {1, 2}, mode); }, [&](const Tensor& x) { return pad(x, {1, 2}, mode); });
      }
    }
  });
}

// The dims an op does not touch stay sharded without communication; the touched ones are gathered.
TEST(ShardedShapeOps, UntouchedShardedDimsStaySharded) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = make_input(data({8, 6}, 2), mesh, {Shard{0}});
    const auto silent = [&](const char* name, const std::function<DTensor()>& op) {
      CommDebugMode mode;
      const DTensor out = op();
      EXPECT_EQ(mode.total_count(), 0) << name;
      EXPECT_EQ(out.layout().placements(), (Placements{Shard{0}})) << name;
    };
    silent("flip", [&] { return flip(x, {1}); });
    silent("roll", [&] { return roll(x, {2}, {1}); });
    silent("pad", [&] { return pad(x, {1, 1}, PadMode::reflect); });
    silent("repeat", [&] { return repeat(x, {1, 3}); });
    CommDebugMode mode;
    const DTensor flipped = flip(x, {0});
    EXPECT_GT(mode.total_count(), 0);
    EXPECT_TRUE(allclose(flipped.full_tensor(), flip(data({8, 6}, 2), {0})));
  });
}

// roll and pad of a sharded dim keep it sharded and move only the rows that change piece: on n
// even pieces of 10 rows, each output row's source row (worked out here row by row) is counted
// as received when another piece holds it, and each rank sends and receives one message per
// peer at most.
TEST(ShardedShapeOps, RollAndPadOfAShardedDimMoveOnlyTheRowsThatChangePiece) {
  for_each_world({4}, [] {
    const int n = world_size();
    const int64_t length = 10 * n, row_bytes = 6 * 4;
    const DeviceMesh mesh({n}, {"x"});
    const Tensor full = data({length, 6}, 3);
    const DTensor x = make_input(full, mesh, {Shard{0}});
    // `pieces`: the output's piece sizes; `source(j)`: the input row output row j reads (-1: fill).
    const auto moved = [&](const std::string& name, const std::function<DTensor()>& op, const Tensor& expected,
                           const std::vector<int64_t>& pieces, const std::function<int64_t(int64_t)>& source) {
      std::vector<int64_t> rows_in(static_cast<size_t>(n), 0), rows_out(static_cast<size_t>(n), 0);
      int64_t j = 0;
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < pieces[static_cast<size_t>(p)]; ++i, ++j) {
          const int64_t row = source(j);
          const int holder = row < 0 ? p : static_cast<int>(row / 10);
          if (holder == p) continue;
          if (p == rank()) ++rows_in[static_cast<size_t>(holder)];
          if (holder == rank()) ++rows_out[static_cast<size_t>(p)];
        }
      int64_t in = 0, out_rows = 0, messages = 0;
      for (int q = 0; q < n; ++q) {
        in += rows_in[static_cast<size_t>(q)];
        out_rows += rows_out[static_cast<size_t>(q)];
        messages += (rows_in[static_cast<size_t>(q)] > 0) + (rows_out[static_cast<size_t>(q)] > 0);
      }
      CommDebugMode debug;
      const DTensor out = op();
      EXPECT_EQ(debug.total_bytes_received(), in * row_bytes) << name;
      EXPECT_EQ(debug.total_bytes_sent(), out_rows * row_bytes) << name;
      EXPECT_EQ(debug.total_count(), messages) << name;
      EXPECT_EQ(out.layout().placements(), (Placements{Shard{0}})) << name;
      EXPECT_EQ(out.layout().piece_sizes(0), pieces) << name << ": " << out.layout().to_string();
      EXPECT_TRUE(allclose(out.full_tensor(), expected, 0, 0)) << name;
    };
    const auto grown = [&](int64_t before, int64_t after) {
      std::vector<int64_t> pieces(static_cast<size_t>(n), 10);
      pieces.front() = std::max<int64_t>(pieces.front() + before, 0);
      pieces.back() += after;
      return pieces;
    };
    const auto wrap = [&](int64_t i) { return ((i % length) + length) % length; };
    for (int64_t shift : {3, -13, 27}) {
      moved("roll " + std::to_string(shift), [&] { return roll(x, {shift}, {0}); }, roll(full, {shift}, {0}),
            grown(0, 0), [&](int64_t j) { return wrap(j - shift); });
    }
    moved("pad constant", [&] { return pad(x, {0, 0, 2, 3}, PadMode::constant, 1.5); },
          pad(full, {0, 0, 2, 3}, PadMode::constant, 1.5), grown(2, 3),
          [&](int64_t j) { return j < 2 || j >= length + 2 ? -1 : j - 2; });
    moved("crop", [&] { return pad(x, {0, 0, -3, -1}); }, pad(full, {0, 0, -3, -1}), grown(-3, -1),
          [](int64_t j) { return j + 3; });
    moved("pad circular", [&] { return pad(x, {0, 0, 2, 3}, PadMode::circular); },
          pad(full, {0, 0, 2, 3}, PadMode::circular), grown(2, 3), [&](int64_t j) { return wrap(j - 2); });
    moved("pad reflect", [&] { return pad(x, {0, 0, 2, 3}, PadMode::reflect); }, pad(full, {0, 0, 2, 3}, PadMode::reflect),
          grown(2, 3), [&](int64_t j) {
            const int64_t i = j - 2;
            return i < 0 ? -i : i >= length ? 2 * (length - 1) - i : i;
          });
    moved("pad replicate", [&] { return pad(x, {0, 0, 2, 3}, PadMode::replicate); },
          pad(full, {0, 0, 2, 3}, PadMode::replicate), grown(2, 3),
          [&](int64_t j) { return std::clamp<int64_t>(j - 2, 0, length - 1); });
  });
}

TEST(ShardedShapeOps, ErrorsMatchTheTensorOps) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"x"});
    const DTensor x = make_input(data({3, 4}, 3), mesh, {Shard{0}});
    const DTensor v = make_input(data({4}, 3), mesh, {Shard{0}});
    EXPECT_TRUE(throws_with<ValueError>([&] { flip(x, {2}); }, {"[flip]", "dim 2 out of range", "[3, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { flip(x, {0, -2}); }, {"[flip]", "dim 0 appears more than once", "[3, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { roll(x, {1, 2}, {0}); }, {"[roll]", "shifts [1, 2] and dims [0] differ in length"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { roll(x, {1, 2}); }, {"[roll]", "shifts [1, 2] must hold one shift", "[3, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { roll(x, {1}, {-3}); }, {"[roll]", "dim -3 out of range", "[3, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { tril(v); }, {"[tril]", "at least 2 dims", "[4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { triu(v, 1); }, {"[triu]", "at least 2 dims", "[4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { repeat(x, {2}); }, {"[repeat]", "repeats [2] has fewer entries than the 2 dims"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { repeat(x, {1, -1}); }, {"[repeat]", "negative repeat -1", "[3, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { tile(x, {-2}); }, {"[tile]", "negative repeat -2", "[3, 4]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {1, 2, 3}); }, {"[pad]", "pads [1, 2, 3] have an odd count 3"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {1, 1, 1, 1, 1, 1}); }, {"[pad]", "pad 3 dims but shape [3, 4] has 2"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {-3, -2}); }, {"[pad]", "leave dim 1 of shape [3, 4] with the negative size -1"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {-1, 0}, PadMode::reflect); }, {"[pad]", "negative pads [-1, 0]", "only constant mode crops"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {0, 4}, PadMode::reflect); }, {"[pad]", "reflect pads (0, 4) of dim 1 of shape [3, 4] must be smaller than its size 4"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(x, {5, 0}, PadMode::circular); }, {"[pad]", "circular pads (5, 0) of dim 1", "at most its size 4"}));
    const DTensor empty = make_input(zeros({2, 0}), mesh, {Shard{0}});
    EXPECT_TRUE(throws_with<ValueError>([&] { pad(empty, {1, 0}, PadMode::replicate); }, {"[pad]", "replicate pads (1, 0) of the zero-size dim 1", "[2, 0]"}));
  });
}
