// Built instead of cuda_device.cpp when the CUDA toolkit was not found.
#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"

namespace cachealloc {
bool cuda_backend_built() noexcept { return false; }
int cuda_device_count() noexcept { return 0; }
int cuda_current_device() noexcept { return 0; }
std::shared_ptr<Device> make_cuda_device(int) {
  throw DeviceError("no CUDA device: this build of cachealloc has no cuda backend (CUDA toolkit not found at build time)");
}
std::shared_ptr<void> hold_cuda_memory(int, std::size_t) {
  throw DeviceError("no CUDA device: this build of cachealloc has no cuda backend (CUDA toolkit not found at build time)");
}
}  // namespace cachealloc
