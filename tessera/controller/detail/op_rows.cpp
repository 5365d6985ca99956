// The controller's op table. The families of ops/op_table.hpp whose ops share an argument form
// (unary, binary and their scalar forms, comparisons, reductions) are expanded from the table;
// the ops with arguments of their own, and the controller's own ops (redistribute, the mesh
// reduce, factories), are one row each below.
#include <tessera/controller/detail/op_rows.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/op_table.hpp>
#include <tessera/ops/random.hpp>

namespace tessera::controller::detail {

namespace {

// ---- call()'s arguments into typed ones. What an op does not take is refused, so that a call
// with misplaced arguments fails where it is made, not on the workers.

bool no_structure(const CallArgs& a) { return a.shape.empty() && a.placements.empty() && a.text.empty(); }

OpArgs no_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && a.ints.empty() && no_structure(a), a, op, "no arguments besides its inputs");
  return NoArgs{};
}

OpArgs scalar_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.size() == 1 && a.ints.empty() && no_structure(a), a, op, "one scalar");
  return ScalarArgs{a.scalars[0]};
}

template <size_t N>
OpArgs dim_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && a.ints.size() == N && no_structure(a), a, op, N == 1 ? "one dim" : "two dims");
  return DimArgs{a.ints};
}

// ints: [keepdim, dims...]; none: over every dim.
OpArgs reduce_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && no_structure(a), a, op, "integers [keepdim, dims...]");
  if (a.ints.empty()) return ReduceArgs{};
  return ReduceArgs{std::vector<int64_t>(a.ints.begin() + 1, a.ints.end()), a.ints[0] != 0};
}

OpArgs shape_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && a.ints.empty() && a.placements.empty() && a.text.empty(), a, op, "a shape");
  return ShapeArgs{a.shape};
}

OpArgs placement_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && a.ints.empty() && a.shape.empty() && a.text.empty() && !a.placements.empty(), a, op,
              "placements");
  return PlacementArgs{a.placements};
}

// ints: [mesh reduction, scatter, mesh dims...].
OpArgs mesh_reduce_args(const CallArgs& a, const std::string& op) {
  check_takes(
      a.scalars.empty() && a.ints.size() >= 3 && no_structure(a) && a.ints[0] >= 0 && a.ints[0] < kMeshReductionCount,
      a, op, "integers [mesh reduction (0 sum ... 5 stack), scatter, mesh dims...]");
  return MeshReduceArgs{static_cast<MeshReduction>(a.ints[0]), a.ints[1] != 0,
                        std::vector<int64_t>(a.ints.begin() + 2, a.ints.end())};
}

// The identity that RemoteTensor::slice_mesh issues with a slice to keep the result on; not
// callable by name (on its own mesh it would do nothing).
OpArgs slice_args(const CallArgs& a, const std::string& op) {
  check_takes(false, a, op, "no call by name: RemoteTensor::slice_mesh issues it");
  return NoArgs{};
}

// On a worker of the sliced mesh: t itself, once every sliced mesh dim holds it Replicate (a
// slice keeps one coordinate of each, which holds all of it only then).
DTensor mesh_slice(const DTensor& t, const MeshReduceArgs& a, const DeviceMesh& mesh) {
  for (int64_t d : a.mesh_dims) {
    const Placement& p = t.placements()[static_cast<size_t>(d)];
    TESSERA_CHECK(is_replicate(p), ShardingError, "slice_mesh", "the tensor is ", to_string(t.placements()), " on ",
                  mesh.to_string(), ": ", to_string(p), " along axis '", mesh.axis_names()[static_cast<size_t>(d)],
                  "', so a slice at one of its coordinates holds ",
                  is_partial(p) ? "one term of the sum" : "one piece of the tensor",
                  "; reduce or redistribute it to Replicate along that axis first");
  }
  return t;
}

// ints: mesh dims, at least one.
OpArgs mesh_dims_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.empty() && !a.ints.empty() && no_structure(a), a, op, "integers [mesh dims...] (one or more)");
  return DimArgs{a.ints};
}

// Monarch's mesh.rank(dims) on a worker: its rank along the mesh dims as a scalar i64 held
// Replicate: each worker's value is its own, as Monarch's are.
DTensor mesh_rank(const DimArgs& a, const DeviceMesh& mesh) {
  FromLocalOptions global;
  global.shape = Shape{};
  return DTensor::from_local(tessera::full(Shape{}, Scalar(rank_along(mesh, a.dims)), DType::i64), mesh,
                             Placements(static_cast<size_t>(mesh.ndim()), Replicate{}), global);
}

