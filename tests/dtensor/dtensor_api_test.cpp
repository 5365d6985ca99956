// The DTensor API on real ranks (threads worlds of several sizes, or the MPI world): from_local in
// all its forms, distribute_tensor, the factories (rand/randn bit for bit against the unsharded
// draw), Monarch's reduce and fetch_shard, redistribute's errors and moves between meshes.
// Globals are built deterministically and identically on every rank, so each rank can compute
// what its block and the full tensor must hold, and every comparison is exact.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// A 2-d factorisation of n: (n/2, 2) when n is even, else (1, n).
std::vector<int64_t> grid_2d(int n) { return n % 2 == 0 ? std::vector<int64_t>{n / 2, 2} : std::vector<int64_t>{1, n}; }

// The deterministic f32 global of `shape`: element i (row-major) is (3i + salt) % 17 - 8.
Tensor pattern(const Shape& shape, int64_t salt = 0) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((3 * static_cast<int64_t>(i) + salt) % 17 - 8);
  return from_vector(v, shape);
}

// scale * x + shift elementwise, as a new contiguous f32 tensor (exact for the small integers used).
Tensor affine(const Tensor& x, double scale, double shift) {
  std::vector<float> v = x.to_vector<float>();
  for (float& e : v) e = static_cast<float>(scale * e + shift);
  return from_vector(v, x.shape());
}


// Sum of v[0..i).
int64_t prefix(const std::vector<int64_t>& v, int64_t i) {
  return std::accumulate(v.begin(), v.begin() + i, int64_t{0});
}

// The global shape from_local infers by default: local shape times the mesh dims sharding each dim.
Shape even_global(Shape local, const std::vector<int64_t>& mesh_shape, const Placements& placements) {
  for (size_t m = 0; m < placements.size(); ++m)
    if (is_shard(placements[m])) local[std::get<Shard>(placements[m]).dim] *= mesh_shape[m];
  return local;
}

}  // namespace

// --- from_local -------------------------------------------------------------------------------

TEST(DTensorApiFromLocal, EvenSplitByDefault) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(g2, {"x", "y"});

    const Tensor g = pattern({2 * n, 3});
    const Tensor local = g.narrow(0, 2 * r, 2);
    const DTensor d = DTensor::from_local(local, line, {Shard{0}});
    EXPECT_EQ(d.shape(), (Shape{2 * n, 3}));
    EXPECT_EQ(d.dtype(), DType::f32);
    EXPECT_EQ(d.ndim(), 2);
    EXPECT_EQ(d.numel(), 6 * n);
    EXPECT_EQ(d.placements(), (Placements{Shard{0}}));
    EXPECT_EQ(d.device_mesh().spec(), line.spec());
    EXPECT_TRUE(d.to_local().is_same(local));  // no copy without run_check
    EXPECT_FALSE(d.layout().has_explicit_sizes(0));
    EXPECT_TRUE(same(d.full_tensor(), g));
    EXPECT_EQ(d.to_string(), "DTensor([" + std::to_string(2 * n) + ", 3] f32 on mesh[x=" + std::to_string(n) +
                                 "] as (S(0)))");

    const DTensor rep = DTensor::from_local(g, line, {Replicate{}});
    EXPECT_EQ(rep.shape(), g.shape());
    EXPECT_TRUE(same(rep.full_tensor(), g));

    for (const Placements& pl : {Placements{Shard{0}, Shard{1}}, Placements{Replicate{}, Shard{1}},
                                 Placements{Shard{1}, Replicate{}}, Placements{Shard{0}, Shard{0}},
                                 Placements{Shard{1}, Shard{0}}, Placements{Replicate{}, Replicate{}}}) {
      SCOPED_TRACE(to_string(pl));
      const Shape global = even_global({2, 3}, g2, pl);
      const Tensor whole = pattern(global, 5);
      const Layout layout(global, DType::f32, grid.spec(), pl);
      const Tensor mine = block_of(whole, layout.block(grid.coordinate()));  // a strided view for S(1)
      ASSERT_EQ(mine.shape(), (Shape{2, 3}));
      const DTensor t = DTensor::from_local(mine, grid, pl);
      EXPECT_EQ(t.shape(), global);
      EXPECT_EQ(t.layout(), layout);
      EXPECT_TRUE(same(t.full_tensor(), whole));
    }
  });
}

TEST(DTensorApiFromLocal, ExplicitShapeForUnevenChunks) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(g2, {"x", "y"});

    const Tensor g = pattern({5, 3});
    const std::vector<int64_t> pieces = chunk_sizes(5, {n});
    if (n == 4) {
      EXPECT_EQ(pieces, (std::vector<int64_t>{2, 2, 1, 0}));
    }
    const Tensor local = g.narrow(0, prefix(pieces, r), pieces[static_cast<size_t>(r)]);
    FromLocalOptions options;
    options.shape = Shape{5, 3};
    const DTensor d = DTensor::from_local(local, line, {Shard{0}}, options);
    EXPECT_EQ(d.shape(), (Shape{5, 3}));
    EXPECT_EQ(d.layout().piece_sizes(0), pieces);
    EXPECT_FALSE(d.layout().has_explicit_sizes(0));
    EXPECT_TRUE(same(d.to_local(), local));
    EXPECT_TRUE(same(d.full_tensor(), g));

    // The contiguous stride is accepted; any other is not (on every rank alike: no communication).
    options.stride = Strides{3, 1};
    EXPECT_TRUE(same(DTensor::from_local(local, line, {Shard{0}}, options).full_tensor(), g));
    options.stride = Strides{1, 5};
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(local, line, {Shard{0}}, options); },
                               {"[DTensor::from_local]", "stride [1, 5]", "[5, 3]"}));

    // 2-d: [5, 7] as (S(1), S(0)) on the grid.
    const Placements pl{Shard{1}, Shard{0}};
    const Tensor whole = pattern({5, 7}, 3);
    const Layout layout(Shape{5, 7}, DType::f32, grid.spec(), pl);
    FromLocalOptions options2;
    options2.shape = Shape{5, 7};
    const DTensor t = DTensor::from_local(block_of(whole, layout.block(grid.coordinate())), grid, pl, options2);
    EXPECT_EQ(t.layout(), layout);
    EXPECT_TRUE(same(t.full_tensor(), whole));
  });
}

