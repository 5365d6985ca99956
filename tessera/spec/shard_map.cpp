// shard_map and its collectives: the region lowers its inputs and output onto DTensor (planned
// redistributes, to_local and a DTensor built from the blocks); the collectives inside run on
// the mesh's per-axis communicators and record their adjoints on the Tensor tape.
#include <tessera/spec/shard_map.hpp>

#include <algorithm>
#include <memory>
#include <string>

#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/spec/detail/manual_blocks.hpp>
#include <tessera/spec/mark_sharding.hpp>

namespace tessera {

namespace {

// The manual region of the innermost shard_map running on this rank (thread).
struct Region {
  DeviceMesh mesh;
  // Mesh dims each value made here is known to vary over (bit m: mesh dim m), by the value's
  // storage. The Tensor is kept, so its storage cannot be freed and its address reused.
  std::vector<std::pair<Tensor, uint64_t>> varying;

  void mark(const Tensor& t, uint64_t dims) { varying.emplace_back(t, dims); }
  // The known variation of t, or 0 when it was not made by a collective or given as an input.
  uint64_t known(const Tensor& t) const {
    for (auto it = varying.rbegin(); it != varying.rend(); ++it)
      if (it->first.raw_data() == t.raw_data() && it->first.shape() == t.shape()) return it->second;
    return 0;
  }
};
thread_local std::vector<Region*> regions;

class RegionScope {
 public:
  explicit RegionScope(Region& region) { regions.push_back(&region); }
  ~RegionScope() { regions.pop_back(); }
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;
};

Region& region(const char* call, std::string_view axis) {
  TESSERA_CHECK(!regions.empty(), ShardingError, call, "over axis '", axis,
                "' outside shard_map: the collectives by axis name run inside a shard_map's function");
  return *regions.back();
}

uint64_t bit(int64_t mesh_dim) { return uint64_t{1} << mesh_dim; }

// One collective by axis name, resolved in the current region.
struct AxisCall {
  const char* call;
  Region& region;
  int64_t dim;  // mesh dim
  std::shared_ptr<Communicator> comm;
  int64_t size() const { return comm->size(); }
};
AxisCall axis_call(const char* call, std::string_view axis) {
  Region& r = region(call, axis);
  const int64_t dim = r.mesh.spec().dim_of(axis, call);
  return {call, r, dim, r.mesh.comm_ptr(dim)};
}

int64_t normalized_dim(const char* call, const Tensor& x, int64_t dim) {
  const int64_t nd = x.ndim();
  TESSERA_CHECK(dim >= -nd && dim < nd, ShardingError, call, "dim ", dim, " is out of range for ",
                x.shape().to_string());
  return dim < 0 ? dim + nd : dim;
}

// x with dim `from` moved to position `to` (a view).
Tensor movedim(const Tensor& x, int64_t from, int64_t to) {
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (d != from) order.push_back(d);
  order.insert(order.begin() + to, from);
  return x.permute(order);
}

// x viewed with dim `dim` split into (n, size/n) and the n moved to the front, made contiguous:
// the n pieces along `dim` as consecutive blocks, the layout scatters and exchanges send.
Tensor pieces_first(const char* call, const Tensor& x, int64_t dim, int64_t n, std::string_view axis) {
  TESSERA_CHECK(x.shape()[dim] % n == 0, ShardingError, call, "dim ", dim, " of ", x.shape().to_string(),
                " does not split into ", n, " equal pieces over axis '", axis, "' of size ", n);
  std::vector<int64_t> split(x.shape().begin(), x.shape().end());
  split[static_cast<size_t>(dim)] = n;
  split.insert(split.begin() + dim + 1, x.shape()[dim] / n);
  return movedim(x.contiguous().reshape(Shape(split)), dim, 0).contiguous();
}

// The inverse for received blocks: `blocks` is [n, ...piece], the pieces concatenated along `dim`.
Tensor concat_pieces(const Tensor& blocks, int64_t dim) {
  std::vector<int64_t> shape(blocks.shape().begin() + 1, blocks.shape().end());
  shape[static_cast<size_t>(dim)] *= blocks.shape()[0];
  return movedim(blocks, 0, dim).contiguous().reshape(Shape(shape));
}

Tensor all_reduce_copy(const Tensor& x, Communicator& comm, ReduceOp op) {
  Tensor out = x.contiguous().clone();
  comm.all_reduce(out.raw_data(), out.numel(), out.dtype(), op);
  return out;
}

Tensor gather_along(const Tensor& x, Communicator& comm, int64_t dim) {
  const Tensor block = x.contiguous();
  std::vector<int64_t> shape{comm.size()};
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  Tensor blocks = empty(Shape(shape), x.dtype());
  comm.all_gather(block.raw_data(), blocks.raw_data(), block.numel(), x.dtype());
  return concat_pieces(blocks, dim);
}

Tensor scatter_along(const char* call, const Tensor& x, Communicator& comm, int64_t dim, std::string_view axis) {
  const Tensor blocks = pieces_first(call, x, dim, comm.size(), axis);
  std::vector<int64_t> shape(blocks.shape().begin() + 1, blocks.shape().end());
  Tensor out = empty(Shape(shape), x.dtype());
  comm.reduce_scatter(blocks.raw_data(), out.raw_data(), out.numel(), x.dtype(), ReduceOp::sum);
  return out;
}

Tensor exchange_along(const char* call, const Tensor& x, Communicator& comm, int64_t split_dim, int64_t concat_dim,
                      std::string_view axis) {
  const Tensor blocks = pieces_first(call, x, split_dim, comm.size(), axis);
  Tensor received = empty(blocks.shape(), x.dtype());
  comm.all_to_all(blocks.raw_data(), received.raw_data(), blocks.numel() / comm.size(), x.dtype());
  // received[i] is rank i's piece, shaped like x with split_dim divided by n.
  return concat_pieces(received, concat_dim);
}

// Sends x along each (src, dst) pair as one all_to_all_v (no ordering of blocking sends to get
// wrong, and the group's desync checks apply); ranks nobody sends to get zeros.
Tensor permute_along(const Tensor& x, Communicator& comm, const std::vector<std::pair<int64_t, int64_t>>& perm) {
  const int n = comm.size(), me = comm.rank();
  const Tensor block = x.contiguous();
  std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
  for (const auto& [src, dst] : perm) {
    if (src == me) send[static_cast<size_t>(dst)] = block.numel();
    if (dst == me) recv[static_cast<size_t>(src)] = block.numel();
  }
  Tensor out = zeros(x.shape(), x.dtype());  // stays zeros when no pair sends here
  comm.all_to_all_v(block.raw_data(), send, out.raw_data(), recv, x.dtype());
  return out;
}

// Records `backward` as out's gradient function when x needs a gradient.
void record_unary(const char* name, Tensor& out, const Tensor& x, std::function<Tensor(const Tensor&)> backward) {
  if (!autograd::needs_grad<Tensor>({&x})) return;
  autograd::record<Tensor>(name, out, {&x}, [backward = std::move(backward)](const Tensor& g) {
    return std::vector<Tensor>{backward(g)};
  });
}

Tensor reduce_over(const char* call, const Tensor& x, std::string_view axis, ReduceOp op) {
  TESSERA_CHECK(x.defined(), ShardingError, call, "undefined tensor over axis '", axis, "'");
  const AxisCall a = axis_call(call, axis);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = all_reduce_copy(x, *a.comm, op == ReduceOp::avg ? ReduceOp::sum : op);
    if (op == ReduceOp::avg) out = out / static_cast<double>(a.size());
  }
  const auto comm = a.comm;
  const double n = static_cast<double>(a.size());
  if (op == ReduceOp::sum) {
    record_unary("psum", out, x, [comm](const Tensor& g) { return all_reduce_copy(g, *comm, ReduceOp::sum); });
  } else if (op == ReduceOp::avg) {
    record_unary("pmean", out, x, [comm, n](const Tensor& g) { return all_reduce_copy(g, *comm, ReduceOp::sum) / n; });
  } else {
    // Every rank holding the maximum shares each element's summed cotangent equally.
    const Tensor mask = eq(x.detach(), out.detach());
    record_unary("pmax", out, x, [comm, mask](const Tensor& g) {
      const Tensor total = all_reduce_copy(g, *comm, ReduceOp::sum);
      const Tensor holders = all_reduce_copy(where(mask, ones_like(g), zeros_like(g)), *comm, ReduceOp::sum);
      return where(mask, total / holders, zeros_like(g));
    });
  }
  a.region.mark(out, a.region.known(x) & ~bit(a.dim));
  return out;
}

// The shard_map output's blocks as a DTensor: a replicated output hands each copy an equal share
// of the cotangent (the copies are one value), which the collectives' adjoints sum back.
Tensor share_cotangent(const Tensor& out, double copies) {
  if (copies == 1 || !autograd::needs_grad<Tensor>({&out})) return out;
  Tensor shared = out.detach();
  autograd::record<Tensor>("shard_map_output", shared, {&out},
                           [copies](const Tensor& g) { return std::vector<Tensor>{g / copies}; });
  return shared;
}

}  // namespace

