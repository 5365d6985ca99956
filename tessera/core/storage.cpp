#include <tessera/core/storage.hpp>

#include <atomic>
#include <bit>
#include <memory>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {

constexpr std::align_val_t kAlignment{64};  // a cache line: aligned vector loads, no false sharing

// Large blocks are cached after free and reused: a fresh block from the OS costs a page fault
// per 4 KiB on first touch, which otherwise dominates memory-bound ops on big tensors (an add
// of 16M floats spent 3x longer faulting than computing). Small blocks go to the system
// allocator, which already recycles them well.
constexpr int64_t kCacheMinBytes = 64 * 1024;

// Rounds up to one of 8 size classes per power of two (at most 12.5% slack).
int64_t size_class(int64_t nbytes) {
  const auto n = static_cast<uint64_t>(nbytes);
  const int top = 63 - std::countl_zero(n);
  const uint64_t step = uint64_t{1} << std::max(top - 3, 0);
  return static_cast<int64_t>((n + step - 1) / step * step);
}

class BlockCache {
 public:
  BlockCache() {
    if (const char* env = std::getenv("TESSERA_ALLOCATOR_CACHE_MB")) limit_ = std::atoll(env) * (int64_t{1} << 20);
#ifdef TESSERA_SANITIZED
    limit_ = 0;  // let the sanitizers see every free
#endif
  }
  // A cached block of exactly `bytes` (a size class), or nullptr.
  void* take(int64_t bytes) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* block = it->second.back();
    it->second.pop_back();
    cached_ -= bytes;
    return block;
  }
  // Keeps the block if there is room, else frees it.
  void give(void* block, int64_t bytes) {
    {
      std::lock_guard lock(mutex_);
      if (cached_ + bytes <= limit_) {
        free_[bytes].push_back(block);
        cached_ += bytes;
        return;
      }
    }
    ::operator delete(block, kAlignment);
  }
  void clear() {
    std::lock_guard lock(mutex_);
    for (auto& [bytes, blocks] : free_)
      for (void* block : blocks) ::operator delete(block, kAlignment);
    free_.clear();
    cached_ = 0;
  }
  int64_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, std::vector<void*>> free_;
  int64_t cached_ = 0;
  int64_t limit_ = int64_t{1} << 30;  // 1 GiB unless TESSERA_ALLOCATOR_CACHE_MB says otherwise
};

// Never destroyed: storages held by static objects may be freed after other statics die.
BlockCache& cache() {
  static auto* instance = new BlockCache();
  return *instance;
}

}  // namespace

// A thread's account: its thread adds and raises the peak; any thread may subtract. A raw pointer
// in each storage and a cache line per account: holding a shared_ptr per storage instead (its
// count touched on every allocation and free) made a 4-rank training step a third slower.
struct alignas(64) detail::MemoryAccount {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
};

namespace {
// Accounts outlive their threads (a storage may outlive the thread that allocated it), so they are
// kept, reachable, for the life of the process: one cache line per thread ever started.
detail::MemoryAccount* new_account() {
  static std::mutex mutex;
  static auto* accounts = new std::vector<std::unique_ptr<detail::MemoryAccount>>();
  std::lock_guard lock(mutex);
  accounts->push_back(std::make_unique<detail::MemoryAccount>());
  return accounts->back().get();
}

detail::MemoryAccount* this_thread_account() {
  thread_local detail::MemoryAccount* const account = new_account();
  return account;
}
}  // namespace

std::string_view name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  TESSERA_CHECK(nbytes >= 0, ValueError, "allocate", "negative size ", nbytes, " bytes");
  TESSERA_CHECK(device == Device::cpu, ValueError, "allocate", "device ", name(device),
                " has no backend in this build; expected cpu");
  const int64_t capacity = nbytes >= kCacheMinBytes ? size_class(nbytes) : std::max<int64_t>(nbytes, 1);
  void* data = capacity >= kCacheMinBytes ? cache().take(capacity) : nullptr;
  if (!data) data = ::operator new(static_cast<size_t>(capacity), kAlignment);
  detail::MemoryAccount* owner = this_thread_account();
  const int64_t live = owner->live.fetch_add(capacity, std::memory_order_relaxed) + capacity;
  if (live > owner->peak.load(std::memory_order_relaxed)) owner->peak.store(live, std::memory_order_relaxed);
  return std::shared_ptr<Storage>(new Storage(data, nbytes, capacity, device, owner));
}

Storage::~Storage() {
  owner_->live.fetch_sub(capacity_, std::memory_order_relaxed);
  if (capacity_ >= kCacheMinBytes) cache().give(data_, capacity_);
  else ::operator delete(data_, kAlignment);
}

MemoryStats memory_stats() {
  const detail::MemoryAccount& owner = *this_thread_account();
  return {owner.live.load(std::memory_order_relaxed), owner.peak.load(std::memory_order_relaxed)};
}

void reset_peak_memory_stats() {
  detail::MemoryAccount& owner = *this_thread_account();
  owner.peak.store(owner.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void empty_cache() { cache().clear(); }
int64_t cached_bytes() { return cache().cached_bytes(); }

}  // namespace tessera