TEST(DTensorApiFromLocal, InferSizesFromTheLocals) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(g2, {"x", "y"});
    FromLocalOptions options;
    options.infer_sizes = true;

    // Rank r holds r + 1 rows: pieces 1..n.
    std::vector<int64_t> rows(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), int64_t{1});
    const int64_t total = n * (n + 1) / 2;
    const Tensor g = pattern({total, 2}, 1);
    const Tensor local = g.narrow(0, prefix(rows, r), r + 1);
    const DTensor d = DTensor::from_local(local, line, {Shard{0}}, options);
    EXPECT_EQ(d.shape(), (Shape{total, 2}));
    // Sizes that happen to be the chunk sizes (1 rank: [1]) are not recorded as explicit.
    EXPECT_EQ(d.layout().has_explicit_sizes(0), rows != chunk_sizes(total, {n}));
    EXPECT_EQ(d.layout().piece_sizes(0), rows);
    EXPECT_TRUE(same(d.to_local(), local));
    EXPECT_TRUE(same(d.full_tensor(), g));

    // Nested (S(0), S(0)): piece p is the rank at row-major position p, so the same pieces.
    const DTensor nested = DTensor::from_local(local, grid, {Shard{0}, Shard{0}}, options);
    EXPECT_EQ(nested.shape(), (Shape{total, 2}));
    EXPECT_EQ(nested.layout().piece_sizes(0), rows);
    EXPECT_TRUE(same(nested.full_tensor(), g));

    // (S(0), S(1)): rank (i, j) holds i + 1 rows and j + 2 columns.
    const auto c = grid.coordinate();
    std::vector<int64_t> prow, pcol;
    for (int64_t i = 0; i < g2[0]; ++i) prow.push_back(i + 1);
    for (int64_t j = 0; j < g2[1]; ++j) pcol.push_back(j + 2);
    const Shape global{std::accumulate(prow.begin(), prow.end(), int64_t{0}),
                       std::accumulate(pcol.begin(), pcol.end(), int64_t{0})};
    const Tensor whole = pattern(global, 4);
    const Tensor mine = whole.narrow(0, prefix(prow, c[0]), c[0] + 1).narrow(1, prefix(pcol, c[1]), c[1] + 2);
    const DTensor t = DTensor::from_local(mine, grid, {Shard{0}, Shard{1}}, options);
    EXPECT_EQ(t.shape(), global);
    EXPECT_EQ(t.layout().piece_sizes(0), prow);
    EXPECT_EQ(t.layout().piece_sizes(1), pcol);
    EXPECT_TRUE(same(t.full_tensor(), whole));
  });
}

TEST(DTensorApiFromLocal, ExplicitSizes) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line({n}, {"x"});
    std::vector<int64_t> sizes;  // 1, 3, 0, 2: an empty piece on the third rank
    for (int i = 0; i < n; ++i) sizes.push_back((2 * i + 1) % 5);
    const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    const Tensor g = pattern({3, total}, 2);
    const Tensor local = g.narrow(1, prefix(sizes, r), sizes[static_cast<size_t>(r)]);
    FromLocalOptions options;
    options.sizes = {{1, sizes}};
    const DTensor d = DTensor::from_local(local, line, {Shard{1}}, options);
    EXPECT_EQ(d.shape(), (Shape{3, total}));
    EXPECT_EQ(d.layout().has_explicit_sizes(1), n > 1);  // [1] is the chunk size of 1 column
    EXPECT_EQ(d.layout().piece_sizes(1), sizes);
    EXPECT_TRUE(same(d.full_tensor(), g));
    // Replicating drops the sizes (they no longer apply): sharding again is chunk-split ...
    const DTensor rep = d.redistribute({Replicate{}});
    const DTensor chunked = rep.redistribute({Shard{1}});
    EXPECT_EQ(chunked.layout().piece_sizes(1), chunk_sizes(total, {n}));
    EXPECT_TRUE(same(chunked.to_local(), my_block(g, chunked)));
    // ... unless the layout with the sizes is asked for.
    const DTensor back = rep.redistribute(line, d.layout());
    EXPECT_EQ(back.layout().piece_sizes(1), sizes);
    EXPECT_TRUE(same(back.to_local(), local));
  });
}

TEST(DTensorApiFromLocal, PartialLocalsReduceToTheirSum) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(g2, {"x", "y"});
    const Tensor g = pattern({4, 3});

    const DTensor sum = DTensor::from_local(affine(g, r + 1, 0), line, {Partial{}});
    EXPECT_EQ(sum.shape(), (Shape{4, 3}));
    EXPECT_EQ(sum.placements(), (Placements{Partial{ReduceOp::sum}}));
    EXPECT_TRUE(same(sum.full_tensor(), affine(g, n * (n + 1) / 2, 0)));

    const DTensor max = DTensor::from_local(affine(g, 1, r), line, {Partial{ReduceOp::max}});
    EXPECT_TRUE(same(max.full_tensor(), affine(g, 1, n - 1)));
    const DTensor min = DTensor::from_local(affine(g, 1, r), line, {Partial{ReduceOp::min}});
    EXPECT_TRUE(same(min.full_tensor(), g));

    // (S(0), P(sum)): rank (i, j) holds its row block times j + 1.
    const Shape global{2 * g2[0], 3};
    const Tensor whole = pattern(global, 6);
    const Layout layout(global, DType::f32, grid.spec(), {Shard{0}, Partial{}});
    const auto c = grid.coordinate();
    const Tensor mine = affine(block_of(whole, layout.block(c)), c[1] + 1, 0);
    const DTensor t = DTensor::from_local(mine, grid, {Shard{0}, Partial{}});
    EXPECT_EQ(t.shape(), global);
    EXPECT_TRUE(same(t.full_tensor(), affine(whole, g2[1] * (g2[1] + 1) / 2, 0)));
  });
}

TEST(DTensorApiFromLocal, NegativeShardDimIsNormalised) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line({n}, {"x"});
    const Tensor g = pattern({2, 3 * n});
    const DTensor d = DTensor::from_local(g.narrow(1, 3 * r, 3), line, {Shard{-1}});
    EXPECT_EQ(d.placements(), (Placements{Shard{1}}));
    EXPECT_EQ(d.shape(), (Shape{2, 3 * n}));
    EXPECT_TRUE(same(d.full_tensor(), g));
    const DTensor rows = d.redistribute({Shard{-2}});
    EXPECT_EQ(rows.placements(), (Placements{Shard{0}}));
    EXPECT_TRUE(same(rows.to_local(), my_block(g, rows)));
  });
}

TEST(DTensorApiFromLocal, RunCheckTakesTheFirstReplica) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(g2, {"x", "y"});
    FromLocalOptions options;
    options.run_check = true;

    const Tensor g = pattern({3, 4});
    const Tensor mine = affine(g, 1, 100 * r);  // differs on every rank
    const DTensor d = DTensor::from_local(mine, line, {Replicate{}}, options);
    EXPECT_TRUE(same(d.to_local(), g));
    EXPECT_TRUE(same(d.full_tensor(), g));
    EXPECT_TRUE(same(mine, affine(g, 1, 100 * r)));  // the caller's tensor is untouched

    // (S(0), R): replicas along y take y = 0's data; the shards along x keep their own.
    const Shape global{2 * g2[0], 4};
    const Tensor whole = pattern(global, 9);
    const Layout layout(global, DType::f32, grid.spec(), {Shard{0}, Replicate{}});
    const auto c = grid.coordinate();
    const Tensor blk = block_of(whole, layout.block(c));
    const DTensor t = DTensor::from_local(affine(blk, 1, 50 * c[1]), grid, {Shard{0}, Replicate{}}, options);
    EXPECT_TRUE(same(t.to_local(), blk));
    EXPECT_TRUE(same(t.full_tensor(), whole));

    // (R, R): every rank ends with rank 0's data.
    const DTensor rr = DTensor::from_local(mine, grid, {Replicate{}, Replicate{}}, options);
    EXPECT_TRUE(same(rr.to_local(), g));
    EXPECT_TRUE(same(rr.full_tensor(), g));
  });
}

