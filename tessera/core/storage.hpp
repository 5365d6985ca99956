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
  Storage(void* data, int64_t nbytes, int64_t capacity, Device device)
      : data_(data), nbytes_(nbytes), capacity_(capacity), device_(device) {}
  void* data_;
  int64_t nbytes_;
  int64_t capacity_;  // bytes actually allocated (a size class for cached blocks)
  Device device_;
};

/// Frees the blocks the allocator keeps for reuse. Large blocks (>= 64 KiB) are cached after
/// free, up to 1 GiB in all (TESSERA_ALLOCATOR_CACHE_MB overrides; 0 disables), because a fresh
/// block costs a page fault per page on first touch.
void empty_cache();
/// Bytes currently held in the allocator's cache.
int64_t cached_bytes();

}  // namespace tessera
