// Sharding annotations lowered onto DTensor: a spec becomes a Layout (layout_from_spec) and the
// planner moves the data; nothing here communicates except through DTensor and one metadata
// gather of local shapes in disable_manual_sharding.
#include <tessera/spec/mark_sharding.hpp>

#include <numeric>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/runtime/runtime.hpp>
#include <tessera/spec/detail/manual_blocks.hpp>

namespace tessera {

namespace {

// The layout of `spec` for a tensor of `shape`, with errors naming the user's call.
Layout spec_layout(std::string_view call, const Shape& shape, DType dtype, const MeshSpec& mesh,
                   const PartitionSpec& spec) {
  try {
    return layout_from_spec(shape, dtype, mesh, spec);
  } catch (const ShardingError& e) {
    std::string what = e.what();
    constexpr std::string_view internal = "[layout_from_spec] ";
    if (what.rfind(internal, 0) != 0) throw;
    throw ShardingError(detail::concat("[", call, "] ", what.substr(internal.size()), " (tensor ", shape.to_string(),
                                       " ", name(dtype), ")"));
  }
}

DTensor constrain(std::string_view call, const DTensor& x, const PartitionSpec& spec) {
  TESSERA_CHECK(x.defined() || !x.device_mesh().is_member(), ShardingError, call, "undefined DTensor for ",
                spec.to_string());
  const Layout target = spec_layout(call, x.shape(), x.dtype(), x.layout().mesh(), spec);
  if (target == x.layout()) return x;
  return x.redistribute(x.device_mesh(), target);
}

}  // namespace

DTensor mark_sharding(const Tensor& global, const DeviceMesh& mesh, const PartitionSpec& spec) {
  TESSERA_CHECK(global.defined(), ShardingError, "mark_sharding", "undefined tensor for ", spec.to_string(), " on ",
                mesh.to_string());
  TESSERA_CHECK(mesh.size() > 0, ShardingError, "mark_sharding", "the mesh is empty (a default-constructed ",
                "DeviceMesh) for ", spec.to_string());
  return distribute_to_layout(global, mesh, spec_layout("mark_sharding", global.shape(), global.dtype(), mesh.spec(), spec),
                           "mark_sharding");
}

DTensor mark_sharding(const DTensor& x, const PartitionSpec& spec) { return constrain("mark_sharding", x, spec); }

DTensor with_sharding_constraint(const DTensor& x, const PartitionSpec& spec) {
  return constrain("with_sharding_constraint", x, spec);
}

Tensor clear_sharding(const DTensor& x) { return x.full_tensor(); }

Tensor enable_manual_sharding(const DTensor& x, const PartitionSpec& spec) {
  return constrain("enable_manual_sharding", x, spec).to_local();
}

DTensor disable_manual_sharding(const Tensor& local, const PartitionSpec& spec, const Shape& full_shape,
                                const DeviceMesh& mesh) {
  return detail::from_manual_blocks("disable_manual_sharding", local, spec, full_shape, mesh);
}

namespace detail {

DTensor from_manual_blocks(const char* call, const Tensor& local, const PartitionSpec& spec,
                           const std::optional<Shape>& full_shape, const DeviceMesh& mesh) {
  const std::string where = " (" + spec.to_string() + " on " + mesh.to_string() + ")";
  TESSERA_CHECK(local.defined(), ShardingError, call, "undefined local tensor", where);
  if (!mesh.is_member()) {
    TESSERA_CHECK(full_shape.has_value(), ShardingError, call, "world rank ", rank(), " is not in the mesh", where);
    return DTensor(Tensor(), mesh, spec_layout(call, *full_shape, local.dtype(), mesh.spec(), spec));
  }
  // Every rank sees every local shape, so all reach the same verdict (one throwing alone would
  // leave the others waiting in their next collective).
  const auto shapes = detail::all_gather_int64(mesh, std::vector<int64_t>(local.shape().begin(), local.shape().end()),
                                               call);
  const MeshSpec& m = mesh.spec();
  const int64_t nd = full_shape ? full_shape->size() : local.ndim();
  for (size_t i = 0; i < shapes.size(); ++i)
    TESSERA_CHECK(static_cast<int64_t>(shapes[i].size()) == nd, ShardingError, call, "rank ", m.ranks()[i],
                  "'s local ", Shape(shapes[i]).to_string(), " has ", shapes[i].size(), " dims, ",
                  full_shape ? "the full shape " + full_shape->to_string() : "rank " + std::to_string(rank()) + "'s",
                  " has ", nd, where);
  const auto dims = spec.resolve(m, nd, call);
  // Each sharded dim's pieces, in splitting order, read off the ranks holding them.
  Shape global = full_shape ? *full_shape : local.shape();
  ShardSizes sizes;
  ShardOrder order;
  for (int64_t d = 0; d < nd; ++d) {
    const auto& by = dims[static_cast<size_t>(d)];
    if (by.empty()) continue;
    std::vector<int64_t> pieces = pieces_from_local_shapes(m, shapes, by, d);
    const int64_t total = std::accumulate(pieces.begin(), pieces.end(), int64_t{0});
    if (!full_shape) global[d] = total;
    TESSERA_CHECK(total == global[d], ShardingError, call, "the locals' pieces of dim ", d, " add up to ", total, " (",
                  Shape(pieces).to_string(), " in splitting order), not the full shape's ", global[d],
                  " (full shape ", global.to_string(), ")", where);
    order[d] = by;
    sizes[d] = std::move(pieces);
  }
  Layout layout = spec_layout(call, global, local.dtype(), m, spec);
  for (const auto& [d, pieces] : sizes)
    if (pieces != layout.piece_sizes(d)) {  // uneven beyond chunk semantics: explicit sizes
      layout = Layout(global, local.dtype(), m, layout.placements(), order, sizes);
      break;
    }
  // The replicas and the unsharded dims: every local must be its block.
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape block = layout.local_shape(m.coordinate_of(m.ranks()[i]));
    TESSERA_CHECK(Shape(shapes[i]) == block, ShardingError, call, "rank ", m.ranks()[i], "'s local ",
                  Shape(shapes[i]).to_string(), " is not its block ", block.to_string(), " of ", layout.to_string(),
                  "; replicas must agree and unsharded dims be whole", where);
  }
  return DTensor(local, mesh, layout);
}

}  // namespace detail

std::string type_string(const DTensor& x) {
  const Layout& layout = x.layout();
  const auto& names = layout.mesh().names();
  std::string text = std::string(name(layout.dtype())) + "[";
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    text.append(d ? "," : "").append(std::to_string(layout.global_shape()[d]));
    const auto& order = layout.shard_order(d);
    if (order.empty()) continue;
    text += "@";
    if (order.size() > 1) text += "(";
    for (size_t i = 0; i < order.size(); ++i) text.append(i ? "," : "").append(names[static_cast<size_t>(order[i])]);
    if (order.size() > 1) text += ")";
  }
  text += "]";
  std::string pending;
  for (size_t m = 0; m < layout.placements().size(); ++m)
    if (const auto* p = std::get_if<Partial>(&layout.placements()[m]))
      pending.append(pending.empty() ? "" : ",").append(to_string(Placement(*p))).append("@").append(names[m]);
  return pending.empty() ? text : text + "{" + pending + "}";
}

}  // namespace tessera
