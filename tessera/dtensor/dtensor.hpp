#pragma once
// DTensor: a global tensor laid out over a DeviceMesh, each rank holding its block as a local
// Tensor. Cheap to copy: the local tensor shares storage and the layout is a
// value. Every rank of the mesh runs the same calls (SPMD); calls that communicate say so.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/sharding/layout.hpp>
#include <tessera/sharding/plan.hpp>

namespace tessera TESSERA_API {

namespace detail {
struct DTensorAccess;
}

/// Options of DTensor::from_local.
struct FromLocalOptions {
  /// Check that every rank of the mesh passed the same dtype, placements and global shape, and
  /// broadcast replicated data from the first rank of each Replicate mesh dim. Communicates.
  bool run_check = false;
  /// The global shape, for locals that are not the even split of it (uneven chunk pieces).
  std::optional<Shape> shape = {};
  /// The global strides; accepted for DTensor parity, must be the contiguous strides of shape.
  std::optional<Strides> stride = {};
  /// Take each sharded dim's piece sizes from the locals themselves (PhysicsNeMo
  /// sharding_shapes="infer"): an all_gather of the local shapes. Communicates.
  bool infer_sizes = false;
  /// Explicit piece sizes per sharded tensor dim (PhysicsNeMo sharding_shapes), as in Layout.
  ShardSizes sizes = {};
};

/// How a redistribution communicates (PyTorch's forward_dtype / backward_dtype). Value type.
/// Example: `x.redistribute({Replicate{}}, {.forward_dtype = DType::bf16})` all-gathers half the
/// bytes of an f32 x and returns a bf16 DTensor.
struct RedistributeOptions {
  /// Cast the local block to this dtype, then move it: the result has this dtype.
  std::optional<DType> forward_dtype = {};
  /// In the backward, cast the gradient to this dtype, move it, and hand it to the input in the
  /// input's dtype (default: the gradient moves in the result's dtype).
  std::optional<DType> backward_dtype = {};
};

class DTensor;

/// A redistribution in flight (DTensor::redistribute_async). Copyable; all copies share one
/// operation. The source DTensor's local must stay untouched until wait() returns.
class PendingDTensor {
 public:
  PendingDTensor() = default;
  /// Blocks until the last collective finished and returns the redistributed DTensor (the same
  /// one on every later call). Rethrows the collective's CommError. Throws ValueError on a
  /// default-constructed handle.
  DTensor wait() const;
  /// True once wait() would not block. Never blocks.
  bool is_completed() const;

 private:
  friend class DTensor;
  struct State;
  std::shared_ptr<State> state_;
};

class DTensor {
 public:
  DTensor() = default;
  /// Wraps this rank's block of `layout` (no communication). Throws ShardingError if `mesh`'s spec
  /// is not the layout's mesh or the local's shape/dtype is not this rank's block.
  DTensor(Tensor local, DeviceMesh mesh, Layout layout);

  /// Builds a DTensor from each rank's local piece. Without options the global shape is the even
  /// split (local size times the mesh dims sharding that dim). No communication unless
  /// options.run_check or options.infer_sizes. Throws ShardingError naming the placements and
  /// shapes if the local is not this rank's block of the resulting layout.
  static DTensor from_local(Tensor local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            FromLocalOptions options = {});

  bool defined() const { return local_.defined(); }
  /// This rank's block (shares storage). An empty tensor on a rank outside the mesh. Under
  /// autograd the local's gradient becomes this DTensor's with the same layout, or with
  /// `grad_placements` (e.g. Partial when each rank's local computation differs), as in DTensor.
  Tensor to_local() const;
  Tensor to_local(std::vector<Placement> grad_placements) const;
  /// The whole tensor on every rank (all-gathers / reduces as needed). Communicates. Under
  /// autograd each rank's gradient of the full tensor counts as `grad_placements` (default
  /// Replicate: every rank computes the same thing; Partial(sum): their gradients add up).
  Tensor full_tensor() const;
  Tensor full_tensor(std::vector<Placement> grad_placements) const;
  /// The same tensor with other placements (shard orders and explicit sizes kept where they
  /// still apply). Communicates. Throws ShardingError for a Partial destination, P(op) ->
  /// P(other op), or a placement count that does not match the mesh.
  /// `options` as PyTorch's redistribute keywords: communicate in another dtype.
  DTensor redistribute(std::vector<Placement> placements, const RedistributeOptions& options = {}) const;
  /// The same tensor on another mesh of the same world (Monarch to_mesh), broadcasting over mesh
  /// dims the source lacks. Every rank of both meshes calls it. Communicates.
  DTensor redistribute(const DeviceMesh& mesh, std::vector<Placement> placements,
                       const RedistributeOptions& options = {}) const;
  /// The same tensor in any layout (shard orders, explicit sizes, another mesh).
  DTensor redistribute(const DeviceMesh& mesh, const Layout& layout, const RedistributeOptions& options = {}) const;
  /// redistribute with its last collective left in flight (PyTorch's async_op=True): the steps
  /// before it run at the call (each needs the previous one's result), the last is issued and
  /// overlaps with the caller's work until wait(). Errors of the arguments throw at the call,
  /// before any communication, as redistribute's do. Every rank calls it and later wait().
  /// Example: `auto pending = x.redistribute_async({Replicate{}}); y = f(z); x = pending.wait();`
  PendingDTensor redistribute_async(std::vector<Placement> placements, const RedistributeOptions& options = {}) const;
  PendingDTensor redistribute_async(const DeviceMesh& mesh, const Layout& layout,
                                    const RedistributeOptions& options = {}) const;

