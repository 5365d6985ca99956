// distribute_tensor and the DTensor factories: each rank builds or receives only its block.
#include <algorithm>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/redistribute.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

// The layout of a new DTensor, checked here so that errors name the user's call: a mesh with
// ranks, one placement per mesh dim, shard dims in [-ndim, ndim) (normalised once, here), no
// Partial.
Layout factory_layout(const char* op, const Shape& shape, DType dtype, const DeviceMesh& mesh,
                      std::vector<Placement> placements) {
  TESSERA_CHECK(mesh.size() > 0, ShardingError, op, "the mesh is empty (a default-constructed DeviceMesh); build one ",
                "with DeviceMesh(shape, names)");
  const std::string given = to_string(placements);
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ShardingError, op, "placements ", given,
                " for ", shape.to_string(), ": ", placements.size(), " placements for ", mesh.to_string(), " of ",
                mesh.ndim(), " dims; give one per mesh dim");
  for (auto& p : placements) {
    TESSERA_CHECK(!is_partial(p), ShardingError, op, "placements ", given, " for ", shape.to_string(), " on ",
                  mesh.to_string(), " hold a Partial: a new tensor has no pending reduction; use Replicate");
    if (auto* s = std::get_if<Shard>(&p)) {
      TESSERA_CHECK(s->dim >= -shape.size() && s->dim < shape.size(), ShardingError, op, "placements ", given,
                    " for ", shape.to_string(), " on ", mesh.to_string(), ": shard dim ", s->dim,
                    " is out of range for ", shape.size(), " dims");
      if (s->dim < 0) s->dim += shape.size();
    }
  }
  return Layout(shape, dtype, mesh.spec(), std::move(placements));
}

template <class Make>
DTensor build(const char* op, const Shape& shape, DType dtype, const DeviceMesh& mesh, std::vector<Placement> placements,
              Make&& make) {
  Layout layout = factory_layout(op, shape, dtype, mesh, std::move(placements));
  if (!mesh.is_member()) return DTensor(Tensor(), mesh, std::move(layout));
  const Block block = layout.block(mesh.coordinate());
  return DTensor(make(block), mesh, std::move(layout));
}

DTensor random(const char* op, Distribution distribution, const Shape& shape, const DeviceMesh& mesh,
               std::vector<Placement> placements, DType dtype) {
  // Every rank takes the same draw (SPMD), members or not, so generators stay in step.
  const RandomDraw draw = default_generator().next(distribution, 0, 1, dtype);
  Layout layout = factory_layout(op, shape, dtype, mesh, std::move(placements));
  const Block block = mesh.is_member() ? layout.block(mesh.coordinate()) : Block{Shape::filled(shape.size(), 0),
                                                                                   Shape::filled(shape.size(), 0)};
  Tensor local = random_block(draw, shape, block.begin, block.shape());  // validates dtype and shape
  if (!mesh.is_member()) return DTensor(Tensor(), mesh, std::move(layout));
  return DTensor(std::move(local), mesh, std::move(layout));
}

}  // namespace

namespace {

// FNV-1a of a text: the same digest on every rank and host, whatever the standard library.
int64_t text_digest(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);  // non-negative, so its negation never overflows
}

}  // namespace

DTensor distribute_tensor(const Tensor& global, const DeviceMesh& mesh, std::vector<Placement> placements) {
  TESSERA_CHECK(global.defined(), ShardingError, "distribute_tensor", "undefined tensor for ", to_string(placements),
                " on ", mesh.to_string());
  Layout layout = factory_layout("distribute_tensor", global.shape(), global.dtype(), mesh, std::move(placements));
  return distribute_to_layout(global, mesh, layout);
}

