#pragma once
// Monarch's single controller: one program, the controller, drives meshes of workers. Every op
// it issues on a RemoteTensor is enqueued, without waiting, to every worker of the tensor's mesh;
// each worker runs its queue in order on DTensor (so the ops are the op library's, sharded as
// in SPMD code). The controller never holds tensor data: results come back only through
// fetch_shard / fetch_full futures, and an error raised on a worker surfaces at the future that
// needs the failed value, naming the worker's rank.
//
//   controller::run(argc, argv, [] {
//     controller::WorkerMesh mesh({2, 2}, {"dp", "tp"});
//     auto x = controller::randn({8, 4}, mesh, {Shard{0}, Replicate{}});
//     auto y = controller::relu(controller::matmul(x, controller::transpose(x, 0, 1)));
//     Tensor whole = controller::fetch_full(y).get();
//   });
//
// Workers are in-process threads (--ranks N, the threads backend), or MPI processes under
// mpirun: rank 0 runs the controller body, every other rank a worker (the same binary). Commands
// are data (an op's name and its arguments), sent to worker processes as words; replies (a
// fetched tensor, a layout, an error) come back when the controller asks for them.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/mesh/mesh_spec.hpp>
#include <tessera/ops/reduction.hpp>
#include <tessera/sharding/placement.hpp>

namespace tessera TESSERA_API {

class Layout;
class DTensor;
class DeviceMesh;

namespace controller {

namespace detail {
template <class T>
struct FutureState;
struct TensorHandle;
struct HandleAccess;
}  // namespace detail

/// Runs `body` once, on the controller (the calling thread), with --ranks N (or TESSERA_RANKS,
/// default 4) workers as in-process threads; under mpirun (or TESSERA_BACKEND=mpi) rank 0 runs
/// body and ranks 1..N-1 are the workers. When body returns every worker finishes the work
/// queued before, then stops. Returns 0, or 1 after printing the error if body threw (the
/// workers are stopped either way). Throws ValueError when called inside a rank or a controller.
int run(int argc, char** argv, std::function<void()> body);

/// The number of workers. Throws ValueError outside run's body.
int num_workers();

/// A result that a worker delivers later. get() blocks until it arrives; a failure on the worker
/// is thrown there as a CommError naming the worker's rank and its message.
template <class T>
class Future {
 public:
  explicit Future(std::shared_ptr<detail::FutureState<T>> state) : state_(std::move(state)) {}
  T get() const;
  bool ready() const;

 private:
  std::shared_ptr<detail::FutureState<T>> state_;
};

extern template class Future<Tensor>;
extern template class Future<Layout>;

class RemoteTensor;

/// A mesh of workers, as the controller sees it: a shape, axis names and the workers' world
/// ranks (0..N-1 in-process, 1..N-1 under MPI). Each worker holds the matching DeviceMesh. Construction enqueues the mesh's creation on every
/// worker (it is collective among them); slice() is local.
class WorkerMesh {
 public:
  /// Every worker, row-major over `shape` (its size must be num_workers()). Throws ShardingError
  /// as DeviceMesh does.
  WorkerMesh(std::vector<int64_t> shape, std::vector<std::string> names);
  /// The submesh at fixed coordinates of some axes (Monarch's slice_mesh): a mesh of the
  /// remaining axes. Throws ShardingError for an unknown axis or an index out of range.
  WorkerMesh slice(const std::map<std::string, int64_t>& at) const;
  /// Monarch's mesh.rank(dims): each worker's rank along `axes` (its coordinates there, row-major:
  /// the first axis major) as a scalar i64 RemoteTensor held Replicate, each worker's value its
  /// own, made on the workers with no remote function. rank({"dp", "tp"}) on a 2 x 2 mesh is 0, 1,
  /// 2, 3 in worker order; reduce(rank("dp"), {"dp"}) sums 0 + 1. Throws ShardingError for an
  /// unknown axis, ValueError for no axis or one named twice.
  RemoteTensor rank(const std::vector<std::string>& axes) const;
  RemoteTensor rank(const std::string& axis) const;
  /// Monarch's mesh.ranks: rank(axis) for every axis, by name.
  std::map<std::string, RemoteTensor> ranks() const;
  const MeshSpec& spec() const { return spec_; }
  std::string to_string() const { return spec_.to_string(); }
  int64_t id() const { return id_; }

