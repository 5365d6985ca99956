// DeviceMesh construction (collective splits of the world), derived meshes (no communication
// except flatten) and per-rank queries.
#include <tessera/mesh/device_mesh.hpp>

#include <algorithm>
#include <bit>
#include <mutex>
#include <numeric>

#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

struct DeviceMesh::State {
  MeshSpec spec;
  int me = -1;                  // calling world rank
  bool member = false;
  std::vector<int64_t> coordinate;
  std::vector<std::shared_ptr<Communicator>> dims;  // per mesh dim, through me (members only)
  // Per set of two or more mesh dims (bit m = mesh dim m): the ranks differing from me only
  // there, for collectives spanning several dims at once (members only).
  std::map<uint64_t, std::shared_ptr<Communicator>> spans;
  // Over every rank of the mesh this one was derived from (the constructed mesh): flatten
  // splits it. Null for ranks outside that mesh.
  std::shared_ptr<Communicator> root;
  std::mutex mutex;  // guards the flatten cache
  std::map<std::pair<std::vector<std::string>, std::string>, std::shared_ptr<State>> flattened;
};

namespace {

// Row-major index of coordinate with dim `skip` left out: names the line along `skip`.
int64_t line_index(const std::vector<int64_t>& coordinate, const Shape& shape, int64_t skip) {
  int64_t index = 0;
  for (int64_t d = 0; d < shape.size(); ++d)
    if (d != skip) index = index * shape[d] + coordinate[static_cast<size_t>(d)];
  return index;
}

void require_rank() {
  TESSERA_CHECK(in_rank(), ValueError, "DeviceMesh",
                "constructed outside a rank; build meshes inside tessera::run or tessera::launch");
}

}  // namespace

std::shared_ptr<DeviceMesh::State> DeviceMesh::construct(std::vector<int64_t> shape, std::vector<std::string> names,
                                                         std::vector<int> ranks) {
  require_rank();
  auto state = std::make_shared<DeviceMesh::State>();
  Communicator& world = tessera::world();
  state->spec = MeshSpec(Shape(shape), std::move(names), std::move(ranks));
  const MeshSpec& spec = state->spec;
  for (int r : spec.ranks())
    TESSERA_CHECK(r < world.size(), ShardingError, "DeviceMesh", spec.to_string(), " names rank ", r,
                  " but the world has ", world.size(), " ranks");
  state->me = tessera::rank();
  state->member = spec.contains(state->me);
  if (state->member) state->coordinate = spec.coordinate_of(state->me);
  // One split for the whole mesh, then one per mesh dim; every world rank takes part.
  const auto position = [&] {
    const auto it = std::find(spec.ranks().begin(), spec.ranks().end(), state->me);
    return static_cast<int>(it - spec.ranks().begin());
  };
  state->root = world.split(state->member ? 0 : -1, state->member ? position() : 0);
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    const int color = state->member ? static_cast<int>(line_index(state->coordinate, spec.shape(), d)) : -1;
    const int key = state->member ? static_cast<int>(state->coordinate[static_cast<size_t>(d)]) : 0;
    state->dims.push_back(world.split(color, key));
  }
  // One split per set of two or more dims; the set of all is the mesh itself (the root).
  const uint64_t all = (uint64_t{1} << spec.ndim()) - 1;
  for (uint64_t mask = 3; mask <= all; ++mask) {
    if (std::popcount(mask) < 2) continue;
    if (mask == all) {
      state->spans[mask] = state->root;
      continue;
    }
    int64_t outside = 0, inside = 0;
    if (state->member)
      for (int64_t d = 0; d < spec.ndim(); ++d) {
        int64_t& index = mask >> d & 1 ? inside : outside;
        index = index * spec.shape()[d] + state->coordinate[static_cast<size_t>(d)];
      }
    state->spans[mask] = world.split(state->member ? static_cast<int>(outside) : -1, static_cast<int>(inside));
  }
  if (!state->member) state->dims.clear(), state->spans.clear();
  return state;
}

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> names) {
  require_rank();
  const int64_t points = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  const int n = world_size();
  TESSERA_CHECK(points == n, ShardingError, "DeviceMesh", "shape ", Shape(shape).to_string(), " holds ", points,
                " ranks but the world has ", n, "; pass explicit ranks for a mesh over part of the world");
  std::vector<int> ranks(static_cast<size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  state_ = construct(std::move(shape), std::move(names), std::move(ranks));
}

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> names, std::vector<int> ranks)
    : state_(construct(std::move(shape), std::move(names), std::move(ranks))) {}

DeviceMesh::DeviceMesh() : state_(std::make_shared<State>()) {}

const MeshSpec& DeviceMesh::spec() const { return state_->spec; }

std::shared_ptr<Communicator> DeviceMesh::mesh_comm_ptr() const {
  const State& s = *state_;
  if (!s.member) return nullptr;
  if (s.root && s.root->world_ranks() == s.spec.ranks()) return s.root;
  if (s.spec.ndim() == 1) return s.dims.front();
  const auto whole = s.spans.find((uint64_t{1} << s.spec.ndim()) - 1);
  return whole == s.spans.end() ? nullptr : whole->second;
}

