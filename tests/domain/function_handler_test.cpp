// ShardTensor's register_function_handler: an op's sharded implementation above autograd, whose
// own ops record the result's gradient in place of the op's derivative.
#include <gtest/gtest.h>

#include <tessera/domain/handlers.hpp>
#include <tessera/dtensor/ops.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Calls of the handlers on this rank (each rank is a thread, or a process under mpirun).
thread_local int handler_calls = 0;
// Whether recording was on inside the latest handler call.
thread_local bool recording_inside = false;

// sign with a straight-through gradient (the estimator of quantised training): the forward is
// sign(x), the gradient passes through unchanged. The built-in sign's gradient is zero, so the
// two are told apart by x's gradient alone.
DTensor straight_through_sign(const std::vector<DTensor>& in, const OpArgs&) {
  ++handler_calls;
  recording_inside = autograd::is_grad_enabled();
  return add(in[0], sub(sign(in[0]), in[0]).detach());
}

// Registered for a test's duration on every rank of this process (before the ranks start).
struct Registered {
  Registered(OpId op, DispatchHandler handler, bool above_autograd) : op(op) {
    if (above_autograd)
      register_function_handler(op, std::move(handler));
    else
      register_dispatch_handler(op, std::move(handler));
  }
  ~Registered() { remove_dispatch_handler(op); }
  OpId op;
};

struct Case {
  DeviceMesh mesh;
  Placements placements;
};

// Meshes and placements for a tensor with uneven pieces, Partial included.
std::vector<Case> cases() {
  const int n = world_size();
  const DeviceMesh line = line_mesh();
  const DeviceMesh grid({2, n / 2}, {"a", "b"});
  return {{line, {Shard{0}}},           {line, {Replicate{}}},           {line, {Partial{}}},
          {grid, {Shard{0}, Shard{1}}}, {grid, {Replicate{}, Shard{0}}}, {grid, {Partial{}, Shard{1}}}};
}

}  // namespace

TEST(FunctionHandler, TheHandlersOpsRecordTheGradientInPlaceOfTheOps) {
  const Registered handler(OpId::sign, straight_through_sign, true);
  for_each_world({2, 4}, [] {
    const Tensor global = data({2 * world_size() + 1, 3}, 5);  // uneven pieces, zeros included
    for (const Case& c : cases()) {
      handler_calls = 0;
      DTensor x = make_input(global, c.mesh, c.placements);
      x.requires_grad_();
      const DTensor y = sign(x);
      EXPECT_EQ(handler_calls, 1);
      EXPECT_TRUE(recording_inside) << "a function handler runs with the caller's recording";
      EXPECT_TRUE(same(y.full_tensor(), sign(global))) << to_string(c.placements);
      // d sum(2 y) / dx: 2 everywhere through the handler's graph (the built-in sign's: 0).
      sum(mul(y, 2.0)).backward();
      EXPECT_TRUE(same(x.grad().full_tensor(), full(global.shape(), 2.0))) << to_string(c.placements);
      // Without recording, the handler still computes the op, and nothing requires a gradient.
      const autograd::NoGradGuard no_grad;
      const DTensor z = sign(x);
      EXPECT_FALSE(recording_inside);
      EXPECT_FALSE(z.requires_grad());
      EXPECT_TRUE(same(z.full_tensor(), sign(global)));
    }
  });
}

TEST(FunctionHandler, TheSameHandlerBelowAutogradKeepsTheOpsDerivative) {
  // The contrast that makes the test above mean something: as a dispatch handler, the same code
  // runs without recording and the op's own derivative (zero for sign) is recorded around it.
  const Registered handler(OpId::sign, straight_through_sign, false);
  for_each_world({2}, [] {
    const Tensor global = data({5, 3}, 5);
    DTensor x = make_input(global, line_mesh(), {Shard{0}});
    x.requires_grad_();
    const DTensor y = sign(x);
    EXPECT_FALSE(recording_inside);
    EXPECT_TRUE(same(y.full_tensor(), sign(global)));
    sum(y).backward();
    EXPECT_TRUE(same(x.grad().full_tensor(), full(global.shape(), 0.0)));
  });
}