TEST(DTensorApiFromLocal, RunCheckRejectsDisagreeingRanksOnEveryRank) {
  for_each_world({2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    if (n < 2) GTEST_SKIP() << "needs 2 or more ranks";
    const DeviceMesh line({n}, {"x"});
    FromLocalOptions options;
    options.run_check = true;
    // Every rank compares every rank's layout with the first, so all of them throw.
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(pattern({r + 1, 2}), line, {Shard{0}}, options); },
                               {"[DTensor::from_local]", "run_check", std::string("[").append(std::to_string(n)).append(", 2]")}));
    const Tensor other_dtype = r == 0 ? pattern({2, 2}) : pattern({2, 2}).to(DType::f64);
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(other_dtype, line, {Replicate{}}, options); },
                               {"[DTensor::from_local]", "run_check", "f32", "f64"}));
    const Placements mixed = r == 0 ? Placements{Replicate{}} : Placements{Shard{0}};
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(pattern({2, 2}), line, mixed, options); },
                               {"[DTensor::from_local]", "run_check"}));
    // The same declared layout, but one rank's local is not its block: every rank throws (none
    // is left waiting in the replica broadcast) and names that rank.
    FromLocalOptions shaped = options;
    shaped.shape = Shape{5, 3};
    EXPECT_TRUE(sharding_error(
        [&] { (void)DTensor::from_local(pattern({r == 1 ? 4 : 5, 3}), line, {Replicate{}}, shaped); },
        {"[DTensor::from_local]", "run_check: rank 1's local shape [4, 3] is not its block [5, 3]"}));
    // infer_sizes checks every rank's local against the inferred layout, on every rank.
    FromLocalOptions infer;
    infer.infer_sizes = true;
    const Tensor dims = r == 0 ? pattern({2, 3}) : pattern({6});
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(dims, line, {Shard{0}}, infer); },
                               {"[DTensor::from_local]", "infer_sizes: rank"}));
    const Tensor width = pattern({2, r == 0 ? 3 : 4});
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(width, line, {Shard{0}}, infer); },
                               {"[DTensor::from_local]", "infer_sizes: rank", "is not its block"}));
    const DeviceMesh grid(grid_2d(n), {"x", "y"});  // replicas along y with different row counts
    EXPECT_TRUE(sharding_error(
        [&] { (void)DTensor::from_local(pattern({r + 1, 2}), grid, {Shard{0}, Replicate{}}, infer); },
        {"[DTensor::from_local]", "infer_sizes: rank", "is not its block"}));
    // Nothing was left half-done: a consistent call still works.
    const Tensor g = pattern({2, 2 * n});
    const DTensor ok = DTensor::from_local(g.narrow(1, 2 * r, 2), line, {Shard{1}}, options);
    EXPECT_TRUE(same(ok.full_tensor(), g));
  });
}

TEST(DTensorApiFromLocal, LocalThatIsNotItsBlock) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    // [4, 3] is no rank's piece of 5 rows on 1..4 ranks (5; 3, 2; 2, 2, 1; 2, 2, 1, 0).
    FromLocalOptions options;
    options.shape = Shape{5, 3};
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(pattern({4, 3}), line, {Shard{0}}, options); },
                               {"[DTensor::from_local]", "[4, 3]", "is not its block", "[5, 3] f32"}));
    // Explicit sizes of one row each, but two-row locals.
    FromLocalOptions sized;
    sized.sizes = {{0, std::vector<int64_t>(static_cast<size_t>(n), 1)}};
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(pattern({2, 3}), line, {Shard{0}}, sized); },
                               {"[DTensor::from_local]", "[2, 3]", "is not its block", "[1, 3]"}));
    // The public constructor checks the same.
    const Layout layout(Shape{5, 3}, DType::f32, line.spec(), {Replicate{}});
    EXPECT_TRUE(sharding_error([&] { (void)DTensor(pattern({4, 3}), line, layout); },
                               {"[DTensor]", "[4, 3]", "is not its block"}));
    EXPECT_TRUE(sharding_error([&] { (void)DTensor(pattern({5, 3}).to(DType::f64), line, layout); },
                               {"[DTensor]", "is not its block", "f32"}));
  });
}

TEST(DTensorApiFromLocal, PlacementErrors) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    const Tensor local = pattern({2, 3});
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(local, line, {Replicate{}, Replicate{}}); },
                               {"[DTensor::from_local]", "(R, R)", "2 placements", "mesh[x="}));
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(local, grid, {Shard{0}}); },
                               {"[DTensor::from_local]", "(S(0))", "1 placements", "mesh[x="}));
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(local, line, {Shard{2}}); }, {"S(2)"}));
    EXPECT_TRUE(sharding_error([&] { (void)DTensor::from_local(Tensor(), line, {Replicate{}}); },
                               {"[DTensor::from_local]", "undefined local"}));
  });
}

// --- distribute_tensor ------------------------------------------------------------------------

