// scatter_tensor: the source's metadata first (so the other ranks can build the layout), then
// distribute_tensor's exchange from that source.
#include <tessera/domain/scatter.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

DTensor scatter_tensor(const Tensor& on_src, int src_rank, const DeviceMesh& mesh, Placements placements) {
  constexpr const char* call = "scatter_tensor";
  TESSERA_CHECK(mesh.size() > 0, ShardingError, call, "the mesh is empty (a default-constructed DeviceMesh)");
  TESSERA_CHECK(mesh.spec().contains(src_rank), ShardingError, call, "source rank ", src_rank, " is not in ",
                mesh.to_string());
  // Metadata from the source: [defined, dtype, ndim, dims...], broadcast over the mesh's ranks
  // through its communicator (a rank outside the mesh takes no part).
  const bool source = rank() == src_rank;
  std::vector<int64_t> meta{0, 0, 0};
  if (source && on_src.defined()) {
    meta = {1, static_cast<int64_t>(on_src.dtype()), on_src.ndim()};
    meta.insert(meta.end(), on_src.shape().begin(), on_src.shape().end());
  }
  if (!mesh.is_member()) return DTensor();
  const auto comm = mesh.mesh_comm_ptr();
  TESSERA_CHECK(comm != nullptr, ShardingError, call, mesh.to_string(),
                " has no communicator over exactly its ranks (a slice keeping several dims): flatten it first");
  const auto& ranks = mesh.spec().ranks();
  const int root = static_cast<int>(std::find(ranks.begin(), ranks.end(), src_rank) - ranks.begin());
  int64_t size = static_cast<int64_t>(meta.size());
  comm->broadcast(&size, 1, DType::i64, root);
  meta.resize(static_cast<size_t>(size));
  comm->broadcast(meta.data(), size, DType::i64, root);
  TESSERA_CHECK(meta[0] == 1, ShardingError, call, "the source rank ", src_rank, " passed an undefined tensor");
  const Shape shape(std::vector<int64_t>(meta.begin() + 3, meta.end()));
  const auto dtype = static_cast<DType>(meta[1]);
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ShardingError, call, to_string(placements),
                " has ", placements.size(), " placements for ", mesh.to_string(), "; give one per mesh dim");
  for (Placement& p : placements) {
    TESSERA_CHECK(!is_partial(p), ShardingError, call, to_string(placements),
                  " holds a Partial: a new tensor has no pending reduction");
    if (auto* s = std::get_if<Shard>(&p)) {
      TESSERA_CHECK(s->dim >= -shape.size() && s->dim < shape.size(), ShardingError, call, "shard dim ", s->dim,
                    " is out of range for the source's ", shape.to_string());
      if (s->dim < 0) s->dim += shape.size();
    }
  }
  return distribute_to_layout(on_src, mesh, Layout(shape, dtype, mesh.spec(), std::move(placements)), call, src_rank);
}

}  // namespace tessera
