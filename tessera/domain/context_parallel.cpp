// context_parallel: splitting and unsplitting the sequence buffers is DTensor work (narrow, cat,
// redistribute, all differentiable); the load-balanced order reaches ring attention through a
// per-thread scope.
#include <tessera/domain/context_parallel.hpp>

#include <algorithm>
#include <string>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/internal/ring_attention.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera {

namespace {

int64_t cp_mesh_dim(const DeviceMesh& mesh, const ContextParallelOptions& options, const char* op) {
  if (options.mesh_dim < 0) {
    TESSERA_CHECK(mesh.ndim() == 1, ValueError, op, mesh.to_string(), " has ", mesh.ndim(),
                  " dims; say which splits the sequence with ContextParallelOptions::mesh_dim");
    return 0;
  }
  TESSERA_CHECK(options.mesh_dim < mesh.ndim(), ValueError, op, "mesh_dim ", options.mesh_dim, " is out of range for ",
                mesh.to_string());
  return options.mesh_dim;
}

// The layout of x with mesh dim `cp` set to `placement`, keeping the other dims' shard orders and
// explicit sizes; `seq_sizes` (if any) become the explicit sizes of dim seq.
Layout with_placement(const DTensor& x, int64_t cp, const Placement& placement, int64_t seq,
                      const std::vector<int64_t>& seq_sizes) {
  const Layout& layout = x.layout();
  Placements placements = x.placements();
  placements[static_cast<size_t>(cp)] = placement;
  ShardOrder order = layout.shard_orders();
  ShardSizes sizes = layout.explicit_sizes();
  order.erase(seq);  // the sequence dim is split over the context-parallel mesh dim alone
  sizes.erase(seq);
  if (!seq_sizes.empty()) sizes[seq] = seq_sizes;
  return Layout(x.shape(), x.dtype(), layout.mesh(), placements, order, sizes);
}

// Chunk c of the 2n zig-zag chunks: its start in the natural order.
std::vector<int64_t> starts_of(const std::vector<int64_t>& cut) {
  std::vector<int64_t> starts(cut.size() + 1, 0);
  for (size_t c = 0; c < cut.size(); ++c) starts[c + 1] = starts[c] + cut[c];
  return starts;
}

void check_buffer(const DTensor& x, const DeviceMesh& mesh, int64_t seq, size_t index, const char* op) {
  TESSERA_CHECK(x.defined(), ShardingError, op, "buffer ", index, " is undefined");
  TESSERA_CHECK(x.device_mesh().spec() == mesh.spec(), ShardingError, op, "buffer ", index, " lives on ",
                x.device_mesh().to_string(), ", not on ", mesh.to_string());
  TESSERA_CHECK(seq >= 0 && seq < x.ndim(), ShardingError, op, "sequence dim ", seq, " of buffer ", index,
                " is out of range for ", x.layout().to_string());
}

DTensor split(const DTensor& x, const DeviceMesh& mesh, int64_t cp, int64_t seq, bool load_balance, size_t index) {
  const char* op = "context_parallel";
  check_buffer(x, mesh, seq, index, op);
  TESSERA_CHECK(is_replicate(x.placements()[static_cast<size_t>(cp)]) && x.layout().shard_order(seq).empty(),
                ShardingError, op, "buffer ", index, " ", x.layout().to_string(), " must be replicated on mesh dim ",
                cp, " with its sequence dim ", seq, " unsplit");
  if (!load_balance) return x.redistribute(mesh, with_placement(x, cp, Shard{seq}, seq, {}));
  const int64_t n = mesh.size(cp);
  const std::vector<int64_t> cut = detail::zigzag_chunk_sizes(x.shape()[seq], n);
  const std::vector<int64_t> starts = starts_of(cut);
  std::vector<DTensor> parts;
  for (size_t c : detail::zigzag_order(n)) parts.push_back(narrow(x, seq, starts[c], cut[c]));
  const DTensor permuted = cat(parts, seq);  // replicated: every rank permutes its own copy
  return permuted.redistribute(mesh, with_placement(permuted, cp, Shard{seq}, seq, detail::zigzag_piece_sizes(x.shape()[seq], n)));
}

// The load-balanced scope of ring attention, left however body ends.
class LoadBalancedScope {
 public:
  LoadBalancedScope(const DeviceMesh& mesh, int64_t cp, bool on) : on_(on) {
    if (on_) detail::push_load_balanced_sequence(mesh, cp);
  }
  ~LoadBalancedScope() {
    if (on_) detail::pop_load_balanced_sequence();
  }
  LoadBalancedScope(const LoadBalancedScope&) = delete;
  LoadBalancedScope& operator=(const LoadBalancedScope&) = delete;

