#pragma once
// Rows moving along one sharded dim between the pieces of a layout. Every piece's output block
// is a list of runs of global rows (or of a fill value); the rows a block reads from other pieces
// travel by isend/irecv between exactly the pairs that share them. The engine under
// halo_exchange (tessera/domain) and under pad and roll of a sharded dim; differentiable: the
// backward sends each row's gradient back and adds it into the row it came from.
#include <cstdint>
#include <memory>
#include <vector>

#include <tessera/comm/tags.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/mesh/device_mesh.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/sharding/layout.hpp>

namespace tessera::detail {

/// RowRun::piece of rows that hold the fill value.
inline constexpr int64_t kFillRows = -1;

/// Output rows [out, out + length) of a piece's block are global rows [row, row + length), held
/// by `piece` (kFillRows: the fill value).
struct RowRun {
  int64_t out, row, length, piece;
};

/// Where every piece's output block along `dim` comes from, and who talks to whom. Pure data:
/// every rank builds the same plan from the layout alone.
struct RowPlan {
  int64_t dim = 0;
  std::vector<int64_t> starts;               ///< piece p holds global rows [starts[p], starts[p + 1])
  std::vector<std::vector<RowRun>> runs;     ///< per piece, its output block's runs in order
  std::vector<int64_t> out_rows;             ///< per piece, its output block's rows
  std::vector<int> group_rank;               ///< per piece, its rank in `comm`
  int64_t me = 0;                            ///< this rank's piece
  std::shared_ptr<Communicator> comm;        ///< over the mesh dims sharding `dim` (null: unsharded)

  /// Sets piece p's runs (out_rows from their lengths).
  void set_runs(int64_t p, std::vector<RowRun> piece_runs);
};

/// The plan's skeleton for `dim` of `layout` on `mesh` (this rank a member): starts, group ranks,
/// this rank's piece and the group; runs empty, to be set for every piece.
RowPlan row_plan(const Layout& layout, const DeviceMesh& mesh, int64_t dim);

/// Builds one piece's runs in output order: spans of global rows are split where pieces end (an
/// empty piece holds nothing) and neighbouring runs from one piece merge.
class RowRunBuilder {
 public:
  explicit RowRunBuilder(const std::vector<int64_t>& starts) : starts_(&starts) {}
  /// `count` rows of the fill value.
  void fill(int64_t count);
  /// Global rows [row, row + count), each in [0, starts.back()).
  void rows(int64_t row, int64_t count);
  /// One row: global row `source`, or the fill where it is negative (pad_source_row's -1).
  void row(int64_t source) { source < 0 ? fill(1) : rows(source, 1); }
  std::vector<RowRun> take() { return std::move(runs_); }
  /// Piece p holds global rows [starts()[p], starts()[p + 1]).
  const std::vector<int64_t>& starts() const { return *starts_; }

 private:
  void add(int64_t row, int64_t length, int64_t piece);
  const std::vector<int64_t>* starts_;
  std::vector<RowRun> runs_;
  int64_t out_ = 0;
};

/// The plan for `dim` with every piece's runs given by `build(piece, runs)`, which adds them to
/// a RowRunBuilder over the plan's starts (this rank a member).
template <class Build>
std::shared_ptr<const RowPlan> row_plan(const Layout& layout, const DeviceMesh& mesh, int64_t dim, Build build) {
  auto plan = std::make_shared<RowPlan>(row_plan(layout, mesh, dim));
  for (size_t p = 0; p + 1 < plan->starts.size(); ++p) {
    RowRunBuilder runs(plan->starts);
    build(p, runs);
    plan->set_runs(static_cast<int64_t>(p), runs.take());
  }
  return plan;
}

/// The global row that position i of a dim of `length` rows reads when the dim is padded in
/// `mode` (i may lie outside [0, length)): i itself inside, the reflected, clamped or wrapped row
/// outside, and -1 (the fill) for constant padding or an empty dim.
int64_t pad_source_row(int64_t i, int64_t length, PadMode mode);

/// One exchange in flight: posted by the constructor (this rank's own rows and the fill already
/// in place), finished by finish(), which waits for the rows from other pieces and returns this
/// rank's output block, recorded for autograd as `op`. Move-only; destroying an unfinished
/// exchange finishes it (the rows must land before the buffers go).
class RowExchange {
 public:
  RowExchange() = default;
  /// `local`: this rank's tensor, its extent along plan->dim its piece's rows (other dims as the
  /// ranks exchanging agree). `tag` separates independent exchanges in flight at once.
  RowExchange(std::shared_ptr<const RowPlan> plan, const Tensor& local, double fill, int tag);
  RowExchange(RowExchange&&) noexcept;
  RowExchange& operator=(RowExchange&&) noexcept;
  ~RowExchange();

  Tensor finish(const char* op);
  bool finished() const;

 private:
  void finish_quietly() noexcept;
  struct State;
  std::shared_ptr<State> state_;
};

/// RowExchange(plan, local, fill, tag).finish(op).
Tensor exchange_rows(std::shared_ptr<const RowPlan> plan, const Tensor& local, double fill, const char* op, int tag);

/// The tag the row exchanges use unless two are in flight at once.
inline constexpr int kRowExchangeTag = kRowExchangeTags.first;

}  // namespace tessera::detail
