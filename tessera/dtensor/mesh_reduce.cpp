// Monarch's mesh operations on DTensor: reduce over named mesh dims (the locals along them are
// values to combine) and fetch_shard. Both lower to the planner: reduce reinterprets the locals as
// Partial (or stacks them into a new leading dim) and redistributes.
#include <tessera/core/error.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

std::string_view reduction_name(MeshReduction r) {
  switch (r) {
    case MeshReduction::sum: return "sum";
    case MeshReduction::avg: return "avg";
    case MeshReduction::product:
      return "product";
    case MeshReduction::max: return "max";
    case MeshReduction::min: return "min";
    case MeshReduction::stack: return "stack";
  }
  return "?";
}

ReduceOp reduce_op_of(MeshReduction r) {
  switch (r) {
    case MeshReduction::sum: return ReduceOp::sum;
    case MeshReduction::avg: return ReduceOp::avg;
    case MeshReduction::product:
      return ReduceOp::product;
    case MeshReduction::max: return ReduceOp::max;
    case MeshReduction::min: return ReduceOp::min;
    case MeshReduction::stack: break;
  }
  return ReduceOp::sum;
}

std::vector<int64_t> mesh_dims_of(const DTensor& t, const std::vector<std::string>& dims, const char* op) {
  TESSERA_CHECK(!dims.empty(), ShardingError, op, "no mesh dims given for ", t.to_string());
  std::vector<int64_t> out;
  for (const std::string& axis : dims) {
    const int64_t m = t.device_mesh().spec().dim_of(axis, op);
    TESSERA_CHECK(std::find(out.begin(), out.end(), m) == out.end(), ShardingError, op, "mesh dim ", axis,
                  " named twice for ", t.to_string());
    out.push_back(m);
  }
  return out;
}

// Shard order of every tensor dim of `layout`, with `extra` mesh dims appended to `dim`'s order.
ShardOrder orders_with(const Layout& layout, const Placements& placements, int64_t shift, int64_t dim,
                       const std::vector<int64_t>& extra) {
  ShardOrder order;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    std::vector<int64_t> o;
    for (int64_t m : layout.shard_order(d))
      if (is_shard(placements[static_cast<size_t>(m)], d + shift)) o.push_back(m);
    if (!o.empty()) order[d + shift] = o;
  }
  for (int64_t m : extra) order[dim].push_back(m);
  return order;
}

// Moves `local` (this rank's block of `from`) to `to` on `mesh`. Mesh dims outside the reduction
// keep their placements, a Partial among them, so the destination may hold a Partial that the
// source already held: allowed here, where a user's redistribute to Partial is not.
DTensor reduction_move(const Tensor& local, const DeviceMesh& mesh, const Layout& from, const Layout& to) {
  const DTensor source(local, mesh, from);  // checks the local against `from`
  const PlanOptions options = plan_options(true);
  const auto p = cached_plan(from, to, options);
  return DTensor(detail::run_plan(*p, source.to_local(), mesh, mesh), mesh, to);
}

}  // namespace

