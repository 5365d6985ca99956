// Partial DTensors reduced in buckets (DDP's gradient buckets): one flat all_reduce per group of
// tensors that reduce over the same communicator, instead of one collective per tensor. With
// targets that shard the reduced rows (FSDP's gradients), one flat reduce_scatter per group.
#include <algorithm>
#include <optional>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/row_split.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera {

namespace {

// Tensors whose blocks are reduced over one group (mesh, Partial dims, op) in one dtype: every
// rank of that group holds blocks of the same shapes, so their concatenations line up.
struct Bucket {
  MeshSpec mesh;
  std::vector<int64_t> dims;
  ReduceOp op;
  DType dtype;
  std::vector<size_t> members;  // indices into the tensors
  int64_t bytes = 0;
};

void flush(Bucket& bucket, const std::vector<DTensor>& tensors, std::vector<DTensor>& out) {
  if (bucket.members.empty()) return;
  const DeviceMesh& mesh = tensors[bucket.members.front()].device_mesh();
  int64_t total = 0;
  for (size_t i : bucket.members) total += tensors[i].to_local().numel();
  Tensor flat = empty({total}, bucket.dtype);
  int64_t at = 0;
  for (size_t i : bucket.members) {
    const Tensor& local = tensors[i].to_local();
    flat.narrow(0, at, local.numel()).copy_(local.reshape({local.numel()}));
    at += local.numel();
  }
  mesh.comm_ptr(bucket.dims)->all_reduce(flat.raw_data(), total, bucket.dtype, bucket.op);
  at = 0;
  for (size_t i : bucket.members) {
    const Layout& from = tensors[i].layout();
    Placements reduced = from.placements();
    for (int64_t d : bucket.dims) reduced[static_cast<size_t>(d)] = Replicate{};
    const Shape shape = tensors[i].to_local().shape();
    out[i] = DTensor(flat.narrow(0, at, shape.numel()).reshape(shape), mesh, from.with_placements(reduced));
    at += shape.numel();
  }
  bucket.members.clear();
  bucket.bytes = 0;
}

// Tensors Partial over one mesh dim whose targets split their rows over it (row_split): each
// rank's runs of rows packed rank by rank, one reduce_scatter, each result a view of its run.
struct ScatterBucket {
  MeshSpec mesh;
  int64_t mesh_dim;
  ReduceOp op;
  DType dtype;
  std::vector<size_t> members;
  std::vector<detail::RowSplit> splits;
  int64_t bytes = 0;
};

void flush(ScatterBucket& bucket, const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
           std::vector<DTensor>& out) {
  if (bucket.members.empty()) return;
  const DeviceMesh& mesh = tensors[bucket.members.front()].device_mesh();
  const int64_t ranks = mesh.spec().shape()[static_cast<size_t>(bucket.mesh_dim)];
  int64_t slot = 0;
  for (const detail::RowSplit& s : bucket.splits) slot += s.capacity;
  Tensor send = zeros({ranks * slot}, bucket.dtype);
  int64_t at = 0;
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const Tensor& local = tensors[bucket.members[k]].to_local();
    const detail::RowSplit& s = bucket.splits[k];
    for (int64_t r = 0; r < ranks; ++r) {
      const auto ri = static_cast<size_t>(r);
      if (s.counts[ri] == 0) continue;
      const Tensor rows = local.narrow(0, s.starts[ri], s.counts[ri]);
      send.narrow(0, r * slot + at, rows.numel()).reshape(rows.shape()).copy_(rows);
    }
    at += s.capacity;
  }
  Tensor recv = empty({slot}, bucket.dtype);
  mesh.comm_ptr(bucket.mesh_dim)->reduce_scatter(send.raw_data(), recv.raw_data(), slot, bucket.dtype, bucket.op);
  at = 0;
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const size_t i = bucket.members[k];
    const Shape shape = targets[i].local_shape(mesh.coordinate());
    out[i] = DTensor(recv.narrow(0, at, shape.numel()).reshape(shape), mesh, targets[i]);
    at += bucket.splits[k].capacity;
  }
  bucket.members.clear();
  bucket.splits.clear();
  bucket.bytes = 0;
}

