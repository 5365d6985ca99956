// DTensor construction from locals, redistribution and the plan cache.
#include <tessera/dtensor/dtensor.hpp>

#include <mutex>
#include <numeric>
#include <unordered_map>

#include <tessera/core/error.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

// Negative shard dims counted from the end, once; a dim out of range is the caller's error,
// named as theirs (not the Layout's they would otherwise meet).
Placements normalized(Placements placements, int64_t ndim, std::string_view call) {
  const std::string given = tessera::to_string(placements);
  for (auto& p : placements)
    if (auto* s = std::get_if<Shard>(&p)) {
      TESSERA_CHECK(s->dim >= -ndim && s->dim < ndim, ShardingError, call, "placements ", given, ": shard dim ",
                    s->dim, " is out of range for a tensor of ", ndim, " dims");
      if (s->dim < 0) s->dim += ndim;
    }
  return placements;
}

// A layout made from the user's arguments: its errors name the user's call, not [Layout].
template <class Make>
Layout users_layout(std::string_view call, Make&& make) {
  try {
    return make();
  } catch (const ShardingError& e) {
    std::string what = e.what();
    constexpr std::string_view internal = "[Layout] ";
    if (what.rfind(internal, 0) != 0) throw;
    throw ShardingError("[" + std::string(call) + "] " + what.substr(internal.size()));
  }
}

// Global shape from the locals' shapes: each sharded dim's pieces read off the rank holding it.
ShardSizes inferred_sizes(const Tensor& local, const DeviceMesh& mesh, const Placements& placements, Shape& global) {
  const MeshSpec& spec = mesh.spec();
  const int64_t nd = local.ndim();
  const auto shapes = detail::all_gather_int64(mesh, std::vector<int64_t>(local.shape().begin(), local.shape().end()),
                                               "DTensor::from_local");
  for (size_t i = 0; i < shapes.size(); ++i)
    TESSERA_CHECK(static_cast<int64_t>(shapes[i].size()) == nd, ShardingError, "DTensor::from_local",
                  "infer_sizes: rank ", spec.ranks()[i], " passed a local of ", shapes[i].size(), " dims, rank ",
                  rank(), " one of ", nd);
  const Layout probe(local.shape(), local.dtype(), spec, placements);  // shard orders, validated
  ShardSizes sizes;
  global = local.shape();
  for (int64_t d = 0; d < nd; ++d) {
    const auto& order = probe.shard_order(d);
    if (order.empty()) continue;
    std::vector<int64_t> pieces = pieces_from_local_shapes(spec, shapes, order, d);
    global[d] = std::accumulate(pieces.begin(), pieces.end(), int64_t{0});
    sizes[d] = std::move(pieces);
  }
  // Every rank's local must be its block of the inferred layout (the unsharded dims and the
  // replicas alike). Checked from the gathered shapes, so every rank throws alike.
  const Layout inferred(global, local.dtype(), spec, placements, {}, sizes);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape theirs(shapes[i]);
    const Shape block = inferred.local_shape(spec.coordinate_of(spec.ranks()[i]));
    TESSERA_CHECK(theirs == block, ShardingError, "DTensor::from_local", "infer_sizes: rank ", spec.ranks()[i],
                  "'s local shape ", theirs.to_string(), " is not its block ", block.to_string(), " of ",
                  inferred.to_string(), " (inferred from rank ", rank(), "'s local ", local.shape().to_string(),
                  ")");
  }
  return sizes;
}

// Every rank of the mesh must describe the same layout, and every rank's local must be its block
// of it; all compare all, so all throw alike (a rank that threw alone would leave the others
// waiting in the replica broadcast that follows).
void check_same_layout(const Layout& layout, const Shape& local_shape, const DeviceMesh& mesh) {
  const Shape block = layout.local_shape(mesh.coordinate());
  const std::string misfit =
      local_shape == block ? "" : local_shape.to_string() + " is not its block " + block.to_string();
  const auto texts = detail::all_gather_text(mesh, layout.to_string() + '\n' + misfit, "DTensor::from_local");
  const auto layout_of = [](const std::string& text) { return text.substr(0, text.find('\n')); };
  const auto misfit_of = [](const std::string& text) { return text.substr(text.find('\n') + 1); };
  for (size_t i = 0; i < texts.size(); ++i)
    TESSERA_CHECK(layout_of(texts[i]) == layout_of(texts.front()), ShardingError, "DTensor::from_local",
                  "run_check: rank ", mesh.spec().ranks()[i], " passed ", layout_of(texts[i]), " but rank ",
                  mesh.spec().ranks()[0], " passed ", layout_of(texts.front()));
  for (size_t i = 0; i < texts.size(); ++i)
    TESSERA_CHECK(misfit_of(texts[i]).empty(), ShardingError, "DTensor::from_local", "run_check: rank ",
                  mesh.spec().ranks()[i], "'s local shape ", misfit_of(texts[i]), " of ", layout.to_string(),
                  "; pass the global shape, explicit sizes or infer_sizes for uneven locals");
}

