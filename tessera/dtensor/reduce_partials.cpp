// Partial DTensors reduced in buckets (DDP's gradient buckets): one flat all_reduce per group of
// tensors that reduce over the same communicator, instead of one collective per tensor.
#include <algorithm>
#include <optional>

#include <tessera/core/error.hpp>
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

}  // namespace

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
