// The DTensor conveniences (dtensor/conveniences.cpp) on real ranks: the in-place ops against the
// Tensor op on the full tensors over the sweep meshes ([4] and 2x2 in a world of 4, 2x3 in one of
// 6), every placement with P(sum), uneven [5, 3]; the Partial rules of each op for every reduce
// op; the *_like factories, to, item, equal and the printers; one test per documented error.
// Globals are small integers built identically on every rank, so every comparison is exact.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>

#include "placement_sweep.hpp"
#include "sharded_inputs.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// The deterministic global of `shape`: element i (row-major) is (3i + salt) % 17 - 8.
Tensor pattern(const Shape& shape, int64_t salt = 0, DType dtype = DType::f32) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((3 * static_cast<int64_t>(i) + salt) % 17 - 8);
  return from_vector(v, shape).to(dtype);
}


// A DTensor of `layout` whose full tensor is `global`: each rank holds (a copy of) its block, and
// along Partial mesh dims (all of one reduce op) the ranks hold pending values that reduce to it
// exactly. With g ranks in the Partial group and the calling rank's index i in it:
//   sum: i == 0 holds block - (g-1) noise, the others noise;   avg: the others block + noise;
//   max: i == 0 holds block, the others less;  min: more;  product: the others ones.
// A b8 global is held whole by every rank (sum/max of b8 is logical or: equal values reduce to it).
DTensor dtensor_of(const Tensor& global, const DeviceMesh& mesh, const Layout& layout) {
  const auto coordinate = mesh.coordinate();
  const Tensor block = block_of(global, layout.block(coordinate)).clone();
  int64_t index = 0, group = 1;
  std::optional<ReduceOp> op;
  for (size_t m = 0; m < layout.placements().size(); ++m)
    if (const auto* p = std::get_if<Partial>(&layout.placements()[m])) {
      op = p->op;
      index = index * mesh.size(static_cast<int64_t>(m)) + coordinate[m];
      group *= mesh.size(static_cast<int64_t>(m));
    }
  if (!op || global.dtype() == DType::b8) return DTensor(block, mesh, layout);
  const Tensor noise = pattern(block.shape(), 5, global.dtype());
  const Tensor away = add(abs(noise), 1);  // >= 1
  Tensor local;
  switch (*op) {
    case ReduceOp::sum:
      local = index == 0 ? sub(block, mul(noise, group - 1)) : noise;
      break;
    case ReduceOp::avg:
      local = index == 0 ? sub(block, mul(noise, group - 1)) : add(block, noise);
      break;
    case ReduceOp::max:
      local = index == 0 ? block : sub(block, away);
      break;
    case ReduceOp::min:
      local = index == 0 ? block : add(block, away);
      break;
    case ReduceOp::product:
      local = index == 0 ? block : ones_like(block);
      break;
  }
  return DTensor(local.to(global.dtype()), mesh, layout);
}

DTensor dtensor_of(const Tensor& global, const DeviceMesh& mesh, const Placements& placements) {
  return dtensor_of(global, mesh, Layout(global.shape(), global.dtype(), mesh.spec(), placements));
}

bool has_partial(const Placements& placements) {
  for (const auto& p : placements)
    if (is_partial(p)) return true;
  return false;
}

// "mesh[a=2, b=2] (S(0), P(sum))", for traces.
std::string describe(const DeviceMesh& mesh, const Placements& placements) {
  return mesh.to_string() + " " + to_string(placements);
}

}  // namespace

// --- in-place ops: oracle sweep -----------------------------------------------------------------