TEST(DTensorApiDistribute, EachRankGetsItsBlockOfRankZerosTensor) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    struct Case {
      const DeviceMesh* mesh;
      Placements placements;
    };
    const std::vector<Case> cases = {
        {&line, {Replicate{}}},
        {&line, {Shard{0}}},
        {&line, {Shard{1}}},
        {&line, {Shard{-1}}},
        {&grid, {Replicate{}, Replicate{}}},
        {&grid, {Shard{0}, Replicate{}}},
        {&grid, {Replicate{}, Shard{1}}},
        {&grid, {Shard{0}, Shard{1}}},
        {&grid, {Shard{1}, Shard{0}}},
        {&grid, {Shard{0}, Shard{0}}},
    };
    for (const Shape& shape : {Shape{7, 5}, Shape{4, 6}, Shape{2, 1}}) {
      const Tensor g0 = pattern(shape);
      const Tensor mine = r == 0 ? g0 : pattern(shape, 7 + r);  // only rank 0's data counts
      for (const Case& c : cases) {
        SCOPED_TRACE(shape.to_string() + " as " + to_string(c.placements) + " on " + c.mesh->to_string());
        const DTensor d = distribute_tensor(mine, *c.mesh, c.placements);
        EXPECT_EQ(d.shape(), shape);
        EXPECT_EQ(d.dtype(), DType::f32);
        EXPECT_EQ(d.layout(), Layout(shape, DType::f32, c.mesh->spec(), c.placements));
        EXPECT_TRUE(same(d.to_local(), my_block(g0, d)));
        EXPECT_TRUE(same(d.full_tensor(), g0));
      }
      EXPECT_TRUE(same(mine, r == 0 ? pattern(shape) : pattern(shape, 7 + r)));  // inputs untouched
    }
    // A 0-d tensor (only Replicate exists for it): rank 0's value reaches every rank.
    const Tensor s0 = full({}, 2.5), smine = r == 0 ? s0 : full({}, -1.0 - r);
    for (const DeviceMesh* mesh : {&line, &grid}) {
      const DTensor d = distribute_tensor(smine, *mesh, Placements(static_cast<size_t>(mesh->ndim()), Replicate{}));
      EXPECT_TRUE(same(d.to_local(), s0)) << mesh->to_string();
      EXPECT_TRUE(same(d.full_tensor(), s0)) << mesh->to_string();
    }
    // Other dtypes travel unchanged.
    for (DType dtype : {DType::bf16, DType::i64, DType::f64}) {
      const Tensor g0 = pattern({5, 3}).to(dtype);
      const Tensor mine = r == 0 ? g0 : pattern({5, 3}, 1).to(dtype);
      const DTensor d = distribute_tensor(mine, grid, {Shard{1}, Shard{0}});
      EXPECT_EQ(d.dtype(), dtype);
      EXPECT_TRUE(same(d.to_local(), my_block(g0, d))) << name(dtype);
      EXPECT_TRUE(same(d.full_tensor(), g0)) << name(dtype);
    }
  });
}

// Replicated: one broadcast from the source (PyTorch's mesh_broadcast) after one 16-byte
// all_reduce that checks every rank passed the same shape and dtype; sharded: the check, then
// the source's blocks.
TEST(DTensorApiDistribute, ReplicatedIsOneBroadcastAfterOneSmallCheck) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh line({world_size()}, {"x"});
    const Tensor g0 = pattern({6, 5});
    const Tensor mine = rank() == 0 ? g0.clone() : pattern({6, 5}, 3);
    CommDebugMode mode;
    const DTensor d = distribute_tensor(mine, line, {Replicate{}});
    EXPECT_EQ(mode.count(CollectiveKind::broadcast), 1) << mode.to_string();
    EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 1) << mode.to_string();
    EXPECT_EQ(mode.total_count(), 2) << mode.to_string();
    EXPECT_TRUE(same(d.to_local(), g0));
    // The local is the DTensor's own: writing the input afterwards changes nothing.
    Tensor written = mine;
    written.copy_(zeros({6, 5}));
    EXPECT_TRUE(same(d.to_local(), g0));
  });
}

TEST(DTensorApiDistribute, Errors) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    EXPECT_TRUE(sharding_error([&] { (void)distribute_tensor(pattern({4, 6}), line, {Partial{}}); },
                               {"[distribute_tensor]", "P(sum)", "Partial"}));
    EXPECT_TRUE(sharding_error([&] { (void)distribute_tensor(pattern({4, 6}), grid, {Shard{0}, Partial{ReduceOp::max}}); },
                               {"[distribute_tensor]", "P(max)"}));
    EXPECT_TRUE(sharding_error([&] { (void)distribute_tensor(Tensor(), line, {Replicate{}}); },
                               {"[distribute_tensor]", "undefined"}));
    if (n >= 2) {
      // Every rank sees every rank's layout, so all throw.
      const Tensor shaped = r == 0 ? pattern({4, 6}) : pattern({4, 7});
      EXPECT_TRUE(sharding_error([&] { (void)distribute_tensor(shaped, line, {Shard{0}}); },
                                 {"[distribute_tensor]", "[4, 6]", "[4, 7]"}));
      const Tensor typed = r == 0 ? pattern({4, 6}) : pattern({4, 6}).to(DType::f64);
      EXPECT_TRUE(sharding_error([&] { (void)distribute_tensor(typed, grid, {Shard{0}, Replicate{}}); },
                                 {"[distribute_tensor]", "f32", "f64"}));
      // Replicated (one broadcast): the same check, on every rank, before any data moves.
      EXPECT_TRUE(sharding_error([&] { (void)distribute_tensor(shaped, line, {Replicate{}}); },
                                 {"[distribute_tensor]", "[4, 6]", "[4, 7]"}));
    }
    // And the mesh still works afterwards.
    EXPECT_TRUE(same(distribute_tensor(pattern({4, 6}), line, {Shard{1}}).full_tensor(), pattern({4, 6})));
  });
}

// --- factories --------------------------------------------------------------------------------

TEST(DTensorApiFactories, ConstantFactoriesBuildTheirBlock) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    const Shape shape{7, 5};
    const std::vector<std::pair<const DeviceMesh*, Placements>> cases = {
        {&line, {Shard{0}}}, {&line, {Replicate{}}}, {&grid, {Shard{0}, Shard{1}}}, {&grid, {Replicate{}, Shard{0}}}};
    for (const auto& [mesh, pl] : cases) {
      for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
        SCOPED_TRACE(to_string(pl) + " " + std::string(name(dtype)));
        const Shape block = Layout(shape, dtype, mesh->spec(), pl).local_shape(mesh->coordinate());
        const DTensor z = zeros(shape, *mesh, pl, dtype);
        EXPECT_EQ(z.shape(), shape);
        EXPECT_EQ(z.placements(), pl);
        EXPECT_TRUE(same(z.to_local(), zeros(block, dtype)));
        EXPECT_TRUE(same(z.full_tensor(), zeros(shape, dtype)));
        const DTensor o = ones(shape, *mesh, pl, dtype);
        EXPECT_TRUE(same(o.to_local(), ones(block, dtype)));
        EXPECT_TRUE(same(o.full_tensor(), ones(shape, dtype)));
        const DTensor f = full(shape, -3.0, *mesh, pl, dtype);
        EXPECT_TRUE(same(f.to_local(), full(block, -3.0, dtype)));
        EXPECT_TRUE(same(f.full_tensor(), full(shape, -3.0, dtype)));
        const DTensor e = empty(shape, *mesh, pl, dtype);
        EXPECT_EQ(e.shape(), shape);
        EXPECT_EQ(e.dtype(), dtype);
        EXPECT_EQ(e.to_local().shape(), block);
        EXPECT_EQ(e.to_local().dtype(), dtype);
      }
    }
    // Negative shard dims are normalised; the default dtype is f32.
    const DTensor z = zeros(shape, line, {Shard{-1}});
    EXPECT_EQ(z.placements(), (Placements{Shard{1}}));
    EXPECT_EQ(z.dtype(), DType::f32);
    EXPECT_TRUE(same(z.full_tensor(), zeros(shape)));
  });
}