Tensor psum(const Tensor& x, std::string_view axis) { return reduce_over("psum", x, axis, ReduceOp::sum); }
Tensor pmax(const Tensor& x, std::string_view axis) { return reduce_over("pmax", x, axis, ReduceOp::max); }
Tensor pmean(const Tensor& x, std::string_view axis) { return reduce_over("pmean", x, axis, ReduceOp::avg); }

Tensor all_gather(const Tensor& x, std::string_view axis, int64_t dim) {
  TESSERA_CHECK(x.defined(), ShardingError, "all_gather", "undefined tensor over axis '", axis, "'");
  const AxisCall a = axis_call("all_gather", axis);
  dim = normalized_dim("all_gather", x, dim);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = gather_along(x, *a.comm, dim);
  }
  const auto comm = a.comm;
  const std::string name(axis);
  record_unary("all_gather", out, x,
               [comm, dim, name](const Tensor& g) { return scatter_along("all_gather", g, *comm, dim, name); });
  a.region.mark(out, a.region.known(x) & ~bit(a.dim));
  return out;
}

Tensor psum_scatter(const Tensor& x, std::string_view axis, int64_t dim) {
  TESSERA_CHECK(x.defined(), ShardingError, "psum_scatter", "undefined tensor over axis '", axis, "'");
  const AxisCall a = axis_call("psum_scatter", axis);
  dim = normalized_dim("psum_scatter", x, dim);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = scatter_along("psum_scatter", x, *a.comm, dim, axis);
  }
  const auto comm = a.comm;
  record_unary("psum_scatter", out, x, [comm, dim](const Tensor& g) { return gather_along(g, *comm, dim); });
  a.region.mark(out, a.region.known(x) | bit(a.dim));
  return out;
}

