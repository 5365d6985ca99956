// FSDP's unshard, bucketed: the parameters of one unit all-gathered in one flat collective
// (FSDP2's foreach_all_gather) instead of one each. Their gradients reach the leaves Partial and
// are reduce-scattered per unit while backward runs (reduce_partials with targets).
#include <algorithm>
#include <memory>
#include <optional>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/detail/deferred_gradients.hpp>
#include <tessera/dtensor/detail/row_split.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/grad/engine.hpp>

namespace tessera {

namespace {

// The one mesh dim where `to` is Replicate and `from` is not (row_split checks the rest).
std::optional<int64_t> unshard_dim(const Layout& from, const Layout& to) {
  std::optional<int64_t> dim;
  for (size_t d = 0; d < from.placements().size(); ++d) {
    if (from.placements()[d] == to.placements()[d]) continue;
    if (dim || !is_replicate(to.placements()[d])) return std::nullopt;
    dim = static_cast<int64_t>(d);
  }
  return dim;
}

struct Group {
  MeshSpec mesh;
  int64_t mesh_dim;
  DType dtype;
  std::vector<size_t> members;
  std::vector<detail::RowSplit> splits;
  // In flight: each member's rows at its offset in `send`, padded to the largest run; `recv`
  // gets every rank's `send` in rank order.
  Tensor send, recv;
  Work work;
};

void start(Group& group, const std::vector<DTensor>& tensors) {
  const DeviceMesh& mesh = tensors[group.members.front()].device_mesh();
  const int64_t ranks = mesh.spec().shape()[static_cast<size_t>(group.mesh_dim)];
  int64_t slot = 0;
  for (const detail::RowSplit& s : group.splits) slot += s.capacity;
  group.send = zeros({slot}, group.dtype);
  int64_t at = 0;
  for (size_t k = 0; k < group.members.size(); ++k) {
    const Tensor& local = tensors[group.members[k]].to_local();
    group.send.narrow(0, at, local.numel()).reshape(local.shape()).copy_(local);
    at += group.splits[k].capacity;
  }
  group.recv = empty({ranks * slot}, group.dtype);
  group.work = mesh.comm_ptr(group.mesh_dim)->all_gather_async(group.send.raw_data(), group.recv.raw_data(), slot,
                                                               group.dtype);
}

void finish(Group& group, const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
            std::vector<DTensor>& out) {
  group.work.wait();
  const DeviceMesh& mesh = tensors[group.members.front()].device_mesh();
  const int64_t ranks = mesh.spec().shape()[static_cast<size_t>(group.mesh_dim)];
  const int64_t slot = group.send.numel();
  int64_t at = 0;
  for (size_t k = 0; k < group.members.size(); ++k) {
    const size_t i = group.members[k];
    const detail::RowSplit& s = group.splits[k];
    Tensor full = empty(targets[i].local_shape(mesh.coordinate()), group.dtype);
    for (int64_t r = 0; r < ranks; ++r) {
      const auto ri = static_cast<size_t>(r);
      if (s.counts[ri] == 0) continue;
      Tensor rows = full.narrow(0, s.starts[ri], s.counts[ri]);
      rows.copy_(group.recv.narrow(0, r * slot + at, rows.numel()).reshape(rows.shape()));
    }
    out[i] = DTensor(std::move(full), mesh, targets[i]);
    at += s.capacity;
  }
  group.send = Tensor();
  group.recv = Tensor();
}

// One gradient node per gathered tensor. The nodes of one group share a token: backward runs them
// together, after every node created later (the unit's compute), and the first of them reduces
// the gradients deferred so far (the previous unit's), FSDP's per-unit reduce_scatter.
void record(const Group& group, const std::vector<DTensor>& tensors, std::vector<DTensor>& out) {
  auto token = std::make_shared<char>();
  for (size_t i : group.members) {
    const DTensor& input = tensors[i];
    if (!input.requires_grad()) continue;
    autograd::record<DTensor>("foreach_all_gather", out[i], {&input},
                              [token, leaf = input.is_leaf(), mesh = input.device_mesh(),
                               source = gradient_layout(input.layout())](const DTensor& g) {
                                detail::gradients_of_group_arriving(token.get());
                                // A leaf takes the Partial gradient as it is: it is reduce-scattered
                                // in the unit's bucket.
                                return std::vector<DTensor>{leaf ? g : g.redistribute(mesh, source)};
                              });
    // Runs even where no gradient reaches it, so every rank reduces its unit at the same point.
    out[i].autograd_meta()->grad_fn->zero_gradient = [mesh = out[i].device_mesh(), layout = out[i].layout()] {
      return std::any(DTensor(zeros(layout.local_shape(mesh.coordinate()), layout.dtype()), mesh, layout));
    };
  }
}

}  // namespace

struct PendingGather::State {
  std::vector<DTensor> tensors;
  std::vector<Layout> targets;
  std::vector<DTensor> out;  // the planner's moves done at once; the groups' filled by wait()
  std::vector<Group> groups;
  bool recording = false;  // autograd was on when the call was made
  bool done = false;
  ~State() {
    // The collectives were issued on every rank: let them land before their buffers go.
    for (Group& group : groups) try {
        group.work.wait();
      } catch (...) {
      }
  }
};

PendingGather foreach_all_gather_async(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets) {
  TESSERA_CHECK(tensors.size() == targets.size(), ValueError, "foreach_all_gather", tensors.size(),
                " tensors but ", targets.size(), " target layouts");
  auto state = std::make_shared<PendingGather::State>();
  state->tensors = tensors;
  state->targets = targets;
  state->out.resize(tensors.size());
  state->recording = autograd::is_grad_enabled();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DTensor& t = tensors[i];
    TESSERA_CHECK(t.defined() || !t.device_mesh().is_member(), ValueError, "foreach_all_gather", "tensor ", i,
                  " is undefined");
    const std::optional<int64_t> dim = unshard_dim(t.layout(), targets[i]);
    std::optional<detail::RowSplit> split;
    if (dim && t.device_mesh().is_member() && t.device_mesh().spec() == targets[i].mesh() &&
        t.dtype() == targets[i].dtype())
      split = detail::row_split(targets[i], t.layout(), *dim, t.device_mesh().coordinate());
    if (!split) {  // not an FSDP unshard: the planner moves it
      state->out[i] = t.redistribute(t.device_mesh(), targets[i]);
      continue;
    }
    auto it = std::find_if(state->groups.begin(), state->groups.end(), [&](const Group& g) {
      return g.mesh == t.device_mesh().spec() && g.mesh_dim == *dim && g.dtype == t.dtype();
    });
    if (it == state->groups.end())
      it = state->groups.insert(state->groups.end(), Group{t.device_mesh().spec(), *dim, t.dtype(), {}, {}, {}, {}, {}});
    it->members.push_back(i);
    it->splits.push_back(*split);
  }
  for (Group& group : state->groups) start(group, tensors);
  PendingGather pending;
  pending.state_ = std::move(state);
  return pending;
}

std::vector<DTensor> PendingGather::wait() const {
  TESSERA_CHECK(state_ != nullptr, ValueError, "PendingGather::wait", "the handle holds no foreach_all_gather_async");
  State& s = *state_;
  if (!s.done) {
    for (Group& group : s.groups) {
      {
        const autograd::NoGradGuard untracked;
        finish(group, s.tensors, s.targets, s.out);
      }
      if (s.recording) record(group, s.tensors, s.out);
    }
    s.done = true;
  }
  return s.out;
}

std::vector<DTensor> foreach_all_gather(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets) {
  return foreach_all_gather_async(tensors, targets).wait();
}

}  // namespace tessera