TEST(DTensorApiFactories, RandAndRandnEqualTheUnshardedDrawBitForBit) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    const std::vector<std::pair<const DeviceMesh*, Placements>> cases = {
        {&line, {Replicate{}}},          {&line, {Shard{0}}},
        {&line, {Shard{1}}},             {&grid, {Shard{0}, Shard{1}}},
        {&grid, {Shard{1}, Shard{0}}},   {&grid, {Shard{0}, Shard{0}}},
        {&grid, {Replicate{}, Shard{1}}}};
    for (const Shape& shape : {Shape{7, 5}, Shape{4, 6}, Shape{2, 3}}) {
      for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
        for (const auto& [mesh, pl] : cases) {
          SCOPED_TRACE(shape.to_string() + " " + std::string(name(dtype)) + " as " + to_string(pl) + " on " +
                       mesh->to_string());
          manual_seed(7);
          const DTensor u = rand(shape, *mesh, pl, dtype);
          const DTensor z = randn(shape, *mesh, pl, dtype);
          manual_seed(7);
          const Tensor ru = rand(shape, dtype);
          const Tensor rz = randn(shape, dtype);
          EXPECT_EQ(u.dtype(), dtype);
          EXPECT_TRUE(same(u.to_local(), my_block(ru, u)));
          EXPECT_TRUE(same(u.full_tensor(), ru));
          EXPECT_TRUE(same(z.to_local(), my_block(rz, z)));
          EXPECT_TRUE(same(z.full_tensor(), rz));
        }
      }
    }
    // Another seed gives other values.
    manual_seed(8);
    const DTensor other = rand({7, 5}, line, {Shard{0}});
    manual_seed(7);
    EXPECT_FALSE(equal(other.full_tensor(), rand({7, 5})));
  });
}

TEST(DTensorApiFactories, Errors) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    EXPECT_TRUE(sharding_error([&] { (void)rand({4, 4}, line, {Partial{}}); }, {"[rand]", "Partial"}));
    EXPECT_TRUE(sharding_error([&] { (void)randn({4, 4}, grid, {Shard{0}, Partial{}}); }, {"[randn]", "Partial"}));
    EXPECT_TRUE(sharding_error([&] { (void)zeros({4, 4}, line, {Partial{}}); }, {"[zeros]", "Partial"}));
    EXPECT_TRUE(sharding_error([&] { (void)ones({4, 4}, line, {Partial{ReduceOp::max}}); }, {"[ones]", "P(max)"}));
    EXPECT_TRUE(sharding_error([&] { (void)full({4, 4}, 1.0, line, {Partial{}}); }, {"[full]"}));
    EXPECT_TRUE(sharding_error([&] { (void)empty({4, 4}, line, {Partial{}}); }, {"[empty]"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)randn({4, 4}, line, {Shard{0}}, DType::i64); }, {}));
    EXPECT_TRUE(throws_with<ValueError>([&] { (void)rand({4, 4}, grid, {Shard{0}, Replicate{}}, DType::i32); }, {}));
    EXPECT_TRUE(sharding_error([&] { (void)zeros({4, 4}, line, {Replicate{}, Replicate{}}); }, {}));
  });
}

// --- Monarch reduce ---------------------------------------------------------------------------

TEST(DTensorApiReduce, OneDimReductionsTreatLocalsAsValues) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line({n}, {"x"});
    const Shape shape{4, 3};
    const double tri = n * (n + 1) / 2.0;
    const DTensor d = DTensor::from_local(full(shape, r + 1.0), line, {Replicate{}});

    const DTensor s = d.reduce({"x"}, MeshReduction::sum);
    EXPECT_EQ(s.placements(), (Placements{Replicate{}}));
    EXPECT_EQ(s.shape(), shape);
    EXPECT_TRUE(same(s.to_local(), full(shape, tri)));
    EXPECT_TRUE(same(d.reduce({"x"}).to_local(), full(shape, tri)));  // sum by default
    EXPECT_TRUE(same(d.reduce({"x"}, MeshReduction::avg).to_local(), full(shape, (n + 1) / 2.0)));
    EXPECT_TRUE(same(d.reduce({"x"}, MeshReduction::max).to_local(), full(shape, n)));
    EXPECT_TRUE(same(d.reduce({"x"}, MeshReduction::min).to_local(), full(shape, 1.0)));
    double factorial = 1;
    for (int i = 2; i <= n; ++i) factorial *= i;
    EXPECT_TRUE(same(d.reduce({"x"}, MeshReduction::product).to_local(), full(shape, factorial)));
    EXPECT_TRUE(same(d.to_local(), full(shape, r + 1.0)));  // the input is untouched

    // scatter: reduce_scatter along the local's dim 0 (chunk pieces of 4 rows, empty ones included).
    const DTensor sc = d.reduce({"x"}, MeshReduction::sum, true);
    EXPECT_EQ(sc.placements(), (Placements{Shard{0}}));
    EXPECT_EQ(sc.shape(), shape);
    const Shape piece{chunk_sizes(4, {n})[static_cast<size_t>(r)], 3};
    EXPECT_TRUE(same(sc.to_local(), full(piece, tri)));
    EXPECT_TRUE(same(sc.full_tensor(), full(shape, tri)));
    EXPECT_TRUE(same(d.reduce({"x"}, MeshReduction::max, true).full_tensor(), full(shape, n)));

    // Values that differ element by element.
    const Tensor g = pattern(shape);
    const DTensor v = DTensor::from_local(affine(g, r + 1, 0), line, {Replicate{}});
    EXPECT_TRUE(same(v.reduce({"x"}).to_local(), affine(g, tri, 0)));
    EXPECT_TRUE(same(v.reduce({"x"}, MeshReduction::sum, true).full_tensor(), affine(g, tri, 0)));

    // A Partial of the same op reduces as its values.
    const DTensor p = DTensor::from_local(affine(g, r + 1, 0), line, {Partial{}});
    EXPECT_TRUE(same(p.reduce({"x"}).to_local(), affine(g, tri, 0)));
    const DTensor pm = DTensor::from_local(affine(g, 1, r), line, {Partial{ReduceOp::max}});
    EXPECT_TRUE(same(pm.reduce({"x"}, MeshReduction::max).to_local(), affine(g, 1, n - 1)));
  });
}