DTensor distribute_to_layout(const Tensor& global, const DeviceMesh& mesh, const Layout& layout, std::string_view call,
                          std::optional<int> src_rank) {
  TESSERA_CHECK(layout.mesh() == mesh.spec(), ShardingError, call, "layout ", layout.to_string(), " is not on ",
                mesh.to_string());
  TESSERA_CHECK(!src_rank || mesh.spec().contains(*src_rank), ShardingError, call, "source rank ", *src_rank,
                " is not in ", mesh.to_string());
  TESSERA_CHECK(!layout.has_partial(), ShardingError, call, "layout ", layout.to_string(),
                " holds a Partial: a new tensor has no pending reduction; use Replicate");
  // Only the ranks that provide data need it: the source, or every rank without one.
  const bool provides = !src_rank || *src_rank == rank();
  if (provides) {
    TESSERA_CHECK(global.defined(), ShardingError, call, "undefined tensor for ", layout.to_string());
    TESSERA_CHECK(layout.global_shape() == global.shape() && layout.dtype() == global.dtype(), ShardingError, call,
                  "layout ", layout.to_string(), " is not of the tensor's ", global.shape().to_string(), " ",
                  name(global.dtype()));
  }
  if (!mesh.is_member()) return DTensor(Tensor(), mesh, layout);
  // All ranks must pass the same shape and dtype, or the block counts would disagree mid-call:
  // one small all_reduce tells whether they do (the largest and the smallest digest of the
  // layouts' texts); only when they do not, the texts are gathered to name who passed what.
  const std::string text = layout.to_string();
  Communicator& comm = detail::mesh_comm(mesh, std::string(call).c_str());
  const int64_t digest = text_digest(text);
  int64_t extremes[2] = {digest, -digest};
  comm.all_reduce(extremes, 2, DType::i64, ReduceOp::max);
  if (extremes[0] != -extremes[1]) {
    const auto texts = detail::all_gather_text(comm, text);
    for (size_t i = 0; i < texts.size(); ++i)
      TESSERA_CHECK(texts[i] == texts.front(), ShardingError, call, "rank ", mesh.spec().ranks()[i], " distributes ",
                    texts[i], " but rank ", mesh.spec().ranks()[0], " distributes ", texts.front());
  }
  // The data comes from the source, by default the first rank of the mesh, as in DTensor.
  const int origin = src_rank ? *src_rank : mesh.spec().ranks().front();
  if (layout.is_replicated()) {
    // Every rank takes the whole tensor: one broadcast (PyTorch's mesh_broadcast).
    const auto& ranks = mesh.spec().ranks();
    const int root = static_cast<int>(std::find(ranks.begin(), ranks.end(), origin) - ranks.begin());
    Tensor local =
        rank() == origin ? global.detach().contiguous().clone() : empty(layout.global_shape(), layout.dtype());
    if (local.numel() > 0) comm.broadcast(local.raw_data(), local.numel(), local.dtype(), root);
    DTensor out(local, mesh, layout);
    if (!src_rank && global.requires_grad()) out.requires_grad_();
    return out;
  }
  // Sharded: the source sends every rank its block.
  std::vector<Transfer> transfers;
  for (int r : mesh.spec().ranks()) transfers.push_back(Transfer{origin, r, layout.block_of_rank(r)});
  const Block whole{Shape::filled(layout.ndim(), 0), layout.global_shape()};
  const Block held = rank() == origin ? whole : Block{whole.begin, whole.begin};
  // Other ranks hold nothing: an empty (defined) tensor, which the exchange may still address.
  const Tensor source = rank() == origin ? global : empty(Shape::filled(layout.ndim(), 0), layout.dtype());
  Tensor local = detail::run_exchange(transfers, source.detach(), held, layout.block(mesh.coordinate()), layout.dtype(),
                                      mesh.mesh_comm_ptr());
  DTensor out(local.detach(), mesh, layout);
  if (!src_rank && global.requires_grad()) out.requires_grad_();
  return out;
}

DTensor empty(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype) {
  return build("empty", shape, dtype, mesh, std::move(placements), [&](const Block& b) { return empty(b.shape(), dtype); });
}

DTensor zeros(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype) {
  return build("zeros", shape, dtype, mesh, std::move(placements), [&](const Block& b) { return zeros(b.shape(), dtype); });
}

DTensor ones(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype) {
  return build("ones", shape, dtype, mesh, std::move(placements), [&](const Block& b) { return ones(b.shape(), dtype); });
}

DTensor full(const Shape& shape, double value, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype) {
  return build("full", shape, dtype, mesh, std::move(placements),
               [&](const Block& b) { return full(b.shape(), value, dtype); });
}

DTensor rand(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype) {
  return random("rand", Distribution::uniform, shape, mesh, std::move(placements), dtype);
}

DTensor randn(const Shape& shape, const DeviceMesh& mesh, std::vector<Placement> placements, DType dtype) {
  return random("randn", Distribution::normal, shape, mesh, std::move(placements), dtype);
}

}  // namespace tessera