std::shared_ptr<Communicator> DeviceMesh::comm_ptr(const std::vector<int64_t>& dims) const {
  const State& s = member_state("DeviceMesh::comm");
  uint64_t mask = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    TESSERA_CHECK(d >= 0 && d < ndim() && (i == 0 || d > dims[i - 1]), ShardingError, "DeviceMesh::comm",
                  "mesh dims must be ascending and in range for ", to_string(), "; got dim ", d);
    mask |= uint64_t{1} << d;
  }
  TESSERA_CHECK(!dims.empty(), ShardingError, "DeviceMesh::comm", "no mesh dims given for ", to_string());
  if (dims.size() == 1) return s.dims[static_cast<size_t>(dims.front())];
  return s.spans.at(mask);
}

bool DeviceMesh::is_member() const { return state_->member; }

const DeviceMesh::State& DeviceMesh::member_state(const char* op) const {
  TESSERA_CHECK(state_->member, ShardingError, op, "world rank ", state_->me, " is not in ", to_string());
  return *state_;
}

std::vector<int64_t> DeviceMesh::coordinate() const { return member_state("DeviceMesh::coordinate").coordinate; }

int64_t DeviceMesh::coordinate(std::string_view axis) const {
  const State& s = member_state("DeviceMesh::coordinate");
  return s.coordinate[static_cast<size_t>(s.spec.dim_of(axis, "DeviceMesh::coordinate"))];
}

std::shared_ptr<Communicator> DeviceMesh::comm_ptr(int64_t dim) const {
  const State& s = member_state("DeviceMesh::comm");
  TESSERA_CHECK(dim >= 0 && dim < ndim(), ShardingError, "DeviceMesh::comm", "mesh dim ", dim, " out of range for ",
                to_string());
  return s.dims[static_cast<size_t>(dim)];
}

Communicator& DeviceMesh::comm(int64_t dim) const { return *comm_ptr(dim); }

DeviceMesh DeviceMesh::operator[](std::string_view axis) const {
  const State& s = member_state("DeviceMesh::operator[]");
  const int64_t d = s.spec.dim_of(axis, "DeviceMesh::operator[]");
  // The line along d through this rank, in coordinate order.
  std::vector<int> ranks;
  std::vector<int64_t> c = s.coordinate;
  for (int64_t i = 0; i < s.spec.shape()[d]; ++i) {
    c[static_cast<size_t>(d)] = i;
    ranks.push_back(s.spec.rank_at(c));
  }
  auto sub = std::make_shared<State>();
  sub->spec = MeshSpec(Shape{s.spec.shape()[d]}, {std::string(axis)}, std::move(ranks));
  sub->me = s.me;
  sub->member = true;
  sub->coordinate = {s.coordinate[static_cast<size_t>(d)]};
  sub->dims = {s.dims[static_cast<size_t>(d)]};
  sub->root = s.root;
  return DeviceMesh(sub);
}

DeviceMesh DeviceMesh::duplicate() const {
  const State& s = *state_;
  auto copy = std::make_shared<State>();
  copy->spec = s.spec;
  copy->me = s.me;
  copy->member = s.member;
  copy->coordinate = s.coordinate;
  // Every group is split whole, in one order on every rank (root, dims, spans by mask), so the
  // splits of different groups cannot wait on each other.
  const auto dup = [](const std::shared_ptr<Communicator>& comm) { return comm ? comm->split(0, comm->rank()) : nullptr; };
  copy->root = dup(s.root);
  for (const auto& comm : s.dims) copy->dims.push_back(dup(comm));
  for (const auto& [mask, comm] : s.spans) copy->spans[mask] = comm == s.root ? copy->root : dup(comm);
  return DeviceMesh(std::move(copy));
}

void DeviceMesh::abort(const std::string& reason) const {
  const State& s = *state_;
  // The root only where it is this mesh's own group: a slice leaves its parent's other ranks be.
  if (s.root && s.root->world_ranks() == s.spec.ranks()) s.root->abort(reason);
  for (const auto& comm : s.dims) comm->abort(reason);
  for (const auto& [mask, comm] : s.spans) comm->abort(reason);
}