struct PlanKey {
  Layout src, dst;
  CostModel cost;
  bool allow_partial;
  size_t hosts;
  friend bool operator==(const PlanKey&, const PlanKey&) = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const noexcept {
    return std::hash<Layout>{}(k.src) * 31 + std::hash<Layout>{}(k.dst) * 7 + std::hash<double>{}(k.cost.call_us) +
           std::hash<double>{}(k.cost.message_us) * 3 + std::hash<double>{}(k.cost.bytes_per_us) * 5 +
           k.allow_partial + k.hosts * 11;
  }
};

// Per mesh dim of `mesh`: whether some line along it holds ranks of two hosts. O(ranks), once
// per mesh and options.
std::vector<bool> dims_spanning_hosts(const MeshSpec& mesh, const HostTopology& hosts) {
  std::vector<bool> spans(static_cast<size_t>(mesh.ndim()), false);
  for (int r : mesh.ranks()) {
    std::vector<int64_t> base = mesh.coordinate_of(r);
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (spans[static_cast<size_t>(m)] || base[static_cast<size_t>(m)] == 0) continue;
      std::vector<int64_t> first = base;
      first[static_cast<size_t>(m)] = 0;
      if (hosts.host_of(r) != hosts.host_of(mesh.rank_at(first))) spans[static_cast<size_t>(m)] = true;
    }
  }
  return spans;
}

struct PlanCache {
  std::mutex mutex;
  std::unordered_map<PlanKey, std::shared_ptr<const Plan>, PlanKeyHash> plans;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

}  // namespace

void clear_plan_cache() {
  PlanCache& cache = plan_cache();
  std::lock_guard lock(cache.mutex);
  cache.plans.clear();
}

PlanOptions plan_options(bool allow_partial_destination) {
  PlanOptions options;
  if (in_rank()) options.cost = CostModel::for_backend(world().backend());
  options.allow_partial_destination = allow_partial_destination;
  if (in_rank() && host_topology().num_hosts() > 1) {
    // Steps over mesh dims that span hosts are priced at the network between them.
    const HostTopology& hosts = host_topology();
    auto known = std::make_shared<std::vector<std::pair<MeshSpec, std::vector<bool>>>>();
    options.spans_hosts = [known, &hosts](const MeshSpec& mesh, int64_t mesh_dim) {
      for (const auto& [m, spans] : *known)
        if (m == mesh) return static_cast<bool>(spans[static_cast<size_t>(mesh_dim)]);
      known->emplace_back(mesh, dims_spanning_hosts(mesh, hosts));
      return static_cast<bool>(known->back().second[static_cast<size_t>(mesh_dim)]);
    };
    options.hosts_id = hosts.hash();
  }
  return options;
}

