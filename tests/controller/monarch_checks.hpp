#pragma once
// Monarch's mesh reductions, fetch_shard's coordinates and drop() (shared by the threads and the
// MPI tests). Each worker's block is its own value: a remote function gives worker i of a 1-d
// mesh the block 100 i + [0, 1, ...] (n x 3), so every reduction is checked against the same
// arithmetic done here.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <tessera/controller/controller.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

namespace monarch_checks {

/// Worker i's block along mesh dim 0 (of a mesh of n there): 100 i + arange(3 n) as n x 3.
inline tessera::Tensor block(int64_t i, int64_t n) {
  using namespace tessera;
  return (arange(3 * n).to(DType::f32) + 100.0 * static_cast<double>(i)).reshape({n, 3});
}

/// Registers "monarch_checks.block" (before controller::run; once): every worker's own block,
/// Replicate over the mesh (each worker's value differs: Monarch's per-worker values).
inline void register_remotes() {
  using namespace tessera;
  static std::once_flag once;
  std::call_once(once, [] {
    controller::register_remote("monarch_checks.block", [](const DeviceMesh& mesh, const std::vector<DTensor>&) {
      const int64_t n = mesh.size(0);
      const Tensor mine = block(mesh.coordinate()[0], n);
      FromLocalOptions global;
      global.shape = mine.shape();
      return std::vector<DTensor>{
          DTensor::from_local(mine, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}), global)};
    });
  });
}

/// The blocks of every worker along dim 0, stacked: [n, n, 3].
inline tessera::Tensor stacked(int64_t n) {
  std::vector<tessera::Tensor> blocks;
  for (int64_t i = 0; i < n; ++i) blocks.push_back(block(i, n));
  return tessera::stack(blocks, 0);
}

/// Every reduction of Monarch's reduce over mesh dim 0 of `mesh` (named `axis`): sum, product,
/// max, stack (all_gather), stack with scatter (all_to_all), and stack onto a slice (gather).
inline void check_mesh_reductions(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  using tessera::testing::throws_with;
  const std::string axis = mesh.spec().names()[0];
  const int64_t n = mesh.spec().size(0);
  const auto v = controller::call_remote("monarch_checks.block", mesh, {})[0];
  const auto whole = [](const controller::RemoteTensor& t) { return controller::fetch_full(t).get(); };
  Tensor sum_of = zeros({n, 3}), product_of = ones({n, 3});
  for (int64_t i = 0; i < n; ++i) sum_of = sum_of + block(i, n), product_of = product_of * block(i, n);
  EXPECT_TRUE(allclose(whole(controller::reduce(v, {axis})), sum_of, 0, 0));
  EXPECT_TRUE(allclose(whole(controller::reduce(v, {axis}, ReduceOp::product)), product_of, 1e-6, 0));
  EXPECT_TRUE(allclose(whole(controller::reduce(v, {axis}, MeshReduction::max)), block(n - 1, n), 0, 0));
  // all_gather: every worker holds every block, stacked in worker order.
  const auto gathered = controller::reduce(v, {axis}, MeshReduction::stack);
  EXPECT_EQ(gathered.shape(), (Shape{n, n, 3}));
  EXPECT_TRUE(allclose(whole(gathered), stacked(n), 0, 0));
  std::vector<int64_t> last(static_cast<size_t>(mesh.spec().ndim()), 0);
  last[0] = n - 1;
  EXPECT_TRUE(allclose(controller::fetch_shard(gathered, last).get(), stacked(n), 0, 0));
  // all_to_all: worker j holds row j of every worker's block.
  const auto exchanged = controller::reduce(v, {axis}, MeshReduction::stack, true);
  EXPECT_TRUE(allclose(whole(exchanged), stacked(n), 0, 0));
  for (int64_t j = 0; j < n; ++j) {
    std::vector<int64_t> at(static_cast<size_t>(mesh.spec().ndim()), 0);
    at[0] = j;
    EXPECT_TRUE(allclose(controller::fetch_shard(exchanged, at).get(), stacked(n).narrow(1, j, 1), 0, 0)) << j;
  }
  // In place: a sum replaces the value; a stack changes the shape, so it is refused at the call.
  const auto w = controller::call_remote("monarch_checks.block", mesh, {})[0];
  controller::reduce_(w, {axis}, MeshReduction::max);
  EXPECT_TRUE(allclose(whole(w), block(n - 1, n), 0, 0));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::reduce_(w, {axis}, MeshReduction::stack); },
                                      {"[reduce_]", "stack", "shape"}));
  // gather: the stack onto the slice at index 0 of the reduced axis (a mesh of the other axes).
  if (mesh.spec().ndim() >= 2) {
    const controller::WorkerMesh first = mesh.slice({{axis, 0}});
    const auto onto = controller::reduce(v, {axis}, MeshReduction::stack, false, &first);
    EXPECT_EQ(onto.mesh().id(), first.id());
    EXPECT_TRUE(allclose(whole(onto), stacked(n), 0, 0));
  }
}

