// scaled_dot_product_attention on DTensor equals the Tensor op on the unsharded inputs, and so do
// the gradients of q, k and v (in the leaves' layouts), on the meshes [4], 2x2 and 2x3 with uneven
// and empty shards, causal, masks and dropout. Placements: every one of q's (R, S(d) for each dim,
// P(sum)) with k's and v's drawn from theirs by a fixed stride (the full product is 36^3 per mesh).
// Then the communication: heads sharded move nothing; rows of q sharded move nothing forward.
#include <gtest/gtest.h>

#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "placement_sweep.hpp"
#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

struct AttentionCase {
  std::string name;
  Shape q, k, v;
  bool causal = false;
  std::optional<Shape> bool_mask;  // b8 mask of this shape (broadcast to the scores)
  double dropout_p = 0;
};

// Small f64 values (data() is integers in [-11, 11]; a tenth keeps the softmax soft).
Tensor input(const Shape& shape, int seed) { return mul(data(shape, seed), Scalar(0.1)).to(DType::f64); }

// Placements of a gradient: the leaf's, Partial ones replicated.
Placements gradient_placements(Placements p) {
  for (auto& placement : p)
    if (is_partial(placement)) placement = Replicate{};
  return p;
}

std::string describe(const std::vector<Placements>& combo) {
  std::string text;
  for (const auto& p : combo) text.append(text.empty() ? "" : " ").append(to_string(p));
  return text;
}

void check(const AttentionCase& c) {
  const Tensor gq = input(c.q, 1), gk = input(c.k, 2), gv = input(c.v, 3);
  std::optional<Tensor> mask;
  if (c.bool_mask) mask = gt(data(*c.bool_mask, 4), Scalar(-6.0));
  // The unsharded op and its gradients.
  Tensor tq = gq.clone(), tk = gk.clone(), tv = gv.clone();
  for (Tensor* t : {&tq, &tk, &tv}) t->requires_grad_();
  manual_seed(9);
  const Tensor expected = scaled_dot_product_attention(tq, tk, tv, mask, c.dropout_p, c.causal);
  const Tensor weights = input(expected.shape(), 5);
  expected.backward(weights);

  for (const auto& mesh_shape : sweep_meshes(world_size())) {
    const DeviceMesh mesh = sweep_mesh(mesh_shape);
    const auto q_options = placement_combinations(c.q.size(), mesh.ndim(), true);
    const auto kv_options = placement_combinations(c.k.size(), mesh.ndim(), true);
    const size_t limit = sample_limit(q_options.size());
    const size_t stride = (q_options.size() + limit - 1) / limit;
    for (size_t i = 0; i < q_options.size(); i += stride) {
      const std::vector<Placements> combo = {q_options[i], kv_options[(i * 7 + 3) % kv_options.size()],
                                             kv_options[(i * 13 + 5) % kv_options.size()]};
      DTensor q = make_input(gq, mesh, combo[0]), k = make_input(gk, mesh, combo[1]), v = make_input(gv, mesh, combo[2]);
      for (DTensor* t : {&q, &k, &v}) t->requires_grad_();
      std::optional<DTensor> dmask;
      if (mask) dmask = make_input(*mask, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{}));
      manual_seed(9);
      const DTensor out = scaled_dot_product_attention(q, k, v, dmask, c.dropout_p, c.causal);
      const std::string where = c.name + " on " + mesh.to_string() + " with " + describe(combo) + " (rank " +
                                std::to_string(rank()) + ")";
      const bool out_ok = allclose(out.full_tensor(), expected.detach(), 1e-10, 1e-10);
      EXPECT_TRUE(out_ok) << where << ": output\n" << out.full_tensor() << "\nexpected " << expected.detach();
      out.backward(make_input(weights, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate{})));
      bool grads_ok = true;
      for (const auto& [leaf, tensor, i] : {std::tuple{&q, &tq, 0}, std::tuple{&k, &tk, 1}, std::tuple{&v, &tv, 2}}) {
        const DTensor grad = leaf->grad();
        const bool ok = grad.defined() && grad.placements() == gradient_placements(combo[static_cast<size_t>(i)]) &&
                        allclose(grad.full_tensor(), tensor->grad(), 1e-9, 1e-9);
        EXPECT_TRUE(ok) << where << ": gradient of input " << i << " "
                        << (grad.defined() ? grad.layout().to_string() : "undefined");
        grads_ok &= ok;
      }
      if (!out_ok || !grads_ok) break;  // one report per case and mesh
    }
  }
}

}  // namespace