  /// Monarch's mesh reduction over the named mesh dims, treating the locals along them as values:
  /// sum/avg/product/max/min -> all_reduce (scatter: reduce_scatter along the local's dim 0); stack ->
  /// all_gather into a new leading dim (scatter: all_to_all). The placements on `dims` must be
  /// Replicate or the same Partial (stack: locals of equal shape). Communicates.
  DTensor reduce(const std::vector<std::string>& dims, MeshReduction reduction = MeshReduction::sum,
                 bool scatter = false) const;
  /// The local piece of the rank at the given mesh coordinates (unnamed axes: 0), on every rank.
  /// Communicates.
  Tensor fetch_shard(const std::map<std::string, int64_t>& coordinates) const;
  /// PhysicsNeMo ShardTensor's offsets: the global start, along the tensor dim that mesh dim
  /// `mesh_dim` shards, of the piece of every rank along that mesh dim (the calling rank's
  /// coordinates on the other mesh dims), in mesh order. Pieces of 3, 1 and 4 rows: [0, 3, 4].
  /// No communication. Throws ShardingError when the mesh dim does not shard a tensor dim or the
  /// calling rank is outside the mesh.
  std::vector<int64_t> offsets(int64_t mesh_dim) const;

  const DeviceMesh& device_mesh() const { return mesh_; }
  const std::vector<Placement>& placements() const { return layout_->placements(); }
  const Layout& layout() const { return *layout_; }
  Shape shape() const { return layout_->global_shape(); }
  DType dtype() const { return layout_->dtype(); }
  int64_t ndim() const { return layout_->ndim(); }
  int64_t numel() const { return layout_->global_shape().numel(); }
  /// "DTensor([8, 6] f32 on mesh[dp=2, tp=2] as (S(0), R))".
  std::string to_string() const;

  // --- in-place ops, conversion, item (dtensor/conveniences.cpp) ---------------------------
  // Every rank of the mesh makes the same calls; the in-place ops do not communicate. The result
  // keeps this DTensor's layout and is written into the local's storage (Tensor::copy_), so every
  // handle on that storage (an earlier to_local()) sees it; a rank outside the mesh does nothing.
  // A DTensor operand must have this layout up to dtype (global shape, mesh, placements, shard
  // orders, piece sizes). Each op throws, on every rank alike and before writing:
  //   ShardingError naming the op if this DTensor or an operand is undefined, if an operand's
  //   layout differs (both layouts named), or for the Partial cases each op lists;
  //   ValueError if this DTensor requires a gradient (outside autograd::NoGradGuard, as
  //   Tensor::copy_), if an operand does (in-place ops are not recorded), or (add_, mul_) if the
  //   result's dtype is of a higher category (b8 < integer < floating) than this dtype, as torch.
  /// this += other. Partial: P(sum) or P(avg) only (the same on both, as the layouts match);
  /// throws ShardingError for P(max)/P(min)/P(product) (a sum of maxima is not a maximum of sums).
  DTensor& add_(const DTensor& other);
  /// this += value, counted once: on P(sum) mesh dims only the ranks at coordinate 0 add it;
  /// P(avg)/P(max)/P(min) add it on every rank. Throws ShardingError for P(product).
  DTensor& add_(Scalar value);
  /// this *= other. Throws ShardingError if either is Partial (redistribute to Replicate first).
  DTensor& mul_(const DTensor& other);
  /// this *= value. P(sum)/P(avg) scale; throws ShardingError for P(max)/P(min) with a negative
  /// value (it swaps maxima and minima) and for P(product) (each rank's factor would count).
  DTensor& mul_(Scalar value);
  /// Every element becomes value (converted to this dtype). Partial: value on the ranks at
  /// coordinate 0 on every P(sum)/P(product) mesh dim, 0 on the other ranks of a P(sum) dim, 1 on
  /// those of a P(product) dim; P(avg)/P(max)/P(min) dims hold value on every rank.
  DTensor& fill_(Scalar value);
  /// Zeros on every rank (zero under every Partial reduction).
  DTensor& zero_();
  /// Copies src's values, converting the dtype. src must have this layout up to dtype; a Partial
  /// src hands over its pending values as they are.
  DTensor& copy_(const DTensor& src);
  /// value wherever mask (any dtype, non-zero is true; this layout up to dtype) is true. Throws
  /// ShardingError if either is Partial (redistribute to Replicate first).
  DTensor& masked_fill_(const DTensor& mask, Scalar value);
  /// This DTensor in another dtype: each local converted, same layout, no communication (a
  /// Partial converts its pending values: P(sum) f32 -> i32 truncates each rank's term). Itself
  /// when already of dtype. Recorded for autograd into a floating dtype, as Tensor::to.
  DTensor to(DType dtype) const;
  /// The value of a one-element DTensor (of its full tensor), as a Scalar of its dtype's kind.
  /// Collective over the mesh. Throws ValueError naming the shape if numel() != 1, on every rank.
  Scalar item() const;

