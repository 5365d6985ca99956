#pragma once
// Storage: the bytes under one or more tensors. Carries its device so kernels can be chosen by
// it (cpu now, cuda later).
#include <cstdint>
#include <memory>
#include <string_view>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

/// Where a storage lives. Only cpu is implemented; cuda is the roadmap's seam.
enum class Device : uint8_t { cpu, cuda };
std::string_view name(Device device);

namespace detail {
struct MemoryAccount;
}

/// A block of bytes, 64-byte aligned. Non-copyable; shared through std::shared_ptr by tensors.
class Storage {
 public:
  /// Uninitialised bytes. Throws ValueError for a negative size or a device without a backend.
  static std::shared_ptr<Storage> allocate(int64_t nbytes, Device device = Device::cpu);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, int64_t nbytes, int64_t capacity, Device device, detail::MemoryAccount* owner)
      : data_(data), nbytes_(nbytes), capacity_(capacity), device_(device), owner_(owner) {}
  void* data_;
  int64_t nbytes_;
  int64_t capacity_;  // bytes actually allocated (a size class for cached blocks)
  Device device_;
  detail::MemoryAccount* owner_;  // the allocating thread's account (memory_stats); never freed
};

/// The tensor memory of the calling thread (a rank: every storage it allocated and that is still
/// alive, wherever it is freed), as torch.cuda.memory_allocated / max_memory_allocated give per
/// device. Bytes are what was allocated (size classes included).
struct MemoryStats {
  int64_t allocated_bytes = 0;       // alive now
  int64_t peak_allocated_bytes = 0;  // the most alive at once since the thread's first allocation or the last reset
};
MemoryStats memory_stats();
/// Starts the calling thread's peak over from what is alive now.
void reset_peak_memory_stats();

/// Frees the blocks the allocator keeps for reuse. Large blocks (>= 64 KiB) are cached after
/// free, up to 1 GiB in all (TESSERA_ALLOCATOR_CACHE_MB overrides; 0 disables), because a fresh
/// block costs a page fault per page on first touch.
void empty_cache();
/// Bytes currently held in the allocator's cache.
int64_t cached_bytes();

}  // namespace tessera
