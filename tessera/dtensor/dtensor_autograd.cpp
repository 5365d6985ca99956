// DTensor's autograd surface: leaves whose gradients land in the leaf's layout, backward(), detach().
#include <tessera/grad/engine.hpp>
#include <tessera/dtensor/detail/deferred_gradients.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/runtime/runtime.hpp>

#include <exception>
#include <memory>

namespace tessera {

Layout gradient_layout(const Layout& layout) {
  if (!layout.has_partial()) return layout;
  Placements placements = layout.placements();
  for (auto& p : placements)
    if (is_partial(p)) p = Replicate{};
  return layout.with_placements(std::move(placements));
}

namespace autograd {
DTensor GradOps<DTensor>::add(const DTensor& a, const DTensor& b) { return tessera::add(a, b); }
}  // namespace autograd

namespace {

// The same values in another dtype (an elementwise cast changes no layout).
DTensor cast(const DTensor& x, DType dtype, const DeviceMesh& mesh) {
  if (x.dtype() == dtype) return x;
  return DTensor(x.to_local().to(dtype), mesh, x.layout().with_dtype(dtype));
}

// The deferred (Partial) gradients of this rank: the leaves waiting for a bucket, in the order
// their first gradient arrived (the same order on every rank), and the buckets in flight.
struct Deferred {
  int depth = 0;           // open NoSync scopes
  int backward_depth = 0;  // running DTensor::backward calls
  struct Leaf {
    std::weak_ptr<autograd::Meta> meta;
    Layout target;
  };
  std::vector<Leaf> leaves;
  int64_t waiting_bytes = 0;  // global bytes of `leaves` (the same on every rank)
  struct InFlight {
    PendingReduction pending;
    std::vector<std::shared_ptr<autograd::Meta>> metas;
  };
  std::vector<InFlight> in_flight;
  bool launched = false;  // a bucket was launched in this backward (the first is smaller)
  // The foreach_all_gather whose gradients backward is delivering (detail::gradients_of_group_arriving).
  const void* arriving_group = nullptr;
  // A backward or NoSync scope that failed: the deferred gradients are this rank's unreduced
  // sums, which no later reduction can make whole (a peer may have failed before adding its
  // own), so their leaves go back to having no gradient, as before the scope (a leaf that had
  // one is reduced at once, never deferred). Left in place, a later backward would add to them
  // without reducing on this rank alone, and the ranks' collectives would no longer match.
  void drop() {
    for (const Leaf& leaf : leaves)
      if (const std::shared_ptr<autograd::Meta> meta = leaf.meta.lock()) meta->grad.reset();
    for (const InFlight& flight : in_flight)
      for (const std::shared_ptr<autograd::Meta>& meta : flight.metas) meta->grad.reset();
    leaves.clear();
    in_flight.clear();  // their collectives land first (PendingReduction)
    waiting_bytes = 0;
    launched = false;
  }
};

// DDP's bucket sizes: a small first bucket starts the overlap early, later ones are large.
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;
constexpr int64_t kBucketBytes = int64_t{25} << 20;

Deferred& deferred() {
  return rank_local<Deferred>("tessera.dtensor.no_sync");
}

// Partial gradients wait (summed locally) while a backward runs or a NoSync scope is open.
bool deferring() { return in_rank() && (deferred().depth > 0 || deferred().backward_depth > 0); }

// The waiting leaves' gradients go into buckets (reduce_partials_async: one flat all_reduce per
// group, as DDP's buckets; FSDP's gradients, Partial with their leaf sharded over that dim, one
// reduce_scatter), in flight until land().
void launch(Deferred& state) {
  std::vector<Deferred::Leaf> leaves = std::move(state.leaves);
  state.leaves.clear();
  state.waiting_bytes = 0;
  Deferred::InFlight flight;
  std::vector<DTensor> grads;
  std::vector<Layout> targets;
  for (const Deferred::Leaf& leaf : leaves) {
    std::shared_ptr<autograd::Meta> meta = leaf.meta.lock();
    if (!meta || !meta->grad.has_value()) continue;
    grads.push_back(std::any_cast<const DTensor&>(meta->grad));
    targets.push_back(leaf.target);
    flight.metas.push_back(std::move(meta));
  }
  if (flight.metas.empty()) return;
  flight.pending = reduce_partials_async(grads, targets, kBucketBytes);
  state.in_flight.push_back(std::move(flight));
  state.launched = true;
}

// Waits for the buckets in flight; each gradient lands in its leaf's layout.
void land(Deferred& state) {
  std::vector<Deferred::InFlight> flights = std::move(state.in_flight);
  state.in_flight.clear();
  for (const Deferred::InFlight& flight : flights) {
    const std::vector<DTensor> reduced = flight.pending.wait();
    for (size_t i = 0; i < flight.metas.size(); ++i) flight.metas[i]->grad = reduced[i];
  }
}

// Everything deferred, reduced now.
void reduce_deferred() {
  Deferred& state = deferred();
  launch(state);
  land(state);
  state.launched = false;
}

// A leaf's gradient arrives while its previous one is in flight: land that first (the new one is
// then added to a reduced gradient).
void land_if_in_flight(Deferred& state, const autograd::Meta& leaf) {
  for (const Deferred::InFlight& flight : state.in_flight)
    for (const auto& meta : flight.metas)
      if (meta.get() == &leaf) return land(state);
}

}  // namespace

namespace detail {

// Backward runs the nodes of one foreach_all_gather together, after every node created later (the
// unit's compute): when the first node of another call runs, the gradients deferred so far are
// complete, and go in flight now rather than at the end (FSDP's reduce_scatter per unit).
// NoSync keeps them all until it closes.
void gradients_of_group_arriving(const void* group) {
  if (!in_rank()) return;
  Deferred& state = deferred();
  if (state.depth > 0 || state.backward_depth == 0 || state.arriving_group == group) return;
  state.arriving_group = group;
  // The previous unit's bucket lands; the one just completed goes in flight while this unit's
  // backward runs (at most two units' full gradients alive).
  land(state);
  launch(state);
}

}  // namespace detail

NoSync::NoSync() { ++deferred().depth; }

NoSync::~NoSync() {
  Deferred& state = deferred();
  if (--state.depth > 0 || state.backward_depth > 0) return;
  // Unwinding from an error: the ranks may be anywhere; reduce nothing.
  if (std::uncaught_exceptions() > 0) {
    state.drop();
    return;
  }
  reduce_deferred();
}

DTensor& DTensor::requires_grad_(bool on) {
  if (!on) {
    TESSERA_CHECK(is_leaf(), ShardingError, "DTensor::requires_grad_", "cannot turn off gradients of a non-leaf ",
                  to_string(), " (result of ", grad_fn_name(), "); use detach()");
    if (autograd_) autograd_->requires_grad = false;
    return *this;
  }
  TESSERA_CHECK(is_floating(dtype()), ShardingError, "DTensor::requires_grad_",
                "only floating DTensors can require gradients; got ", to_string());
  if (requires_grad()) return *this;
  auto meta = std::make_shared<autograd::Meta>();
  meta->requires_grad = true;
  meta->accumulate = [mesh = mesh_, target = gradient_layout(*layout_), self = std::weak_ptr<autograd::Meta>(meta)](
                         autograd::Meta& leaf, const std::any& incoming) {
    DTensor grad = cast(std::any_cast<const DTensor&>(incoming), target.dtype(), mesh);
    // During a backward or under NoSync a Partial gradient stays Partial (summed locally;
    // reduced in buckets at the end).
    if (deferring() && grad.layout().has_partial()) {
      Deferred& state = deferred();
      land_if_in_flight(state, leaf);
      if (!leaf.grad.has_value()) {
        state.leaves.push_back({self, target});
        state.waiting_bytes += grad.numel() * itemsize(grad.dtype());
      } else {
        const DTensor& previous = std::any_cast<const DTensor&>(leaf.grad);
        grad = previous.layout() == grad.layout() ? add(previous, grad)
                                                  : add(previous.redistribute(mesh, target), grad.redistribute(mesh, target));
      }
      leaf.grad = grad;
      // DDP: a full bucket goes in flight while backward goes on (not under NoSync).
      if (state.depth == 0 && state.waiting_bytes >= (state.launched ? kBucketBytes : kFirstBucketBytes)) launch(state);
      return;
    }
    grad = grad.redistribute(mesh, target);  // no-op when it is there already
    if (leaf.grad.has_value()) {
      const DTensor& previous = std::any_cast<const DTensor&>(leaf.grad);
      grad = add(previous.layout() == target ? previous : previous.redistribute(mesh, target), grad);
    }
    leaf.grad = grad;
  };
  autograd_ = std::move(meta);
  return *this;
}

DTensor DTensor::grad() const {
  if (!autograd_ || !autograd_->grad.has_value()) return DTensor();
  return std::any_cast<const DTensor&>(autograd_->grad);
}

void DTensor::set_grad(const DTensor& grad) {
  TESSERA_CHECK(requires_grad() && is_leaf(), ShardingError, "DTensor::set_grad",
                "only a leaf that requires a gradient has one; ", to_string(), " does not");
  if (!grad.defined()) {
    autograd_->grad.reset();
    return;
  }
  TESSERA_CHECK(grad.shape() == shape(), ShardingError, "DTensor::set_grad", "gradient ", grad.to_string(), " for ",
                to_string());
  autograd_->grad = grad;
}

void DTensor::backward() const {
  TESSERA_CHECK(requires_grad(), ShardingError, "DTensor::backward", to_string(),
                " does not require a gradient (no input called requires_grad_)");
  TESSERA_CHECK(numel() == 1, ShardingError, "DTensor::backward", "a gradient is needed for ", to_string(),
                "; only one-element DTensors default to 1");
  const Layout seed_layout = gradient_layout(*layout_);
  backward(DTensor(
      full(seed_layout.local_shape(mesh_.is_member() ? mesh_.coordinate()
                                                     : std::vector<int64_t>(static_cast<size_t>(mesh_.ndim()), 0)),
           1.0, dtype()),
      mesh_, seed_layout));
}

void DTensor::backward(const DTensor& grad) const {
  TESSERA_CHECK(requires_grad(), ShardingError, "DTensor::backward", to_string(),
                " does not require a gradient (no input called requires_grad_)");
  TESSERA_CHECK(grad.shape() == shape(), ShardingError, "DTensor::backward", "gradient ", grad.to_string(), " for ",
                to_string());
  // Partial gradients (data parallel) are summed locally during the backward and reduced in
  // buckets once it finished (unless a NoSync scope defers them further).
  Deferred& state = deferred();
  ++state.backward_depth;
  try {
    autograd::run_backward(autograd_, std::any(grad));
  } catch (...) {
    if (--state.backward_depth == 0) {
      state.arriving_group = nullptr;
      if (state.depth == 0) state.drop();
    }
    throw;
  }
  if (--state.backward_depth == 0) {
    state.arriving_group = nullptr;
    if (state.depth == 0) reduce_deferred();
  }
}

DTensor DTensor::detach() const {
  DTensor out = *this;
  out.autograd_.reset();
  return out;
}

std::string DTensor::grad_fn_name() const { return is_leaf() ? "" : autograd_->grad_fn->name(); }

}  // namespace tessera