// Every placement combination (with P(sum)) of an uneven [5, 3] on every sweep mesh: each in-place
// op's full tensor equals the Tensor op on the full tensors, the layout is unchanged and the local
// is written in place (a handle taken from to_local() before the op sees the new values).
TEST(ConveniencesInPlace, EveryOpMatchesTheTensorOpOnEveryLayout) {
  for_each_world({4, 6}, [] {
    const Shape shape{5, 3};
    const Tensor gx = pattern(shape, 0), go = pattern(shape, 7);
    const Tensor gmask = gt(gx, 0);
    struct Case {
      std::string name;
      bool rejects_partial;
      std::function<void(DTensor& x, const DTensor& other, const DTensor& mask)> op;
      Tensor expected;
    };
    const std::vector<Case> cases = {
        {"add_", false, [](DTensor& x, const DTensor& o, const DTensor&) { x.add_(o); }, add(gx, go)},
        {"add_", false, [](DTensor& x, const DTensor&, const DTensor&) { x.add_(3); }, add(gx, 3)},
        {"mul_", true, [](DTensor& x, const DTensor& o, const DTensor&) { x.mul_(o); }, mul(gx, go)},
        {"mul_", false, [](DTensor& x, const DTensor&, const DTensor&) { x.mul_(-2); }, mul(gx, -2)},
        {"fill_", false, [](DTensor& x, const DTensor&, const DTensor&) { x.fill_(2.5); }, full(shape, 2.5)},
        {"zero_", false, [](DTensor& x, const DTensor&, const DTensor&) { x.zero_(); }, zeros(shape)},
        {"copy_", false, [](DTensor& x, const DTensor& o, const DTensor&) { x.copy_(o); }, go},
        {"masked_fill_", true, [](DTensor& x, const DTensor&, const DTensor& m) { x.masked_fill_(m, -7); },
         masked_fill(gx, gmask, -7)},
    };
    for (const auto& mesh_shape : sweep_meshes(world_size())) {
      const DeviceMesh mesh = sweep_mesh(mesh_shape);
      for (const Placements& pl : placement_combinations(2, mesh.ndim(), true)) {
        const bool partial = has_partial(pl);
        const DTensor other = dtensor_of(go, mesh, pl);
        const DTensor mask = dtensor_of(gmask, mesh, pl);
        for (const Case& c : cases) {
          SCOPED_TRACE(c.name + " on " + describe(mesh, pl) + " expecting " + c.expected.to_string());
          DTensor x = dtensor_of(gx, mesh, pl);
          const Layout before = x.layout();
          const Tensor handle = x.to_local();
          if (partial && c.rejects_partial) {
            EXPECT_TRUE(sharding_error([&] { c.op(x, other, mask); },
                                       {"[" + c.name + "]", "P(sum)", "redistribute to Replicate first"}));
            EXPECT_TRUE(same(x.full_tensor(), gx));  // nothing written
            continue;
          }
          c.op(x, other, mask);
          EXPECT_EQ(x.layout(), before);
          EXPECT_TRUE(x.to_local().is_same(handle));
          EXPECT_TRUE(same(x.full_tensor(), c.expected));
          if (!partial) {
            EXPECT_TRUE(same(handle, my_block(c.expected, x)));
          }
        }
        // The operands were only read.
        EXPECT_TRUE(same(other.full_tensor(), go));
      }
    }
  });
}

