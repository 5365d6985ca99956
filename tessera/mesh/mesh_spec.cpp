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

MeshSpec::MeshSpec(Shape shape, std::vector<std::string> names, std::vector<int> ranks)
    : shape_(std::move(shape)), names_(std::move(names)), ranks_(std::move(ranks)) {
  const std::string text = describe(shape_, names_);
  TESSERA_CHECK(static_cast<int64_t>(names_.size()) == shape_.size(), ShardingError, "DeviceMesh", "shape ",
                shape_.to_string(), " has ", shape_.size(), " dims but ", names_.size(), " axis names were given");
  std::unordered_set<std::string> seen;
  for (size_t d = 0; d < names_.size(); ++d) {
    TESSERA_CHECK(!names_[d].empty(), ShardingError, "DeviceMesh", "axis ", d, " of ", text, " has an empty name");
    TESSERA_CHECK(seen.insert(names_[d]).second, ShardingError, "DeviceMesh", "axis name '", names_[d],
                  "' appears twice in ", text);
    TESSERA_CHECK(shape_[static_cast<int64_t>(d)] >= 1, ShardingError, "DeviceMesh", "axis '", names_[d], "' of ",
                  text, " has size ", shape_[static_cast<int64_t>(d)], "; expected >= 1");
  }
  const int64_t n = shape_.numel();
  if (ranks_.empty()) {
    ranks_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ranks_[static_cast<size_t>(i)] = static_cast<int>(i);
  }
  TESSERA_CHECK(static_cast<int64_t>(ranks_.size()) == n, ShardingError, "DeviceMesh", text, " has ", n,
                " grid points but ", ranks_.size(), " ranks were given");
  std::unordered_set<int> distinct;
  for (int r : ranks_) {
    TESSERA_CHECK(r >= 0, ShardingError, "DeviceMesh", "negative rank ", r, " in ", text);
    TESSERA_CHECK(distinct.insert(r).second, ShardingError, "DeviceMesh", "rank ", r, " appears twice in ", text);
  }
}

int64_t MeshSpec::size(int64_t dim) const {
  TESSERA_CHECK(dim >= 0 && dim < ndim(), ShardingError, "DeviceMesh", "mesh dim ", dim, " out of range for ",
                to_string());
  return shape_[dim];
}

int64_t MeshSpec::dim_of(std::string_view axis) const {
  for (size_t d = 0; d < names_.size(); ++d)
    if (names_[d] == axis) return static_cast<int64_t>(d);
  throw ShardingError(detail::concat("[DeviceMesh] unknown axis '", axis, "' in ", to_string()));
}

bool MeshSpec::contains(int world_rank) const {
  return std::find(ranks_.begin(), ranks_.end(), world_rank) != ranks_.end();
}

std::vector<int64_t> MeshSpec::coordinate_of(int world_rank) const {
  const auto it = std::find(ranks_.begin(), ranks_.end(), world_rank);
  TESSERA_CHECK(it != ranks_.end(), ShardingError, "DeviceMesh", "world rank ", world_rank, " is not in ", to_string());
  int64_t flat = it - ranks_.begin();
  std::vector<int64_t> coordinate(static_cast<size_t>(ndim()));
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    coordinate[static_cast<size_t>(d)] = flat % shape_[d];
    flat /= shape_[d];
  }
  return coordinate;
}

std::vector<std::vector<int64_t>> MeshSpec::group(std::vector<int64_t> coordinate,
                                                   const std::vector<int64_t>& dims) const {
  int64_t points = 1;
  for (int64_t m : dims) points *= shape_[m];
  std::vector<std::vector<int64_t>> out;
  out.reserve(static_cast<size_t>(points));
  for (int64_t f = 0; f < points; ++f) {
    int64_t rest = f;
    for (auto m = dims.rbegin(); m != dims.rend(); ++m) {
      coordinate[static_cast<size_t>(*m)] = rest % shape_[*m];
      rest /= shape_[*m];
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
    TESSERA_CHECK(c >= 0 && c < shape_[d], ShardingError, "DeviceMesh", "coordinate ", Shape(coordinate).to_string(),
                  " out of range for ", to_string(), " (axis '", names_[static_cast<size_t>(d)], "' has size ",
                  shape_[d], ")");
    flat = flat * shape_[d] + c;
  }
  return ranks_[static_cast<size_t>(flat)];
}

std::string MeshSpec::to_string() const {
  std::string text = describe(shape_, names_);
  bool identity = true;
  for (size_t i = 0; i < ranks_.size(); ++i) identity = identity && ranks_[i] == static_cast<int>(i);
  if (!identity) {
    text += " ranks [";
    for (size_t i = 0; i < ranks_.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks_[i]);
    text += "]";
  }
  return text;
}

}  // namespace tessera

size_t std::hash<tessera::MeshSpec>::operator()(const tessera::MeshSpec& mesh) const noexcept {
  size_t h = 0;
  const auto mix = [&](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int64_t s : mesh.shape()) mix(std::hash<int64_t>{}(s));
  for (const auto& n : mesh.names()) mix(std::hash<std::string>{}(n));
  for (int r : mesh.ranks()) mix(std::hash<int>{}(r));
  return h;
}