Tensor all_to_all(const Tensor& x, std::string_view axis, int64_t split_dim, int64_t concat_dim) {
  TESSERA_CHECK(x.defined(), ShardingError, "all_to_all", "undefined tensor over axis '", axis, "'");
  const AxisCall a = axis_call("all_to_all", axis);
  split_dim = normalized_dim("all_to_all", x, split_dim);
  concat_dim = normalized_dim("all_to_all", x, concat_dim);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = exchange_along("all_to_all", x, *a.comm, split_dim, concat_dim, axis);
  }
  const auto comm = a.comm;
  const std::string name(axis);
  // The adjoint sends every piece back: split where the forward concatenated, and vice versa.
  record_unary("all_to_all", out, x, [comm, split_dim, concat_dim, name](const Tensor& g) {
    return exchange_along("all_to_all", g, *comm, concat_dim, split_dim, name);
  });
  a.region.mark(out, a.region.known(x) | bit(a.dim));
  return out;
}

Tensor ppermute(const Tensor& x, std::string_view axis, std::vector<std::pair<int64_t, int64_t>> perm) {
  TESSERA_CHECK(x.defined(), ShardingError, "ppermute", "undefined tensor over axis '", axis, "'");
  const AxisCall a = axis_call("ppermute", axis);
  const int64_t n = a.size();
  std::vector<int> sources(static_cast<size_t>(n), 0), targets(static_cast<size_t>(n), 0);
  for (const auto& [src, dst] : perm) {
    TESSERA_CHECK(src >= 0 && src < n && dst >= 0 && dst < n, ShardingError, "ppermute", "pair (", src, ", ", dst,
                  ") is out of range for axis '", axis, "' of size ", n);
    TESSERA_CHECK(++sources[static_cast<size_t>(src)] == 1, ShardingError, "ppermute", "axis index ", src,
                  " sends twice in the permutation over axis '", axis, "'; each index sends at most once");
    TESSERA_CHECK(++targets[static_cast<size_t>(dst)] == 1, ShardingError, "ppermute", "axis index ", dst,
                  " receives twice in the permutation over axis '", axis, "'; each index receives at most once");
  }
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = permute_along(x, *a.comm, perm);
  }
  std::vector<std::pair<int64_t, int64_t>> inverse;
  for (const auto& [src, dst] : perm) inverse.emplace_back(dst, src);
  const auto comm = a.comm;
  record_unary("ppermute", out, x, [comm, inverse](const Tensor& g) { return permute_along(g, *comm, inverse); });
  a.region.mark(out, a.region.known(x) | bit(a.dim));
  return out;
}

