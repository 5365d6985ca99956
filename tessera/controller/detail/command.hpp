#pragma once
// The controller's protocol: what it sends a worker, as Monarch's worker messages are, one struct
// per kind of command. Data only (an op's name and typed arguments, tensor ids, request ids),
// never code or pointers, so in-process queues and MPI messages carry the same commands; a
// worker answers a request (a fetch, a layout) by its id through the transport (transport.hpp).
//
// Each struct lists its fields once, in `fields`: the wire codec (wire.cpp) writes and reads that
// list, so a field cannot be sent and not received.
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/export.hpp>
#include <tessera/core/reduce_op.hpp>
#include <tessera/core/shape.hpp>
#include <tessera/sharding/placement.hpp>

namespace tessera TESSERA_API {
namespace controller::detail {

// ---- An op's arguments besides its input tensors, typed per op family -------------------------

struct NoArgs {
  template <class Self>
  static auto fields(Self&) {
    return std::tie();
  }
  bool operator==(const NoArgs&) const = default;
};
/// A binary op's scalar operand (add_scalar ...).
struct ScalarArgs {
  double value = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.value);
  }
  bool operator==(const ScalarArgs&) const = default;
};
/// Tensor dims an op names (softmax: one, transpose: two).
struct DimArgs {
  std::vector<int64_t> dims;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.dims);
  }
  bool operator==(const DimArgs&) const = default;
};
struct ShapeArgs {
  Shape shape;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.shape);
  }
  bool operator==(const ShapeArgs&) const = default;
};
struct PlacementArgs {
  Placements placements;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.placements);
  }
  bool operator==(const PlacementArgs&) const = default;
};
/// A reduction over tensor dims (all of them when empty).
struct ReduceArgs {
  std::vector<int64_t> dims;
  bool keepdim = false;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.dims, s.keepdim);
  }
  bool operator==(const ReduceArgs&) const = default;
};
/// Monarch's mesh reduce (DTensor::reduce): each worker's block is its own value along
/// `mesh_dims`, combined by `reduction` onto every worker, or with `scatter` split over them.
struct MeshReduceArgs {
  MeshReduction reduction = MeshReduction::sum;
  bool scatter = false;
  std::vector<int64_t> mesh_dims;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.reduction, s.scatter, s.mesh_dims);
  }
  bool operator==(const MeshReduceArgs&) const = default;
};
/// A factory's block: `value` for full.
struct FactoryArgs {
  Shape shape;
  Placements placements;
  DType dtype = DType::f32;
  double value = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.shape, s.placements, s.dtype, s.value);
  }
  bool operator==(const FactoryArgs&) const = default;
};

/// The arguments of the ops with several kinds of them (nn, view, shape, index and autograd
/// ops): call()'s scalars, integers, shape and text as given, each row reading its own after
/// checking them at the call.
struct ListArgs {
  std::vector<double> scalars;
  std::vector<int64_t> ints;
  Shape shape;
  std::string text;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.scalars, s.ints, s.shape, s.text);
  }
  bool operator==(const ListArgs&) const = default;
};

using OpArgs = std::variant<NoArgs, ScalarArgs, DimArgs, ShapeArgs, PlacementArgs, ReduceArgs, MeshReduceArgs,
                            FactoryArgs, ListArgs>;

// ---- Commands. `stream`: the stream it runs on (0 is "main") -----------------------------------

