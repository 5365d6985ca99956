// DeviceMesh construction (collective splits of the world), the groups over several dims (made on
// first use), derived meshes (no communication except flatten, duplicate and the first slice
// keeping a given set of several axes) and per-rank queries.
#include <tessera/mesh/device_mesh.hpp>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <optional>

#include <tessera/core/error.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

// Row-major index of `coordinate` over the dims in `mask` (inside) or not in it (outside).
int64_t index_over(const std::vector<int64_t>& coordinate, const Shape& shape, uint64_t mask, bool inside) {
  int64_t index = 0;
  for (int64_t d = 0; d < shape.size(); ++d)
    if (static_cast<bool>(mask >> d & 1) == inside) index = index * shape[d] + coordinate[static_cast<size_t>(d)];
  return index;
}

// The groups over several dims of one mesh through the calling rank, made on first use: each is
// a split of `base`, the communicator over exactly that mesh's ranks (collective over them only,
// who all run the same step in SPMD code), kept for every later use and every copy or slice of
// the mesh. A mesh of n dims would otherwise split the world 2^n - n - 1 times when built.
class SpanGroups {
 public:
  SpanGroups(std::shared_ptr<Communicator> base_comm, Shape grid, std::vector<int64_t> at)
      : base(std::move(base_comm)), shape(std::move(grid)), coordinate(std::move(at)) {}

  // The group over the dims in `mask` (two or more, not all) through this rank, itself holding
  // the groups over subsets of those dims. Collective over the ranks of `base` the first time.
  std::shared_ptr<SpanGroups> over(uint64_t mask) {
    if (auto made = find(mask)) return made;
    // One split of `base` at a time: two threads of this rank must not split it at once (like
    // any call on a communicator), and the second one then finds the first one's group.
    std::lock_guard creating(splitting_);
    if (auto made = find(mask)) return made;
    const int color = static_cast<int>(index_over(coordinate, shape, mask, false));
    const int key = static_cast<int>(index_over(coordinate, shape, mask, true));
    auto comm = base->split(color, key);
    Shape sub;
    std::vector<int64_t> at;
    for (int64_t d = 0; d < shape.size(); ++d)
      if (mask >> d & 1) sub.push_back(shape[d]), at.push_back(coordinate[static_cast<size_t>(d)]);
    auto made = std::make_shared<SpanGroups>(std::move(comm), std::move(sub), std::move(at));
    std::lock_guard lock(mutex_);
    // An abort that came while the split ran reaches the new group too.
    if (aborted_) made->abort(*aborted_);
    return groups_.emplace(mask, std::move(made)).first->second;
  }

  // Fails `base`, every group made from it and those made later (DeviceMesh::abort). Not
  // collective; never waits for a split in progress (the abort releases it).
  void abort(const std::string& reason) {
    std::vector<std::shared_ptr<SpanGroups>> made;
    {
      std::lock_guard lock(mutex_);
      if (!aborted_) aborted_ = reason;
      for (const auto& [mask, group] : groups_) made.push_back(group);
    }
    base->abort(reason);
    for (const auto& group : made) group->abort(reason);
  }

  const std::shared_ptr<Communicator> base;
  const Shape shape;                     // of the mesh `base` spans
  const std::vector<int64_t> coordinate;  // the calling rank's, in that mesh

 private:
  std::shared_ptr<SpanGroups> find(uint64_t mask) {
    std::lock_guard lock(mutex_);
    const auto it = groups_.find(mask);
    return it == groups_.end() ? nullptr : it->second;
  }

  std::mutex splitting_;  // held while a split of `base` runs
  std::mutex mutex_;      // guards groups_ and aborted_; never held while communicating
  std::map<uint64_t, std::shared_ptr<SpanGroups>> groups_;  // by mask of dims
  std::optional<std::string> aborted_;
};

void require_rank() {
  TESSERA_CHECK(in_rank(), ValueError, "DeviceMesh",
                "constructed outside a rank; build meshes inside tessera::run or tessera::launch");
}

}  // namespace

