#include <tessera/mesh/mesh_spec.hpp>

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {
std::string describe(const Shape& shape, const std::vector<std::string>& names) {
  std::ostringstream out;
  out << "mesh[";
  for (int64_t d = 0; d < shape.size(); ++d)
    out << (d ? ", " : "") << (static_cast<size_t>(d) < names.size() ? names[static_cast<size_t>(d)] : "?") << '='
        << shape[d];
  out << ']';
  return out.str();
}
}  // namespace

namespace {
size_t hash_of(const Shape& shape, const std::vector<std::string>& names, const std::vector<int>& ranks) {
  size_t h = 0;
  const auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int64_t s : shape) mix(std::hash<int64_t>{}(s));
  for (const auto& n : names) mix(std::hash<std::string>{}(n));
  for (int r : ranks) mix(std::hash<int>{}(r));
  return h;
}
}  // namespace

MeshSpec::MeshSpec() {
  static const auto empty = [] {
    auto d = std::make_shared<Data>();
    d->hash = hash_of(d->shape, d->names, d->ranks);
    return std::shared_ptr<const Data>(std::move(d));
  }();
  data_ = empty;
}

MeshSpec::MeshSpec(Shape shape, std::vector<std::string> names, std::vector<int> ranks) {
  auto data = std::make_shared<Data>();
  data->shape = std::move(shape);
  data->names = std::move(names);
  data->ranks = std::move(ranks);
  Data& mesh = *data;
  const std::string text = describe(mesh.shape, mesh.names);
  TESSERA_CHECK(static_cast<int64_t>(mesh.names.size()) == mesh.shape.size(), ShardingError, "DeviceMesh", "shape ",
                mesh.shape.to_string(), " has ", mesh.shape.size(), " dims but ", mesh.names.size(), " axis names were given");
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < mesh.names.size(); ++i) {
    TESSERA_CHECK(!mesh.names[i].empty(), ShardingError, "DeviceMesh", "axis ", i, " of ", text, " has an empty name");
    TESSERA_CHECK(seen.insert(mesh.names[i]).second, ShardingError, "DeviceMesh", "axis name '", mesh.names[i],
                  "' appears twice in ", text);
    TESSERA_CHECK(mesh.shape[static_cast<int64_t>(i)] >= 1, ShardingError, "DeviceMesh", "axis '", mesh.names[i], "' of ",
                  text, " has size ", mesh.shape[static_cast<int64_t>(i)], "; expected >= 1");
  }
  const int64_t n = mesh.shape.numel();
  if (mesh.ranks.empty()) {
    mesh.ranks.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mesh.ranks[static_cast<size_t>(i)] = static_cast<int>(i);
  }
  TESSERA_CHECK(static_cast<int64_t>(mesh.ranks.size()) == n, ShardingError, "DeviceMesh", text, " has ", n,
                " grid points but ", mesh.ranks.size(), " ranks were given");
  std::unordered_set<int> distinct;
  for (int r : mesh.ranks) {
    TESSERA_CHECK(r >= 0, ShardingError, "DeviceMesh", "negative rank ", r, " in ", text);
    TESSERA_CHECK(distinct.insert(r).second, ShardingError, "DeviceMesh", "rank ", r, " appears twice in ", text);
  }
  data->hash = hash_of(mesh.shape, mesh.names, mesh.ranks);
  // Lookup tables: layouts ask for the coordinates of every rank, many times per plan.
  int top = -1;
  for (int r : mesh.ranks) top = std::max(top, r);
  mesh.index_of_rank.assign(static_cast<size_t>(top + 1), -1);
  mesh.coordinates.resize(mesh.ranks.size());
  for (size_t i = 0; i < mesh.ranks.size(); ++i) {
    mesh.index_of_rank[static_cast<size_t>(mesh.ranks[i])] = static_cast<int64_t>(i);
    auto& c = mesh.coordinates[i];
    c.resize(static_cast<size_t>(mesh.shape.size()));
    int64_t flat = static_cast<int64_t>(i);
    for (int64_t d = mesh.shape.size() - 1; d >= 0; --d) {
      c[static_cast<size_t>(d)] = flat % mesh.shape[d];
      flat /= mesh.shape[d];
    }
  }
  data_ = std::move(data);
}

