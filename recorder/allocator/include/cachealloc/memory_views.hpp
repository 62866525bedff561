// The three views of GPU memory at one moment, from the allocator outwards:
// what the framework holds (allocated, reserved), what this process holds
// on the device and what the whole device holds (NVML, as nvidia-smi shows
// them), and what the driver says is free (cudaMemGetInfo). Each step's
// remainder is named, so "why does nvidia-smi show more than
// memory_reserved()?" has an answer in bytes.
//
// Thread safety: memory_views() reads the allocator's stats and the device
// as any other thread may; figures read a moment apart may drift by the
// allocations made in between.
#pragma once

#include <cstdint>
#include <optional>

#include "cachealloc/allocator.hpp"

namespace cachealloc {

struct MemoryViews {
  std::uint64_t allocated = 0;        // torch.cuda.memory_allocated()
  std::uint64_t reserved = 0;         // torch.cuda.memory_reserved()
  DeviceUsage usage;                  // nvidia-smi's figures (NVML), or why there are none
  std::optional<MemoryInfo> driver;   // torch.cuda.mem_get_info() (cudaMemGetInfo), when it answered

  // reserved - allocated: cached in the allocator (pending frees and cached free blocks).
  std::uint64_t cached() const noexcept { return reserved - allocated; }
  // this process on the device - reserved: the CUDA context and other
  // allocators in this process. Unknown without NVML's figure for this
  // process, or when NVML reports less than reserved.
  std::optional<std::uint64_t> outside_allocator() const noexcept;
  // device used - this process: other processes and memory no process holds.
  std::optional<std::uint64_t> outside_process() const noexcept;
  // device total - used - the driver's reservation.
  std::optional<std::uint64_t> device_free() const noexcept;
};

// Reads the allocator's figures, then NVML and the driver. Never throws
// for a device that cannot report: the figure is left unknown instead.
MemoryViews memory_views(CachingAllocator& allocator);

}  // namespace cachealloc
