#pragma once
// What a worker runs by name: the controller's op table and the registry of remote functions.
// The controller looks a row up to check a call's arguments and turn them into the op's typed
// arguments (command.hpp); the worker runs the row on DTensor. Rows are generated from the op
// table's families (ops/op_table.hpp) whose ops share an argument form; op_rows.cpp lists the
// others, one row each.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <tessera/controller/detail/command.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/mesh/device_mesh.hpp>

namespace tessera::controller::detail {

/// controller::call's untyped arguments.
struct CallArgs {
  std::vector<double> scalars;
  std::vector<int64_t> ints;
  Shape shape;
  Placements placements;
  DType dtype = DType::f32;
  std::string text;
};

struct OpRow {
  /// How many input tensors the op takes (at least, with most_inputs).
  int inputs = 0;
  /// The op's typed arguments from call()'s; throws ValueError naming `op` when they do not fit.
  std::function<OpArgs(const CallArgs& args, const std::string& op)> parse;
  /// Runs the op on a worker.
  std::function<DTensor(const std::vector<DTensor>& inputs, const OpArgs& args, const DeviceMesh& mesh)> run;
  /// The most input tensors it takes, where optional ones follow (a bias) or the count varies
  /// (cat); 0: exactly `inputs`.
  int most_inputs = 0;

  bool takes(size_t count) const {
    return static_cast<int>(count) >= inputs && static_cast<int>(count) <= std::max(inputs, most_inputs);
  }
};
using OpTable = std::unordered_map<std::string, OpRow>;

/// call()'s arguments as the errors show them: "1 scalars, 2 integers, shape [4, 4]".
std::string given(const CallArgs& args);
/// Throws ValueError naming controller::call unless `fits`: "'op' takes <takes>; got <given>".
void check_takes(bool fits, const CallArgs& args, const std::string& op, const std::string& takes);

/// What a row of ListArgs takes besides tensors, checked at the call: how many scalars and
/// integers (ranges; `integers_fit` for counts a range cannot say, such as conv2d's 0, 2, 4, 6,
/// 7), whether a shape or a text is required, and `what` for the error.
struct Takes {
  size_t scalars_least = 0, scalars_most = 0;
  size_t ints_least = 0, ints_most = 0;
  bool shape = false;
  bool text = false;
  bool (*integers_fit)(size_t count) = nullptr;
  const char* what = "no arguments besides its inputs";
};
/// Any count of integers.
inline constexpr size_t kAny = static_cast<size_t>(-1);
using ListRun = std::function<DTensor(const std::vector<DTensor>& inputs, const ListArgs& args)>;
/// Adds row `name`: `inputs` tensors (up to `most_inputs`, 0: exactly), arguments as `takes`
/// says, run by `run` on the worker.
void row(OpTable& table, const char* name, int inputs, int most_inputs, Takes takes, ListRun run);

/// The rows of the op table's ops with arguments of several kinds (nn, view, shape and index
/// ops: structured_rows.cpp) and of autograd (autograd_rows.cpp), added to `table`.
void add_structured_rows(OpTable& table);
void add_autograd_rows(OpTable& table);

/// The row of op `name`, or null.
const OpRow* find_op(const std::string& name);

/// The calling worker's rank along `mesh_dims` of `mesh`: its coordinates there, row-major (the
/// first dim major; Monarch's mesh.rank(dims)), 0 for none. Throws ShardingError for a dim out of
/// range.
int64_t rank_along(const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims);
/// Every op's name, sorted.
std::vector<std::string> op_row_names();

/// The remote functions registered by name (every worker of this process sees them).
using RemoteFn = std::function<std::vector<DTensor>(const DeviceMesh&, const std::vector<DTensor>&)>;
const RemoteFn* find_remote(const std::string& name);
/// Registers `fn` as `name`; false when the name is taken.
bool add_remote(const std::string& name, RemoteFn fn);

}  // namespace tessera::controller::detail
