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
  using A = const ListArgs&;
  // requires_grad_(t, [on]): in place. The value becomes a leaf that records what reads it.
  row(t, "requires_grad_", 1, 0, {.ints_most = 1, .what = "at most one integer (on)"}, [](In in, A a) {
    DTensor out = in[0];
    out.requires_grad_(a.ints.empty() || a.ints[0] != 0);
    return out;
  });
  row(t, "detach", 1, 0, {}, [](In in, A) { return in[0].detach(); });
  // backward(loss, [grad]): in place on the loss, which stays as it is; the leaves' gradients
  // accumulate (reduced over the mesh as DTensor's backward reduces them).
  row(t, "backward", 1, 2, {}, [](In in, A) {
    if (in.size() > 1)
      in[0].backward(in[1]);
    else
      in[0].backward();
    return in[0];
  });
  // grad(t): the leaf's accumulated gradient, as a tensor of its own.
  row(t, "grad", 1, 0, {}, [](In in, A) { return gradient_of(in[0], "grad"); });
  // zero_grad_(t): in place; the leaf's gradient is cleared (torch's set_to_none).
  row(t, "zero_grad_", 1, 0, {}, [](In in, A) {
    DTensor p = in[0];
    TESSERA_CHECK(p.requires_grad() && p.is_leaf(), ValueError, "zero_grad_", "the tensor ", p.to_string(),
                  " is not a leaf that requires a gradient");
    p.set_grad(DTensor());
    return p;
  });
  // sgd_step_(p, lr, [weight_decay]): in place, torch.optim.SGD's update without momentum,
  // p -= lr (grad + weight_decay p), written into p's shard: p stays the same leaf.
  row(t, "sgd_step_", 1, 0, {.scalars_least = 1, .scalars_most = 2, .what = "one or two scalars [lr, weight_decay]"},
      [](In in, A a) {
        const auto& s = a.scalars;
        DTensor p = in[0];
        DTensor g = gradient_of(p, "sgd_step_");
        const autograd::NoGradGuard no_grad;
        if (!(g.layout() == p.layout())) g = g.redistribute(p.device_mesh(), p.layout());
        const DTensor value = p.detach();
        const DTensor step = s.size() > 1 && s[1] != 0 ? add(g, mul(value, Scalar(s[1]))) : g;
        const DTensor updated = sub(value, mul(step, Scalar(s[0])));
        Tensor local = p.to_local();
        local.copy_(updated.to_local());
        return p;
      });
}

}  // namespace tessera::controller::detail