std::shared_ptr<const Plan> cached_plan(const Layout& src, const Layout& dst, const PlanOptions& options) {
  auto& [mutex, cache] = plan_cache();
  PlanKey key{src, dst, options.cost, options.allow_partial_destination, options.hosts_id};
  {
    std::lock_guard lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto made = std::make_shared<const Plan>(plan(src, dst, options));  // outside the lock: may throw
  std::lock_guard lock(mutex);
  if (cache.size() > 4096) cache.clear();  // a bound, not a policy: programs use few layouts
  return cache.emplace(std::move(key), std::move(made)).first->second;
}

DTensor::DTensor(Tensor local, DeviceMesh mesh, Layout layout)
    : local_(std::move(local)), mesh_(std::move(mesh)), layout_(std::make_shared<const Layout>(std::move(layout))) {
  TESSERA_CHECK(mesh_.spec() == layout_->mesh(), ShardingError, "DTensor", "layout ", layout_->to_string(),
                " is not on ", mesh_.to_string());
  if (!mesh_.is_member()) {
    local_ = empty(Shape::filled(layout_->ndim(), 0), layout_->dtype());
    return;
  }
  const Shape block = layout_->local_shape(mesh_.coordinate());
  TESSERA_CHECK(local_.defined() && local_.shape() == block && local_.dtype() == layout_->dtype(), ShardingError,
                "DTensor", "rank ", rank(), "'s local ",
                local_.defined() ? local_.shape().to_string() + " " + std::string(name(local_.dtype())) : "(undefined)",
                " is not its block ", block.to_string(), " ", name(layout_->dtype()), " of ", layout_->to_string());
  // A local that requires a gradient: the DTensor holds it detached and records the bridge, whose
  // backward hands the local its piece of the DTensor's gradient.
  if (autograd::needs_grad<Tensor>({&local_})) {
    const Tensor source = local_;
    local_ = local_.detach();
    autograd::record<DTensor, Tensor>("from_local", *this, {&source},
                                      [mesh = mesh_, target = gradient_layout(*layout_)](const DTensor& g) {
                                        return std::vector<Tensor>{g.redistribute(mesh, target).to_local()};
                                      });
  }
}

DTensor DTensor::from_local(Tensor local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            FromLocalOptions options) {
  TESSERA_CHECK(local.defined(), ShardingError, "DTensor::from_local", "undefined local tensor for ",
                tessera::to_string(placements), " on ", mesh.to_string());
  TESSERA_CHECK(mesh.size() > 0, ShardingError, "DTensor::from_local", "the mesh is empty (a default-constructed "
                "DeviceMesh) for local ", local.shape().to_string(), " as ", tessera::to_string(placements),
                "; build one with DeviceMesh(shape, names)");
  placements = normalized(std::move(placements), local.ndim(), "DTensor::from_local");
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ShardingError, "DTensor::from_local",
                tessera::to_string(placements), " has ", placements.size(), " placements for ", mesh.to_string());
  Shape global = local.shape();
  ShardSizes sizes = options.sizes;
  const bool member = mesh.is_member();
  if (options.infer_sizes && member) {
    sizes = inferred_sizes(local, mesh, placements, global);
  } else if (options.shape) {
    global = *options.shape;
  } else {
    const Layout probe(local.shape(), local.dtype(), mesh.spec(), placements);
    for (int64_t d = 0; d < local.ndim(); ++d) {
      if (auto it = sizes.find(d); it != sizes.end()) {
        global[d] = std::accumulate(it->second.begin(), it->second.end(), int64_t{0});
        continue;
      }
      for (int64_t m : probe.shard_order(d)) global[d] *= mesh.size(m);
    }
  }
  if (options.stride)
    TESSERA_CHECK(*options.stride == contiguous_strides(global), ShardingError, "DTensor::from_local", "stride ",
                  options.stride->to_string(), " is not the contiguous stride of global shape ", global.to_string(),
                  "; DTensors are row-major");
  const Layout layout = users_layout("DTensor::from_local",
                                     [&] { return Layout(global, local.dtype(), mesh.spec(), placements, {}, sizes); });
  // A rank outside the mesh holds nothing; its layout is what its local implies.
  if (!member) return DTensor(Tensor(), mesh, layout);
  if (options.run_check) {
    check_same_layout(layout, local.shape(), mesh);  // every local fits its block past here
    // Replicas must agree: take the first rank's data along every Replicate mesh dim.
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (!is_replicate(placements[static_cast<size_t>(m)]) || mesh.size(m) == 1) continue;
      local = local.clone();
      mesh.comm(m).broadcast(local.raw_data(), local.numel(), local.dtype(), 0);
    }
  }
  const Shape block = layout.local_shape(mesh.coordinate());
  TESSERA_CHECK(local.shape() == block, ShardingError, "DTensor::from_local", "rank ", rank(), "'s local shape ",
                local.shape().to_string(), " is not its block ", block.to_string(), " of ", layout.to_string(),
                "; pass the global shape, explicit sizes or infer_sizes for uneven locals");
  return DTensor(std::move(local), mesh, layout);
}

Tensor DTensor::full_tensor() const { return full_tensor(Placements(static_cast<size_t>(mesh_.ndim()), Replicate{})); }

Tensor DTensor::full_tensor(std::vector<Placement> grad_placements) const {
  TESSERA_CHECK(mesh_.size() > 0, ShardingError, "DTensor::full_tensor",
                "the DTensor is on an empty mesh (a default-constructed DTensor or DeviceMesh); expected one made by "
                "distribute_tensor, from_local or a factory on a DeviceMesh(shape, names)");
  TESSERA_CHECK(mesh_.is_member(), ShardingError, "DTensor::full_tensor", "world rank ", rank(), " is not in ",
                mesh_.to_string(), " holding ", layout_->to_string());
  for (const auto& p : grad_placements)
    TESSERA_CHECK(!is_shard(p), ShardingError, "DTensor::full_tensor", "grad_placements ",
                  tessera::to_string(grad_placements),
                  " must be Replicate or Partial: the gradient of a full tensor is whole on every rank");
  return redistribute(Placements(static_cast<size_t>(mesh_.ndim()), Replicate{})).to_local(std::move(grad_placements));
}

