// halo_exchange against the widened block cut from the full tensor, over meshes, shard orders,
// uneven and empty pieces, halo widths beyond a neighbour's piece and every padding; its
// gradient by finite differences; its bytes against the halo bound.
#include <gtest/gtest.h>

#include <tessera/autograd/gradcheck.hpp>
#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/domain/halo.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// The widened block the rank holding `block` must get, from the full tensor.
Tensor expected_halo(const Tensor& full, const Block& block, int64_t dim, int64_t left, int64_t right, HaloPadding pad) {
  const int64_t length = full.shape()[dim];
  std::vector<Tensor> rows;
  for (int64_t g = block.begin[dim] - left; g < block.end[dim] + right; ++g) {
    int64_t row = g;
    if (g < 0 || g >= length) {
      if (length == 0 || pad == HaloPadding::zeros)
        row = -1;
      else if (pad == HaloPadding::periodic)
        row = ((g % length) + length) % length;
      else
        row = std::clamp<int64_t>(g, 0, length - 1);
    }
    Block one = block;
    one.begin[dim] = row < 0 ? 0 : row;
    one.end[dim] = one.begin[dim] + 1;
    Tensor piece = row < 0 ? zeros(one.shape(), full.dtype()) : block_of(full, one);
    rows.push_back(piece);
  }
  if (rows.empty()) {
    Shape shape = block.shape();
    shape[dim] = 0;
    return zeros(shape, full.dtype());
  }
  return cat(rows, dim);
}

const char* name(HaloPadding pad) {
  return pad == HaloPadding::zeros ? "zeros" : pad == HaloPadding::periodic ? "periodic" : "replicate";
}

void expect_halos(const DTensor& x, const Tensor& full, int64_t dim) {
  for (HaloPadding pad : {HaloPadding::zeros, HaloPadding::periodic, HaloPadding::replicate})
    for (auto [left, right] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}, {2, 0}, {0, 3}, {5, 4}}) {
      const Tensor got = halo_exchange(x, dim, left, right, pad);
      const Tensor expected = expected_halo(full, x.layout().block(x.device_mesh().coordinate()), dim, left, right, pad);
      EXPECT_TRUE(equal(got, expected)) << x.layout().to_string() << " dim " << dim << " left " << left << " right "
                                        << right << " " << name(pad) << "\ngot " << got << "\nexpected " << expected;
    }
}

}  // namespace

TEST(HaloExchange, OneMeshDimEvenUnevenAndEmptyPieces) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    for (int64_t rows : {int64_t{2} * n, int64_t{2} * n + 1, int64_t{1}, int64_t{0}}) {
      const Tensor full = data({rows, 3}, 1);
      expect_halos(distribute_tensor(full, mesh, {Shard{0}}), full, 0);
      const Tensor wide = data({2, rows}, 2);
      expect_halos(distribute_tensor(wide, mesh, {Shard{1}}), wide, 1);
    }
    // Explicit sizes with an empty piece in the middle: halos reach past it.
    std::vector<int64_t> sizes(static_cast<size_t>(n), 2);
    sizes[static_cast<size_t>(n / 2)] = 0;
    const int64_t rows = 2 * (n - 1);
    const Tensor full = data({rows, 2}, 3);
    const Layout layout({rows, 2}, DType::f32, mesh.spec(), {Shard{0}}, {}, {{0, sizes}});
    const DTensor x(block_of(full, layout.block(mesh.coordinate())), mesh, layout);
    expect_halos(x, full, 0);
  });
}

TEST(HaloExchange, SeveralMeshDimsAndShardOrders) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    const DeviceMesh mesh({2, n / 2}, {"a", "b"});
    const Tensor full = data({3 * n + 1, 5}, 4);
    for (const ShardOrder& order : {ShardOrder{}, ShardOrder{{0, {1, 0}}}}) {
      const Layout layout(full.shape(), DType::f32, mesh.spec(), {Shard{0}, Shard{0}}, order);
      expect_halos(DTensor(block_of(full, layout.block(mesh.coordinate())), mesh, layout), full, 0);
    }
    // The halo dim on one mesh dim, another tensor dim on the other: groups exchange separately.
    const Tensor grid = data({7, 9}, 5);
    expect_halos(distribute_tensor(grid, mesh, {Shard{1}, Shard{0}}), grid, 0);
    expect_halos(distribute_tensor(grid, mesh, {Shard{1}, Shard{0}}), grid, 1);
    // Replicated along the dim: only padding, no communication.
    const DTensor along = distribute_tensor(grid, mesh, {Shard{1}, Replicate{}});
    CommDebugMode debug;
    expect_halos(along, grid, 0);
    EXPECT_EQ(debug.total_count(), 0);
  });
}

