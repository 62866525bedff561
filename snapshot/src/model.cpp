#include "cachealloc/snapshot/model.hpp"

#include <array>
#include <string_view>

namespace cachealloc::snapshot {
namespace {
constexpr std::array<std::string_view, kEventKindCount> kEventKindNames = {
    "alloc",         "free_requested",  "free_completed", "split",       "merge",
    "segment_alloc", "segment_release", "segment_map",    "segment_unmap", "empty_cache",
    "oom",           "annotation_begin", "annotation_end", "snapshot"};
}  // namespace

const char* to_string(EventKind kind) noexcept {
  const auto index = static_cast<std::size_t>(kind);
  return index < kEventKindNames.size() ? kEventKindNames[index].data() : "unknown";
}

bool parse_event_kind(const std::string& name, EventKind& out) noexcept {
  for (std::size_t i = 0; i < kEventKindNames.size(); ++i) {
    if (kEventKindNames[i] == name) {
      out = static_cast<EventKind>(i);
      return true;
    }
  }
  return false;
}

const char* to_string(BlockState state) noexcept {
  switch (state) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
    case BlockState::unmapped: return "unmapped";
  }
  return "unknown";
}

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