 private:
  WorkerMesh(MeshSpec spec, int64_t id) : spec_(std::move(spec)), id_(id) {}
  MeshSpec spec_;
  int64_t id_ = -1;
};

class Stream;

/// A handle of a DTensor whose shards live on the workers of a mesh. Copies share the handle;
/// when the last copy goes, the workers drop the tensor. It belongs to the stream that made it.
class RemoteTensor {
 public:
  RemoteTensor() = default;
  const WorkerMesh& mesh() const;
  bool defined() const { return handle_ != nullptr; }
  /// The layout (shape, dtype, placements), as the mesh's first worker reports it after running
  /// the op that made this tensor: waits for that op. Throws as the op failed.
  Layout layout() const;
  Shape shape() const;
  uint64_t id() const;
  /// Monarch's drop(): the workers free the tensor once the work issued before it on its stream
  /// ran. Every later use of it, through this handle or a copy, is a ValueError naming it. Throws
  /// ValueError when it is dropped already or lent to another stream (drop the Borrow first).
  void drop() const;
  /// Whether drop() was called on this handle or a copy of it.
  bool dropped() const;
  /// Monarch's t.slice_mesh(**coords): the tensor on the slice of its mesh at `at` (the mesh of
  /// the other axes, WorkerMesh::slice), each worker of the slice keeping its block, enqueued
  /// without waiting. The sliced axes must hold the tensor Replicate (a worker's own value in
  /// Monarch's sense): where one is Shard or Partial, a slice holds part of the tensor or of the
  /// sum, and the result fails at its futures naming the axis (redistribute or reduce first).
  /// Throws ShardingError for an unknown axis or an index out of range, ValueError for no axis.
  RemoteTensor slice_mesh(const std::map<std::string, int64_t>& at) const;
  /// The same onto `slice`, a slice of this tensor's mesh (WorkerMesh::slice), so that tensors
  /// sliced apart share one mesh. Throws ShardingError when it is not one.
  RemoteTensor slice_mesh(const WorkerMesh& slice) const;
  /// Monarch's t.to_mesh(mesh): the tensor on `mesh`, each worker there holding the block of
  /// this tensor's worker at its coordinates of the axes both meshes name (an axis only `mesh`
  /// has broadcasts: t.slice_mesh({{"host", 0}}).to_mesh(t.mesh()) gives every host host 0's
  /// values), placed as this tensor is along those axes, Replicate along the new ones; each
  /// worker's value moves as it is, so per-worker values stay per worker. Enqueued without
  /// waiting; the blocks travel point to point. Throws ShardingError when an axis both name has
  /// different sizes, or an axis of more than one worker only this tensor's mesh has (which
  /// worker's block would be ambiguous: slice it first). Onto its own mesh: the tensor itself.
  RemoteTensor to_mesh(const WorkerMesh& mesh) const;