int64_t axis_index(std::string_view axis) {
  Region& r = region("axis_index", axis);
  return r.mesh.coordinate(axis);
}

DTensor shard_map(std::function<Tensor(const std::vector<Tensor>&)> fn, const DeviceMesh& mesh,
                  std::vector<PartitionSpec> in_specs, PartitionSpec out_spec, const std::vector<DTensor>& args,
                  ShardMapOptions options) {
  TESSERA_CHECK(fn != nullptr, ShardingError, "shard_map", "no function given");
  TESSERA_CHECK(in_specs.size() == args.size(), ShardingError, "shard_map", in_specs.size(), " in_specs for ",
                args.size(), " arguments; give one spec per argument");
  TESSERA_CHECK(mesh.size() > 0, ShardingError, "shard_map", "the mesh is empty (a default-constructed DeviceMesh)");
  TESSERA_CHECK(mesh.is_member(), ShardingError, "shard_map", "world rank ", rank(), " is not in ",
                mesh.to_string(), "; call shard_map on the mesh's ranks only");
  const MeshSpec& spec = mesh.spec();
  Region region{mesh, {}};
  std::vector<Tensor> locals;
  for (size_t i = 0; i < args.size(); ++i) {
    const DTensor& arg = args[i];
    TESSERA_CHECK(arg.layout().mesh() == spec, ShardingError, "shard_map", "argument ", i, " (",
                  arg.layout().to_string(), ") is not on ", mesh.to_string(), "; move it there first");
    const DTensor laid = with_sharding_constraint(arg, in_specs[i]);
    // A replicated input's copies are one value: their cotangents add up (Partial on those dims).
    Placements grad = laid.placements();
    uint64_t sharded = 0;
    for (size_t m = 0; m < grad.size(); ++m) {
      if (is_replicate(grad[m]))
        grad[m] = Partial{};
      else
        sharded |= bit(static_cast<int64_t>(m));
    }
    locals.push_back(laid.to_local(grad));
    region.mark(locals.back(), sharded);
  }
  Tensor out;
  {
    RegionScope scope(region);
    out = fn(locals);
  }
  TESSERA_CHECK(out.defined(), ShardingError, "shard_map", "the function returned an undefined tensor for out_spec ",
                out_spec.to_string());
  const auto named = out_spec.resolve(spec, out.ndim(), "shard_map");
  uint64_t out_spec_axes = 0;
  for (const auto& dims : named)
    for (int64_t m : dims) out_spec_axes |= bit(m);
  double copies = 1;
  for (int64_t m = 0; m < spec.ndim(); ++m) {
    if (out_spec_axes & bit(m)) continue;
    copies *= static_cast<double>(spec.size(m));
    TESSERA_CHECK(!options.check_vma || !(region.known(out) & bit(m)), ShardingError, "shard_map", "out_spec ",
                  out_spec.to_string(), " claims the output is replicated over axis '", spec.names()[static_cast<size_t>(m)],
                  "', but it varies over it (an input sharded over it, or a psum_scatter, all_to_all or ppermute over ",
                  "it); psum it over '", spec.names()[static_cast<size_t>(m)], "' or name the axis in out_spec");
  }
  return detail::from_manual_blocks("shard_map", share_cotangent(out, copies), out_spec, std::nullopt, mesh);
}

}  // namespace tessera