TEST(DTensorApiReduce, StackGathersTheLocals) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line({n}, {"x"});
    const Shape shape{4, 3};
    const Tensor g = pattern(shape);
    auto local_of = [&](int i) { return affine(g, 1, 100 * i); };
    const DTensor d = DTensor::from_local(local_of(r), line, {Replicate{}});

    const DTensor st = d.reduce({"x"}, MeshReduction::stack);
    EXPECT_EQ(st.shape(), (Shape{n, 4, 3}));
    EXPECT_EQ(st.placements(), (Placements{Replicate{}}));
    ASSERT_EQ(st.to_local().shape(), (Shape{n, 4, 3}));
    for (int i = 0; i < n; ++i) EXPECT_TRUE(same(st.to_local().select(0, i), local_of(i))) << "slice " << i;

    // scatter: all_to_all — rank j holds piece j (dim 0) of every rank's local.
    const DTensor sc = d.reduce({"x"}, MeshReduction::stack, true);
    EXPECT_EQ(sc.shape(), (Shape{n, 4, 3}));
    EXPECT_EQ(sc.placements(), (Placements{Shard{1}}));
    const auto pieces = chunk_sizes(4, {n});
    const int64_t rows = pieces[static_cast<size_t>(r)], start = prefix(pieces, r);
    ASSERT_EQ(sc.to_local().shape(), (Shape{n, rows, 3}));
    for (int i = 0; i < n; ++i)
      EXPECT_TRUE(same(sc.to_local().select(0, i), local_of(i).narrow(0, start, rows))) << "slice " << i;
    EXPECT_TRUE(same(sc.full_tensor(), st.to_local()));
  });
}

TEST(DTensorApiReduce, OverNamedDimsOfATwoDimMesh) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const int64_t m0 = g2[0], m1 = g2[1];
    const DeviceMesh grid(g2, {"x", "y"});
    const auto c = grid.coordinate();
    const Shape shape{4, 3};
    const DTensor d = DTensor::from_local(full(shape, r + 1.0), grid, {Replicate{}, Replicate{}});

    // Over y: rank (i, j) sums i*m1 + j' + 1 over j'.
    const DTensor ys = d.reduce({"y"});
    EXPECT_EQ(ys.placements(), (Placements{Replicate{}, Replicate{}}));
    EXPECT_TRUE(same(ys.to_local(), full(shape, static_cast<double>(m1 * (c[0] * m1 + 1) + m1 * (m1 - 1) / 2))));
    // Over x: the max of i'*m1 + j + 1 over i'.
    EXPECT_TRUE(same(d.reduce({"x"}, MeshReduction::max).to_local(), full(shape, (m0 - 1) * m1 + c[1] + 1.0)));
    // Over both, in either order.
    EXPECT_TRUE(same(d.reduce({"x", "y"}).to_local(), full(shape, n * (n + 1) / 2.0)));
    EXPECT_TRUE(same(d.reduce({"y", "x"}, MeshReduction::min).to_local(), full(shape, 1.0)));
    // Stack over y: slice j is rank (i, j)'s local.
    const DTensor st = d.reduce({"y"}, MeshReduction::stack);
    EXPECT_EQ(st.shape(), (Shape{m1, 4, 3}));
    for (int64_t j = 0; j < m1; ++j)
      EXPECT_TRUE(same(st.to_local().select(0, j), full(shape, c[0] * m1 + j + 1.0))) << "slice " << j;

    // A tensor sharded over x, reduced over y: the shards stay, each summed over its y line.
    const Tensor g = pattern({5, 3});
    const DTensor dd = distribute_tensor(g, grid, {Shard{0}, Replicate{}});
    const DTensor s = dd.reduce({"y"});
    EXPECT_EQ(s.placements(), (Placements{Shard{0}, Replicate{}}));
    EXPECT_TRUE(same(s.to_local(), my_block(affine(g, m1, 0), s)));
    EXPECT_TRUE(same(s.full_tensor(), affine(g, m1, 0)));
    const DTensor sc = dd.reduce({"y"}, MeshReduction::sum, true);
    EXPECT_EQ(sc.placements(), (Placements{Shard{0}, Shard{0}}));
    EXPECT_TRUE(same(sc.full_tensor(), affine(g, m1, 0)));
    const DTensor sst = dd.reduce({"y"}, MeshReduction::stack);
    EXPECT_EQ(sst.shape(), (Shape{m1, 5, 3}));
    EXPECT_EQ(sst.placements(), (Placements{Shard{1}, Replicate{}}));
    const Tensor stacked = sst.full_tensor();
    for (int64_t j = 0; j < m1; ++j) EXPECT_TRUE(same(stacked.select(0, j), g)) << "slice " << j;
  });
}

TEST(DTensorApiReduce, PartialOnAnotherMeshDimStaysPartial) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const auto g2 = grid_2d(n);
    const int64_t m0 = g2[0], m1 = g2[1];
    const DeviceMesh grid(g2, {"x", "y"});
    const auto c = grid.coordinate();
    const Tensor g = pattern({4, 3});
    // P(sum) over x, values along y: rank (i, j) holds g * (i + 1) + 10 j.
    const DTensor d = DTensor::from_local(affine(g, c[0] + 1, 10 * c[1]), grid, {Partial{}, Replicate{}});
    const double ysum = 10.0 * m1 * (m1 - 1) / 2;  // sum of 10 j over the y line
    const Tensor total = affine(g, m1 * m0 * (m0 + 1) / 2.0, m0 * ysum);

    const DTensor s = d.reduce({"y"});
    EXPECT_EQ(s.placements(), (Placements{Partial{}, Replicate{}}));
    EXPECT_TRUE(same(s.to_local(), affine(g, m1 * (c[0] + 1.0), ysum)));
    EXPECT_TRUE(same(s.full_tensor(), total));

    const DTensor sc = d.reduce({"y"}, MeshReduction::sum, true);
    EXPECT_EQ(sc.placements(), (Placements{Partial{}, Shard{0}}));
    EXPECT_TRUE(same(sc.full_tensor(), total));

    const DTensor st = d.reduce({"y"}, MeshReduction::stack);
    EXPECT_EQ(st.placements(), (Placements{Partial{}, Replicate{}}));
    EXPECT_EQ(st.shape(), (Shape{m1, 4, 3}));
    const Tensor stacked = st.full_tensor();
    for (int64_t j = 0; j < m1; ++j) {
      EXPECT_TRUE(same(st.to_local().select(0, j), affine(g, c[0] + 1.0, 10.0 * j))) << "slice " << j;
      EXPECT_TRUE(same(stacked.select(0, j), affine(g, m0 * (m0 + 1) / 2.0, 10.0 * j * m0))) << "slice " << j;
    }
  });
}

