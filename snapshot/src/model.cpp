#include "cachealloc/snapshot/model.hpp"

#include <array>
#include <string_view>

namespace cachealloc::snapshot {
const char* to_string(UsageSource source) noexcept {
  switch (source) {
    case UsageSource::not_recorded: return "not_recorded";
    case UsageSource::nvml: return "nvml";
    case UsageSource::simulated: return "simulated";
    case UsageSource::unavailable: return "unavailable";
  }
  return "unknown";
}

}  // namespace cachealloc::snapshot
