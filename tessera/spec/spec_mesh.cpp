// torch_xla's mesh constructors, lowered onto DeviceMesh with explicit rank lists.
#include <tessera/spec/spec_mesh.hpp>

#include <algorithm>
#include <memory>

#include <tessera/comm/topology.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

std::vector<std::string> default_names(std::vector<std::string> names, size_t ndim) {
  if (!names.empty()) return names;
  for (size_t i = 0; i < ndim; ++i) names.push_back("axis" + std::to_string(i));
  return names;
}

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t p = 1;
  for (int64_t s : sizes) p *= s;
  return p;
}

std::string text(const std::vector<int64_t>& sizes) { return Shape(sizes).to_string(); }

// Row-major index of `index` over `sizes`.
int64_t row_major(const std::vector<int64_t>& index, const std::vector<int64_t>& sizes) {
  int64_t flat = 0;
  for (size_t i = 0; i < sizes.size(); ++i) flat = flat * sizes[i] + index[i];
  return flat;
}

// The global mesh lives in the rank's state, not in a thread_local: under MPI the main thread
// outlives MPI_Finalize, and the mesh's communicators must go before it.
std::shared_ptr<DeviceMesh> global_mesh_slot() {
  return std::static_pointer_cast<DeviceMesh>(rank_state("tessera.spec.global_mesh"));
}

}  // namespace

DeviceMesh mesh_from_device_ids(std::vector<int> device_ids, std::vector<int64_t> shape,
                                std::vector<std::string> names) {
  names = default_names(std::move(names), shape.size());
  const int world = world_size();
  for (int64_t s : shape)
    TESSERA_CHECK(s >= 1, ShardingError, "mesh_from_device_ids", "mesh shape ", text(shape),
                  " has a size below 1");
  TESSERA_CHECK(static_cast<int64_t>(device_ids.size()) == product(shape), ShardingError, "mesh_from_device_ids",
                device_ids.size(), " device ids for mesh shape ", text(shape), " of ", product(shape),
                " devices; give one id per device");
  std::vector<int> seen(static_cast<size_t>(world), -1);
  for (size_t i = 0; i < device_ids.size(); ++i) {
    const int id = device_ids[i];
    TESSERA_CHECK(id >= 0 && id < world, ShardingError, "mesh_from_device_ids", "device id ", id,
                  " is not a rank of the world of ", world, " ranks (mesh shape ", text(shape), ")");
    TESSERA_CHECK(seen[static_cast<size_t>(id)] < 0, ShardingError, "mesh_from_device_ids", "device id ", id,
                  " appears twice (positions ", seen[static_cast<size_t>(id)], " and ", i, ")");
    seen[static_cast<size_t>(id)] = static_cast<int>(i);
  }
  return DeviceMesh(std::move(shape), std::move(names), std::move(device_ids));
}

std::vector<std::vector<int>> logical_mesh(const DeviceMesh& mesh) {
  const MeshSpec& spec = mesh.spec();
  const auto& ranks = spec.ranks();
  const size_t row = spec.ndim() == 0 ? ranks.size() : static_cast<size_t>(spec.shape()[spec.ndim() - 1]);
  std::vector<std::vector<int>> rows;
  for (size_t begin = 0; begin < ranks.size(); begin += row)
    rows.emplace_back(ranks.begin() + static_cast<std::ptrdiff_t>(begin),
                      ranks.begin() + static_cast<std::ptrdiff_t>(begin + row));
  return rows;
}

DeviceMesh hybrid_mesh(std::vector<int64_t> ici_shape, std::vector<int64_t> dcn_shape,
                       std::vector<std::string> names) {
  names = default_names(std::move(names), ici_shape.size());
  TESSERA_CHECK(ici_shape.size() == dcn_shape.size() && names.size() == ici_shape.size(), ShardingError,
                "hybrid_mesh", "ici shape ", text(ici_shape), ", dcn shape ", text(dcn_shape), " and ", names.size(),
                " names differ in length; give one ici size, one dcn size and one name per axis");
  for (size_t i = 0; i < ici_shape.size(); ++i)
    TESSERA_CHECK(ici_shape[i] >= 1 && dcn_shape[i] >= 1, ShardingError, "hybrid_mesh", "ici shape ",
                  text(ici_shape), " and dcn shape ", text(dcn_shape), " must hold sizes >= 1");
  const HostTopology& hosts = host_topology();
  TESSERA_CHECK(hosts.num_hosts() == product(dcn_shape), ShardingError, "hybrid_mesh", "dcn shape ", text(dcn_shape),
                " spans ", product(dcn_shape), " hosts, but the world has ", hosts.to_string(),
                " (set TESSERA_HOSTS to simulate hosts)");
  for (int h = 0; h < hosts.num_hosts(); ++h)
    TESSERA_CHECK(static_cast<int64_t>(hosts.ranks_on(h).size()) == product(ici_shape), ShardingError,
                  "hybrid_mesh", "ici shape ", text(ici_shape), " needs ", product(ici_shape),
                  " ranks on every host, but ", hosts.host_name(h), " has ", hosts.ranks_on(h).size(), " of ",
                  hosts.to_string());
  // Walk the mesh row-major; each coordinate splits into a host (dcn) and a place in it (ici).
  std::vector<int64_t> shape(ici_shape.size());
  for (size_t i = 0; i < shape.size(); ++i) shape[i] = ici_shape[i] * dcn_shape[i];
  std::vector<int> ranks;
  std::vector<int64_t> coordinate(shape.size(), 0), dcn(shape.size()), ici(shape.size());
  for (int64_t flat = 0; flat < product(shape); ++flat) {
    for (size_t i = 0; i < shape.size(); ++i) {
      dcn[i] = coordinate[i] / ici_shape[i];
      ici[i] = coordinate[i] % ici_shape[i];
    }
    const auto on_host = hosts.ranks_on(static_cast<int>(row_major(dcn, dcn_shape)));
    ranks.push_back(on_host[static_cast<size_t>(row_major(ici, ici_shape))]);
    for (size_t i = shape.size(); i-- > 0;) {  // next coordinate, row-major
      if (++coordinate[i] < shape[i]) break;
      coordinate[i] = 0;
    }
  }
  return DeviceMesh(std::move(shape), std::move(names), std::move(ranks));
}

void set_global_mesh(const DeviceMesh& mesh) {
  rank_state("tessera.spec.global_mesh") = std::make_shared<DeviceMesh>(mesh);
}

bool has_global_mesh() { return global_mesh_slot() != nullptr; }

const DeviceMesh& global_mesh() {
  const std::shared_ptr<DeviceMesh> mesh = global_mesh_slot();
  TESSERA_CHECK(mesh != nullptr, ShardingError, "global_mesh",
                "this rank has no global mesh; call set_global_mesh(mesh) first");
  return *mesh;  // the rank's state keeps it alive until set_global_mesh replaces it
}

DeviceMesh get_1d_mesh(std::string name) {
  return DeviceMesh({world_size()}, {name.empty() ? std::string("axis0") : std::move(name)});
}

}  // namespace tessera