template <bool kValue>
OpArgs factory_args(const CallArgs& a, const std::string& op) {
  check_takes(a.scalars.size() == (kValue ? 1 : 0) && a.ints.empty() && a.text.empty(), a, op,
              kValue ? "a shape, placements, a dtype and one scalar (the value)" : "a shape, placements and a dtype");
  return FactoryArgs{a.shape, a.placements, a.dtype, kValue ? a.scalars[0] : 0.0};
}

// ---- Running a row on a worker.

// A reduction of the op table's family, by the form its DTensor function takes: over dims (sum,
// mean, prod, amax, amin), with a correction (var: Bessel's, torch's default), or over one dim
// or all (argmax, argmin).
template <class F>
DTensor reduce_with(F f, const char* name, const DTensor& x, const ReduceArgs& a) {
  if constexpr (std::is_invocable_v<F, const DTensor&, const std::vector<int64_t>&, int64_t, bool>) {
    return f(x, a.dims, int64_t{1}, a.keepdim);
  } else if constexpr (std::is_invocable_v<F, const DTensor&, const std::vector<int64_t>&, bool>) {
    return f(x, a.dims, a.keepdim);
  } else {
    TESSERA_CHECK(a.dims.size() <= 1, ValueError, name, "reduces over one dim or all of them; got dims ",
                  Shape(a.dims).to_string());
    return f(x, a.dims.empty() ? std::nullopt : std::optional<int64_t>(a.dims[0]), a.keepdim);
  }
}

// DTensor's mesh reduce over the mesh dims, named.
DTensor mesh_reduce(const DTensor& x, const MeshReduceArgs& a, const DeviceMesh& mesh) {
  std::vector<std::string> axes;
  for (int64_t d : a.mesh_dims) axes.push_back(mesh.axis_names().at(static_cast<size_t>(d)));
  return x.reduce(axes, a.reduction, a.scatter);
}

template <class T>
const T& args_of(const OpArgs& args) {
  return std::get<T>(args);
}

using Table = OpTable;

Table make_table() {
  Table t;
#define TESSERA_CONTROLLER_UNARY(name, ...)                                                      \
  t[#name] = {1, no_args, [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) { \
                return tessera::name(in.at(0));                                                  \
              }};
  TESSERA_UNARY_OPS(TESSERA_CONTROLLER_UNARY)
#undef TESSERA_CONTROLLER_UNARY
#define TESSERA_CONTROLLER_BINARY(name, ...)                                                                     \
  t[#name] = {2, no_args, [](const std::vector<DTensor>& in, const OpArgs&, const DeviceMesh&) {                 \
                return tessera::name(in.at(0), in.at(1));                                                        \
              }};                                                                                                \
  t[#name "_scalar"] = {1, scalar_args, [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) { \
                          return tessera::name(in.at(0), Scalar(args_of<ScalarArgs>(a).value));                  \
                        }};
  TESSERA_BINARY_OPS(TESSERA_CONTROLLER_BINARY)
  TESSERA_COMPARISON_OPS(TESSERA_CONTROLLER_BINARY)
#undef TESSERA_CONTROLLER_BINARY
#define TESSERA_CONTROLLER_REDUCTION(name)                                                                   \
  t[#name] = {1, reduce_args, [](const std::vector<DTensor>& in, const OpArgs& a, const DeviceMesh&) {       \
                const auto f = [](auto&&... x) -> decltype(tessera::name(std::forward<decltype(x)>(x)...)) { \
                  return tessera::name(std::forward<decltype(x)>(x)...);                                     \
                };                                                                                           \
                return reduce_with(f, #name, in.at(0), args_of<ReduceArgs>(a));                              \
              }};
  TESSERA_REDUCTION_OPS(TESSERA_CONTROLLER_REDUCTION)