Tensor DTensor::to_local() const {
  if (!autograd::needs_grad<DTensor>({this})) return local_;
  return to_local(layout_->placements());
}

Tensor DTensor::to_local(std::vector<Placement> grad_placements) const {
  Tensor out = local_;
  if (!autograd::needs_grad<DTensor>({this})) return out;
  grad_placements = normalized(std::move(grad_placements), ndim(), "DTensor::to_local");
  TESSERA_CHECK(static_cast<int64_t>(grad_placements.size()) == mesh_.ndim(), ShardingError, "DTensor::to_local",
                "grad_placements ", tessera::to_string(grad_placements), " has ", grad_placements.size(),
                " placements for ", layout_->to_string());
  const Layout grad_layout =
      grad_placements == layout_->placements() ? *layout_ : layout_->with_placements(std::move(grad_placements));
  autograd::record<Tensor, DTensor>("to_local", out, {this}, [mesh = mesh_, grad_layout](const Tensor& g) {
    return std::vector<DTensor>{DTensor(g, mesh, grad_layout)};
  });
  return out;
}

DTensor DTensor::redistribute(std::vector<Placement> placements, const RedistributeOptions& options) const {
  placements = normalized(std::move(placements), ndim(), "DTensor::redistribute");
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh_.ndim(), ShardingError, "DTensor::redistribute",
                tessera::to_string(placements), " has ", placements.size(), " placements for ", layout_->to_string());
  return redistribute(mesh_, layout_->with_placements(std::move(placements)), options);
}

PendingDTensor DTensor::redistribute_async(std::vector<Placement> placements,
                                           const RedistributeOptions& options) const {
  placements = normalized(std::move(placements), ndim(), "DTensor::redistribute_async");
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh_.ndim(), ShardingError,
                "DTensor::redistribute_async", tessera::to_string(placements), " has ", placements.size(),
                " placements for ", layout_->to_string());
  return redistribute_async(mesh_, layout_->with_placements(std::move(placements)), options);
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, std::vector<Placement> placements,
                              const RedistributeOptions& options) const {
  placements = normalized(std::move(placements), ndim(), "DTensor::redistribute");
  if (mesh.spec() == mesh_.spec()) return redistribute(std::move(placements), options);
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ShardingError, "DTensor::redistribute",
                tessera::to_string(placements), " has ", placements.size(), " placements for ", mesh.to_string());
  return redistribute(mesh, Layout(shape(), dtype(), mesh.spec(), std::move(placements)), options);
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, const Layout& layout, const RedistributeOptions& options) const {
  TESSERA_CHECK(mesh.spec() == layout.mesh(), ShardingError, "DTensor::redistribute", "layout ", layout.to_string(),
                " is not on ", mesh.to_string());
  if (options.forward_dtype || options.backward_dtype) return redistribute_in(mesh, layout, options);
  if (layout == *layout_) {
    DTensor same(local_, mesh, layout);
    same.autograd_ = autograd_;
    return same;
  }
  const auto p = cached_plan(*layout_, layout);
  DTensor out(detail::run_plan(*p, local_, mesh_, mesh), mesh, layout);
  if (autograd::needs_grad<DTensor>({this}))
    autograd::record<DTensor>("redistribute", out, {this},
                              [mesh = mesh_, source = gradient_layout(*layout_)](const DTensor& g) {
                                return std::vector<DTensor>{g.redistribute(mesh, source)};
                              });
  return out;
}

// A redistribution that communicates in other dtypes: forward_dtype for the values (the result
// keeps it), backward_dtype for the gradient (which reaches the input in the input's dtype).
DTensor DTensor::redistribute_in(const DeviceMesh& mesh, const Layout& layout, const RedistributeOptions& options) const {
  TESSERA_CHECK(defined() || !mesh_.is_member(), ShardingError, "DTensor::redistribute", "the DTensor is undefined");
  const DType forward = options.forward_dtype.value_or(dtype());
  DTensor out;
  {
    const autograd::NoGradGuard untracked;  // one node below stands for the cast and the move
    out = to(forward).redistribute(mesh, layout.with_dtype(forward));
  }
  if (autograd::needs_grad<DTensor>({this}))
    autograd::record<DTensor>(
        "redistribute", out, {this},
        [mesh = mesh_, source = gradient_layout(*layout_), backward = options.backward_dtype](const DTensor& g) {
          const DType moving = backward.value_or(g.dtype());
          return std::vector<DTensor>{
              g.to(moving).redistribute(mesh, source.with_dtype(moving)).to(source.dtype())};
        });
  return out;
}

std::string DTensor::to_string() const { return "DTensor(" + layout_->to_string() + ")"; }

}  // namespace tessera
