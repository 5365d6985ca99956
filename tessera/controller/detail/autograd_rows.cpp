// Autograd on the workers, by name: a controller program marks parameters, runs backward from a
// loss, reads gradients and steps SGD without a remote function (Monarch's workers run torch's
// autograd on the tensors the controller's ops made). Each worker's values keep their autograd
// history, as DTensor's do; the rows that change a tensor in place are issued as writes
// (call_inplace), so the stream rules order them.
#include <tessera/controller/detail/op_rows.hpp>

#include <string>

#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera::controller::detail {

namespace {

OpArgs no_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && a.ints.empty() && a.shape.empty() && a.placements.empty() && a.text.empty(), a, op,
              "no arguments besides its inputs");
  return ListArgs{};
}

// A leaf's gradient, or ValueError naming `op` and the tensor when it has none yet.
DTensor gradient_of(const DTensor& p, const char* op) {
  TESSERA_CHECK(p.requires_grad(), ValueError, op, "the tensor ", p.to_string(),
                " does not require a gradient (requires_grad_ it before the forward)");
  TESSERA_CHECK(p.is_leaf(), ValueError, op, "the tensor ", p.to_string(), " is the result of ", p.grad_fn_name(),
                ", not a leaf: only leaves keep a gradient");
  const DTensor g = p.grad();
  TESSERA_CHECK(g.defined(), ValueError, op, "the tensor ", p.to_string(),
                " has no gradient yet (no backward reached it since it was made or zeroed)");
  return g;
}

}  // namespace

void add_autograd_rows(OpTable& t) {
  using In = const std::vector<DTensor>&;
  using Mesh = const DeviceMesh&;
  // requires_grad_(t, [on]): in place. The value becomes a leaf that records what reads it.
  t["requires_grad_"] = OpRow{1,
                              [](const CallArgs& a, const std::string& op) {
                                check_takes(a.scalars.empty() && a.ints.size() <= 1 && a.shape.empty() &&
                                                a.placements.empty() && a.text.empty(),
                                            a, op, "at most one integer (on)");
                                return OpArgs{ListArgs{{}, a.ints, {}, {}}};
                              },
                              [](In in, const OpArgs& a, Mesh) {
                                const auto& ints = std::get<ListArgs>(a).ints;
                                DTensor out = in[0];
                                out.requires_grad_(ints.empty() || ints[0] != 0);
                                return out;
                              }};
  t["detach"] = OpRow{1, no_args, [](In in, const OpArgs&, Mesh) { return in[0].detach(); }};
  // backward(loss, [grad]): in place on the loss, which stays as it is; the leaves' gradients
  // accumulate (reduced over the mesh as DTensor's backward reduces them).
  t["backward"] = OpRow{1, no_args,
                        [](In in, const OpArgs&, Mesh) {
                          if (in.size() > 1)
                            in[0].backward(in[1]);
                          else
                            in[0].backward();
                          return in[0];
                        },
                        2};
  // grad(t): the leaf's accumulated gradient, as a tensor of its own.
  t["grad"] = OpRow{1, no_args, [](In in, const OpArgs&, Mesh) { return gradient_of(in[0], "grad"); }};
  // zero_grad_(t): in place; the leaf's gradient is cleared (torch's set_to_none).
  t["zero_grad_"] = OpRow{1, no_args, [](In in, const OpArgs&, Mesh) {
                            DTensor p = in[0];
                            TESSERA_CHECK(p.requires_grad() && p.is_leaf(), ValueError, "zero_grad_", "the tensor ",
                                          p.to_string(), " is not a leaf that requires a gradient");
                            p.set_grad(DTensor());
                            return p;
                          }};
  // sgd_step_(p, lr, [weight_decay]): in place, torch.optim.SGD's update without momentum,
  // p -= lr (grad + weight_decay p), written into p's shard: p stays the same leaf.
  t["sgd_step_"] = OpRow{1,
                         [](const CallArgs& a, const std::string& op) {
                           check_takes(!a.scalars.empty() && a.scalars.size() <= 2 && a.ints.empty() &&
                                           a.shape.empty() && a.placements.empty() && a.text.empty(),
                                       a, op, "one or two scalars [lr, weight_decay]");
                           return OpArgs{ListArgs{a.scalars, {}, {}, {}}};
                         },
                         [](In in, const OpArgs& a, Mesh) {
                           const auto& s = std::get<ListArgs>(a).scalars;
                           DTensor p = in[0];
                           DTensor g = gradient_of(p, "sgd_step_");
                           const autograd::NoGradGuard no_grad;
                           if (!(g.layout() == p.layout())) g = g.redistribute(p.device_mesh(), p.layout());
                           const DTensor value = p.detach();
                           DTensor step = s.size() > 1 && s[1] != 0 ? add(g, mul(value, Scalar(s[1]))) : g;
                           const DTensor updated = sub(value, mul(step, Scalar(s[0])));
                           Tensor local = p.to_local();
                           local.copy_(updated.to_local());
                           return p;
                         }};
}

}  // namespace tessera::controller::detail
