#include <tessera/core/storage.hpp>

#include <new>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {
constexpr std::align_val_t kAlignment{64};  // a cache line: aligned vector loads, no false sharing
}

std::string_view name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  TESSERA_CHECK(nbytes >= 0, ValueError, "allocate", "negative size ", nbytes, " bytes");
  TESSERA_CHECK(device == Device::cpu, ValueError, "allocate", "device ", name(device),
                " has no backend in this build; expected cpu");
  void* data = ::operator new(static_cast<size_t>(nbytes > 0 ? nbytes : 1), kAlignment);
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device));
}

Storage::~Storage() { ::operator delete(data_, kAlignment); }

}  // namespace tessera