/// fetch_shard without a coordinate (0 everywhere, Monarch's shard=None) and with named ones
/// (unnamed axes 0); an unknown axis or an index outside it is a ShardingError at the call.
inline void check_fetch_shard_coordinates(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  using tessera::testing::throws_with;
  const std::string axis = mesh.spec().names()[0];
  const int64_t n = mesh.spec().size(0);
  const auto v = controller::call_remote("monarch_checks.block", mesh, {})[0];
  EXPECT_TRUE(allclose(controller::fetch_shard(v).get(), block(0, n), 0, 0));
  EXPECT_TRUE(allclose(controller::fetch_shard(v, {{axis, n - 1}}).get(), block(n - 1, n), 0, 0));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        (void)controller::fetch_shard(v, {{"no_such_axis", 0}});
      },
      {"[fetch_shard]", "no_such_axis"}));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        (void)controller::fetch_shard(v, {{axis, n}});
      },
      {"[fetch_shard]", "outside"}));
}

/// drop(): the handle (and every copy of it) is dropped; every later use is a ValueError naming
/// the tensor; so is a second drop, and a drop while another stream borrows it.
inline void check_drop(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  using tessera::testing::throws_with;
  const Placements replicated(static_cast<size_t>(mesh.spec().ndim()), Replicate{});
  controller::RemoteTensor t = controller::ones({2, 2}, mesh, replicated);
  const controller::RemoteTensor copy = t;
  const std::string name = "tensor " + std::to_string(t.id());
  EXPECT_FALSE(t.dropped());
  t.drop();
  EXPECT_TRUE(t.dropped());
  EXPECT_TRUE(copy.dropped());
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)controller::add(copy, copy); }, {"[add]", name, "dropped"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)controller::fetch_full(t); }, {"[fetch_full]", name, "dropped"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)t.layout(); }, {"[RemoteTensor::layout]", name, "dropped"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { t.drop(); }, {"[RemoteTensor::drop]", name, "dropped already"}));
  // Lent to another stream: its owner cannot free it under the borrower.
  const controller::RemoteTensor lent = controller::ones({2}, mesh, replicated);
  const controller::Stream other("monarch_checks.other");
  {
    controller::Borrow borrow = other.borrow(lent);
    EXPECT_TRUE(throws_with<ValueError>([&] { lent.drop(); }, {"[RemoteTensor::drop]", "borrowed by stream"}));
  }
  lent.drop();
  // The workers carry on.
  EXPECT_TRUE(allclose(controller::fetch_full(controller::ones({2}, mesh, replicated)).get(), ones({2}), 0, 0));
}