 private:
  bool on_;
};

}  // namespace

void context_parallel(const DeviceMesh& mesh, const std::vector<DTensor*>& buffers, const std::vector<int64_t>& seq_dims,
                      const std::function<void()>& body, const ContextParallelOptions& options,
                      const std::vector<DTensor*>& no_restore) {
  const char* op = "context_parallel";
  TESSERA_CHECK(buffers.size() == seq_dims.size(), ValueError, op, buffers.size(), " buffers but ", seq_dims.size(),
                " sequence dims");
  for (DTensor* keep : no_restore)
    TESSERA_CHECK(std::find(buffers.begin(), buffers.end(), keep) != buffers.end(), ValueError, op,
                  "no_restore names a buffer that is not among the buffers");
  const int64_t cp = cp_mesh_dim(mesh, options, op);
  std::vector<DTensor> saved, split_buffers;
  for (size_t i = 0; i < buffers.size(); ++i) {
    TESSERA_CHECK(buffers[i] != nullptr, ValueError, op, "buffer ", i, " is null");
    saved.push_back(*buffers[i]);
    split_buffers.push_back(split(*buffers[i], mesh, cp, seq_dims[i], options.load_balance, i));
  }
  for (size_t i = 0; i < buffers.size(); ++i) *buffers[i] = split_buffers[i];
  const auto restore = [&] {
    for (size_t i = 0; i < buffers.size(); ++i)
      if (std::find(no_restore.begin(), no_restore.end(), buffers[i]) == no_restore.end()) *buffers[i] = saved[i];
  };
  try {
    const LoadBalancedScope scope(mesh, cp, options.load_balance);
    body();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

std::vector<DTensor> context_parallel_unshard(const DeviceMesh& mesh, const std::vector<DTensor>& buffers,
                                              const std::vector<int64_t>& seq_dims,
                                              const ContextParallelOptions& options) {
  const char* op = "context_parallel_unshard";
  TESSERA_CHECK(buffers.size() == seq_dims.size(), ValueError, op, buffers.size(), " buffers but ", seq_dims.size(),
                " sequence dims");
  const int64_t cp = cp_mesh_dim(mesh, options, op);
  const int64_t n = mesh.size(cp);
  std::vector<DTensor> out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const DTensor& x = buffers[i];
    const int64_t seq = seq_dims[i];
    check_buffer(x, mesh, seq, i, op);
    TESSERA_CHECK(is_shard(x.placements()[static_cast<size_t>(cp)], seq) && x.layout().shard_order(seq).size() == 1,
                  ShardingError, op, "buffer ", i, " ", x.layout().to_string(), " is not split along dim ", seq,
                  " over mesh dim ", cp, " alone, as context_parallel splits it");
    const DTensor full = x.redistribute(mesh, with_placement(x, cp, Replicate{}, seq, {}));
    if (!options.load_balance) {
      out.push_back(full);
      continue;
    }
    const std::vector<int64_t> cut = detail::zigzag_chunk_sizes(x.shape()[seq], n);
    // Where each chunk sits in the held (zig-zag) order, then the chunks in natural order.
    std::vector<int64_t> held_at(cut.size(), 0);
    int64_t offset = 0;
    for (size_t c : detail::zigzag_order(n)) held_at[c] = offset, offset += cut[c];
    std::vector<DTensor> parts;
    for (size_t c = 0; c < cut.size(); ++c) parts.push_back(narrow(full, seq, held_at[c], cut[c]));
    out.push_back(cat(parts, seq));
  }
  return out;
}

}  // namespace tessera
