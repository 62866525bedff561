// Reading the value tree: a container's items and a dict's keys, whatever
// shape (pickle_value.hpp) the unpickler stored it in.
#include "pickle_value.hpp"

namespace cachealloc::snapshot::pickle {

const char* to_string(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::text: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
  }
  return "?";
}

namespace {
Value text_value(std::string_view text) noexcept {
  Value value;
  value.kind = Kind::text;
  value.length = static_cast<std::uint32_t>(text.size());
  value.text = text.data();
  return value;
}
}  // namespace

std::optional<Value> Tree::trace_value(const Event& entry, TraceField field) const noexcept {
  Value value;
  switch (field_state(entry, field)) {
    case FieldState::absent: return std::nullopt;
    case FieldState::none: return value;
    case FieldState::container:
      value.kind = container(entry.thread).kind;
      value.length = entry.thread;
      return value;
    case FieldState::boolean:
      value.kind = Kind::boolean;
      value.magnitude = trace_slot(entry, field);
      value.flag = value.magnitude != 0;
      return value;
    case FieldState::integer:
    case FieldState::negative:
    case FieldState::too_big:
      value.kind = Kind::integer;
      value.magnitude = trace_slot(entry, field);
      value.flag = field_state(entry, field) == FieldState::negative;
      value.too_big = field_state(entry, field) == FieldState::too_big;
      return value;
  }
  return std::nullopt;
}

Container Tree::changed_container(ContainerId id) const noexcept {
  const auto found = changed.find(id);
  if (found != changed.end()) return found->second;
  const std::uint32_t index = id & kWholeEntryIndexMask;
  if ((id & kWholeEntryFrames) != kWholeEntryFrames) return Container{Kind::dict, Shape::trace_entry, 0, index};
  const std::uint32_t list = entry_frames[index];
  if (list == 0) return Container{Kind::list, Shape::items, 0, 0};
  return Container{Kind::list, Shape::frame_list, frame_lists[list - 1].size, list - 1};
}

std::size_t Tree::size(ContainerId id) const noexcept {
  const Container c = container(id);
  if (c.shape == Shape::trace_run) return c.offset + c.size <= traces.size() ? c.size : 0;  // 0: moved into the events
  if (c.shape != Shape::trace_entry) return c.size;
  if (c.offset >= traces.size()) return 0;  // already moved into the model's events
  std::size_t fields = 1;                    // the action
  for (int f = 0; f < kTraceFieldCount; ++f) {
    if (field_state(traces[c.offset], static_cast<TraceField>(f)) != FieldState::absent) ++fields;
  }
  return 2 * fields;
}

Value Tree::item(ContainerId id, std::size_t index) const noexcept {
  const Container c = container(id);
  switch (c.shape) {
    case Shape::items: return arena[c.offset + index];
    case Shape::frame_list: {
      Value value;
      value.kind = Kind::dict;
      value.length = frame_items[frame_lists[c.offset].offset + index];
      return value;
    }
    case Shape::trace_run: {
      Value value;
      value.kind = Kind::dict;
      value.length = traces[c.offset + index].stack.value;
      return value;
    }
    case Shape::trace_entry: break;
  }
  const Event& entry = traces[c.offset];
  // The action, then the fields present, in TraceField order.
  std::size_t pair = index / 2;
  if (pair == 0) return index % 2 == 0 ? text_value("action") : text_value(trace_action_name(entry.kind));
  for (int f = 0; f < kTraceFieldCount; ++f) {
    const auto field = static_cast<TraceField>(f);
    if (field_state(entry, field) == FieldState::absent) continue;
    if (--pair == 0) return index % 2 == 0 ? text_value(trace_key(field)) : *trace_value(entry, field);
  }
  return Value{};
}

std::optional<Value> Tree::find(ContainerId dict, std::string_view key) const noexcept {
  const Container c = container(dict);
  if (c.shape == Shape::trace_entry) {
    if (c.offset >= traces.size()) return std::nullopt;
    const int field = trace_key_of(key);
    if (field == kNotATraceKey) return std::nullopt;
    const Event& entry = traces[c.offset];
    if (field == kActionKey) return text_value(trace_action_name(entry.kind));
    return trace_value(entry, static_cast<TraceField>(field));
  }
  // Linear, from the end so a repeated key resolves as in Python.
  for (std::size_t i = c.size; i >= 2; i -= 2) {
    const Value& candidate = arena[c.offset + i - 2];
    if (candidate.kind == Kind::text && candidate.view() == key) return arena[c.offset + i - 1];
  }
  return std::nullopt;
}

}  // namespace cachealloc::snapshot::pickle