TEST(ShardedAttention, EqualsTheUnshardedOpWithGradients) {
  const std::vector<AttentionCase> cases = {
      {"heads", {2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 3}, false, std::nullopt, 0.0},
      {"causal", {3, 6, 2}, {3, 5, 2}, {3, 5, 3}, true, std::nullopt, 0.0},
      {"bool mask", {2, 5, 3}, {2, 6, 3}, {2, 6, 2}, false, Shape{5, 6}, 0.0},
      {"dropout causal", {2, 5, 3}, {2, 4, 3}, {2, 4, 2}, true, std::nullopt, 0.3},
  };
  for (const auto& c : cases)
    for_each_world({4, 6}, [&] { check(c); });
}

TEST(ShardedAttention, ShardedHeadsAndRowsMoveNothingForward) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    const Tensor gq = input({2, 4, 6, 3}, 1), gk = input({2, 4, 5, 3}, 2), gv = input({2, 4, 5, 2}, 3);
    {
      // Heads sharded on q, k, v alike (tensor-parallel attention): every rank attends alone.
      const DTensor q = make_input(gq, mesh, {Shard{1}}), k = make_input(gk, mesh, {Shard{1}}),
                    v = make_input(gv, mesh, {Shard{1}});
      CommDebugMode mode;
      const DTensor out = scaled_dot_product_attention(q, k, v, std::nullopt, 0, true);
      EXPECT_EQ(mode.total_count(), 0);
      EXPECT_EQ(out.placements(), (Placements{Shard{1}}));
      EXPECT_TRUE(allclose(out.full_tensor(), scaled_dot_product_attention(gq, gk, gv, std::nullopt, 0, true)));
    }
    {
      // q's rows sharded, k and v replicated (sequence-parallel queries): no communication, and
      // the gradients of k and v come back P(sum), reduced together when the backward ends (one
      // bucketed all_reduce for both).
      DTensor q = make_input(gq, mesh, {Shard{2}}), k = make_input(gk, mesh, {Replicate{}}),
              v = make_input(gv, mesh, {Replicate{}});
      for (DTensor* t : {&q, &k, &v}) t->requires_grad_();
      CommDebugMode mode;
      const DTensor out = scaled_dot_product_attention(q, k, v, std::nullopt, 0, true);
      EXPECT_EQ(mode.total_count(), 0);
      EXPECT_EQ(out.placements(), (Placements{Shard{2}}));
      sum(out).backward();
      EXPECT_EQ(mode.count(CollectiveKind::all_reduce), 1) << mode.to_string();  // dk and dv in one bucket
      EXPECT_EQ(mode.total_count(), 1) << mode.to_string();
      EXPECT_EQ(k.grad().placements(), (Placements{Replicate{}}));
    }
  });
}

TEST(ShardedAttention, ErrorsNameTheOp) {
  for_each_world({4}, [] {
    const DeviceMesh mesh({world_size()}, {"tp"});
    const DTensor q = make_input(input({2, 4, 3}, 1), mesh, {Shard{0}});
    const DTensor k = make_input(input({2, 5, 3}, 2), mesh, {Shard{0}});
    const DTensor v = make_input(input({2, 6, 2}, 3), mesh, {Shard{0}});
    EXPECT_TRUE(throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, v); },
                                        {"[scaled_dot_product_attention]", "sequence dim S"}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { scaled_dot_product_attention(q, DTensor(), k); },
                                           {"[scaled_dot_product_attention]", "undefined DTensor"}));
  });
}