// The storage of a from_local view is the caller's: an in-place op writes through to it.
TEST(ConveniencesInPlace, WritesThroughToTheCallersStorage) {
  for_each_world({4, 6}, [] {
    const DeviceMesh mesh = sweep_mesh({world_size()});
    const Tensor g = pattern({3, 2 * world_size()});
    Tensor storage = g.clone();
    const Tensor view = storage.narrow(1, 2 * rank(), 2);  // a strided view of the caller's tensor
    DTensor x = DTensor::from_local(view, mesh, {Shard{1}});
    x.add_(10).mul_(2);  // chained: each returns the DTensor itself
    EXPECT_TRUE(same(view, mul(add(g.narrow(1, 2 * rank(), 2), 10), 2)));
    EXPECT_TRUE(same(storage.narrow(1, 2 * rank(), 2), view));
    EXPECT_TRUE(same(x.full_tensor(), mul(add(g, 10), 2)));
    // copy_ converts the dtype of its source; masked_fill_ takes a b8 mask of the same layout.
    const DTensor src = dtensor_of(pattern(g.shape(), 3, DType::f64), mesh, {Shard{1}});
    x.copy_(src);
    EXPECT_TRUE(same(x.full_tensor(), pattern(g.shape(), 3)));
    EXPECT_EQ(x.dtype(), DType::f32);
    x.masked_fill_(dtensor_of(lt(g, 0), mesh, {Shard{1}}), 100);
    EXPECT_TRUE(same(view, masked_fill(pattern(g.shape(), 3), lt(g, 0), 100).narrow(1, 2 * rank(), 2)));
    // A wider operand dtype is fine when its category is not higher (i32 += i64 stays i32).
    DTensor i = dtensor_of(pattern(g.shape(), 0, DType::i32), mesh, {Shard{1}});
    i.add_(dtensor_of(pattern(g.shape(), 1, DType::i64), mesh, {Shard{1}})).mul_(3);
    EXPECT_TRUE(same(i.full_tensor(), mul(add(pattern(g.shape(), 0, DType::i64), pattern(g.shape(), 1, DType::i64)), 3)
                                          .to(DType::i32)));
  });
}

// --- in-place ops: the Partial rules, per reduce op ------------------------------------------------

TEST(ConveniencesInPlace, PartialRulesPerReduceOp) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    const DeviceMesh line = sweep_mesh({n});
    const DeviceMesh grid = sweep_mesh({2, n / 2});
    const Shape shape{5, 3};
    const Tensor gx = pattern(shape, 1), go = pattern(shape, 4);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::product}) {
      const Placement p = Partial{op};
      const std::string text = to_string(p);
      const bool linear = op == ReduceOp::sum || op == ReduceOp::avg;
      const std::vector<std::pair<const DeviceMesh*, Placements>> layouts = {
          {&line, {p}}, {&grid, {p, Shard{0}}}, {&grid, {Shard{1}, p}}, {&grid, {p, p}}, {&grid, {Replicate{}, p}}};
      for (const auto& [mesh, pl] : layouts) {
        SCOPED_TRACE(describe(*mesh, pl));
        const auto fresh = [&] { return dtensor_of(gx, *mesh, pl); };
        ASSERT_TRUE(same(fresh().full_tensor(), gx));  // the construction itself

        // add_(scalar): once, whatever the reduction, except a product.
        DTensor x = fresh();
        if (op == ReduceOp::product) {
          EXPECT_TRUE(sharding_error([&] { x.add_(3); }, {"[add_]", text, "redistribute to Replicate first"}));
        } else {
          x.add_(3);
          EXPECT_TRUE(same(x.full_tensor(), add(gx, 3)));
        }
        // mul_(scalar): linear reductions scale; max/min take non-negative factors only.
        x = fresh();
        if (op == ReduceOp::product) {
          EXPECT_TRUE(sharding_error([&] { x.mul_(2); }, {"[mul_]", text, "each rank's factor"}));
        } else {
          x.mul_(2);
          EXPECT_TRUE(same(x.full_tensor(), mul(gx, 2)));
        }
        x = fresh();
        if (linear) {
          x.mul_(-3);
          EXPECT_TRUE(same(x.full_tensor(), mul(gx, -3)));
        } else {
          EXPECT_TRUE(sharding_error([&] { x.mul_(-3); },
                                     {"[mul_]", text, op == ReduceOp::product ? "each rank's factor" : "factor -3",
                                      "redistribute to Replicate first"}));
          EXPECT_TRUE(same(x.full_tensor(), gx));
        }
        // fill_ and zero_: the value once, for every reduction.
        x = fresh();
        x.fill_(4);
        EXPECT_EQ(x.placements(), pl);
        EXPECT_TRUE(same(x.full_tensor(), full(shape, 4)));
        x = fresh();
        x.zero_();
        EXPECT_TRUE(same(x.to_local(), zeros(x.to_local().shape())));  // zeros on every rank
        EXPECT_TRUE(same(x.full_tensor(), zeros(shape)));
        // add_(DTensor): pending values add up under sum and avg only.
        x = fresh();
        const DTensor o = dtensor_of(go, *mesh, pl);
        if (linear) {
          x.add_(o);
          EXPECT_TRUE(same(x.full_tensor(), add(gx, go)));
        } else {
          EXPECT_TRUE(sharding_error([&] { x.add_(o); }, {"[add_]", text, "redistribute to Replicate first"}));
        }
        // copy_ hands the pending values over as they are, for every reduction.
        x = fresh();
        x.copy_(o);
        EXPECT_TRUE(same(x.full_tensor(), go));
        // mul_(DTensor) and masked_fill_ never take a Partial.
        x = fresh();
        EXPECT_TRUE(sharding_error([&] { x.mul_(o); }, {"[mul_]", text, "redistribute to Replicate first"}));
        EXPECT_TRUE(sharding_error([&] { x.masked_fill_(dtensor_of(gt(gx, 0), *mesh, pl), 1); },
                                   {"[masked_fill_]", text, "redistribute to Replicate first"}));
        EXPECT_TRUE(same(x.full_tensor(), gx));
      }
    }
  });
}

