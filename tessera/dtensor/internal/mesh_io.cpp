#include <tessera/dtensor/internal/mesh_io.hpp>

#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::detail {

Communicator& mesh_comm(const DeviceMesh& mesh, const char* op) {
  TESSERA_CHECK(mesh.is_member(), ShardingError, op, "world rank ", rank(), " is not in ", mesh.to_string());
  const auto comm = mesh.mesh_comm_ptr();
  TESSERA_CHECK(comm != nullptr, ShardingError, op, mesh.to_string(),
                " has no communicator over all its ranks (a slice of a larger mesh); flatten it first");
  return *comm;
}

std::vector<std::vector<int64_t>> all_gather_int64(Communicator& comm, const std::vector<int64_t>& values) {
  const int64_t n = comm.size();
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  const int64_t mine = static_cast<int64_t>(values.size());
  comm.all_gather(&mine, lengths.data(), 1, DType::i64);
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  std::vector<int64_t> all(static_cast<size_t>(total));
  comm.all_gather_v(values.data(), all.data(), lengths, DType::i64);
  std::vector<std::vector<int64_t>> out;
  auto at = all.begin();
  for (int64_t l : lengths) {
    out.emplace_back(at, at + l);
    at += l;
  }
  return out;
}

std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text) {
  const auto codes = all_gather_int64(comm, std::vector<int64_t>(text.begin(), text.end()));
  std::vector<std::string> out;
  for (const auto& c : codes) out.emplace_back(c.begin(), c.end());
  return out;
}

std::vector<std::vector<int64_t>> all_gather_int64(const DeviceMesh& mesh, const std::vector<int64_t>& values,
                                                   const char* op) {
  return all_gather_int64(mesh_comm(mesh, op), values);
}

std::vector<std::string> all_gather_text(const DeviceMesh& mesh, const std::string& text, const char* op) {
  return all_gather_text(mesh_comm(mesh, op), text);
}

}  // namespace tessera::detail
