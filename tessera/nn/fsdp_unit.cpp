#include <tessera/nn/detail/fsdp_unit.hpp>

#include <algorithm>
#include <atomic>

#include <tessera/core/grad_mode.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::nn::detail {

namespace {

// Per rank (its streams share it: a write on one invalidates what another gathered).
std::atomic<uint64_t>& generation() {
  if (!in_rank()) {
    thread_local std::atomic<uint64_t> outside{0};
    return outside;
  }
  return rank_local<std::atomic<uint64_t>>("tessera.nn.parameter_generation");
}

// The unit this thread gathered last, to learn each unit's successor in forward order.
struct LastGathered {
  std::weak_ptr<FsdpUnit> unit;
  uint64_t generation = 0;
  MeshSpec mesh;
};
thread_local LastGathered last_gathered;

}  // namespace

uint64_t parameter_generation() { return generation().load(std::memory_order_relaxed); }
void parameters_written() { generation().fetch_add(1, std::memory_order_relaxed); }

size_t FsdpUnit::add(DTensor* storage, Layout compute) {
  reshard();
  storage_.push_back(storage);
  compute_.push_back(std::move(compute));
  return storage_.size() - 1;
}

void FsdpUnit::reshard() {
  gathered_.clear();
  taken_.clear();
  prefetched_ = PendingGather();  // its collectives land first
}

std::vector<DTensor> FsdpUnit::storage_values() const {
  std::vector<DTensor> values;
  values.reserve(storage_.size());
  for (const DTensor* p : storage_) values.push_back(*p);
  return values;
}

void FsdpUnit::prefetch() {
  prefetched_ = foreach_all_gather_async(storage_values(), compute_);
  prefetched_generation_ = parameter_generation();
  prefetched_recorded_ = autograd::is_grad_enabled();
}

void FsdpUnit::gather() {
  const uint64_t now = parameter_generation();
  const bool recording = autograd::is_grad_enabled();
  PendingGather pending = std::move(prefetched_);
  prefetched_ = PendingGather();
  if (pending.valid() && prefetched_generation_ == now && (prefetched_recorded_ || !recording)) {
    gathered_ = pending.wait();
    recorded_ = prefetched_recorded_;
  } else {
    pending = PendingGather();  // stale: let it land, gather afresh
    gathered_ = foreach_all_gather(storage_values(), compute_);
    recorded_ = recording;
  }
  taken_.assign(storage_.size(), false);
  generation_ = now;

  // Learn the forward order, and start the next unit's all_gather now.
  const MeshSpec mesh = storage_.front()->device_mesh().spec();
  const std::shared_ptr<FsdpUnit> self = shared_from_this();
  if (auto last = last_gathered.unit.lock(); last && last != self && last_gathered.generation == now &&
                                             last_gathered.mesh == mesh)
    last->next_ = self;
  last_gathered = {self, now, mesh};
  if (auto next = next_.lock(); next && next != self && !next->prefetched_.valid() && next->gathered_.empty())
    next->prefetch();
}

DTensor FsdpUnit::take(size_t index) {
  const bool fresh = !gathered_.empty() && !taken_[index] && generation_ == parameter_generation() &&
                     (recorded_ || !autograd::is_grad_enabled());
  if (!fresh) gather();
  taken_[index] = true;
  DTensor out = gathered_[index];
  // Every value served: hold none between forwards (autograd keeps what backward needs).
  if (std::all_of(taken_.begin(), taken_.end(), [](bool t) { return t; })) {
    gathered_.clear();
    taken_.clear();
  }
  return out;
}

}  // namespace tessera::nn::detail