// --- in-place ops: errors ------------------------------------------------------------------------

TEST(ConveniencesInPlace, Errors) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    const DeviceMesh line = sweep_mesh({n});
    const DeviceMesh grid = sweep_mesh({2, n / 2});
    const Tensor g = pattern({5, 3});
    DTensor x = dtensor_of(g, line, {Shard{0}});
    const std::string mine = "[5, 3] f32 on mesh[a=" + std::to_string(n) + "] as (S(0))";

    // Mismatched layouts: placements, shape, mesh; both layouts named.
    const DTensor replicated = dtensor_of(g, line, {Replicate{}});
    EXPECT_TRUE(sharding_error([&] { x.add_(replicated); },
                               {"[add_]", "other has layout [5, 3] f32 on mesh[a=" + std::to_string(n) + "] as (R)",
                                "the target has " + mine, "redistribute"}));
    const DTensor wide = dtensor_of(pattern({5, 4}), line, {Shard{0}});
    EXPECT_TRUE(sharding_error([&] { x.mul_(wide); }, {"[mul_]", "[5, 4] f32", mine}));
    const DTensor other_mesh = dtensor_of(g, grid, {Shard{0}, Replicate{}});
    EXPECT_TRUE(sharding_error([&] { x.copy_(other_mesh); }, {"[copy_]", "src has layout", "mesh[a=2, b=", mine}));
    EXPECT_TRUE(sharding_error([&] { x.masked_fill_(dtensor_of(gt(g, 0), line, {Shard{1}}), 0); },
                               {"[masked_fill_]", "mask has layout [5, 3] b8", "(S(1))", mine}));
    // A b8 mask of the same placements is fine; a dtype difference is not a layout difference.
    x.masked_fill_(dtensor_of(gt(g, 0), line, {Shard{0}}), 0);
    EXPECT_TRUE(same(x.full_tensor(), masked_fill(g, gt(g, 0), 0)));
    x.copy_(dtensor_of(g, line, {Shard{0}}));

    // Undefined target or operand.
    DTensor undefined;
    EXPECT_TRUE(sharding_error([&] { undefined.add_(1); }, {"[add_]", "the target is an undefined DTensor"}));
    EXPECT_TRUE(sharding_error([&] { undefined.zero_(); }, {"[zero_]", "undefined DTensor"}));
    EXPECT_TRUE(sharding_error([&] { x.copy_(undefined); }, {"[copy_]", "src is an undefined DTensor"}));
    EXPECT_TRUE(sharding_error([&] { x.masked_fill_(undefined, 1); }, {"[masked_fill_]", "mask is an undefined"}));

    // The result's dtype may not be of a higher category than the target's (as torch).
    DTensor ints = dtensor_of(pattern({5, 3}, 0, DType::i32), line, {Shard{0}});
    EXPECT_TRUE(value_error([&] { ints.add_(2.5); }, {"[add_]", "result dtype f32", "into i32"}));
    EXPECT_TRUE(value_error([&] { ints.mul_(x); }, {"[mul_]", "result dtype f32", "into i32"}));
    EXPECT_TRUE(same(ints.full_tensor(), pattern({5, 3}, 0, DType::i32)));

    // A target that requires a gradient: ValueError, as Tensor::copy_; fine under NoGradGuard.
    DTensor w = dtensor_of(g, line, {Shard{0}});
    w.requires_grad_();
    const std::vector<std::string> grad_parts = {"in-place write into DTensor(" + mine + ")",
                                                 "requires a gradient", "NoGradGuard"};
    for (const auto& [name, op] : std::vector<std::pair<std::string, std::function<void()>>>{
             {"add_", [&] { w.add_(1); }},
             {"add_", [&] { w.add_(x); }},
             {"mul_", [&] { w.mul_(2); }},
             {"mul_", [&] { w.mul_(x); }},
             {"fill_", [&] { w.fill_(1); }},
             {"zero_", [&] { w.zero_(); }},
             {"copy_", [&] { w.copy_(x); }},
             {"masked_fill_", [&] { w.masked_fill_(x, 1); }}}) {
      std::vector<std::string> parts{"[" + name + "]"};
      parts.insert(parts.end(), grad_parts.begin(), grad_parts.end());
      EXPECT_TRUE(value_error(op, parts));
    }
    EXPECT_TRUE(same(w.full_tensor(), g));
    {
      autograd::NoGradGuard no_grad;
      w.add_(1);
    }
    EXPECT_TRUE(same(w.detach().full_tensor(), add(g, 1)));
    EXPECT_TRUE(w.requires_grad());
    // An operand that requires a gradient would lose it: ValueError.
    EXPECT_TRUE(value_error([&] { x.add_(w); }, {"[add_]", "other DTensor(" + mine + ") requires a gradient"}));
    EXPECT_TRUE(value_error([&] { x.copy_(w); }, {"[copy_]", "src", "requires a gradient"}));
    x.copy_(w.detach());
    EXPECT_TRUE(same(x.full_tensor(), add(g, 1)));
  });
}

