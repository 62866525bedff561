#include "cachealloc/memory_views.hpp"

namespace cachealloc {

std::optional<std::uint64_t> MemoryViews::outside_allocator() const noexcept {
  if (usage.source == DeviceUsage::Source::unavailable || !usage.process_found || usage.process_used < reserved)
    return std::nullopt;
  return usage.process_used - reserved;
}

std::optional<std::uint64_t> MemoryViews::outside_process() const noexcept {
  if (usage.source == DeviceUsage::Source::unavailable || !usage.process_found || usage.device_used < usage.process_used)
    return std::nullopt;
  return usage.device_used - usage.process_used;
}

std::optional<std::uint64_t> MemoryViews::device_free() const noexcept {
  if (usage.source == DeviceUsage::Source::unavailable || usage.device_used + usage.device_reserved > usage.device_total)
    return std::nullopt;
  return usage.device_total - usage.device_used - usage.device_reserved;
}

MemoryViews memory_views(CachingAllocator& allocator) {
  MemoryViews views;
  views.allocated = allocator.memory_allocated();
  views.reserved = allocator.memory_reserved();
  Device& device = allocator.device();
  views.usage = device.usage();
  try {
    views.driver = device.memory_info();
  } catch (const std::exception&) {
  }
  return views;
}

}  // namespace cachealloc
