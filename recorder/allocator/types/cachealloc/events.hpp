// The allocator's event vocabulary: what kinds of event the allocator reports
// to its observer (allocator.hpp), and the flags of a new segment.
//
// The history records these kinds and the snapshot format stores them, so the
// numeric values are part of the on-disk format: append only, never renumber.
// Header-only, so that the snapshot library shares the vocabulary without
// linking the allocator.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cachealloc::events {

enum class EventKind : std::uint8_t {
  alloc = 0,           // address, size = block size, aux = requested bytes
  free_requested = 1,  // address, size = block size, aux = requested bytes
  free_completed = 2,  // address, size = block size, aux = requested bytes (may follow
                       // free_requested later, when the free waited for stream events)
  split = 3,           // address = block start, size = the front part handed out,
                       // aux = the remainder, which starts at address + size
  merge = 4,           // address = merged block start, size = merged size,
                       // aux = bytes absorbed from the neighbour
  segment_alloc = 5,   // address, size = segment size, aux = SegmentFlags
  segment_release = 6, // address, size = segment size
  segment_map = 7,     // expandable segments: address, size of the range mapped
  segment_unmap = 8,   // expandable segments: address, size of the range unmapped
  empty_cache = 9,     // size = bytes released to the device by this call
  oom = 10,            // size = requested bytes, address = device free bytes,
                       // aux = allocator cap in bytes (0 = no cap)
  annotation_begin = 11, // aux = StringId of the annotation's name
  annotation_end = 12,   // aux = StringId of the annotation's name
  snapshot = 13,         // PyTorch only: a snapshot was taken here
  category = 14,         // what a live allocation is, learned after it was made:
                         // address = the allocation's start, aux = AllocationCategory,
                         // size = 0
};
inline constexpr int kEventKindCount = 15;

// What an allocation holds, as the program that made it knows (a category
// event) or as the analyzer infers it. The codes are stored on disk (aux of
// a category event): append only, never renumber.
enum class AllocationCategory : std::uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,  // saved for backward
  temporary,
  workspace,  // cuBLAS, cuDNN, NCCL
  cuda_graph_pool,
  other,
};
inline constexpr std::size_t kAllocationCategoryCount = 8;

enum SegmentFlags : std::uint64_t {
  segment_flag_large_pool = 1u << 0,
  segment_flag_expandable = 1u << 1,
};

namespace detail {
inline constexpr std::array<std::string_view, kEventKindCount> kEventKindNames = {
    "alloc",         "free_requested",  "free_completed", "split",       "merge",
    "segment_alloc", "segment_release", "segment_map",    "segment_unmap", "empty_cache",
    "oom",           "annotation_begin", "annotation_end", "snapshot",      "category"};
inline constexpr std::array<std::string_view, kAllocationCategoryCount> kAllocationCategoryNames = {
    "parameter", "gradient", "optimizer_state", "activation", "temporary", "workspace", "cuda_graph_pool", "other"};
}  // namespace detail

// The kind's name as tables, JSON and --kind spell it; "unknown" past the last.
inline const char* to_string(EventKind kind) noexcept {
  const auto index = static_cast<std::size_t>(kind);
  return index < detail::kEventKindNames.size() ? detail::kEventKindNames[index].data() : "unknown";
}

// Returns false when `name` names no kind. PyTorch's trace calls a
// segment_release "segment_free"; that name is taken too.
inline bool parse_event_kind(const std::string& name, EventKind& out) noexcept {
  if (name == "segment_free") {
    out = EventKind::segment_release;
    return true;
  }
  for (std::size_t i = 0; i < detail::kEventKindNames.size(); ++i) {
    if (detail::kEventKindNames[i] == name) {
      out = static_cast<EventKind>(i);
      return true;
    }
  }
  return false;
}

// The category's name as JSON keys and the C ABI spell it ("optimizer_state");
// "unknown" past the last.
inline const char* to_string(AllocationCategory category) noexcept {
  const auto index = static_cast<std::size_t>(category);
  return index < detail::kAllocationCategoryNames.size() ? detail::kAllocationCategoryNames[index].data() : "unknown";
}

// Returns false when `name` is no category's name (exactly as to_string spells it).
inline bool parse_allocation_category(std::string_view name, AllocationCategory& out) noexcept {
  for (std::size_t i = 0; i < detail::kAllocationCategoryNames.size(); ++i) {
    if (detail::kAllocationCategoryNames[i] == name) {
      out = static_cast<AllocationCategory>(i);
      return true;
    }
  }
  return false;
}

}  // namespace cachealloc::events