// --- *_like ----------------------------------------------------------------------------------------

TEST(ConveniencesLike, KeepLayoutAndDtype) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    const Shape shape{5, 3};
    for (const auto& mesh_shape : sweep_meshes(n)) {
      const DeviceMesh mesh = sweep_mesh(mesh_shape);
      for (const Placements& pl : placement_combinations(2, mesh.ndim(), true)) {
        SCOPED_TRACE(describe(mesh, pl));
        const DTensor x = dtensor_of(pattern(shape, 0, DType::bf16), mesh, pl);
        const Layout i64_layout = x.layout().with_dtype(DType::i64);

        const DTensor z = zeros_like(x);
        EXPECT_EQ(z.layout(), x.layout());
        EXPECT_FALSE(z.requires_grad());
        EXPECT_TRUE(same(z.to_local(), zeros(x.to_local().shape(), DType::bf16)));
        EXPECT_TRUE(same(z.full_tensor(), zeros(shape, DType::bf16)));
        const DTensor zi = zeros_like(x, DType::i64);
        EXPECT_EQ(zi.layout(), i64_layout);
        EXPECT_TRUE(same(zi.full_tensor(), zeros(shape, DType::i64)));
        const DTensor e = empty_like(x, DType::i64);
        EXPECT_EQ(e.layout(), i64_layout);
        EXPECT_EQ(e.to_local().shape(), x.to_local().shape());
        EXPECT_EQ(e.to_local().dtype(), DType::i64);

        if (has_partial(pl)) {
          for (const auto& [name, make] : std::vector<std::pair<std::string, std::function<void()>>>{
                   {"ones_like", [&] { (void)ones_like(x); }},
                   {"full_like", [&] { (void)full_like(x, 2); }},
                   {"rand_like", [&] { (void)rand_like(x); }},
                   {"randn_like", [&] { (void)randn_like(x); }}})
            EXPECT_TRUE(sharding_error(make, {"[" + name + "]", x.to_string(), "is Partial",
                                              "redistribute to Replicate first"}));
          continue;
        }
        const DTensor o = ones_like(x);
        EXPECT_EQ(o.layout(), x.layout());
        EXPECT_TRUE(same(o.to_local(), ones(x.to_local().shape(), DType::bf16)));
        EXPECT_TRUE(same(o.full_tensor(), ones(shape, DType::bf16)));
        const DTensor f = full_like(x, -2.5, DType::f64);
        EXPECT_EQ(f.layout(), x.layout().with_dtype(DType::f64));
        EXPECT_TRUE(same(f.full_tensor(), full(shape, -2.5, DType::f64)));
        const DTensor fi = full_like(zi, 7);
        EXPECT_EQ(fi.layout(), i64_layout);
        EXPECT_TRUE(same(fi.full_tensor(), full(shape, 7, DType::i64)));

        // rand_like/randn_like: the rand/randn factories for that shape and placements, bit for bit.
        manual_seed(11);
        const DTensor u = rand_like(x);
        const DTensor v = randn_like(x, DType::f32);
        manual_seed(11);
        const DTensor ru = rand(shape, mesh, pl, DType::bf16);
        const DTensor rv = randn(shape, mesh, pl, DType::f32);
        EXPECT_EQ(u.layout(), x.layout());
        EXPECT_EQ(v.layout(), x.layout().with_dtype(DType::f32));
        EXPECT_TRUE(same(u.to_local(), ru.to_local()));
        EXPECT_TRUE(same(v.to_local(), rv.to_local()));
        manual_seed(11);
        EXPECT_TRUE(same(u.full_tensor(), rand(shape, DType::bf16)));
      }
    }
  });
}

