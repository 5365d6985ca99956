// ShardTensor's custom sharded implementations: register_dispatch_handler and
// register_named_function_handler replace an op's rule and kernel with the user's sharded code.
#include <gtest/gtest.h>

#include <tessera/domain/handlers.hpp>
#include <tessera/dtensor/dispatch.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/dtensor/sharded_op.hpp>

#include "rank_test_util.hpp"
#include "sharded_inputs.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Calls of the handlers on this rank (each rank is a thread, or a process under mpirun).
thread_local int handler_calls = 0;

Placements all_replicate(const DeviceMesh& mesh) { return Placements(static_cast<size_t>(mesh.ndim()), Replicate{}); }

// A user's sharded sum unlike the built-in rule: it gathers the input and returns a Replicate
// result, where the built-in reduces shards locally and returns a Partial.
DTensor gathering_sum(const std::vector<DTensor>& inputs, const OpArgs& args) {
  ++handler_calls;
  EXPECT_FALSE(autograd::is_grad_enabled()) << "a dispatch handler runs below autograd";
  const auto& reduce = std::get<ReduceArgs>(args);
  const Tensor total = sum(inputs[0].full_tensor(), reduce.dims.vec(), reduce.keepdim);
  return DTensor::from_local(total, inputs[0].device_mesh(), all_replicate(inputs[0].device_mesh()));
}

// Registered for a test's duration on every rank of this process (before the ranks start, so
// that no rank runs the op while another registers or removes its handler).
struct Registered {
  explicit Registered(OpId op, DispatchHandler handler) : op(op) { register_dispatch_handler(op, std::move(handler)); }
  ~Registered() { remove_dispatch_handler(op); }
  OpId op;
};

}  // namespace

TEST(DispatchHandler, ReplacesTheRuleAndKeepsTheOpsDerivative) {
  const Registered sum_handler(OpId::sum, gathering_sum);
  for_each_world({2, 4}, [] {
    handler_calls = 0;
    const int n = world_size();
    const DeviceMesh line = line_mesh();
    const DeviceMesh grid({2, n / 2}, {"a", "b"});
    const Tensor global = data({2 * n + 1, 3}, 7);  // uneven pieces
    for (const auto& [mesh, placements] :
         std::vector<std::pair<DeviceMesh, Placements>>{{line, {Shard{0}}},
                                                        {line, {Replicate{}}},
                                                        {grid, {Shard{0}, Shard{1}}},
                                                        {grid, {Replicate{}, Shard{0}}}}) {
      DTensor x = make_input(global, mesh, placements);
      x.requires_grad_();
      const int before = handler_calls;
      const DTensor rows = sum(x, {0});
      EXPECT_EQ(handler_calls, before + 1);
      // The handler's placements, not the rule's (which gives a Partial for a sharded dim 0).
      EXPECT_EQ(rows.placements(), all_replicate(mesh)) << to_string(placements);
      EXPECT_TRUE(same(rows.full_tensor(), sum(global, {0})));
      // The op's own derivative is recorded around the handler: d sum / dx = 1 everywhere.
      sum(rows).backward();
      EXPECT_TRUE(same(x.grad().full_tensor(), full(global.shape(), 1.0))) << to_string(placements);
    }
    // A full reduction and keepdim reach the handler as ReduceArgs.
    const DTensor x = make_input(global, grid, {Shard{0}, Replicate{}});
    EXPECT_TRUE(same(sum(x, {0, 1}, true).full_tensor(), sum(global, {0, 1}, true)));
  });
  // Removed: the rule decides again (a Partial for a sharded dim 0).
  remove_dispatch_handler(OpId::sum);
  for_each_world({2}, [] {
    const DTensor x = make_input(data({5, 3}, 1), line_mesh(), {Shard{0}});
    EXPECT_TRUE(is_partial(sum(x, {0}).placements()[0]));
  });
}

TEST(DispatchHandler, CallsOfTheOpInsideItsHandlerTakeTheBuiltInPath) {
  // By name, as PhysicsNeMo matches an op whose overload object differs.
  register_dispatch_handler("add", [](const std::vector<DTensor>& in, const OpArgs&) {
    ++handler_calls;
    const Placements r = all_replicate(in[0].device_mesh());
    return add(in[0].redistribute(r), in[1].redistribute(r));  // the built-in add, not this handler again
  });
  for_each_world({2, 3}, [] {
    handler_calls = 0;
    const DeviceMesh mesh = line_mesh();
    const Tensor a = data({7, 2}, 3), b = data({7, 2}, 4);
    const DTensor out = add(make_input(a, mesh, {Shard{0}}), make_input(b, mesh, {Shard{1}}));
    EXPECT_EQ(handler_calls, 1);
    EXPECT_EQ(out.placements(), (Placements{Replicate{}}));
    EXPECT_TRUE(same(out.full_tensor(), add(a, b)));
    // A Scalar operand keeps the built-in path: its value does not reach the dispatcher.
    const DTensor shifted = add(make_input(a, mesh, {Shard{0}}), 2.0);
    EXPECT_EQ(handler_calls, 1);
    EXPECT_TRUE(same(shifted.full_tensor(), add(a, 2.0)));
  });
  remove_dispatch_handler("add");
}