TEST(DTensorApiReduce, ExplicitSizesOnAnotherMeshDim) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const auto g2 = grid_2d(n);
    const int64_t m0 = g2[0], m1 = g2[1];
    const DeviceMesh grid(g2, {"x", "y"});
    const auto c = grid.coordinate();
    std::vector<int64_t> pieces;  // 3, 5: not the chunk sizes (4, 4)
    for (int64_t i = 0; i < m0; ++i) pieces.push_back(2 * i + 3);
    const int64_t total = std::accumulate(pieces.begin(), pieces.end(), int64_t{0});
    const Tensor g = pattern({total, 3});
    const Tensor blk = g.narrow(0, prefix(pieces, c[0]), pieces[static_cast<size_t>(c[0])]);
    FromLocalOptions options;
    options.sizes = {{0, pieces}};
    // Rows split by explicit sizes over x; values along y differ by 10 j.
    const DTensor d = DTensor::from_local(affine(blk, 1, 10 * c[1]), grid, {Shard{0}, Replicate{}}, options);
    const double ysum = 10.0 * m1 * (m1 - 1) / 2;

    const DTensor s = d.reduce({"y"});
    EXPECT_EQ(s.placements(), (Placements{Shard{0}, Replicate{}}));
    EXPECT_EQ(s.layout().piece_sizes(0), pieces);
    EXPECT_TRUE(same(s.to_local(), affine(blk, m1, ysum)));
    EXPECT_TRUE(same(s.full_tensor(), affine(g, m1, ysum)));

    // Scattering splits each x piece again over y: chunk semantics from here on.
    const DTensor sc = d.reduce({"y"}, MeshReduction::sum, true);
    EXPECT_EQ(sc.placements(), (Placements{Shard{0}, Shard{0}}));
    EXPECT_EQ(sc.layout().shard_order(0), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(sc.layout().piece_sizes(0), chunk_sizes(total, {m0, m1}));
    EXPECT_TRUE(same(sc.full_tensor(), affine(g, m1, ysum)));

    const DTensor st = d.reduce({"y"}, MeshReduction::stack);
    EXPECT_EQ(st.shape(), (Shape{m1, total, 3}));
    EXPECT_EQ(st.placements(), (Placements{Shard{1}, Replicate{}}));
    EXPECT_EQ(st.layout().piece_sizes(1), pieces);
    const Tensor stacked = st.full_tensor();
    for (int64_t j = 0; j < m1; ++j) {
      EXPECT_TRUE(same(st.to_local().select(0, j), affine(blk, 1, 10.0 * j))) << "slice " << j;
      EXPECT_TRUE(same(stacked.select(0, j), affine(g, 1, 10.0 * j))) << "slice " << j;
    }
    const DTensor sts = d.reduce({"y"}, MeshReduction::stack, true);
    EXPECT_EQ(sts.placements(), (Placements{Shard{1}, Shard{1}}));
    EXPECT_TRUE(same(sts.full_tensor(), stacked));
  });
}

TEST(DTensorApiReduce, Errors) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    const Tensor g = pattern({4, 3});
    const DTensor d = DTensor::from_local(g, line, {Replicate{}});
    EXPECT_TRUE(sharding_error([&] { (void)d.reduce({"z"}); }, {"[DTensor::reduce(sum)]", "unknown axis 'z'"}));
    EXPECT_TRUE(sharding_error([&] { (void)d.reduce({}); }, {"[DTensor::reduce(sum)]", "no mesh dims"}));
    EXPECT_TRUE(sharding_error([&] { (void)d.reduce({"x", "x"}); }, {"[DTensor::reduce(sum)]", "named twice"}));
    const DTensor sharded = distribute_tensor(g, line, {Shard{0}});
    EXPECT_TRUE(sharding_error([&] { (void)sharded.reduce({"x"}); },
                               {"[DTensor::reduce(sum)]", "holds S(0)", "redistribute first"}));
    EXPECT_TRUE(sharding_error([&] { (void)sharded.reduce({"x"}, MeshReduction::stack); },
                               {"[DTensor::reduce(stack)]", "holds S(0)", "stack needs Replicate or Partial"}));
    const DTensor pmax = DTensor::from_local(g, line, {Partial{ReduceOp::max}});
    EXPECT_TRUE(sharding_error([&] { (void)pmax.reduce({"x"}, MeshReduction::sum); },
                               {"[DTensor::reduce(sum)]", "holds P(max)", "Replicate or P(sum)"}));
    EXPECT_TRUE(sharding_error([&] { (void)pmax.reduce({"x"}, MeshReduction::avg, true); },
                               {"[DTensor::reduce(avg, scatter)]", "P(max)"}));
    const DTensor scalar = DTensor::from_local(full(Shape{}, 1.0), line, {Replicate{}});
    EXPECT_TRUE(sharding_error([&] { (void)scalar.reduce({"x"}, MeshReduction::sum, true); }, {"0-d"}));
    EXPECT_TRUE(same(scalar.reduce({"x"}).to_local(), full(Shape{}, static_cast<double>(n))));
  });
}

// --- fetch_shard ------------------------------------------------------------------------------

TEST(DTensorApiFetchShard, EveryRankGetsTheNamedRanksLocal) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size(), r = rank();
    const auto g2 = grid_2d(n);
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(g2, {"x", "y"});

    const Tensor g = pattern({3, 2});
    const DTensor d = DTensor::from_local(affine(g, 1, 100 * r), line, {Replicate{}});
    for (int i = 0; i < n; ++i) EXPECT_TRUE(same(d.fetch_shard({{"x", i}}), affine(g, 1, 100 * i))) << i;
    EXPECT_TRUE(same(d.fetch_shard({}), g));  // unnamed axes default to 0

    // Uneven shards, an empty one on 4 ranks.
    const Tensor rows = pattern({5, 3}, 2);
    const DTensor ds = distribute_tensor(rows, line, {Shard{0}});
    for (int64_t i = 0; i < n; ++i)
      EXPECT_TRUE(same(ds.fetch_shard({{"x", i}}), block_of(rows, ds.layout().block({i})))) << i;

    // 2-d, with all or some coordinates given.
    const Tensor w = pattern({5, 4}, 3);
    const DTensor dg = distribute_tensor(w, grid, {Shard{0}, Shard{1}});
    for (int64_t i = 0; i < g2[0]; ++i)
      for (int64_t j = 0; j < g2[1]; ++j)
        EXPECT_TRUE(same(dg.fetch_shard({{"x", i}, {"y", j}}), block_of(w, dg.layout().block({i, j}))))
            << i << "," << j;
    for (int64_t j = 0; j < g2[1]; ++j)
      EXPECT_TRUE(same(dg.fetch_shard({{"y", j}}), block_of(w, dg.layout().block({0, j})))) << j;
    EXPECT_TRUE(same(dg.fetch_shard({{"x", g2[0] - 1}}), block_of(w, dg.layout().block({g2[0] - 1, 0}))));

    EXPECT_TRUE(sharding_error([&] { (void)d.fetch_shard({{"x", n}}); },
                               {"[DTensor::fetch_shard]", "x=" + std::to_string(n), "out of range"}));
    EXPECT_TRUE(sharding_error([&] { (void)dg.fetch_shard({{"y", -1}}); }, {"[DTensor::fetch_shard]", "out of range"}));
    EXPECT_TRUE(sharding_error([&] { (void)dg.fetch_shard({{"q", 0}}); }, {"[DTensor::fetch_shard]", "unknown axis 'q'"}));
  });
}