// The single mesh dim a tensor is Partial on, and its op (nullopt: none or several).
std::optional<std::pair<int64_t, ReduceOp>> single_partial(const Layout& layout) {
  std::optional<std::pair<int64_t, ReduceOp>> found;
  for (size_t d = 0; d < layout.placements().size(); ++d)
    if (const auto* partial = std::get_if<Partial>(&layout.placements()[d])) {
      if (found) return std::nullopt;
      found = std::pair{static_cast<int64_t>(d), partial->op};
    }
  return found;
}

}  // namespace

std::vector<DTensor> reduce_partials(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
                                     int64_t bucket_bytes) {
  TESSERA_CHECK(tensors.size() == targets.size(), ValueError, "reduce_partials", tensors.size(), " tensors but ",
                targets.size(), " target layouts");
  TESSERA_CHECK(bucket_bytes > 0, ValueError, "reduce_partials", "bucket_bytes ", bucket_bytes, " must be positive");
  std::vector<DTensor> out(tensors.size());
  std::vector<DTensor> rest;  // reduced by all_reduce buckets, then moved to their targets
  std::vector<size_t> rest_index;
  std::vector<ScatterBucket> open;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DTensor& t = tensors[i];
    std::optional<detail::RowSplit> split;
    const auto partial = t.defined() ? single_partial(t.layout()) : std::nullopt;
    if (partial && t.device_mesh().is_member() && t.device_mesh().spec() == targets[i].mesh() &&
        t.dtype() == targets[i].dtype())
      split = detail::row_split(t.layout(), targets[i], partial->first, t.device_mesh().coordinate());
    if (!split) {
      rest.push_back(t);
      rest_index.push_back(i);
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(), [&](const ScatterBucket& b) {
      return b.mesh == t.device_mesh().spec() && b.mesh_dim == partial->first && b.op == partial->second &&
             b.dtype == t.dtype();
    });
    if (it == open.end())
      it = open.insert(open.end(), ScatterBucket{t.device_mesh().spec(), partial->first, partial->second, t.dtype(), {}, {}, 0});
    it->members.push_back(i);
    it->splits.push_back(*split);
    it->bytes += t.shape().numel() * itemsize(t.dtype());
    if (it->bytes >= bucket_bytes) flush(*it, tensors, targets, out);
  }
  for (ScatterBucket& bucket : open) flush(bucket, tensors, targets, out);
  const std::vector<DTensor> reduced = reduce_partials(rest, bucket_bytes);
  for (size_t k = 0; k < rest.size(); ++k) {
    const size_t i = rest_index[k];
    out[i] = !reduced[k].defined() || reduced[k].layout() == targets[i]
                 ? reduced[k]
                 : reduced[k].redistribute(reduced[k].device_mesh(), targets[i]);
  }
  return out;
}

std::vector<DTensor> reduce_partials(const std::vector<DTensor>& tensors, int64_t bucket_bytes) {
  TESSERA_CHECK(bucket_bytes > 0, ValueError, "reduce_partials", "bucket_bytes ", bucket_bytes, " must be positive");
  std::vector<DTensor> out = tensors;
  std::vector<Bucket> open;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DTensor& t = tensors[i];
    if (!t.defined() || !t.layout().has_partial() || !t.device_mesh().is_member()) continue;
    std::vector<int64_t> dims;
    std::optional<ReduceOp> op;
    bool one_op = true;
    for (size_t d = 0; d < t.placements().size(); ++d)
      if (const auto* partial = std::get_if<Partial>(&t.placements()[d])) {
        dims.push_back(static_cast<int64_t>(d));
        one_op = one_op && (!op || *op == partial->op);
        op = partial->op;
      }
    if (!one_op) {  // the planner orders reductions of two ops
      Placements reduced = t.placements();
      for (int64_t d : dims) reduced[static_cast<size_t>(d)] = Replicate{};
      out[i] = t.redistribute(t.device_mesh(), reduced);
      continue;
    }
    auto it = std::find_if(open.begin(), open.end(), [&](const Bucket& b) {
      return b.mesh == t.device_mesh().spec() && b.dims == dims && b.op == *op && b.dtype == t.dtype();
    });
    if (it == open.end()) it = open.insert(open.end(), Bucket{t.device_mesh().spec(), dims, *op, t.dtype(), {}, 0});
    it->members.push_back(i);
    it->bytes += t.shape().numel() * itemsize(t.dtype());
    if (it->bytes >= bucket_bytes) flush(*it, tensors, out);
  }
  for (Bucket& bucket : open) flush(bucket, tensors, out);
  return out;
}

}  // namespace tessera
