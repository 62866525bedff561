// PyTorch's names of trace-entry keys and actions, both ways.
#include <array>

#include "trace_schema.hpp"

namespace cachealloc::snapshot::pickle {

int trace_key_of(std::string_view key) noexcept {
  switch (key.size()) {
    case 4:
      if (key == "addr") return static_cast<int>(TraceField::addr);
      if (key == "size") return static_cast<int>(TraceField::size);
      return kNotATraceKey;
    case 6:
      if (key == "action") return kActionKey;
      if (key == "stream") return static_cast<int>(TraceField::stream);
      if (key == "frames") return static_cast<int>(TraceField::frames);
      return kNotATraceKey;
    case 7: return key == "time_us" ? static_cast<int>(TraceField::time_us) : kNotATraceKey;
    case 11: return key == "device_free" ? static_cast<int>(TraceField::device_free) : kNotATraceKey;
    case 13: return key == "user_metadata" ? static_cast<int>(TraceField::user_metadata) : kNotATraceKey;
    case 15: return key == "compile_context" ? static_cast<int>(TraceField::compile_context) : kNotATraceKey;
    default: return kNotATraceKey;
  }
}

constexpr std::array<EventKind, 9> kTraceActions = {
    EventKind::alloc,          EventKind::free_requested, EventKind::free_completed,
    EventKind::segment_alloc,  EventKind::segment_release, EventKind::segment_map,
    EventKind::segment_unmap,  EventKind::snapshot,       EventKind::oom};

std::optional<EventKind> trace_action_of(std::string_view name) noexcept {
  for (const EventKind kind : kTraceActions) {
    if (trace_action_name(kind) == name) return kind;
  }
  return std::nullopt;
}

std::string_view trace_key(TraceField field) noexcept {
  switch (field) {
    case TraceField::addr: return "addr";
    case TraceField::size: return "size";
    case TraceField::stream: return "stream";
    case TraceField::time_us: return "time_us";
    case TraceField::device_free: return "device_free";
    case TraceField::frames: return "frames";
    case TraceField::compile_context: return "compile_context";
    case TraceField::user_metadata: return "user_metadata";
  }
  return "";
}

std::string_view trace_action_name(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::alloc: return "alloc";
    case EventKind::free_requested: return "free_requested";
    case EventKind::free_completed: return "free_completed";
    case EventKind::segment_alloc: return "segment_alloc";
    case EventKind::segment_release: return "segment_free";
    case EventKind::segment_map: return "segment_map";
    case EventKind::segment_unmap: return "segment_unmap";
    case EventKind::snapshot: return "snapshot";
    case EventKind::oom: return "oom";
    default: return "";
  }
}

}  // namespace cachealloc::snapshot::pickle