 private:
  explicit RemoteTensor(std::shared_ptr<detail::TensorHandle> handle) : handle_(std::move(handle)) {}
  std::shared_ptr<detail::TensorHandle> handle_;
  friend struct detail::TensorHandle;
  friend struct detail::HandleAccess;
  friend RemoteTensor call(const std::string&, const std::vector<RemoteTensor>&, const std::vector<double>&,
                           const std::vector<int64_t>&, const WorkerMesh*, const Shape&, const Placements&, DType,
                           const std::string&);
  friend std::vector<RemoteTensor> call_remote(const std::string&, const WorkerMesh&, const std::vector<RemoteTensor>&,
                                               int64_t);
  friend class Stream;
  friend class Borrow;
  friend void call_inplace(const std::string&, const RemoteTensor&, const std::vector<RemoteTensor>&,
                           const std::vector<double>&, const std::vector<int64_t>&);
};

class Borrow;

/// An ordered queue of work on every worker (Monarch's Stream). Ops issued while a stream is
/// active run on it; a tensor belongs to the stream that made it, and another stream uses it
/// only through a Borrow: immutable (both may read, neither writes) or mutable (only the
/// borrower touches it until drop()). Every violation is a ValueError at the call that commits
/// it, naming the tensor and both streams. The default stream is "main".
/// Each worker runs every stream on a thread of its own, with its own communicators (a
/// duplicate of every mesh), so streams run concurrently (a transfer on one overlaps compute on
/// another) and their collectives never meet. A borrow orders them: the borrower's uses wait for
/// the owner's work issued before borrow(), and the owner's work issued after drop() waits for
/// the borrower's. Each stream draws random numbers from its own generator.
class Stream {
 public:
  /// A new stream: every worker starts its thread. Throws ValueError outside run's body.
  explicit Stream(std::string name);
  /// The default stream of the running controller.
  static Stream main();
  const std::string& name() const { return name_; }
  int64_t id() const { return id_; }
  /// Lends `t` to this stream. Throws ValueError when t already belongs to it, is mutably
  /// borrowed, or (mutable) is borrowed at all.
  Borrow borrow(const RemoteTensor& t, bool mutable_borrow = false) const;

  /// Ops issued during the scope run on the stream (Monarch's `with stream.activate()`).
  class Activation {
   public:
    ~Activation();
    Activation(const Activation&) = delete;
    Activation& operator=(const Activation&) = delete;

   private:
    friend class Stream;
    explicit Activation(int64_t previous) : previous_(previous) {}
    int64_t previous_;
  };
  [[nodiscard]] Activation activate() const;

 private:
  Stream(std::string name, int64_t id) : name_(std::move(name)), id_(id) {}
  std::string name_;
  int64_t id_;
};

/// A tensor lent to a stream until drop() (or the Borrow's end).
class Borrow {
 public:
  Borrow(Borrow&& other) noexcept;
  Borrow& operator=(Borrow&&) = delete;
  Borrow(const Borrow&) = delete;
  ~Borrow();
  /// The borrowed tensor (the same handle).
  const RemoteTensor& tensor() const { return tensor_; }
  /// Returns the tensor to its stream. Throws ValueError when dropped already.
  void drop();