  // --- autograd (as on Tensor; core/grad_mode.hpp, grad/engine.hpp) -------------------------
  // A leaf's gradient has the leaf's layout with Partial replaced by Replicate: a Replicate
  // parameter's gradient is all-reduced (data parallel), a Shard one's reduce-scattered (FSDP).
  // Redistributions are recorded; the adjoint of a redistribution moves the gradient back to the
  // source layout (Shard->Replicate <-> reduce_scatter, Replicate->Shard <-> all_gather,
  // Partial->Replicate <-> identity into Replicate).
  bool requires_grad() const { return autograd_ && autograd_->requires_grad; }
  /// Marks a leaf (every rank of the mesh calls it). Throws ShardingError for non-floating dtypes.
  DTensor& requires_grad_(bool on = true);
  bool is_leaf() const { return !autograd_ || !autograd_->grad_fn; }
  /// The accumulated gradient of a leaf (undefined before the first backward).
  DTensor grad() const;
  /// Replaces a leaf's gradient (undefined clears it).
  void set_grad(const DTensor& grad);
  /// Backpropagates from this DTensor (every rank calls it; collectives run inside). Without a
  /// gradient the DTensor must have one element: its gradient is 1. Leaf gradients that arrive
  /// Partial (data parallel) are summed locally and reduced in buckets when it returns.
  void backward() const;
  void backward(const DTensor& grad) const;
  /// The same DTensor with no autograd history.
  DTensor detach() const;
  /// The recorded op that produced this DTensor, or "" for a leaf.
  std::string grad_fn_name() const;
  /// Internal: the autograd state, for the recording helpers.
  const std::shared_ptr<autograd::Meta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<autograd::Meta> meta) { autograd_ = std::move(meta); }

 private:
  DTensor redistribute_in(const DeviceMesh& mesh, const Layout& layout, const RedistributeOptions& options) const;
  Tensor local_;
  DeviceMesh mesh_{};
  // Shared so that copies and dispatch outputs cost a reference count, not a layout copy.
  std::shared_ptr<const Layout> layout_ = empty_layout();
  std::shared_ptr<autograd::Meta> autograd_;
  static const std::shared_ptr<const Layout>& empty_layout() {
    static const auto empty = std::make_shared<const Layout>();
    return empty;
  }
  // Unchecked: the dispatcher's output path, whose blocks were validated when the decision was made.
  DTensor(Tensor local, DeviceMesh mesh, std::shared_ptr<const Layout> layout, bool /*unchecked*/)
      : local_(std::move(local)), mesh_(std::move(mesh)), layout_(std::move(layout)) {}
  friend struct detail::DTensorAccess;
};

namespace autograd {
/// Gradient arithmetic on DTensor (dtensor/dtensor_autograd.cpp).
template <>
struct GradOps<DTensor> {
  static DTensor add(const DTensor& a, const DTensor& b);
};
}  // namespace autograd

/// The layout a gradient of `layout` takes: Partial mesh dims become Replicate (the gradient of
/// a Partial value is the gradient of its reduced value, on every rank).
Layout gradient_layout(const Layout& layout);

/// DDP's no_sync for DTensor leaves (RAII): inside the scope, a leaf's gradient that arrives
/// Partial (a sum still owed over the ranks that split the batch or the rows) stays Partial and
/// accumulates locally; when the outermost scope ends, these gradients are reduced once into
/// the leaves' gradient layouts, in buckets (reduce_partials), in the order the leaves first
/// received one (the same on every rank). (Outside NoSync, backward() reduces them as DDP does:
/// once the waiting gradients fill a bucket, 1 MiB for the first and 25 MiB after, their
/// collective is issued asynchronously while backward goes on, and the rest when it returns;
/// the gradients of one foreach_all_gather call (an FSDP unit) go in flight as soon as backward
/// has passed that unit. Every gradient has landed when backward returns.) So n microbatches
/// cost one gradient reduction, not n: microbatch() and
/// mpmd::Pipeline::step() open one. Inside the scope a leaf's grad() may be Partial. Per rank;
/// every rank of a mesh opens and closes it alike. A scope left by an exception reduces nothing.
class NoSync {
 public:
  NoSync();
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;
};