struct DeviceMesh::State {
  MeshSpec spec;
  int me = -1;                  // calling world rank
  bool member = false;
  std::vector<int64_t> coordinate;
  std::vector<std::shared_ptr<Communicator>> dims;  // per mesh dim, through me (members only)
  // The groups over exactly this mesh's ranks and over several of its dims, for members of a
  // mesh of two or more dims; `spans_failed` says why there are none where slicing a failed mesh
  // could not make them.
  std::shared_ptr<SpanGroups> spans;
  std::string spans_failed;
  // Over every rank of the mesh this one was derived from (the constructed mesh): flatten
  // splits it. Null for ranks outside that mesh.
  std::shared_ptr<Communicator> root;
  std::mutex mutex;  // guards the flatten cache
  std::map<std::pair<std::vector<std::string>, std::string>, std::shared_ptr<State>> flattened;
};

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
  // One split for the whole mesh, then one per mesh dim; every world rank takes part. The
  // groups over several dims come from the whole mesh's group when first used.
  const auto position = [&] {
    const auto it = std::find(spec.ranks().begin(), spec.ranks().end(), state->me);
    return static_cast<int>(it - spec.ranks().begin());
  };
  state->root = world.split(state->member ? 0 : -1, state->member ? position() : 0);
  for (int64_t d = 0; d < spec.ndim(); ++d) {
    const uint64_t line = uint64_t{1} << d;
    const int color = state->member ? static_cast<int>(index_over(state->coordinate, spec.shape(), line, false)) : -1;
    const int key = state->member ? static_cast<int>(state->coordinate[static_cast<size_t>(d)]) : 0;
    state->dims.push_back(world.split(color, key));
  }
  if (!state->member) state->dims.clear();
  if (state->member && spec.ndim() >= 2)
    state->spans = std::make_shared<SpanGroups>(state->root, spec.shape(), state->coordinate);
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

namespace {

// The mesh's groups over several dims; a CommError where slicing a failed mesh left none.
SpanGroups& spans_of(const std::shared_ptr<SpanGroups>& spans, const std::string& failed, const std::string& mesh,
                     const char* op) {
  if (!spans)
    throw CommError(detail::concat("[", op, "] ", mesh, " has no communicators over several of its dims: slicing",
                                   " it from a failed mesh could not make them (", failed, ")"));
  return *spans;
}

}  // namespace

std::shared_ptr<Communicator> DeviceMesh::mesh_comm_ptr() const {
  const State& s = *state_;
  if (!s.member) return nullptr;
  if (s.root && s.root->world_ranks() == s.spec.ranks()) return s.root;
  if (s.spec.ndim() == 0) return nullptr;
  if (s.spec.ndim() == 1) return s.dims.front();
  return spans_of(s.spans, s.spans_failed, to_string(), "DeviceMesh::mesh_comm_ptr").base;
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
  SpanGroups& spans = spans_of(s.spans, s.spans_failed, to_string(), "DeviceMesh::comm");
  if (static_cast<int64_t>(dims.size()) == ndim()) return spans.base;
  return spans.over(mask)->base;
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
  // Every group is split whole, in one order on every rank (root, dims, then the group over the
  // mesh's ranks where that is not the root), so the splits of different groups cannot wait on
  // each other. The copy makes its own groups over several dims when it first uses them.
  const auto dup = [](const std::shared_ptr<Communicator>& comm) { return comm ? comm->split(0, comm->rank()) : nullptr; };
  copy->root = dup(s.root);
  for (const auto& comm : s.dims) copy->dims.push_back(dup(comm));
  if (s.spans)
    copy->spans = std::make_shared<SpanGroups>(s.spans->base == s.root ? copy->root : dup(s.spans->base),
                                               s.spans->shape, s.spans->coordinate);
  copy->spans_failed = s.spans_failed;
  return DeviceMesh(std::move(copy));
}

void DeviceMesh::abort(const std::string& reason) const {
  const State& s = *state_;
  // The root only where it is this mesh's own group: a slice leaves its parent's other ranks be.
  if (s.root && s.root->world_ranks() == s.spec.ranks()) s.root->abort(reason);
  for (const auto& comm : s.dims) comm->abort(reason);
  if (s.spans) s.spans->abort(reason);
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
  }
  // The group over the slice's ranks: the parent's group over the kept axes, made (on first
  // need) by every rank of the parent, in or out of this slice, so that each gets its own.
  if (kept.size() >= 2 && static_cast<int64_t>(kept.size()) == ndim()) {
    sub->spans = s.spans;
    sub->spans_failed = s.spans_failed;
  } else if (kept.size() >= 2 && s.spans) {
    uint64_t mask = 0;
    for (int64_t d : kept) mask |= uint64_t{1} << d;
    try {
      auto spans = s.spans->over(mask);
      if (sub->member) sub->spans = std::move(spans);
    } catch (const CommError& e) {
      // A failed mesh still slices (as before its groups were made on first use); the slice's
      // collectives over several axes fail with the reason.
      if (sub->member) sub->spans_failed = e.what();
    }
  } else if (kept.size() >= 2 && sub->member) {
    sub->spans_failed = s.spans_failed;
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
    for (const auto& axis : axes) name.append(name.empty() ? "" : "_").append(axis);
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