 private:
  friend class Stream;
  Borrow(RemoteTensor tensor, int64_t stream, bool is_mutable) : tensor_(std::move(tensor)), stream_(stream), mutable_(is_mutable) {}
  RemoteTensor tensor_;
  int64_t stream_;
  bool mutable_;
  bool dropped_ = false;
};

/// Any op of the op table by name: inputs on one mesh, scalar and integer arguments as the op
/// takes them (a binary op's `_scalar` form: one scalar; softmax: one dim; transpose: two;
/// reductions: [keepdim, dims...], none for all dims; mesh_reduce: [reduce op, scatter, mesh
/// dims...]); factories take `mesh`, `shape`, `placements` and `dtype`. The others, in torch's
/// argument order, optional ones trailing (inputs; scalars; integers; shape; text):
///   where (cond, a, b); masked_fill (x, mask; value); clamp (x; lo, hi); bmm (a, b);
///   linear (x, weight[, bias]); einsum (operands...; text: the equation);
///   log_softmax (x; ; dim); layer_norm (x[, weight[, bias]]; [eps]; ; normalized_shape);
///   rms_norm (x[, weight]; [eps]; ; normalized_shape); embedding (weight, indices; ; [padding_idx]);
///   cross_entropy and nll_loss (input, target; ; [ignore_index, reduction: 0 none, 1 mean, 2 sum]);
///   mse_loss (input, target; ; [reduction]); dropout (x; p; [training]);
///   scaled_dot_product_attention (q, k, v[, mask]; [dropout_p, scale]; [is_causal]);
///   conv2d (x, weight[, bias]; ; [stride h, w, padding h, w, dilation h, w, groups], a prefix);
///   permute (x; ; dims); expand (x; ; ; shape); narrow (x; ; [dim, start, length]);
///   cat and stack (tensors...; ; [dim]); flip (x; ; dims); roll (x; ; [shift] or [shifts..., dims...]);
///   tril and triu (x; ; [diagonal]); repeat (x; ; repeats); pad (x; [value]; pads);
///   gather and index_select (x, index; ; [dim]); scatter and scatter_add (x, index, src; ; [dim]);
///   index_add (x, index, src; [alpha]; [dim]);
///   autograd: requires_grad_ (t; ; [on]), backward (loss[, grad]), zero_grad_ (t) and
///   sgd_step_ (p; lr[, weight_decay]) in place (call_inplace); grad (t), detach (t).
/// The op runs on every worker of the mesh, after everything enqueued there before. Throws
/// ValueError for an unknown op or for inputs or arguments the op does not take (naming what it
/// takes), ShardingError for inputs on two meshes (naming both) or on none.
RemoteTensor call(const std::string& op, const std::vector<RemoteTensor>& inputs,
                  const std::vector<double>& scalars = {}, const std::vector<int64_t>& ints = {},
                  const WorkerMesh* mesh = nullptr, const Shape& shape = {}, const Placements& placements = {},
                  DType dtype = DType::f32, const std::string& text = {});
/// The names call() accepts.
std::vector<std::string> op_names();

// Factories: each worker makes its block.
RemoteTensor zeros(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype = DType::f32);
RemoteTensor ones(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype = DType::f32);
RemoteTensor full(const Shape& shape, double value, const WorkerMesh& mesh, Placements placements, DType dtype = DType::f32);
/// Standard normal / uniform [0, 1): each worker draws from its generator, seeded by manual_seed.
RemoteTensor randn(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype = DType::f32);
RemoteTensor rand(const Shape& shape, const WorkerMesh& mesh, Placements placements, DType dtype = DType::f32);
/// manual_seed(seed) on every worker of `mesh`, for the active stream's generator: the same
/// draws as SPMD code after manual_seed.
void manual_seed(uint64_t seed, const WorkerMesh& mesh);
/// Per-worker seeds: every worker of `mesh` seeds its generator with seed + its rank along
/// `per_worker` (as WorkerMesh::rank numbers them; torch.manual_seed(seed + rank) on each worker),
/// so rand and randn draw differently along those axes and alike along the others: randn held
/// Replicate then gives each worker its own values (Monarch's per-worker tensors). Throws
/// ShardingError for an unknown axis, ValueError for no axis or one named twice.
void manual_seed(uint64_t seed, const WorkerMesh& mesh, const std::vector<std::string>& per_worker);

// Ops (DTensor's): enqueued on the inputs' mesh.
RemoteTensor add(const RemoteTensor& a, const RemoteTensor& b);
RemoteTensor sub(const RemoteTensor& a, const RemoteTensor& b);
RemoteTensor mul(const RemoteTensor& a, const RemoteTensor& b);
RemoteTensor div(const RemoteTensor& a, const RemoteTensor& b);
RemoteTensor matmul(const RemoteTensor& a, const RemoteTensor& b);
RemoteTensor scale(const RemoteTensor& a, double factor);
RemoteTensor neg(const RemoteTensor& a);
RemoteTensor exp(const RemoteTensor& a);
RemoteTensor tanh(const RemoteTensor& a);
RemoteTensor relu(const RemoteTensor& a);
RemoteTensor gelu(const RemoteTensor& a);
RemoteTensor softmax(const RemoteTensor& a, int64_t dim);
RemoteTensor sum(const RemoteTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
RemoteTensor mean(const RemoteTensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
RemoteTensor transpose(const RemoteTensor& a, int64_t dim0, int64_t dim1);
RemoteTensor reshape(const RemoteTensor& a, const Shape& shape);
/// DTensor::redistribute on the workers (the planner's collectives).
RemoteTensor redistribute(const RemoteTensor& a, const Placements& placements);

// nn ops (DTensor's, differentiable on the workers): with the autograd below, a controller
// program trains a model without remote functions.
RemoteTensor linear(const RemoteTensor& x, const RemoteTensor& weight,
                    const std::optional<RemoteTensor>& bias = std::nullopt);
RemoteTensor log_softmax(const RemoteTensor& x, int64_t dim);
RemoteTensor layer_norm(const RemoteTensor& x, const Shape& normalized_shape,
                        const std::optional<RemoteTensor>& weight = std::nullopt,
                        const std::optional<RemoteTensor>& bias = std::nullopt, double eps = 1e-5);
RemoteTensor embedding(const RemoteTensor& weight, const RemoteTensor& indices);
RemoteTensor cross_entropy(const RemoteTensor& logits, const RemoteTensor& target, int64_t ignore_index = -100,
                           Reduction reduction = Reduction::mean);
RemoteTensor scaled_dot_product_attention(const RemoteTensor& q, const RemoteTensor& k, const RemoteTensor& v,
                                          const std::optional<RemoteTensor>& attn_mask = std::nullopt,
                                          double dropout_p = 0.0, bool is_causal = false);
RemoteTensor conv2d(const RemoteTensor& x, const RemoteTensor& weight,
                    const std::optional<RemoteTensor>& bias = std::nullopt, std::vector<int64_t> stride = {1, 1},
                    std::vector<int64_t> padding = {0, 0}, std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
RemoteTensor einsum(const std::string& equation, const std::vector<RemoteTensor>& operands);

// Autograd on the workers (torch's, as Monarch's workers run it): each worker's values keep
// their history, so backward from a loss reaches the leaves it was computed from.
/// Marks t a leaf that requires a gradient (t.requires_grad_()): a write to t. Returns t.
const RemoteTensor& requires_grad_(const RemoteTensor& t, bool on = true);
/// loss.backward() (a one-element loss) or loss.backward(grad) on the workers: the leaves'
/// gradients accumulate, reduced over the mesh as DTensor's backward reduces them. Ordered
/// after the loss's writers on the loss's stream.
void backward(const RemoteTensor& loss);
void backward(const RemoteTensor& loss, const RemoteTensor& grad);
/// t.grad: the leaf's accumulated gradient as a tensor of its own. Fails at its futures (a
/// ValueError naming grad and the tensor) when t is not a leaf requiring a gradient, or no
/// backward reached it since it was made or zeroed.
RemoteTensor grad(const RemoteTensor& t);
/// torch.optim.SGD without momentum on remote parameters: step() writes p -= lr (grad +
/// weight_decay p) into each parameter (each stays the same leaf); zero_grad() clears the
/// gradients (set_to_none). Both are writes to the parameters under the stream rules.
class SGD {
 public:
  SGD(std::vector<RemoteTensor> params, double lr, double weight_decay = 0.0);
  void step() const;
  void zero_grad() const;

 private:
  std::vector<RemoteTensor> params_;
  double lr_, weight_decay_;
};

/// The in-place form of an op: `target` = op(target, inputs...) (Monarch's `_inplace` / `out=`):
/// a write to target, so the stream rules for writers apply.
void call_inplace(const std::string& op, const RemoteTensor& target, const std::vector<RemoteTensor>& inputs,
                  const std::vector<double>& scalars = {}, const std::vector<int64_t>& ints = {});
void add_(const RemoteTensor& target, const RemoteTensor& other);
void mul_(const RemoteTensor& target, const RemoteTensor& other);

/// Monarch's mesh reduce (DTensor::reduce on the workers): each worker's block taken as its own
/// value along the mesh `axes` (which t must hold Replicate, or the same Partial), combined by
/// `reduction` across them: onto every worker (Replicate; sum is all_reduce), or with `scatter`
/// split over them along dim 0 (reduce_scatter). `stack` gathers the blocks into a new leading
/// dim of their count instead (all_gather; with scatter, all_to_all: the blocks split along
/// their dim 0, the old leading one). With `onto`, a slice of t's mesh without those axes
/// (Monarch's `mesh=` such as gpu=0), the result lives on that slice only (reduce, or gather with
/// stack). Throws ShardingError for an unknown axis or a bad target (errors on the workers, such
/// as a sharded axis, surface at the result's futures).
/// With `out` (Monarch's `out=`), the result is written into out, which must live on the
/// result's mesh (a write to out under the stream rules), and out is returned.
RemoteTensor reduce(const RemoteTensor& t, const std::vector<std::string>& axes, MeshReduction reduction,
                    bool scatter = false, const WorkerMesh* onto = nullptr, const RemoteTensor* out = nullptr);
/// The same by a ReduceOp (sum, avg, product, max, min).
RemoteTensor reduce(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op = ReduceOp::sum,
                    bool scatter = false, const WorkerMesh* onto = nullptr, const RemoteTensor* out = nullptr);
/// The same, the result replacing t's value (Monarch's `_inplace=True`); not with `onto`, and not
/// a stack (which changes the shape: a ValueError at the call).
void reduce_(const RemoteTensor& t, const std::vector<std::string>& axes, MeshReduction reduction,
             bool scatter = false);
void reduce_(const RemoteTensor& t, const std::vector<std::string>& axes, ReduceOp op = ReduceOp::sum,
             bool scatter = false);

/// Monarch's to_mesh over a list: each tensor's to_mesh(mesh).
std::vector<RemoteTensor> to_mesh(const std::vector<RemoteTensor>& tensors, const WorkerMesh& mesh);

/// Monarch's slice_mesh(tensors, **coords) over a list: each tensor on the slice of its mesh at
/// `at`, tensors of one mesh on one slice (so ops can combine them). Throws as
/// RemoteTensor::slice_mesh.
std::vector<RemoteTensor> slice_mesh(const std::vector<RemoteTensor>& tensors,
                                     const std::map<std::string, int64_t>& at);

/// Monarch's no_mesh: while one is alive, issuing work (an op, a factory, a remote function, a
/// reduce, a seed) is a ValueError, so that code meant to run on the controller alone cannot
/// start computation by accident. Fetching results stays allowed. Scopes nest.
class NoMesh {
 public:
  NoMesh();
  ~NoMesh();
  NoMesh(const NoMesh&) = delete;
  NoMesh& operator=(const NoMesh&) = delete;
};

/// Registers a remote function under `name`: SPMD code that every worker of a mesh runs with the
/// mesh and its DTensors (the RemoteTensor arguments' shards), returning DTensors that become
/// RemoteTensors. State it keeps between calls belongs in rank_state (per worker).
/// Register before run (every worker process must know it). A worker's exception fails the
/// call's results on every worker of the mesh (with the first failing worker's error), and with
/// them every value computed from them; so does a result that is not a DTensor on the call's
/// mesh (the error names both meshes). After each call the mesh's workers agree on how it went
/// (the call ends together on all of them). The stream's communicators of the mesh stay usable
/// unless a collective was cut short: an exception came out of a collective, the workers'
/// calls do not pair up, or workers still wait in a collective for a failed one after the desync
/// grace period (TESSERA_DESYNC_GRACE_S, default 1 s). Then every worker fails them: the waiting
/// workers are released with the error, and later collectives on that mesh and stream fail with
/// it (a new Stream works on the mesh afresh). Throws ValueError for an empty name or one
/// registered twice.
using RemoteFunction = std::function<std::vector<DTensor>(const DeviceMesh& mesh, const std::vector<DTensor>& inputs)>;
void register_remote(const std::string& name, RemoteFunction fn);
/// Calls the remote function `name` on `mesh` (Monarch's remote(fn).call_on(mesh)) with `inputs`
/// (on that mesh) and returns its `outputs` results, enqueued without waiting. Throws ValueError
/// for an unknown name, ShardingError for an input on another mesh.
std::vector<RemoteTensor> call_remote(const std::string& name, const WorkerMesh& mesh,
                                      const std::vector<RemoteTensor>& inputs, int64_t outputs = 1);

/// Monarch's propagate=: the layouts of a remote function's results (one per result, on the
/// call's mesh) from the inputs' layouts, computed on the controller, so the results' layout()
/// and shape() are known at the call without asking a worker. Pure; it runs at every call.
using Propagator = std::function<std::vector<Layout>(const std::vector<Layout>& inputs)>;

/// A remote function's handle (Monarch's `remote`): remote(name, fn) registers fn under name
/// and returns it; call(mesh, inputs, outputs) is call_remote(name, ...).
/// With a propagation (Monarch's propagate=), the controller knows the results' layouts at the
/// call: from a Propagator, or "cached": the first call with given input layouts (and mesh)
/// waits for the workers' layouts and keeps them, later calls with the same ones reuse them (as
/// Monarch's cached propagation runs the function once per input pattern). The inputs' layouts
/// it reads are known at once when a propagated call or a finished op made them. The workers
/// check each result against the layout the controller handed out: a result that differs
/// fails (at its futures), naming the function, both layouts and the result's index, as does a
/// result of a failed call. Monarch's "mocked" and "inspect" run the function on the
/// controller, which holds no data here: a ValueError at remote().
class Remote {
 public:
  explicit Remote(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  /// With a propagation the call returns as many results as it gives: `outputs` must match
  /// (ValueError naming both counts); so must each layout's mesh the call's (ShardingError).
  std::vector<RemoteTensor> call(const WorkerMesh& mesh, const std::vector<RemoteTensor>& inputs = {},
                                 int64_t outputs = 1) const;
  /// "none", "function" or "cached".
  const char* propagation() const;
  /// "cached": calls that reused kept layouts, and that asked the workers.
  int64_t cache_hits() const;
  int64_t cache_misses() const;

 private:
  friend Remote remote(const std::string&, RemoteFunction, Propagator);
  friend Remote remote(const std::string&, RemoteFunction, const std::string&);
  struct Cache;
  std::string name_;
  Propagator propagate_;
  std::shared_ptr<Cache> cache_;  // "cached" (shared by copies of the handle)
};
/// register_remote(name, fn), returning its handle. Before run, as register_remote.
Remote remote(const std::string& name, RemoteFunction fn);
/// The same with a propagation function.
Remote remote(const std::string& name, RemoteFunction fn, Propagator propagate);
/// The same with a named propagation: "cached". ValueError for any other name.
Remote remote(const std::string& name, RemoteFunction fn, const std::string& propagate);

/// The local block of the worker at `coordinate` of the tensor's mesh (a clone), read on the
/// active stream (the stream rules for readers apply); none: coordinate 0 on every axis
/// (Monarch's shard=None, as after an all_reduce). Throws ShardingError at the call for a
/// coordinate outside the mesh.
Future<Tensor> fetch_shard(const RemoteTensor& t, const std::vector<int64_t>& coordinate = {});
/// fetch_shard(t, {1, 0}): a braced coordinate (this overload keeps it from also reading as a map).
inline Future<Tensor> fetch_shard(const RemoteTensor& t, std::initializer_list<int64_t> coordinate) {
  return fetch_shard(t, std::vector<int64_t>(coordinate));
}
/// The same at named coordinates (Monarch's `fetch_shard(t, gpu=1)`); unnamed axes are 0. Throws
/// ShardingError for an unknown axis.
Future<Tensor> fetch_shard(const RemoteTensor& t, const std::map<std::string, int64_t>& at);
/// The whole tensor (full_tensor on every worker of the mesh; the first delivers it): for small
/// tensors, as Monarch's inspect.
Future<Tensor> fetch_full(const RemoteTensor& t);

}  // namespace controller
}  // namespace tessera