/// Monarch's mesh.rank / mesh.ranks and per-worker seeds on a 2-d mesh (axes named a, b): each
/// worker's value is its own, made with no remote function. rank({a, b}) numbers the workers
/// row-major; a reduction over a sums the ranks along it; manual_seed(seed, mesh, {a}) draws as a
/// mesh-wide manual_seed(seed + i) does at the workers of row i, alike along b.
inline void check_per_worker_factories(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  using tessera::testing::throws_with;
  ASSERT_EQ(mesh.spec().ndim(), 2);
  const std::string a = mesh.spec().names()[0], b = mesh.spec().names()[1];
  const int64_t na = mesh.spec().size(0), nb = mesh.spec().size(1);
  const auto at = [](const controller::RemoteTensor& t, int64_t i, int64_t j) {
    return controller::fetch_shard(t, {i, j}).get();
  };
  const controller::RemoteTensor along_a = mesh.rank(a), along_b = mesh.rank(b);
  const controller::RemoteTensor row_major = mesh.rank({a, b}), column_major = mesh.rank({b, a});
  const std::map<std::string, controller::RemoteTensor> ranks = mesh.ranks();
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(row_major.layout().global_shape(), Shape{});
  EXPECT_EQ(row_major.layout().dtype(), DType::i64);
  EXPECT_EQ(row_major.layout().placements(), (Placements{Replicate{}, Replicate{}}));
  for (int64_t i = 0; i < na; ++i)
    for (int64_t j = 0; j < nb; ++j) {
      EXPECT_EQ(at(along_a, i, j).item<int64_t>(), i);
      EXPECT_EQ(at(along_b, i, j).item<int64_t>(), j);
      EXPECT_EQ(at(row_major, i, j).item<int64_t>(), i * nb + j);
      EXPECT_EQ(at(column_major, i, j).item<int64_t>(), j * na + i);
      EXPECT_EQ(at(ranks.at(a), i, j).item<int64_t>(), i);
      EXPECT_EQ(at(ranks.at(b), i, j).item<int64_t>(), j);
    }
  // Monarch's reduce over a: every worker gets 0 + 1 + ... + (na - 1).
  const controller::RemoteTensor summed = controller::reduce(controller::call("mul_scalar", {along_a}, {1.0}), {a});
  for (int64_t j = 0; j < nb; ++j)
    EXPECT_EQ(at(summed, na - 1, j).item<double>(), static_cast<double>(na * (na - 1) / 2));

  // Per-worker seeds along a: row i draws what seed + i draws everywhere.
  const Placements replicated{Replicate{}, Replicate{}};
  controller::manual_seed(5, mesh, {a});
  const controller::RemoteTensor own = controller::randn({4}, mesh, replicated);
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < na; ++i) {
    controller::manual_seed(5 + static_cast<uint64_t>(i), mesh);
    rows.push_back(controller::fetch_shard(controller::randn({4}, mesh, replicated), {0, 0}).get());
  }
  for (int64_t i = 0; i < na; ++i)
    for (int64_t j = 0; j < nb; ++j)
      EXPECT_TRUE(allclose(at(own, i, j), rows[static_cast<size_t>(i)], 0, 0)) << i << ", " << j;
  if (na > 1) {
    EXPECT_FALSE(allclose(rows[0], rows[1], 0, 0));
  }

  // Errors name the call, the axis and the mesh.
  const std::string where = mesh.to_string();
  EXPECT_TRUE(throws_with<ShardingError>([&] { (void)mesh.rank("nope"); }, {"[WorkerMesh::rank]", "nope"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)mesh.rank(std::vector<std::string>{}); },
                                      {"[WorkerMesh::rank]", "one axis or more", where}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        (void)mesh.rank({a, a});
      },
      {"[WorkerMesh::rank]", a, "named twice", where}));
  EXPECT_TRUE(throws_with<ValueError>([&] { controller::manual_seed(1, mesh, {}); },
                                      {"[controller::manual_seed]", "one axis or more", where}));
  EXPECT_TRUE(throws_with<ShardingError>([&] { controller::manual_seed(1, mesh, {"nope"}); },
                                         {"[controller::manual_seed]", "nope"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)controller::call("mesh_rank", {}, {}, {}, &mesh); },
                                      {"mesh_rank", "mesh dims"}));
  // A mesh dim out of range by name fails on the workers, at the result's future.
  const controller::RemoteTensor bad = controller::call("mesh_rank", {}, {}, {7}, &mesh);
  EXPECT_TRUE(throws_with<CommError>([&] { (void)controller::fetch_full(bad).get(); }, {"mesh dim 7", "out of range"}));
  // The workers carry on.
  EXPECT_EQ(at(mesh.rank(b), na - 1, nb - 1).item<int64_t>(), nb - 1);
}