TEST(ConveniencesLike, ExplicitSizesAndErrors) {
  for_each_world({4, 6}, [] {
    const int n = world_size(), r = rank();
    const DeviceMesh line = sweep_mesh({n});
    // Rank r holds r + 1 rows: explicit piece sizes the *_like results keep.
    std::vector<int64_t> rows;
    for (int i = 0; i < n; ++i) rows.push_back(i + 1);
    const int64_t total = n * (n + 1) / 2;
    FromLocalOptions options;
    options.sizes = {{0, rows}};
    const DTensor x = DTensor::from_local(pattern({r + 1, 2}), line, {Shard{0}}, options);
    ASSERT_EQ(x.shape(), (Shape{total, 2}));
    for (const DTensor& like : {zeros_like(x), ones_like(x), full_like(x, 3), empty_like(x), rand_like(x)}) {
      EXPECT_EQ(like.layout(), x.layout());
      EXPECT_EQ(like.layout().piece_sizes(0), rows);
    }
    manual_seed(3);
    const DTensor u = randn_like(x);
    manual_seed(3);
    EXPECT_TRUE(same(u.full_tensor(), randn({total, 2})));  // the slice of the unsharded draw

    const DTensor undefined;
    EXPECT_TRUE(sharding_error([&] { (void)zeros_like(undefined); }, {"[zeros_like]", "undefined DTensor"}));
    EXPECT_TRUE(sharding_error([&] { (void)rand_like(undefined); }, {"[rand_like]", "undefined DTensor"}));
    EXPECT_TRUE(value_error([&] { (void)rand_like(x, DType::i32); }, {}));
  });
}

// --- to, item, equal -------------------------------------------------------------------------------

