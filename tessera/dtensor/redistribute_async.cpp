// DTensor::redistribute_async: redistribute with the plan's last collective left in flight.
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera {

struct PendingDTensor::State {
  detail::PendingLocal pending;
  DeviceMesh mesh;
  Layout layout;
  DTensor source;                 // the input, for the autograd record made at wait()
  std::optional<DType> backward;  // the gradient's dtype on its way back
  std::optional<DTensor> result;  // set by the first wait()
};

DTensor PendingDTensor::wait() const {
  TESSERA_CHECK(state_ != nullptr, ValueError, "PendingDTensor::wait", "the handle holds no redistribution");
  State& s = *state_;
  if (s.result) return *s.result;
  s.pending.work.wait();
  DTensor out(s.pending.finish(), s.mesh, s.layout);
  s.pending.finish = nullptr;  // frees the buffers
  if (autograd::needs_grad<DTensor>({&s.source}))
    autograd::record<DTensor>(
        "redistribute", out, {&s.source},
        [mesh = s.source.device_mesh(), source = gradient_layout(s.source.layout()), backward = s.backward](
            const DTensor& g) {
          const DType moving = backward.value_or(g.dtype());
          return std::vector<DTensor>{g.to(moving).redistribute(mesh, source.with_dtype(moving)).to(source.dtype())};
        });
  s.result = out;
  s.source = DTensor();  // the input is no longer needed alive
  return out;
}

bool PendingDTensor::is_completed() const { return !state_ || state_->result || state_->pending.work.is_completed(); }

PendingDTensor DTensor::redistribute_async(const DeviceMesh& mesh, const Layout& layout,
                                           const RedistributeOptions& options) const {
  TESSERA_CHECK(defined() || !mesh_.is_member(), ShardingError, "DTensor::redistribute_async",
                "the DTensor is undefined");
  TESSERA_CHECK(mesh.spec() == layout.mesh(), ShardingError, "DTensor::redistribute_async", "layout ",
                layout.to_string(), " is not on ", mesh.to_string());
  const DType forward = options.forward_dtype.value_or(dtype());
  DTensor moving;
  {
    const autograd::NoGradGuard untracked;  // the record made at wait() stands for the cast and the move
    moving = forward == dtype() ? detach() : to(forward);
  }
  const Layout target = layout.with_dtype(forward);
  const auto p = cached_plan(moving.layout(), target);  // throws here, on every rank alike, for a bad target
  auto state = std::make_shared<PendingDTensor::State>();
  state->pending = detail::run_plan_async(*p, moving.to_local(), mesh_, mesh);
  state->mesh = mesh;
  state->layout = target;
  state->source = *this;
  state->backward = options.backward_dtype;
  PendingDTensor handle;
  handle.state_ = std::move(state);
  return handle;
}

}  // namespace tessera