// --- redistribute errors ----------------------------------------------------------------------

TEST(DTensorApiRedistribute, Errors) {
  for_each_world({1, 2, 3, 4}, [] {
    const int n = world_size();
    const DeviceMesh line({n}, {"x"});
    const DeviceMesh grid(grid_2d(n), {"x", "y"});
    const Tensor g = pattern({4, 3});
    const DTensor d = distribute_tensor(g, line, {Replicate{}});
    EXPECT_TRUE(sharding_error([&] { (void)d.redistribute({Partial{}}); },
                               {"[redistribute]", "cannot redistribute to Partial"}));
    const DTensor p = DTensor::from_local(g, line, {Partial{}});
    EXPECT_TRUE(sharding_error([&] { (void)p.redistribute({Partial{ReduceOp::max}}); },
                               {"[redistribute]", "cannot turn P(sum) into P(max)"}));
    // The same Partial is no move at all.
    EXPECT_TRUE(p.redistribute({Partial{}}).to_local().is_same(p.to_local()));
    EXPECT_TRUE(sharding_error([&] { (void)d.redistribute({Replicate{}, Replicate{}}); },
                               {"[DTensor::redistribute]", "2 placements"}));
    const DTensor dg = distribute_tensor(g, grid, {Shard{0}, Replicate{}});
    EXPECT_TRUE(sharding_error([&] { (void)dg.redistribute({Replicate{}}); },
                               {"[DTensor::redistribute]", "1 placements"}));
    EXPECT_TRUE(sharding_error([&] { (void)d.redistribute(grid, {Replicate{}}); },
                               {"[DTensor::redistribute]", "1 placements", "mesh[x="}));
    EXPECT_TRUE(sharding_error([&] { (void)d.redistribute({Shard{2}}); }, {"S(2)"}));
    // Still usable after all that.
    EXPECT_TRUE(same(d.redistribute({Shard{1}}).full_tensor(), g));
    EXPECT_TRUE(same(p.full_tensor(), affine(g, n, 0)));
  });
}

// --- moving between meshes --------------------------------------------------------------------

TEST(DTensorApiToMesh, BetweenMeshesOfOneWorld) {
  for_each_world({4}, [] {
    if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
    const int r = rank();
    // Mesh construction is collective: every rank builds every mesh, in the same order.
    const DeviceMesh a({2}, {"a"}, {0, 1});
    const DeviceMesh b({2, 2}, {"x", "y"});
    const DeviceMesh c({2}, {"c"}, {2, 3});
    const bool in_a = r < 2, in_c = r >= 2;
    const Tensor g = pattern({6, 5});

    const DTensor da = distribute_tensor(g, a, {Shard{0}});
    EXPECT_EQ(da.shape(), (Shape{6, 5}));
    EXPECT_EQ(da.to_local().shape(), (in_a ? Shape{3, 5} : Shape{0, 0}));
    if (in_a) {
      EXPECT_TRUE(same(da.to_local(), g.narrow(0, 3 * r, 3)));
    }

    const DTensor db = da.redistribute(b, {Replicate{}, Shard{0}});
    EXPECT_EQ(db.device_mesh().spec(), b.spec());
    EXPECT_EQ(db.placements(), (Placements{Replicate{}, Shard{0}}));
    EXPECT_TRUE(same(db.to_local(), my_block(g, db)));
    EXPECT_TRUE(same(db.full_tensor(), g));

    const DTensor dc = db.redistribute(c, {Shard{1}});
    EXPECT_EQ(dc.device_mesh().spec(), c.spec());
    if (in_c) {
      EXPECT_TRUE(same(dc.to_local(), my_block(g, dc)));
      EXPECT_TRUE(same(dc.full_tensor(), g));
    } else {
      EXPECT_EQ(dc.to_local().numel(), 0);
      EXPECT_TRUE(sharding_error([&] { (void)dc.full_tensor(); }, {"[DTensor::full_tensor]", "is not in"}));
    }

    // Between the two disjoint meshes, replicated on arrival.
    const DTensor back = dc.redistribute(a, {Replicate{}});
    if (in_a) {
      EXPECT_TRUE(same(back.to_local(), g));
    } else {
      EXPECT_EQ(back.to_local().numel(), 0);
    }

    // Uneven explicit sizes on a (1 and 5 rows) into (S(0), S(1)) on b. Non-members pass a local of
    // the right width and the same sizes.
    FromLocalOptions sized;
    sized.sizes = {{0, {1, 5}}};
    const Tensor mine = r == 0 ? g.narrow(0, 0, 1) : r == 1 ? g.narrow(0, 1, 5) : zeros({0, 5});
    const DTensor du = DTensor::from_local(mine, a, {Shard{0}}, sized);
    EXPECT_EQ(du.shape(), (Shape{6, 5}));
    const DTensor dub = du.redistribute(b, {Shard{0}, Shard{1}});
    EXPECT_TRUE(same(dub.to_local(), my_block(g, dub)));
    EXPECT_TRUE(same(dub.full_tensor(), g));

    // A Partial is reduced on its own mesh before it leaves: the sum of a's two locals arrives.
    const DTensor dp = DTensor::from_local(in_a ? affine(g, r + 1, 0) : zeros({6, 5}), a, {Partial{}});
    const DTensor dpb = dp.redistribute(b, {Shard{1}, Replicate{}});
    EXPECT_TRUE(same(dpb.to_local(), my_block(affine(g, 3, 0), dpb)));
    EXPECT_TRUE(same(dpb.full_tensor(), affine(g, 3, 0)));

    // Monarch reduce and fetch_shard on a mesh over part of the world: its members only.
    const DTensor va = DTensor::from_local(full({2, 2}, r + 1.0), a, {Replicate{}});
    const DTensor sa = va.reduce({"a"});
    if (in_a) {
      EXPECT_TRUE(same(sa.to_local(), full({2, 2}, 3.0)));
      EXPECT_TRUE(same(va.fetch_shard({{"a", 1}}), full({2, 2}, 2.0)));
    } else {
      EXPECT_EQ(sa.to_local().numel(), 0);
      EXPECT_TRUE(sharding_error([&] { (void)va.fetch_shard({{"a", 1}}); }, {"[DTensor::fetch_shard]", "is not in"}));
    }

    // Random factories on a part of the world keep every rank's generator in step.
    manual_seed(7);
    const DTensor ra = rand({6, 5}, a, {Shard{0}});
    const DTensor rb = rand({6, 5}, b, {Shard{0}, Shard{1}});
    manual_seed(7);
    const Tensor first = rand({6, 5});
    const Tensor second = rand({6, 5});
    if (in_a) {
      EXPECT_TRUE(same(ra.full_tensor(), first));
    }
    EXPECT_TRUE(same(rb.full_tensor(), second));
  });
}