/// Splits a global tensor that every rank holds; the data of each block comes from the first rank
/// of the mesh (coordinate 0 on every mesh dim), as in DTensor. Communicates. Throws
/// ShardingError for Partial placements. The result is a leaf that requires a gradient when
/// `global` does (as in PyTorch).
DTensor distribute_tensor(const Tensor& global, const DeviceMesh& mesh, std::vector<Placement> placements);
/// distribute_tensor into any layout on `mesh` (shard orders, explicit sizes): what front ends
/// with their own vocabulary (tessera/spec's mark_sharding) lower onto; errors name `call`. With
/// `src_rank` the data comes from that world rank of the mesh, and only it needs `global`
/// (ShardTensor's scatter_tensor); the others may pass an undefined tensor.
/// Throws ShardingError when the layout is not on `mesh`, not of global's shape and dtype, or
/// holds a Partial.
DTensor distribute_to_layout(const Tensor& global, const DeviceMesh& mesh, const Layout& layout,
                             std::string_view call = "distribute_tensor", std::optional<int> src_rank = std::nullopt);

/// Factories: each rank builds only its block (no communication). Partial placements are an error.
DTensor empty(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype = DType::f32);
DTensor zeros(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype = DType::f32);
DTensor ones(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype = DType::f32);
DTensor full(const Shape& shape, double value, const DeviceMesh& mesh, std::vector<Placement> placements,
             DType dtype = DType::f32);
/// Uniform [0, 1) / standard normal; each takes one draw from the calling rank's generator, so
/// with one manual_seed on every rank the result equals the unsharded rand/randn bit for bit.
DTensor rand(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype = DType::f32);
DTensor randn(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype = DType::f32);

/// DTensors of x's layout (placements, shard orders, piece sizes) and dtype, or `dtype`: each rank
/// builds only its block, no communication; none requires a gradient. empty_like and zeros_like
/// keep a Partial layout (zeros reduce to zeros); ones_like, full_like, rand_like and randn_like
/// throw ShardingError naming the op for a Partial layout (redistribute to Replicate first). All
/// throw ShardingError for an undefined x.
DTensor empty_like(const DTensor& x, std::optional<DType> dtype = std::nullopt);
DTensor zeros_like(const DTensor& x, std::optional<DType> dtype = std::nullopt);
DTensor ones_like(const DTensor& x, std::optional<DType> dtype = std::nullopt);
DTensor full_like(const DTensor& x, Scalar value, std::optional<DType> dtype = std::nullopt);
/// As rand/randn for x's shape and placements (one draw from the calling rank's generator, each
/// rank its block of the unsharded draw): equal to rand(x.shape(), mesh, placements) bit for bit.
/// Throws ValueError for a non-floating dtype.
DTensor rand_like(const DTensor& x, std::optional<DType> dtype = std::nullopt);
DTensor randn_like(const DTensor& x, std::optional<DType> dtype = std::nullopt);

/// Same global shape, same dtype and equal values (NaN unequal), with the same answer on every
/// rank: b is moved to a's layout (Partial dims of a replaced by Replicate), the locals compared
/// and the verdicts all-reduced. Collective over the mesh unless shape or dtype differ (then false
/// at once). Throws ShardingError if either is undefined or they live on different meshes.
bool equal(const DTensor& a, const DTensor& b);

/// Writes x.to_string(): "DTensor([8, 6] f32 on mesh[dp=2, tp=2] as (S(0), R))".
std::ostream& operator<<(std::ostream& out, const DTensor& x);

/// The planner's options in this process: the recorded cost model of the running backend
/// (CostModel::for_backend; the threads model outside a rank) and whether a Partial destination
/// is allowed (sharded ops need it; a user's redistribute to Partial is an error).
PlanOptions plan_options(bool allow_partial_destination = false);
/// The plan a redistribution from `src` to `dst` runs: plan() memoised per process (pure, so
/// every rank computes the same one). Thread-safe.
std::shared_ptr<const Plan> cached_plan(const Layout& src, const Layout& dst,
                                        const PlanOptions& options = plan_options());
/// Forgets every memoised plan (benchmarks time a cold planner with it). Thread-safe; plans
/// already handed out stay valid.
void clear_plan_cache();

}  // namespace tessera