/// Monarch's slice_mesh on a 2-d mesh (axes a, b): a per-worker value sliced at a = i lives on the
/// slice of the b axis and keeps each worker's value; a list sliced in one call shares one slice;
/// onto a slice made beforehand; a tensor sharded along the sliced axis fails at its future; the
/// errors of the call.
inline void check_slice_mesh(const tessera::controller::WorkerMesh& mesh) {
  using namespace tessera;
  using tessera::testing::throws_with;
  ASSERT_EQ(mesh.spec().ndim(), 2);
  const std::string a = mesh.spec().names()[0], b = mesh.spec().names()[1];
  const int64_t na = mesh.spec().size(0), nb = mesh.spec().size(1);
  const controller::RemoteTensor mine = mesh.rank({a, b});  // worker (i, j) holds i nb + j
  const int64_t i = na - 1;
  const controller::RemoteTensor row = mine.slice_mesh({{a, i}});
  EXPECT_EQ(row.mesh().spec().names(), std::vector<std::string>{b});
  EXPECT_EQ(row.mesh().spec().size(), nb);
  for (int64_t j = 0; j < nb; ++j) {
    EXPECT_EQ(controller::fetch_shard(row, {j}).get().item<int64_t>(), i * nb + j);
    EXPECT_EQ(row.mesh().spec().ranks()[static_cast<size_t>(j)], mesh.spec().ranks()[static_cast<size_t>(i * nb + j)]);
  }
  EXPECT_EQ(row.layout().placements(), (Placements{Replicate{}}));
  // A list sliced in one call shares one slice, so its tensors combine.
  const controller::RemoteTensor twos = controller::full({3}, 2.0, mesh, {Replicate{}, Replicate{}});
  const std::vector<controller::RemoteTensor> both = controller::slice_mesh({mine, twos}, {{b, 0}});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].mesh().id(), both[1].mesh().id());
  const controller::RemoteTensor sum = controller::add(both[1], controller::call("mul_scalar", {both[0]}, {1.0}));
  for (int64_t k = 0; k < na; ++k)
    EXPECT_TRUE(allclose(controller::fetch_shard(sum, {k}).get(), full({3}, 2.0 + static_cast<double>(k * nb)), 0, 0));
  // Onto a slice made beforehand: two tensors sliced apart share it.
  const controller::WorkerMesh column = mesh.slice({{b, nb - 1}});
  const controller::RemoteTensor x = twos.slice_mesh(column),
                                 y = controller::ones({3}, mesh, {Replicate{}, Replicate{}}).slice_mesh(column);
  EXPECT_TRUE(allclose(controller::fetch_full(controller::add(x, y)).get(), full({3}, 3.0), 0, 0));
  // Sharded along the sliced axis: the slice would hold one piece; the future says so.
  const controller::RemoteTensor split = controller::zeros({2 * na, 2}, mesh, {Shard{0}, Replicate{}});
  if (na > 1) {
    EXPECT_TRUE(throws_with<CommError>(
        [&] {
          (void)controller::fetch_full(split.slice_mesh({{a, 0}})).get();
        },
        {"slice_mesh", "S(0)", a, "Replicate"}));
  }
  // Errors at the call.
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        (void)mine.slice_mesh({{"nope", 0}});
      },
      {"[RemoteTensor::slice_mesh]", "nope"}));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        (void)mine.slice_mesh({{a, na}});
      },
      {"[RemoteTensor::slice_mesh]", "index " + std::to_string(na), a}));
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)mine.slice_mesh(std::map<std::string, int64_t>{}); },
                                      {"[RemoteTensor::slice_mesh]", "one axis or more"}));
  EXPECT_TRUE(throws_with<ShardingError>([&] { (void)row.slice_mesh(column); },
                                         {"[RemoteTensor::slice_mesh]", "is not a slice of"}));
  EXPECT_TRUE(
      throws_with<ValueError>([&] { (void)controller::call("mesh_slice", {mine}); }, {"mesh_slice", "slice_mesh"}));
  // The workers carry on.
  EXPECT_EQ(controller::fetch_shard(mesh.rank(b).slice_mesh({{a, 0}}), {nb - 1}).get().item<int64_t>(), nb - 1);
}

