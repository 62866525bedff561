// PyTorch's trace schema: the keys and actions of a device_traces entry, and
// how a TraceEntry (pickle_value.hpp) packs its fields into an Event.
// Private to the snapshot library.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot::pickle {

// The fields of a TraceEntry, packed into an Event of Tree::traces:
//   kind = the action; time_ns = time_us; address = addr; size; stream;
//   aux = device_free; thread = the 'frames' container; device = the state
//   of each field (FieldState, 3 bits each, at 3 * TraceField); stack = the
//   dict's own ContainerId.
enum class TraceField : std::uint8_t { addr, size, stream, time_us, device_free, frames, compile_context, user_metadata };
inline constexpr int kTraceFieldCount = 8;
enum class FieldState : std::uint8_t { absent, none, boolean, integer, negative, too_big, container };

std::string_view trace_key(TraceField field) noexcept;
// PyTorch's name of an action, e.g. "segment_free" for segment_release.
std::string_view trace_action_name(EventKind kind) noexcept;

inline FieldState field_state(const Event& entry, TraceField field) noexcept {
  return static_cast<FieldState>((static_cast<std::uint32_t>(entry.device) >> (3 * static_cast<int>(field))) & 7u);
}

// PyTorch's trace-entry keys: a TraceField, kActionKey or kNotATraceKey.
inline constexpr int kActionKey = -1;
inline constexpr int kNotATraceKey = -2;
int trace_key_of(std::string_view key) noexcept;
std::optional<EventKind> trace_action_of(std::string_view name) noexcept;

// Where an integer field of a TraceEntry lives in its Event.
inline std::uint64_t& trace_slot(Event& entry, TraceField field) noexcept {
  switch (field) {
    case TraceField::addr: return entry.address;
    case TraceField::size: return entry.size;
    case TraceField::stream: return entry.stream;
    case TraceField::time_us: return entry.time_ns;
    default: return entry.aux;  // device_free
  }
}
inline void set_field_state(Event& entry, TraceField field, FieldState state) noexcept {
  const int shift = 3 * static_cast<int>(field);
  auto bits = static_cast<std::uint32_t>(entry.device);
  bits = (bits & ~(7u << shift)) | (static_cast<std::uint32_t>(state) << shift);
  entry.device = static_cast<std::int32_t>(bits);
}
inline std::uint64_t trace_slot(const Event& entry, TraceField field) noexcept {
  return trace_slot(const_cast<Event&>(entry), field);
}

}  // namespace cachealloc::snapshot::pickle
