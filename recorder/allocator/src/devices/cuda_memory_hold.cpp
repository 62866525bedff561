// hold_cuda_memory: physical device memory with no address behind it, so a
// test can put a real memory limit on cudaMalloc without touching the
// address space that the driver address model describes.
#include <cuda.h>  // driver API types only; the functions come from cudaGetDriverEntryPointByVersion
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"

namespace cachealloc {
namespace {

template <typename F>
F driver_entry_point(const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || !address) {
    (void)cudaGetLastError();
    throw DeviceError(std::string("hold_cuda_memory: driver entry point ") + symbol + " not found");
  }
  return reinterpret_cast<F>(address);
}

using MemCreate = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
using MemRelease = CUresult (*)(CUmemGenericAllocationHandle);
using Granularity = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);

struct Held {
  MemRelease release = nullptr;
  std::vector<CUmemGenericAllocationHandle> handles;
  ~Held() {
    for (auto handle : handles) (void)release(handle);
  }
};

}  // namespace

std::shared_ptr<void> hold_cuda_memory(int index, std::size_t bytes) {
  int previous = 0;
  // cudaFree(nullptr) makes the device's primary context current, as cudaMalloc would.
  const bool ok = cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(index) == cudaSuccess && cudaFree(nullptr) == cudaSuccess;
  if (!ok) {
    (void)cudaGetLastError();
    throw DeviceError("hold_cuda_memory: no CUDA device " + std::to_string(index));
  }
  struct Restore {
    int device;
    ~Restore() { (void)cudaSetDevice(device); }
  } restore{previous};
  const auto create = driver_entry_point<MemCreate>("cuMemCreate");
  const auto granularity_of = driver_entry_point<Granularity>("cuMemGetAllocationGranularity");
  auto held = std::make_shared<Held>();
  held->release = driver_entry_point<MemRelease>("cuMemRelease");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = index;
  std::size_t granularity = 0;
  if (granularity_of(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || granularity == 0)
    throw DeviceError("hold_cuda_memory: cuMemGetAllocationGranularity failed");
  // Handles of at most 1 GiB, so that one odd-sized remainder is the only
  // rounding: bytes is rounded down to the granularity.
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  for (std::size_t left = bytes / granularity * granularity; left > 0;) {
    const std::size_t piece = std::min(left, kPiece);
    CUmemGenericAllocationHandle handle = 0;
    if (create(&handle, piece, &prop, 0) != CUDA_SUCCESS)
      throw DeviceError("hold_cuda_memory: cuMemCreate of " + std::to_string(piece) + " bytes failed");
    held->handles.push_back(handle);
    left -= piece;
  }
  return held;
}

}  // namespace cachealloc