#undef TESSERA_CONTROLLER_REDUCTION

  using In = const std::vector<DTensor>&;
  using Args = const OpArgs&;
  using Mesh = const DeviceMesh&;
  t["matmul"] = {2, no_args, [](In in, Args, Mesh) { return matmul(in.at(0), in.at(1)); }};
  t["softmax"] = {1, dim_args<1>,
                  [](In in, Args a, Mesh) { return softmax(in.at(0), args_of<DimArgs>(a).dims.at(0)); }};
  t["transpose"] = {1, dim_args<2>, [](In in, Args a, Mesh) {
                      const std::vector<int64_t>& dims = args_of<DimArgs>(a).dims;
                      return transpose(in.at(0), dims.at(0), dims.at(1));
                    }};
  t["reshape"] = {1, shape_args, [](In in, Args a, Mesh) { return reshape(in.at(0), args_of<ShapeArgs>(a).shape); }};
  // The controller's own ops.
  t["redistribute"] = {1, placement_args, [](In in, Args a, Mesh mesh) {
                         return in.at(0).redistribute(mesh, args_of<PlacementArgs>(a).placements);
                       }};
  t["mesh_reduce"] = {1, mesh_reduce_args,
                      [](In in, Args a, Mesh mesh) { return mesh_reduce(in.at(0), args_of<MeshReduceArgs>(a), mesh); }};
#define TESSERA_CONTROLLER_FACTORY(name)                           \
  t[#name] = {0, factory_args<false>, [](In, Args a, Mesh mesh) {  \
                const auto& f = args_of<FactoryArgs>(a);           \
                return name(f.shape, mesh, f.placements, f.dtype); \
              }};
  TESSERA_CONTROLLER_FACTORY(zeros)
  TESSERA_CONTROLLER_FACTORY(ones)
  TESSERA_CONTROLLER_FACTORY(randn)
  TESSERA_CONTROLLER_FACTORY(rand)
#undef TESSERA_CONTROLLER_FACTORY
  t["mesh_slice"] = {1, slice_args,
                     [](In in, Args a, Mesh mesh) { return mesh_slice(in.at(0), args_of<MeshReduceArgs>(a), mesh); }};
  t["mesh_rank"] = {0, mesh_dims_args, [](In, Args a, Mesh mesh) { return mesh_rank(args_of<DimArgs>(a), mesh); }};
  t["full"] = {0, factory_args<true>, [](In, Args a, Mesh mesh) {
                 const auto& f = args_of<FactoryArgs>(a);
                 return full(f.shape, f.value, mesh, f.placements, f.dtype);
               }};
  add_structured_rows(t);
  add_autograd_rows(t);
  return t;
}

const Table& table() {
  static const Table rows = make_table();
  return rows;
}

std::mutex remote_mutex;
std::map<std::string, RemoteFn>& remotes() {
  static std::map<std::string, RemoteFn> registered;
  return registered;
}

}  // namespace

std::string given(const CallArgs& a) {
  return std::to_string(a.scalars.size()) + " scalars, " + std::to_string(a.ints.size()) + " integers" +
         (a.shape.empty() ? "" : ", shape " + a.shape.to_string()) +
         (a.placements.empty() ? "" : ", placements " + tessera::to_string(a.placements)) +
         (a.text.empty() ? "" : ", text '" + a.text + "'");
}

void check_takes(bool fits, const CallArgs& a, const std::string& op, const std::string& takes) {
  TESSERA_CHECK(fits, ValueError, "controller::call", "'", op, "' takes ", takes, "; got ", given(a));
}

int64_t rank_along(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims) {
  const std::vector<int64_t> coordinate = mesh.coordinate();
  int64_t rank = 0;
  for (int64_t d : mesh_dims) {
    TESSERA_CHECK(d >= 0 && d < mesh.ndim(), ShardingError, "mesh_rank", "mesh dim ", d, " is out of range for ",
                  mesh.to_string(), " (", mesh.ndim(), " dims)");
    rank = rank * mesh.size(d) + coordinate[static_cast<size_t>(d)];
  }
  return rank;
}

const OpRow* find_op(const std::string& name) {
  const auto it = table().find(name);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> op_row_names() {
  std::vector<std::string> names;
  for (const auto& [name, row] : table()) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

const RemoteFn* find_remote(const std::string& name) {
  std::lock_guard<std::mutex> lock(remote_mutex);
  const auto it = remotes().find(name);
  return it == remotes().end() ? nullptr : &it->second;
}

bool add_remote(const std::string& name, RemoteFn fn) {
  std::lock_guard<std::mutex> lock(remote_mutex);
  return remotes().emplace(name, std::move(fn)).second;
}

}  // namespace tessera::controller::detail