bool MeshSpec::same_as(const MeshSpec& other) const {
  const Data& x = *data_;
  const Data& y = *other.data_;
  return x.hash == y.hash && x.shape == y.shape && x.ranks == y.ranks && x.names == y.names;
}

int64_t MeshSpec::size(int64_t dim) const {
  TESSERA_CHECK(dim >= 0 && dim < ndim(), ShardingError, "DeviceMesh", "mesh dim ", dim, " out of range for ",
                to_string());
  return data_->shape[dim];
}

int64_t MeshSpec::dim_of(std::string_view axis, std::string_view call) const {
  for (size_t d = 0; d < data_->names.size(); ++d)
    if (data_->names[d] == axis) return static_cast<int64_t>(d);
  std::string axes;
  for (const auto& n : data_->names) axes.append(axes.empty() ? "'" : ", '").append(n + "'");
  throw ShardingError(detail::concat("[", call, "] unknown axis '", axis, "' in ", to_string(), " (its axes: ",
                                     axes.empty() ? "none" : axes, ")"));
}

bool MeshSpec::contains(int world_rank) const {
  const auto& index = data_->index_of_rank;
  return world_rank >= 0 && static_cast<size_t>(world_rank) < index.size() && index[static_cast<size_t>(world_rank)] >= 0;
}

const std::vector<int64_t>& MeshSpec::coordinate_of(int world_rank) const {
  TESSERA_CHECK(contains(world_rank), ShardingError, "DeviceMesh", "world rank ", world_rank, " is not in ", to_string());
  return data_->coordinates[static_cast<size_t>(data_->index_of_rank[static_cast<size_t>(world_rank)])];
}

std::vector<std::vector<int64_t>> MeshSpec::group(std::vector<int64_t> coordinate,
                                                   const std::vector<int64_t>& dims) const {
  int64_t points = 1;
  for (int64_t m : dims) points *= data_->shape[m];
  std::vector<std::vector<int64_t>> out;
  out.reserve(static_cast<size_t>(points));
  for (int64_t f = 0; f < points; ++f) {
    int64_t rest = f;
    for (auto m = dims.rbegin(); m != dims.rend(); ++m) {
      coordinate[static_cast<size_t>(*m)] = rest % data_->shape[*m];
      rest /= data_->shape[*m];
    }
    out.push_back(coordinate);
  }
  return out;
}

int MeshSpec::rank_at(const std::vector<int64_t>& coordinate) const {
  TESSERA_CHECK(static_cast<int64_t>(coordinate.size()) == ndim(), ShardingError, "DeviceMesh", "coordinate ",
                Shape(coordinate).to_string(), " has ", coordinate.size(), " entries for ", to_string());
  int64_t flat = 0;
  for (int64_t d = 0; d < ndim(); ++d) {
    const int64_t c = coordinate[static_cast<size_t>(d)];
    TESSERA_CHECK(c >= 0 && c < data_->shape[d], ShardingError, "DeviceMesh", "coordinate ", Shape(coordinate).to_string(),
                  " out of range for ", to_string(), " (axis '", data_->names[static_cast<size_t>(d)], "' has size ",
                  data_->shape[d], ")");
    flat = flat * data_->shape[d] + c;
  }
  return data_->ranks[static_cast<size_t>(flat)];
}

std::string MeshSpec::to_string() const {
  std::string text = describe(data_->shape, data_->names);
  bool identity = true;
  for (size_t i = 0; i < data_->ranks.size(); ++i) identity = identity && data_->ranks[i] == static_cast<int>(i);
  if (!identity) {
    text += " ranks [";
    for (size_t i = 0; i < data_->ranks.size(); ++i) text.append(i ? ", " : "").append(std::to_string(data_->ranks[i]));
    text += "]";
  }
  return text;
}

}  // namespace tessera

size_t std::hash<tessera::MeshSpec>::operator()(const tessera::MeshSpec& mesh) const noexcept { return mesh.hash(); }