TEST(DispatchHandler, ANamedFunctionHandlerRunsACustomOpWithoutARule) {
  // A custom op (call_sharded by name) with no rule at all: the handler is its implementation.
  register_named_function_handler("handlers_test.row_norms", [](const std::vector<DTensor>& in, const OpArgs&) {
    ++handler_calls;
    // Rows stay where they are: each rank squares and sums its own rows' columns after
    // gathering the columns (dim 1) it lacks.
    const DTensor rows = in[0].redistribute(Placements{Shard{0}});
    return sqrt(sum(mul(rows, rows), {1}));
  });
  for_each_world({2, 4}, [] {
    handler_calls = 0;
    const DeviceMesh mesh = line_mesh();
    const Tensor x = data({9, 5}, 11);
    for (const Placements& p : {Placements{Shard{1}}, Placements{Shard{0}}, Placements{Replicate{}}}) {
      const DTensor out =
          call_sharded("handlers_test.row_norms", {make_input(x, mesh, p)}, [](const std::vector<Tensor>&) -> Tensor {
            ADD_FAILURE() << "the kernel runs only without a handler";
            return {};
          });
      EXPECT_EQ(out.placements(), (Placements{Shard{0}}));
      EXPECT_TRUE(same(out.full_tensor(), sqrt(sum(mul(x, x), {1})))) << to_string(p);
    }
    EXPECT_EQ(handler_calls, 3);
  });
  remove_dispatch_handler("handlers_test.row_norms");
}

TEST(DispatchHandler, ErrorsNameTheCall) {
  EXPECT_TRUE(value_error([] { register_dispatch_handler(OpId::matmul, nullptr); },
                          {"[register_dispatch_handler]", "empty handler for op 'matmul'"}));
  EXPECT_TRUE(value_error([] { register_dispatch_handler("handlers_test.no_such_op", gathering_sum); },
                          {"[register_dispatch_handler]", "'handlers_test.no_such_op' is not a built-in op",
                           "register_named_function_handler"}));
  EXPECT_TRUE(value_error([] { register_named_function_handler("matmul", gathering_sum); },
                          {"[register_named_function_handler]", "'matmul' is a built-in op"}));
  EXPECT_FALSE(has_dispatch_handler(RuleRegistry::id(OpId::matmul)));
  // A handler whose result is not a DTensor on the inputs' mesh fails the call on every rank.
  {
    const Registered bad(OpId::neg, [](const std::vector<DTensor>&, const OpArgs&) { return DTensor(); });
    for_each_world({2}, [] {
      const DTensor x = make_input(data({4, 2}, 2), line_mesh(), {Shard{0}});
      const std::string mesh = "mesh[x=" + std::to_string(world_size()) + "]";
      EXPECT_TRUE(
          sharding_error([&] { (void)neg(x); }, {"[neg]", "the dispatch handler of 'neg' returned an undefined DTensor",
                                                 "[4, 2] f32 on " + mesh + " as (S(0))"}));
    });
  }
  {
    const Registered elsewhere(OpId::neg, [](const std::vector<DTensor>& in, const OpArgs&) {
      const DeviceMesh other({world_size()}, {"other"});
      return DTensor::from_local(neg(in[0].to_local()), other, {Replicate{}});
    });
    for_each_world({2}, [] {
      const DTensor x = make_input(data({4, 2}, 2), line_mesh(), {Replicate{}});
      const std::string n = std::to_string(world_size());
      EXPECT_TRUE(sharding_error([&] { (void)neg(x); }, {"[neg]", "returned a DTensor on mesh[other=" + n + "]",
                                                         "its inputs live on mesh[x=" + n + "]"}));
    });
  }
  // The handler's own error reaches the caller, and the op works again afterwards.
  {
    const Registered failing(OpId::neg, [](const std::vector<DTensor>&, const OpArgs&) -> DTensor {
      throw ValueError("[my_neg] not today");
    });
    for_each_world({2}, [] {
      const DTensor x = make_input(data({4, 2}, 2), line_mesh(), {Shard{0}});
      EXPECT_TRUE(value_error([&] { (void)neg(x); }, {"[my_neg] not today"}));
    });
  }
  for_each_world({2}, [] {
    const Tensor global = data({4, 2}, 2);
    EXPECT_TRUE(same(neg(make_input(global, line_mesh(), {Shard{0}})).full_tensor(), neg(global)));
  });
}