TEST(ConveniencesTo, ConvertsEachLocalKeepingTheLayout) {
  for_each_world({4, 6}, [] {
    for (const auto& mesh_shape : sweep_meshes(world_size())) {
      const DeviceMesh mesh = sweep_mesh(mesh_shape);
      for (const Placements& pl : placement_combinations(2, mesh.ndim(), true)) {
        SCOPED_TRACE(describe(mesh, pl));
        const Tensor g = pattern({5, 3}, 2);
        const DTensor x = dtensor_of(g, mesh, pl);
        const DTensor same_dtype = x.to(DType::f32);
        EXPECT_TRUE(same_dtype.to_local().is_same(x.to_local()));
        // A P(sum) of small integers converts exactly into an integer dtype, each rank's term alone.
        for (DType dtype : {DType::f64, DType::i32, DType::bf16}) {
          const DTensor y = x.to(dtype);
          EXPECT_EQ(y.layout(), x.layout().with_dtype(dtype));
          EXPECT_TRUE(same(y.to_local(), x.to_local().to(dtype)));
          EXPECT_TRUE(same(y.full_tensor(), g.to(dtype)));
        }
      }
    }
    // Recorded for autograd: the gradient comes back in the source dtype.
    const DeviceMesh line = sweep_mesh({world_size()});
    DTensor w = dtensor_of(pattern({5, 3}), line, {Shard{0}});
    w.requires_grad_();
    const DTensor y = w.to(DType::f64);
    EXPECT_EQ(y.grad_fn_name(), "to");
    sum(mul(y, 2.0)).backward();
    EXPECT_EQ(w.grad().dtype(), DType::f32);
    EXPECT_TRUE(same(w.grad().full_tensor(), full({5, 3}, 2.0)));
    EXPECT_TRUE(sharding_error([] { (void)DTensor().to(DType::f64); }, {"[DTensor::to]", "undefined DTensor"}));
  });
}

TEST(ConveniencesItem, OneElementOnEveryRank) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    const DeviceMesh line = sweep_mesh({n});
    const DeviceMesh grid = sweep_mesh({2, n / 2});
    // [1] as S(0): one rank holds the element, the others empty pieces.
    const Scalar a = dtensor_of(full({1}, -2.5), line, {Shard{0}}).item();
    EXPECT_TRUE(a.is_floating());
    EXPECT_EQ(a.to_double(), -2.5);
    // A P(sum) [1, 1] on the grid: the pending values are reduced.
    EXPECT_EQ(dtensor_of(full({1, 1}, 6.0), grid, {Partial{}, Shard{1}}).item().to_double(), 6.0);
    EXPECT_EQ(dtensor_of(full({1, 1}, 6.0), grid, {Partial{ReduceOp::max}, Partial{ReduceOp::max}}).item().to_double(),
              6.0);
    // A 0-d i64 keeps an integral Scalar; b8 a boolean one.
    const Scalar i = dtensor_of(full({}, 41, DType::i64), grid, {Replicate{}, Partial{}}).item();
    EXPECT_EQ(i.kind(), Scalar::Kind::integral);
    EXPECT_EQ(i.to_int(), 41);
    EXPECT_EQ(dtensor_of(full({1}, 1, DType::b8), line, {Replicate{}}).item().kind(), Scalar::Kind::boolean);
    // Two elements: ValueError naming the shape, on every rank, before any communication.
    const DTensor two = dtensor_of(pattern({2}), line, {Shard{0}});
    EXPECT_TRUE(value_error([&] { (void)two.item(); },
                            {"[item]", "DTensor([2] f32 on mesh[a=" + std::to_string(n) + "] as (S(0)))",
                             "has shape [2] with 2 elements", "expected exactly one"}));
    EXPECT_TRUE(sharding_error([] { (void)DTensor().item(); }, {"[item]", "undefined DTensor"}));
  });
}

