// Partial DTensors reduced in buckets (DDP's gradient buckets): one flat all_reduce per group of
// tensors that reduce over the same communicator, instead of one collective per tensor. With
// targets that shard the reduced rows (FSDP's gradients), one flat reduce_scatter per group. The
// async form leaves the buckets' collectives in flight (DDP's overlap with backward).
#include <algorithm>
#include <optional>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/row_split.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera {

namespace {

// Tensors reduced over one group (mesh, Partial dims, op) in one dtype: every rank of that group
// holds blocks of the same shapes, so their concatenations line up. A scatter bucket (one Partial
// dim, targets split rows over it) packs each rank's runs of rows rank by rank and reduce-scatters.
struct Bucket {
  MeshSpec mesh;
  std::vector<int64_t> dims;
  ReduceOp op = ReduceOp::sum;
  DType dtype = DType::f32;
  bool scatter = false;
  std::vector<size_t> members;           // indices into the tensors
  std::vector<detail::RowSplit> splits;  // scatter: per member
  int64_t bytes = 0;                     // global bytes of the members (the same on every rank)
  Tensor send, recv;                     // in flight
  Work work;
};

// In flight when `async`; else done on return (no hand-over to the async queue).
void start(Bucket& bucket, const std::vector<DTensor>& tensors, bool async) {
  const DeviceMesh& mesh = tensors[bucket.members.front()].device_mesh();
  if (!bucket.scatter) {
    int64_t total = 0;
    for (size_t i : bucket.members) total += tensors[i].to_local().numel();
    bucket.send = empty({total}, bucket.dtype);
    int64_t at = 0;
    for (size_t i : bucket.members) {
      const Tensor& local = tensors[i].to_local();
      bucket.send.narrow(0, at, local.numel()).reshape(local.shape()).copy_(local);
      at += local.numel();
    }
    Communicator& comm = *mesh.comm_ptr(bucket.dims);
    if (async) bucket.work = comm.all_reduce_async(bucket.send.raw_data(), total, bucket.dtype, bucket.op);
    else comm.all_reduce(bucket.send.raw_data(), total, bucket.dtype, bucket.op);
    return;
  }
  const int64_t m = bucket.dims.front();
  const int64_t ranks = mesh.spec().shape()[static_cast<size_t>(m)];
  int64_t slot = 0;
  for (const detail::RowSplit& s : bucket.splits) slot += s.capacity;
  bucket.send = zeros({ranks * slot}, bucket.dtype);
  int64_t at = 0;
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const Tensor& local = tensors[bucket.members[k]].to_local();
    const detail::RowSplit& s = bucket.splits[k];
    for (int64_t r = 0; r < ranks; ++r) {
      const auto ri = static_cast<size_t>(r);
      if (s.counts[ri] == 0) continue;
      const Tensor rows = local.narrow(0, s.starts[ri], s.counts[ri]);
      bucket.send.narrow(0, r * slot + at, rows.numel()).reshape(rows.shape()).copy_(rows);
    }
    at += s.capacity;
  }
  bucket.recv = empty({slot}, bucket.dtype);
  Communicator& comm = *mesh.comm_ptr(m);
  if (async)
    bucket.work = comm.reduce_scatter_async(bucket.send.raw_data(), bucket.recv.raw_data(), slot, bucket.dtype, bucket.op);
  else
    comm.reduce_scatter(bucket.send.raw_data(), bucket.recv.raw_data(), slot, bucket.dtype, bucket.op);
}

// Each member's result is a view of the bucket's buffer, in its target layout.
void finish(Bucket& bucket, const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
            std::vector<DTensor>& out) {
  bucket.work.wait();
  const DeviceMesh& mesh = tensors[bucket.members.front()].device_mesh();
  int64_t at = 0;
  for (size_t k = 0; k < bucket.members.size(); ++k) {
    const size_t i = bucket.members[k];
    if (bucket.scatter) {
      const Shape shape = targets[i].local_shape(mesh.coordinate());
      out[i] = DTensor(bucket.recv.narrow(0, at, shape.numel()).reshape(shape), mesh, targets[i]);
      at += bucket.splits[k].capacity;
      continue;
    }
    Placements reduced = tensors[i].placements();
    for (int64_t d : bucket.dims) reduced[static_cast<size_t>(d)] = Replicate{};
    const Shape shape = tensors[i].to_local().shape();
    DTensor value(bucket.send.narrow(0, at, shape.numel()).reshape(shape), mesh,
                  tensors[i].layout().with_placements(reduced));
    out[i] = value.layout() == targets[i] ? value : value.redistribute(mesh, targets[i]);
    at += shape.numel();
  }
  bucket.send = Tensor();
  bucket.recv = Tensor();
}