/// Monarch's to_mesh on a grid (axes host, gpu): a slice broadcast back over host (each worker
/// takes host 0's block at its gpu, per-worker values staying per worker), a sharded tensor from
/// one host's slice to the grid and to another host's slice, a list, a failed source failing the
/// result, and the axes' errors at the call.
inline void check_to_mesh(const tessera::controller::WorkerMesh& grid) {
  using namespace tessera;
  namespace c = tessera::controller;
  using tessera::testing::throws_with;
  const int64_t hosts = grid.spec().size(0), gpus = grid.spec().size(1);
  const Placements replicated{Replicate{}, Replicate{}};
  // Per-worker values: each worker draws its own.
  c::manual_seed(21, grid, {"host", "gpu"});
  const c::RemoteTensor own = c::randn({3}, grid, replicated);
  const c::RemoteTensor broadcast = own.slice_mesh({{"host", 0}}).to_mesh(grid);
  EXPECT_EQ(broadcast.mesh().id(), grid.id());
  EXPECT_EQ(broadcast.layout().placements(), replicated);
  for (int64_t h = 0; h < hosts; ++h)
    for (int64_t g = 0; g < gpus; ++g)
      EXPECT_TRUE(allclose(c::fetch_shard(broadcast, {h, g}).get(), c::fetch_shard(own, {0, g}).get(), 0, 0))
          << "host " << h << " gpu " << g;
  // A tensor sharded over gpu: from the last host's slice onto the grid, and onto host 0's slice.
  c::manual_seed(22, grid);
  const c::RemoteTensor rows = c::randn({5, 4}, grid, {Replicate{}, Shard{0}});
  const Tensor whole = c::fetch_full(rows).get();
  const c::RemoteTensor on_last = rows.slice_mesh({{"host", hosts - 1}});
  const c::RemoteTensor back = on_last.to_mesh(grid);
  EXPECT_EQ(back.layout().placements(), (Placements{Replicate{}, Shard{0}}));
  EXPECT_TRUE(allclose(c::fetch_full(back).get(), whole, 0, 0));
  const c::WorkerMesh first = grid.slice({{"host", 0}});
  const std::vector<c::RemoteTensor> moved = c::to_mesh({on_last, c::scale(on_last, 2.0)}, first);
  EXPECT_TRUE(allclose(c::fetch_full(moved[0]).get(), whole, 0, 0));
  EXPECT_TRUE(allclose(c::fetch_full(moved[1]).get(), whole * 2.0, 0, 0));
  EXPECT_EQ(moved[0].mesh().id(), first.id());
  EXPECT_EQ(rows.to_mesh(grid).id(), rows.id());  // onto its own mesh: itself
  // A failed source fails the result on every target worker; the workers carry on.
  const c::RemoteTensor bad = c::matmul(on_last, on_last);
  EXPECT_TRUE(throws_with<CommError>([&] { (void)c::fetch_full(bad.to_mesh(grid)).get(); }, {"worker rank", "matmul"}));
  EXPECT_TRUE(allclose(c::fetch_full(on_last.to_mesh(grid)).get(), whole, 0, 0));
  // The axes' errors, at the call.
  if (hosts > 1) {
    EXPECT_TRUE(
        throws_with<ShardingError>([&] { (void)rows.to_mesh(first); },
                                   {"[RemoteTensor::to_mesh]", "axis 'host' of", "whose block each worker takes"}));
  }
  const c::WorkerMesh line({hosts * gpus}, {"gpu"});
  if (hosts > 1) {
    EXPECT_TRUE(throws_with<ShardingError>([&] { (void)c::ones({2}, line, {Replicate{}}).to_mesh(grid); },
                                           {"[RemoteTensor::to_mesh]", "axis 'gpu' has", "must match"}));
  }
  EXPECT_TRUE(throws_with<ValueError>([&] { (void)c::RemoteTensor().to_mesh(grid); },
                                      {"[RemoteTensor::to_mesh]", "undefined RemoteTensor"}));
}

}  // namespace monarch_checks