DTensor DTensor::reduce(const std::vector<std::string>& dims, MeshReduction reduction, bool scatter) const {
  TESSERA_CHECK(!autograd::needs_grad<DTensor>({this}), ShardingError, "DTensor::reduce",
                "mesh reductions are not differentiable; ", to_string(), " requires a gradient (use detach())");
  const std::string op = "DTensor::reduce(" + std::string(reduction_name(reduction)) + (scatter ? ", scatter)" : ")");
  const auto mdims = mesh_dims_of(*this, dims, op.c_str());
  const Placements& now = placements();
  if (reduction != MeshReduction::stack) {
    // The locals along `dims` are values to reduce: Replicate ones count once per rank.
    const Partial partial{reduce_op_of(reduction)};
    Placements src = now, dst = now;
    for (int64_t m : mdims) {
      const Placement& p = now[static_cast<size_t>(m)];
      TESSERA_CHECK(is_replicate(p) || p == Placement{partial}, ShardingError, op.c_str(), "mesh dim ",
                    mesh_.spec().names()[static_cast<size_t>(m)], " holds ", tessera::to_string(p), " in ",
                    to_string(), "; reduce needs Replicate or ", tessera::to_string(Placement{partial}),
                    " there (redistribute first)");
      src[static_cast<size_t>(m)] = partial;
      dst[static_cast<size_t>(m)] = scatter ? Placement{Shard{0}} : Placement{Replicate{}};
    }
    TESSERA_CHECK(!scatter || ndim() >= 1, ShardingError, op.c_str(), "cannot scatter a 0-d tensor ", to_string());
    ShardSizes sizes;
    for (int64_t d = 0; d < ndim(); ++d)
      if (layout_->has_explicit_sizes(d)) sizes[d] = layout_->piece_sizes(d);
    const Layout from(shape(), dtype(), mesh_.spec(), src, orders_with(*layout_, src, 0, 0, {}), sizes);
    if (scatter) sizes.erase(0);  // more mesh dims split dim 0 now: chunk semantics
    const Layout to(shape(), dtype(), mesh_.spec(), dst,
                    orders_with(*layout_, dst, 0, 0, scatter ? mdims : std::vector<int64_t>{}), sizes);
    return reduction_move(local_, mesh_, from, to);
  }
  // stack: a new leading dim indexed by position along `dims`, sharded over them (each rank holds
  // its own local as one slice), then gathered (or all_to_all'd onto the old leading dim).
  Placements src, dst;
  int64_t count = 1;
  for (int64_t m = 0; m < mesh_.ndim(); ++m) {
    const Placement& p = now[static_cast<size_t>(m)];
    const bool stacked = std::find(mdims.begin(), mdims.end(), m) != mdims.end();
    if (stacked) {
      TESSERA_CHECK(is_replicate(p) || is_partial(p), ShardingError, op.c_str(), "mesh dim ",
                    mesh_.spec().names()[static_cast<size_t>(m)], " holds ", tessera::to_string(p), " in ",
                    to_string(), "; stack needs Replicate or Partial there (equal local shapes)");
      count *= mesh_.size(m);
      src.push_back(Shard{0});
      dst.push_back(scatter ? Placement{Shard{1}} : Placement{Replicate{}});
    } else {
      const Placement shifted = is_shard(p) ? Placement{Shard{std::get<Shard>(p).dim + 1}} : p;
      src.push_back(shifted);
      dst.push_back(shifted);
    }
  }
  TESSERA_CHECK(!scatter || ndim() >= 1, ShardingError, op.c_str(), "cannot scatter a 0-d tensor ", to_string());
  Shape stacked_shape{count};
  for (int64_t s : shape()) stacked_shape.push_back(s);
  ShardSizes sizes;
  for (int64_t d = 0; d < ndim(); ++d)
    if (layout_->has_explicit_sizes(d)) sizes[d + 1] = layout_->piece_sizes(d);
  const Layout from(stacked_shape, dtype(), mesh_.spec(), src, orders_with(*layout_, src, 1, 0, mdims), sizes);
  ShardSizes dst_sizes = sizes;
  if (scatter) dst_sizes.erase(1);
  const Layout to(stacked_shape, dtype(), mesh_.spec(), dst,
                  orders_with(*layout_, dst, 1, 1, scatter ? mdims : std::vector<int64_t>{}), dst_sizes);
  const Tensor slice = mesh_.is_member() ? local_.unsqueeze(0) : Tensor();
  return reduction_move(slice, mesh_, from, to);
}

Tensor DTensor::fetch_shard(const std::map<std::string, int64_t>& coordinates) const {
  const MeshSpec& spec = mesh_.spec();
  std::vector<int64_t> at(static_cast<size_t>(spec.ndim()), 0);
  for (const auto& [axis, index] : coordinates) {
    const int64_t m = spec.dim_of(axis, "DTensor::fetch_shard");
    TESSERA_CHECK(index >= 0 && index < spec.shape()[m], ShardingError, "DTensor::fetch_shard", "coordinate ", axis,
                  "=", index, " out of range for ", spec.to_string());
    at[static_cast<size_t>(m)] = index;
  }
  TESSERA_CHECK(mesh_.is_member(), ShardingError, "DTensor::fetch_shard", "world rank ", rank(), " is not in ",
                spec.to_string());
  const int owner = spec.rank_at(at);
  const Block block = layout_->block(at);
  if (const auto comm = mesh_.mesh_comm_ptr()) {
    const auto& ranks = comm->world_ranks();
    const int root = static_cast<int>(std::find(ranks.begin(), ranks.end(), owner) - ranks.begin());
    Tensor out = rank() == owner ? local_.clone() : empty(block.shape(), dtype());
    comm->broadcast(out.raw_data(), out.numel(), dtype(), root);
    return out;
  }
  // A slice without a mesh communicator: the owner sends the block to every rank.
  std::vector<Transfer> transfers;
  for (int r : spec.ranks()) transfers.push_back(Transfer{owner, r, block});
  const Block none{block.begin, block.begin};
  return detail::run_exchange(transfers, rank() == owner ? local_ : Tensor(), rank() == owner ? block : none, block,
                              dtype(), nullptr);
}

}  // namespace tessera

namespace tessera {

std::vector<int64_t> DTensor::offsets(int64_t mesh_dim) const {
  TESSERA_CHECK(mesh_dim >= 0 && mesh_dim < mesh_.ndim(), ShardingError, "DTensor::offsets", "mesh dim ", mesh_dim,
                " is out of range for ", layout_->to_string());
  const auto* shard = std::get_if<Shard>(&layout_->placements()[static_cast<size_t>(mesh_dim)]);
  TESSERA_CHECK(shard != nullptr, ShardingError, "DTensor::offsets", "mesh dim ", mesh_dim, " of ",
                layout_->to_string(), " shards no tensor dim");
  TESSERA_CHECK(mesh_.is_member(), ShardingError, "DTensor::offsets", "world rank ", rank(), " is not in ",
                mesh_.to_string());
  std::vector<int64_t> coordinate = mesh_.coordinate(), starts;
  for (int64_t c = 0; c < mesh_.size(mesh_dim); ++c) {
    coordinate[static_cast<size_t>(mesh_dim)] = c;
    starts.push_back(layout_->block(coordinate).begin[shard->dim]);
  }
  return starts;
}

}  // namespace tessera