// The mesh dims a tensor is Partial on and their op; nullopt when two ops mix.
std::optional<std::pair<std::vector<int64_t>, ReduceOp>> partial_dims(const Layout& layout) {
  std::vector<int64_t> dims;
  std::optional<ReduceOp> op;
  for (size_t d = 0; d < layout.placements().size(); ++d)
    if (const auto* partial = std::get_if<Partial>(&layout.placements()[d])) {
      if (op && *op != partial->op) return std::nullopt;
      dims.push_back(static_cast<int64_t>(d));
      op = partial->op;
    }
  if (!op) return std::nullopt;
  return std::pair{std::move(dims), *op};
}

}  // namespace

struct PendingReduction::State {
  std::vector<DTensor> tensors;
  std::vector<Layout> targets;
  std::vector<DTensor> out;  // what needed no bucket is filled at the call; the buckets' by wait()
  std::vector<Bucket> buckets;
  bool done = false;
  ~State() {
    // The collectives were issued on every rank: let them land before their buffers go.
    for (Bucket& bucket : buckets) try {
        bucket.work.wait();
      } catch (...) {
      }
  }
};

namespace {

std::shared_ptr<PendingReduction::State> reduce(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
                                               int64_t bucket_bytes, bool async) {
  TESSERA_CHECK(tensors.size() == targets.size(), ValueError, "reduce_partials", tensors.size(), " tensors but ",
                targets.size(), " target layouts");
  TESSERA_CHECK(bucket_bytes > 0, ValueError, "reduce_partials", "bucket_bytes ", bucket_bytes, " must be positive");
  auto state = std::make_shared<PendingReduction::State>();
  state->tensors = tensors;
  state->targets = targets;
  state->out.resize(tensors.size());
  std::vector<size_t> open;  // indices into state->buckets still filling
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DTensor& t = tensors[i];
    const auto partial = t.defined() ? partial_dims(t.layout()) : std::nullopt;
    if (!partial || !t.device_mesh().is_member()) {
      // Nothing to reduce here, two reduce ops (the planner orders them), or not this rank's mesh.
      state->out[i] = !t.defined() || t.layout() == targets[i] ? t : t.redistribute(t.device_mesh(), targets[i]);
      continue;
    }
    std::optional<detail::RowSplit> split;
    if (partial->first.size() == 1 && t.device_mesh().spec() == targets[i].mesh() && t.dtype() == targets[i].dtype())
      split = detail::row_split(t.layout(), targets[i], partial->first.front(), t.device_mesh().coordinate());
    const bool scatter = split.has_value();
    auto it = std::find_if(open.begin(), open.end(), [&](size_t b) {
      const Bucket& bucket = state->buckets[b];
      return bucket.mesh == t.device_mesh().spec() && bucket.dims == partial->first && bucket.op == partial->second &&
             bucket.dtype == t.dtype() && bucket.scatter == scatter;
    });
    if (it == open.end()) {
      Bucket& fresh = state->buckets.emplace_back();
      fresh.mesh = t.device_mesh().spec();
      fresh.dims = partial->first;
      fresh.op = partial->second;
      fresh.dtype = t.dtype();
      fresh.scatter = scatter;
      it = open.insert(open.end(), state->buckets.size() - 1);
    }
    Bucket& bucket = state->buckets[*it];
    bucket.members.push_back(i);
    if (scatter) bucket.splits.push_back(*split);
    bucket.bytes += t.shape().numel() * itemsize(t.dtype());
    if (bucket.bytes >= bucket_bytes) {
      start(bucket, tensors, async);
      open.erase(it);
    }
  }
  for (size_t b : open) start(state->buckets[b], tensors, async);
  return state;
}

const std::vector<DTensor>& finish_all(PendingReduction::State& s);

}  // namespace

PendingReduction reduce_partials_async(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
                                       int64_t bucket_bytes) {
  PendingReduction pending;
  pending.state_ = reduce(tensors, targets, bucket_bytes, true);
  return pending;
}

namespace {
const std::vector<DTensor>& finish_all(PendingReduction::State& s) {
  if (!s.done) {
    for (Bucket& bucket : s.buckets) finish(bucket, s.tensors, s.targets, s.out);
    s.done = true;
  }
  return s.out;
}
}  // namespace

std::vector<DTensor> PendingReduction::wait() const {
  TESSERA_CHECK(state_ != nullptr, ValueError, "PendingReduction::wait", "the handle holds no reduce_partials_async");
  return finish_all(*state_);
}

std::vector<DTensor> reduce_partials(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
                                     int64_t bucket_bytes) {
  return finish_all(*reduce(tensors, targets, bucket_bytes, false));
}

std::vector<DTensor> reduce_partials(const std::vector<DTensor>& tensors, int64_t bucket_bytes) {
  std::vector<Layout> targets;
  targets.reserve(tensors.size());
  for (const DTensor& t : tensors) targets.push_back(t.defined() ? gradient_layout(t.layout()) : Layout());
  return reduce_partials(tensors, targets, bucket_bytes);
}

}  // namespace tessera