/// A mesh over all workers (collective among them), built by each worker's own thread.
struct MakeMesh {
  int64_t mesh = -1;
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::vector<int64_t> ranks;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.shape, s.names, s.ranks);
  }
  bool operator==(const MakeMesh&) const = default;
};
/// Mesh `mesh` as the slice of `parent` at fixed indices of some of its axes.
struct SliceMesh {
  int64_t mesh = -1;
  int64_t parent = -1;
  std::map<std::string, int64_t> at;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.parent, s.at);
  }
  bool operator==(const SliceMesh&) const = default;
};
/// A new stream on every worker: a thread with its own copy of every mesh.
struct MakeStream {
  int64_t stream = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.stream);
  }
  bool operator==(const MakeStream&) const = default;
};
/// An op of the op table (op_rows.hpp) on `mesh`. `output` receives its result; in place it is
/// among the inputs. With `onto` (a mesh reduce onto a slice), the result lives on that slice.
/// `layout_request`: where the mesh's first worker reports the result's layout (0: when asked).
struct RunOp {
  int64_t mesh = -1;
  int64_t stream = 0;
  std::string op;
  std::vector<uint64_t> inputs;
  OpArgs args;
  uint64_t output = 0;
  int64_t onto = -1;
  uint64_t layout_request = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.stream, s.op, s.inputs, s.args, s.output, s.onto, s.layout_request);
  }
  bool operator==(const RunOp&) const = default;
};
/// A registered remote function (register_remote) with several outputs.
struct CallRemote {
  int64_t mesh = -1;
  int64_t stream = 0;
  std::string function;
  std::vector<uint64_t> inputs;
  std::vector<uint64_t> outputs;
  std::vector<uint64_t> layout_requests;  // per output, as RunOp's (empty: when asked)
  // Per output, the layout (layout_words) the controller's propagation gave it, which the
  // results must have (empty: none; the workers report theirs).
  std::vector<std::vector<int64_t>> expected_layouts;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.stream, s.function, s.inputs, s.outputs, s.layout_requests, s.expected_layouts);
  }
  bool operator==(const CallRemote&) const = default;
};
/// manual_seed on the stream's generator: `seed`, plus the worker's rank along `per_worker`
/// (mesh dims, row-major) where it names any.
struct Seed {
  int64_t mesh = -1;
  int64_t stream = 0;
  uint64_t seed = 0;
  std::vector<int64_t> per_worker;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.stream, s.seed, s.per_worker);
  }
  bool operator==(const Seed&) const = default;
};
/// Tensor `tensor` to the controller: one worker's block (`whole` false), or the whole tensor
/// gathered over the mesh (collective) and sent by its first worker.
struct Fetch {
  int64_t mesh = -1;
  int64_t stream = 0;
  uint64_t tensor = 0;
  bool whole = false;
  uint64_t request = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.stream, s.tensor, s.whole, s.request);
  }
  bool operator==(const Fetch&) const = default;
};
/// Tensor `tensor`'s layout to the controller (workers in other processes report when asked).
struct QueryLayout {
  int64_t mesh = -1;
  int64_t stream = 0;
  uint64_t tensor = 0;
  uint64_t request = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.stream, s.tensor, s.request);
  }
  bool operator==(const QueryLayout&) const = default;
};
/// Forget tensor `tensor` once the stream's work before it ran.
struct Drop {
  int64_t mesh = -1;
  int64_t stream = 0;
  uint64_t tensor = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.mesh, s.stream, s.tensor);
  }
  bool operator==(const Drop&) const = default;
};
/// Marks `event` once everything before it on the stream ran.
struct Signal {
  int64_t stream = 0;
  uint64_t event = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.stream, s.event);
  }
  bool operator==(const Signal&) const = default;
};
/// Runs nothing after it on the stream until `event` is marked.
struct Wait {
  int64_t stream = 0;
  uint64_t event = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.stream, s.event);
  }
  bool operator==(const Wait&) const = default;
};
/// Every stream finishes what it has, then the worker ends.
struct Stop {
  template <class Self>
  static auto fields(Self&) {
    return std::tie();
  }
  bool operator==(const Stop&) const = default;
};

/// Monarch's to_mesh: tensor `tensor` on mesh `from` onto mesh `to` as `output`, each worker of
/// `to` receiving the block of the worker of `from` at its coordinates of the axes both have
/// (the axes only `to` has broadcast). Run by the workers of both meshes; the blocks travel
/// over mesh `all` (every worker, 1-d), whose stream copies no other command uses.
struct ToMesh {
  int64_t from = -1;
  int64_t to = -1;
  int64_t all = -1;
  int64_t stream = 0;
  uint64_t tensor = 0;
  uint64_t output = 0;
  uint64_t layout_request = 0;
  template <class Self>
  static auto fields(Self& s) {
    return std::tie(s.from, s.to, s.all, s.stream, s.tensor, s.output, s.layout_request);
  }
  bool operator==(const ToMesh&) const = default;
};

using Command = std::variant<Stop, MakeMesh, SliceMesh, MakeStream, RunOp, CallRemote, Seed, Fetch, QueryLayout, Drop,
                             Signal, Wait, ToMesh>;

/// The stream a command runs on (0 for those about every stream).
int64_t stream_of(const Command& command);
/// The request a command asks the workers to answer (a fetch, a query), or 0.
uint64_t request_of(const Command& command);
/// "run_op", "fetch", ...: for messages.
const char* kind_name(const Command& command);

}  // namespace controller::detail
}  // namespace tessera