TEST(FunctionHandler, AHandlerThatMovesDataIsDifferentiableThroughItsMoves) {
  // A row-parallel matmul by name: a's rows stay sharded, b is gathered whole, and the result
  // comes back Shard(0) whatever the inputs were (the rule would pick other placements, a
  // Partial for a sharded inner dim). Its gradient flows through the handler's redistributions.
  register_function_handler("matmul", [](const std::vector<DTensor>& in, const OpArgs&) {
    ++handler_calls;
    const DeviceMesh& mesh = in[0].device_mesh();
    const Placements rows(static_cast<size_t>(mesh.ndim()), Replicate{});
    Placements a_rows = rows;
    a_rows[0] = Shard{0};
    return matmul(in[0].redistribute(a_rows), in[1].redistribute(rows));  // the built-in matmul
  });
  for_each_world({2, 3, 4}, [] {
    const Tensor a = data({2 * world_size() + 1, 5}, 2), b = data({5, 3}, 9);
    Tensor ta = a.clone(), tb = b.clone();
    ta.requires_grad_();
    tb.requires_grad_();
    const Tensor expected = matmul(ta, tb);
    sum(mul(expected, expected)).backward();
    const DeviceMesh mesh = line_mesh();
    for (const auto& [pa, pb] : std::vector<std::pair<Placements, Placements>>{{{Shard{1}}, {Shard{0}}},
                                                                               {{Shard{0}}, {Replicate{}}},
                                                                               {{Replicate{}}, {Shard{1}}},
                                                                               {{Partial{}}, {Shard{0}}}}) {
      handler_calls = 0;
      DTensor da = make_input(a, mesh, pa), db = make_input(b, mesh, pb);
      da.requires_grad_();
      db.requires_grad_();
      const DTensor out = matmul(da, db);
      EXPECT_EQ(handler_calls, 1);
      EXPECT_EQ(out.placements(), (Placements{Shard{0}})) << to_string(pa) << " @ " << to_string(pb);
      EXPECT_TRUE(same(out.full_tensor(), expected.detach()));
      sum(mul(out, out)).backward();
      EXPECT_TRUE(same(da.grad().full_tensor(), ta.grad())) << to_string(pa) << " @ " << to_string(pb);
      EXPECT_TRUE(same(db.grad().full_tensor(), tb.grad())) << to_string(pa) << " @ " << to_string(pb);
    }
  });
  remove_dispatch_handler("matmul");
}

TEST(FunctionHandler, AnInputReturnedAsItIsKeepsItsOwnGraph) {
  // abs as the identity (inputs known to be positive): the result is the input itself. Its
  // gradient passes through, and the input, returned as is, is not marked: ops on it afterwards
  // record their own derivatives.
  const Registered handler(
      OpId::abs, [](const std::vector<DTensor>& in, const OpArgs&) { return in[0]; }, true);
  for_each_world({2, 4}, [] {
    const Tensor global = data({7, 2}, 3, true);
    for (const Case& c : cases()) {
      DTensor x = make_input(global, c.mesh, c.placements);
      x.requires_grad_();
      const DTensor y = abs(x);
      EXPECT_TRUE(same(y.full_tensor(), global));
      sum(add(mul(y, 3.0), mul(x, x))).backward();  // 3 + 2x
      EXPECT_TRUE(same(x.grad().full_tensor(), add(mul(global, 2.0), 3.0))) << to_string(c.placements);
    }
  });
}

TEST(FunctionHandler, ErrorsNameTheCall) {
  EXPECT_TRUE(value_error([] { register_function_handler(OpId::matmul, nullptr); },
                          {"[register_function_handler]", "empty handler for op 'matmul'"}));
  EXPECT_TRUE(value_error([] { register_function_handler("", straight_through_sign); },
                          {"[register_function_handler]", "empty op name"}));
  EXPECT_TRUE(value_error([] { register_function_handler("handlers_test.no_such_op", straight_through_sign); },
                          {"[register_function_handler]", "'handlers_test.no_such_op' is not a built-in op",
                           "register_named_function_handler"}));
  // The handler's own error reaches the caller on every rank, none is left waiting, and the op
  // works again once the handler is removed.
  {
    const Registered failing(
        OpId::sign,
        [](const std::vector<DTensor>& in, const OpArgs&) -> DTensor {
          (void)in[0].full_tensor();  // a collective first: every rank takes part, then every rank fails
          throw ValueError("[my_sign] not today");
        },
        true);
    for_each_world({2, 4}, [] {
      DTensor x = make_input(data({5, 2}, 2), line_mesh(), {Shard{0}});
      x.requires_grad_();
      EXPECT_TRUE(value_error([&] { (void)sign(x); }, {"[my_sign] not today"}));
    });
  }
  for_each_world({2}, [] {
    const Tensor global = data({5, 2}, 2);
    DTensor x = make_input(global, line_mesh(), {Shard{0}});
    x.requires_grad_();
    const DTensor y = sign(x);
    EXPECT_TRUE(same(y.full_tensor(), sign(global)));
    sum(y).backward();
    EXPECT_TRUE(same(x.grad().full_tensor(), full(global.shape(), 0.0)));  // the built-in derivative again
  });
}