TEST(HaloExchange, MovesOnlyTheHaloRows) {
  for_each_world({4}, [] {
    const DeviceMesh mesh = line_mesh();
    const Tensor full = data({400, 16}, 6);
    const DTensor x = distribute_tensor(full, mesh, {Shard{0}});
    CommDebugMode debug;
    halo_exchange(x, 0, 2, 3, HaloPadding::zeros);
    // Interior ranks receive 2 + 3 rows, the edges one side (zeros at the domain's edges).
    const int64_t row_bytes = 16 * 4;
    const int r = rank(), n = world_size();
    const int64_t rows_in = (r > 0 ? 2 : 0) + (r < n - 1 ? 3 : 0);
    EXPECT_EQ(debug.total_bytes_received(), rows_in * row_bytes);
    // A neighbour needs 3 of my rows on its right side and 2 on its left: the same bound sent.
    const int64_t rows_out = (r > 0 ? 3 : 0) + (r < n - 1 ? 2 : 0);
    EXPECT_EQ(debug.total_bytes_sent(), rows_out * row_bytes);
    // One message per neighbour and direction, nothing to or from the others.
    const int neighbours = (r > 0) + (r < n - 1);
    EXPECT_EQ(debug.count(CollectiveKind::recv), neighbours);
    EXPECT_EQ(debug.count(CollectiveKind::send), neighbours);
    EXPECT_EQ(debug.total_count(), 2 * neighbours);
  });
}

// halo_exchange_start posts and returns; the rank computes meanwhile; finish gives what
// halo_exchange gives, value and gradient, on every layout and padding of a 2 x n/2 mesh.
TEST(HaloExchange, StartAndFinishOverlapComputeWithTheSameResult) {
  for_each_world({4}, [] {
    const int n = world_size();
    if (n % 2) return;
    const DeviceMesh mesh({2, n / 2}, {"a", "b"});
    const Tensor grid = data({11, 7}, 9);
    for (const Placements& placements : std::vector<Placements>{{Shard{0}, Shard{1}}, {Shard{0}, Shard{0}}}) {
      const DTensor x = distribute_tensor(grid, mesh, placements);
      for (HaloPadding pad : {HaloPadding::zeros, HaloPadding::periodic, HaloPadding::replicate}) {
        HaloExchange exchange = halo_exchange_start(x, 0, 2, 1, pad);
        EXPECT_FALSE(exchange.finished());
        const Tensor interior = x.to_local() * 2.0;  // compute while the rows travel
        const Tensor widened = exchange.finish();
        EXPECT_TRUE(exchange.finished());
        EXPECT_TRUE(allclose(widened, halo_exchange(x, 0, 2, 1, pad), 0, 0)) << x.layout().to_string();
        EXPECT_TRUE(allclose(interior, x.to_local() * 2.0, 0, 0));
        EXPECT_TRUE(value_error([&] { exchange.finish(); }, {"[HaloExchange::finish]", "already finished"}));
      }
    }
    // The gradient flows through finish as through halo_exchange.
    Tensor leaf = data({5, 7}, 3);
    leaf.requires_grad_(true);
    FromLocalOptions infer;
    infer.infer_sizes = true;
    const DTensor x = DTensor::from_local(leaf, mesh, {Shard{0}, Shard{1}}, infer);
    HaloExchange exchange = halo_exchange_start(x, 0, 1, 1, HaloPadding::periodic);
    sum(exchange.finish() * 3.0).backward();
    const Tensor via_start = leaf.grad().clone();
    leaf.set_grad(Tensor());
    sum(halo_exchange(x, 0, 1, 1, HaloPadding::periodic) * 3.0).backward();
    EXPECT_TRUE(allclose(via_start, leaf.grad(), 0, 0));
    // An exchange dropped unfinished still lands its rows (its peers' finish completes).
    { HaloExchange dropped = halo_exchange_start(x, 1, 1, 0); }
    EXPECT_TRUE(value_error([&] { HaloExchange().finish(); }, {"[HaloExchange::finish]", "no exchange was started"}));
  });
}

TEST(HaloExchange, GradientAddsHaloRowsBackIntoTheirSources) {
  for_each_world({2, 3, 4}, [] {
    const DeviceMesh mesh = line_mesh();
    const int n = world_size();
    for (HaloPadding pad : {HaloPadding::zeros, HaloPadding::periodic, HaloPadding::replicate}) {
      // Each rank weighs its widened block differently; the sum over ranks is every rank's value.
      const auto fn = [&](const std::vector<Tensor>& in) {
        const DTensor x = DTensor::from_local(in[0], mesh, {Replicate{}}).redistribute({Shard{0}});
        const Tensor widened = halo_exchange(x, 0, 2, 1, pad);
        const Tensor w = sin(arange(widened.numel()).to(DType::f64) * 0.3 + rank()).reshape(widened.shape());
        const Tensor mine = sum(widened * w).reshape({1});
        return DTensor::from_local(mine, mesh, {Partial{}}).full_tensor();
      };
      const Tensor full = sin(arange(2 * n + 1).to(DType::f64) * 0.7).reshape({2 * n + 1, 1}) ;
      const auto result = autograd::gradcheck(fn, {full});
      EXPECT_TRUE(result.ok) << name(pad) << ": " << result.message;
    }
  });
}

TEST(HaloExchange, ErrorsNameTheLayout) {
  for_each_world({2}, [] {
    const DeviceMesh mesh = line_mesh();
    const DTensor x = distribute_tensor(data({4, 2}, 1), mesh, {Shard{0}});
    EXPECT_TRUE(sharding_error([&] { halo_exchange(x, 2, 1, 1); }, {"[halo_exchange]", "dim 2 is out of range"}));
    EXPECT_TRUE(sharding_error([&] { halo_exchange(x, 0, -1, 1); }, {"[halo_exchange]", "must be >= 0"}));
    const DTensor partial = DTensor::from_local(data({4, 2}, 1), mesh, {Partial{}});
    EXPECT_TRUE(sharding_error([&] { halo_exchange(partial, 0, 1, 1); }, {"[halo_exchange]", "holds a Partial"}));
  });
}