TEST(ConveniencesEqual, SameAnswerOnEveryRank) {
  for_each_world({4, 6}, [] {
    const int n = world_size();
    const Shape shape{5, 3};
    const Tensor g = pattern(shape, 0);
    // One element changed: held by one rank only in sharded layouts.
    Tensor changed = g.clone();
    changed.narrow(0, 4, 1).narrow(1, 2, 1).fill_(99);
    for (const auto& mesh_shape : sweep_meshes(n)) {
      const DeviceMesh mesh = sweep_mesh(mesh_shape);
      const auto combos = placement_combinations(2, mesh.ndim(), true);
      for (const Placements& pa : combos)
        for (const Placements& pb : {combos.front(), combos[1], combos.back(), pa}) {
          SCOPED_TRACE("a " + describe(mesh, pa) + ", b " + to_string(pb));
          const DTensor a = dtensor_of(g, mesh, pa);
          EXPECT_TRUE(equal(a, dtensor_of(g, mesh, pb)));
          EXPECT_FALSE(equal(a, dtensor_of(changed, mesh, pb)));
          EXPECT_FALSE(equal(dtensor_of(changed, mesh, pa), dtensor_of(g, mesh, pb)));
        }
      const DTensor a = dtensor_of(g, mesh, combos[1]);
      EXPECT_FALSE(equal(a, dtensor_of(g.to(DType::f64), mesh, combos[1])));  // another dtype
      EXPECT_FALSE(equal(a, dtensor_of(pattern({3, 5}), mesh, combos[1])));   // another shape
      EXPECT_TRUE(equal(a, a));
    }
    // Every rank computes the same verdict: gather them to check.
    const DeviceMesh line = sweep_mesh({n});
    const bool verdict = equal(dtensor_of(g, line, {Shard{0}}), dtensor_of(changed, line, {Shard{1}}));
    const DTensor verdicts =
        DTensor::from_local(full({1}, verdict ? 1 : 0, DType::i64), line, {Shard{0}}).redistribute({Replicate{}});
    EXPECT_TRUE(same(verdicts.to_local(), zeros({n}, DType::i64)));

    const DeviceMesh grid = sweep_mesh({2, n / 2});
    EXPECT_TRUE(sharding_error([&] { (void)equal(dtensor_of(g, line, {Shard{0}}), dtensor_of(g, grid, {Shard{0}, Shard{1}})); },
                               {"[equal]", "different meshes", "mesh[a=" + std::to_string(n) + "]", "mesh[a=2, b="}));
    EXPECT_TRUE(sharding_error([&] { (void)equal(DTensor(), dtensor_of(g, line, {Shard{0}})); },
                               {"[equal]", "a is an undefined DTensor"}));
  });
}

// --- printing ----------------------------------------------------------------------------------------

TEST(ConveniencesPrint, CanonicalForms) {
  const auto text = [](const auto& value) {
    std::ostringstream out;
    out << value;
    return out.str();
  };
  EXPECT_EQ(text(Shape{8, 6}), "[8, 6]");
  EXPECT_EQ(text(Shape{}), "[]");
  EXPECT_EQ(text(Strides{3, 1}), "[3, 1]");
  EXPECT_EQ(text(Placement(Shard{0})), "S(0)");
  EXPECT_EQ(text(Placement(Replicate{})), "R");
  EXPECT_EQ(text(Placement(Partial{ReduceOp::max})), "P(max)");
  EXPECT_EQ(text(Placements{Shard{0}, Replicate{}}), "(S(0), R)");
  EXPECT_EQ(text(Placements{Partial{}}), "(P(sum))");
  EXPECT_EQ(text(Placements{}), "()");
  for_each_world({4, 6}, [&] {
    const int n = world_size();
    const DeviceMesh grid = sweep_mesh({2, n / 2});
    const DTensor x = dtensor_of(pattern({8, 6}), grid, {Shard{0}, Replicate{}});
    EXPECT_EQ(text(x), "DTensor([8, 6] f32 on mesh[a=2, b=" + std::to_string(n / 2) + "] as (S(0), R))");
    EXPECT_EQ(text(x), x.to_string());
    EXPECT_EQ(text(x.to(DType::i64).placements()), "(S(0), R)");
  });
}