DeviceMesh DeviceMesh::slice(const std::map<std::string, int64_t>& at) const {
  const State& s = *state_;
  std::vector<int64_t> fixed(static_cast<size_t>(ndim()), -1);
  for (const auto& [axis, index] : at) {
    const int64_t d = s.spec.dim_of(axis, "DeviceMesh::slice");
    TESSERA_CHECK(index >= 0 && index < s.spec.shape()[d], ShardingError, "DeviceMesh::slice", "index ", index,
                  " out of range for axis '", axis, "' of ", to_string());
    fixed[static_cast<size_t>(d)] = index;
  }
  Shape shape;
  std::vector<std::string> names;
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < ndim(); ++d)
    if (fixed[static_cast<size_t>(d)] < 0) {
      shape.push_back(s.spec.shape()[d]);
      names.push_back(s.spec.names()[static_cast<size_t>(d)]);
      kept.push_back(d);
    }
  // Ranks of the slice, row-major over the kept axes.
  std::vector<int> ranks;
  std::vector<int64_t> c(fixed.begin(), fixed.end());
  const int64_t points = shape.numel();
  for (int64_t flat = 0; flat < points; ++flat) {
    int64_t rest = flat;
    for (int64_t k = static_cast<int64_t>(kept.size()) - 1; k >= 0; --k) {
      c[static_cast<size_t>(kept[static_cast<size_t>(k)])] = rest % shape[k];
      rest /= shape[k];
    }
    ranks.push_back(s.spec.rank_at(c));
  }
  auto sub = std::make_shared<State>();
  sub->spec = MeshSpec(shape, names, ranks);
  sub->me = s.me;
  sub->root = s.root;
  sub->member = s.member && sub->spec.contains(s.me);
  if (sub->member) {
    // The lines along kept axes through this rank stay inside the slice: reuse their comms.
    for (int64_t d : kept) {
      sub->coordinate.push_back(s.coordinate[static_cast<size_t>(d)]);
      sub->dims.push_back(s.dims[static_cast<size_t>(d)]);
    }
    // Likewise the groups over several kept axes: the parent's group over the same axes.
    for (const auto& [mask, comm] : s.spans) {
      uint64_t sub_mask = 0;
      bool inside = true;
      for (int64_t d = 0; d < ndim() && inside; ++d) {
        if (!(mask >> d & 1)) continue;
        const auto k = std::find(kept.begin(), kept.end(), d);
        inside = k != kept.end();
        if (inside) sub_mask |= uint64_t{1} << (k - kept.begin());
      }
      if (inside) sub->spans[sub_mask] = comm;
    }
  }
  return DeviceMesh(sub);
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& axes, std::string name) const {
  State& s = *state_;
  TESSERA_CHECK(!axes.empty(), ShardingError, "DeviceMesh::flatten", "no axes given for ", to_string());
  std::vector<int64_t> dims;
  for (const auto& axis : axes) {
    const int64_t d = s.spec.dim_of(axis, "DeviceMesh::flatten");
    TESSERA_CHECK(std::find(dims.begin(), dims.end(), d) == dims.end(), ShardingError, "DeviceMesh::flatten",
                  "axis '", axis, "' given twice for ", to_string());
    dims.push_back(d);
  }
  if (name.empty())
    for (const auto& axis : axes) name += (name.empty() ? "" : "_") + axis;
  std::lock_guard lock(s.mutex);
  const auto key = std::make_pair(axes, name);
  if (auto it = s.flattened.find(key); it != s.flattened.end()) return DeviceMesh(it->second);
  TESSERA_CHECK(s.root != nullptr, ShardingError, "DeviceMesh::flatten", "world rank ", s.me,
                " is outside the mesh that ", to_string(), " was derived from");
  auto flat = std::make_shared<State>();
  flat->me = s.me;
  flat->root = s.root;
  std::vector<int> ranks;
  int64_t my_index = 0;
  {
    // Ranks sharing this rank's coordinates on the other axes, row-major over `axes` (for a
    // rank outside the mesh: the group at coordinate 0, so its handle still describes a mesh).
    std::vector<int64_t> c = s.member ? s.coordinate : std::vector<int64_t>(static_cast<size_t>(ndim()), 0);
    int64_t points = 1;
    for (int64_t d : dims) points *= s.spec.shape()[d];
    for (int64_t f = 0; f < points; ++f) {
      int64_t rest = f;
      for (int64_t k = static_cast<int64_t>(dims.size()) - 1; k >= 0; --k) {
        const int64_t d = dims[static_cast<size_t>(k)];
        c[static_cast<size_t>(d)] = rest % s.spec.shape()[d];
        rest /= s.spec.shape()[d];
      }
      ranks.push_back(s.spec.rank_at(c));
    }
  }
  if (s.member)
    for (int64_t k : dims) my_index = my_index * s.spec.shape()[k] + s.coordinate[static_cast<size_t>(k)];
  // Every rank of the root takes part; each group is named by its smallest world rank.
  const int color = s.member ? *std::min_element(ranks.begin(), ranks.end()) : -1;
  auto comm = s.root->split(color, static_cast<int>(my_index));
  const int64_t n = static_cast<int64_t>(ranks.size());
  flat->spec = MeshSpec(Shape{n}, {name}, std::move(ranks));
  if (s.member) {
    flat->member = true;
    flat->coordinate = {my_index};
    flat->dims = {std::move(comm)};
  }
  s.flattened[key] = flat;
  return DeviceMesh(flat);
}

}  // namespace tessera
