// validate(): the checks every snapshot we read or write passes, and the
// cheap screen of them that the streaming reader runs while it decodes.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/invariants.hpp"
#include "format_v3.hpp"

namespace cachealloc::snapshot {
namespace {

using detail::inconsistent;

void check_stack(StackId id, const Snapshot& snapshot, const std::string& where) {
  if (id.value != 0 && id.value >= snapshot.stacks.size()) {
    inconsistent(where + " references stack " + std::to_string(id.value) + " but the stack table has " +
                 std::to_string(snapshot.stacks.size()) + " entries");
  }
}
void check_string(StringId id, const Snapshot& snapshot, const std::string& where) {
  if (id.value != 0 && id.value >= snapshot.strings.size()) {
    inconsistent(where + " references string " + std::to_string(id.value) + " but the string table has " +
                 std::to_string(snapshot.strings.size()) + " entries");
  }
}

// NVML's readings: a known source, figures within the device, OOM readings
// in event order naming an OOM event, the dump's reading last. The events
// are checked only when they are here (a streaming reader checks the index
// against its event count, reader.cpp).
void check_usage(const Snapshot& snapshot) {
  for (const DeviceInfo& device : snapshot.devices) {
    const std::string where = "device " + std::to_string(device.index);
    if (static_cast<int>(device.usage_source) > static_cast<int>(UsageSource::unavailable))
      inconsistent(where + " has unknown usage source " + std::to_string(static_cast<int>(device.usage_source)));
    if (!device.usage.empty() && device.usage_source != UsageSource::nvml &&
        device.usage_source != UsageSource::simulated)
      inconsistent(where + " holds usage readings but its usage source is " + to_string(device.usage_source));
    for (std::size_t i = 0; i < device.usage.size(); ++i) {
      const DeviceUsage& u = device.usage[i];
      const std::string which = where + " usage reading " + std::to_string(i);
      if (u.device_used > u.device_total || u.device_reserved > u.device_total - u.device_used ||
          (u.process_found && u.process_used > u.device_total) || u.other_processes_used > u.device_total)
        inconsistent(which + " has figures beyond the device's total of " + std::to_string(u.device_total) + " bytes");
      if (u.event == kUsageAtDump) {
        if (i + 1 != device.usage.size()) inconsistent(which + " is the dump's but not the last");
        continue;
      }
      if (i > 0 && u.event <= device.usage[i - 1].event)
        inconsistent(which + " names event " + std::to_string(u.event) + ", not after the previous reading's");
      if (!snapshot.events.empty() &&
          (u.event >= snapshot.events.size() || snapshot.events[u.event].kind != EventKind::oom))
        inconsistent(which + " names event " + std::to_string(u.event) + ", which is not an OOM of the trace");
    }
  }
}

// The segments of a layout and their blocks; `suffix` says which layout in
// messages ("" for the final one).
void check_layout(const std::vector<Segment>& segments, const Snapshot& snapshot, const std::string& suffix) {
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& segment = segments[s];
    check_stack(segment.stack, snapshot, "segment " + std::to_string(s) + suffix);
    for (std::size_t b = 0; b < segment.blocks.size(); ++b) {
      const Block& block = segment.blocks[b];
      const std::string where = "block " + std::to_string(b) + " of segment " + std::to_string(s) + suffix;
      if (static_cast<std::uint8_t>(block.state) > static_cast<std::uint8_t>(BlockState::unmapped)) {
        inconsistent(where + " has unknown state " + std::to_string(static_cast<int>(block.state)));
      }
      check_stack(block.stack, snapshot, where);
    }
  }
}

}  // namespace

void validate(const Snapshot& snapshot) {
  for (std::size_t i = 0; i < snapshot.frames.size(); ++i) {
    const Frame& frame = snapshot.frames[i];
    const std::string where = "frame " + std::to_string(i);
    check_string(frame.function, snapshot, where);
    check_string(frame.file, snapshot, where);
    check_string(frame.module, snapshot, where);
  }
  for (std::size_t i = 0; i < snapshot.stacks.size(); ++i) {
    for (const FrameId frame : snapshot.stacks[i].frames) {
      if (frame.value >= snapshot.frames.size()) {
        inconsistent("stack " + std::to_string(i) + " references frame " + std::to_string(frame.value) +
                     " but the frame table has " + std::to_string(snapshot.frames.size()) + " entries");
      }
    }
  }
  check_layout(snapshot.segments, snapshot, "");
  for (std::size_t r = 0; r < snapshot.ring_start.size(); ++r) {
    const RingStart& start = snapshot.ring_start[r];
    const std::string where = "ring start " + std::to_string(r);
    if (start.device < 0) inconsistent(where + " is for device " + std::to_string(start.device) + "; device indices start at 0");
    if (r > 0 && start.device <= snapshot.ring_start[r - 1].device) {
      inconsistent(where + " is for device " + std::to_string(start.device) + ", not after device " +
                   std::to_string(snapshot.ring_start[r - 1].device));
    }
    check_layout(start.segments, snapshot, " of " + where);
  }
  // The layout and text rules both readers share (invariants.hpp).
  if (const std::optional<std::string> problem = layout_problem(snapshot)) inconsistent(*problem);
  check_usage(snapshot);
  detail::validate_events(snapshot, snapshot.events, 0);
}

namespace {
// The full checks of one event, in their order; reached only for an event
// the screen in validate_events flags, which fails one of them or is a rare
// figure the screen cannot tell from a bad one (a segment above the
// smallest device's total). `thread_last`: its thread's previous time.
[[gnu::noinline]] void validate_event(const Snapshot& snapshot, const Event& event, std::uint64_t i,
                                      std::uint64_t thread_last) {
  if (static_cast<int>(event.kind) >= kEventKindCount) {
    inconsistent("event " + std::to_string(i) + " has unknown kind " + std::to_string(static_cast<int>(event.kind)));
  }
  if (!snapshot.threads.empty() && event.thread >= snapshot.threads.size()) {
    inconsistent("event " + std::to_string(i) + " references thread " + std::to_string(event.thread) +
                 " but the thread table has " + std::to_string(snapshot.threads.size()) + " entries");
  }
  if (event.stack.value != 0 && event.stack.value >= snapshot.stacks.size()) {
    check_stack(event.stack, snapshot, "event " + std::to_string(i));
  }
  if (event.kind == EventKind::annotation_begin || event.kind == EventKind::annotation_end) {
    if (event.aux > UINT32_MAX) {
      inconsistent("event " + std::to_string(i) + " names annotation string " + std::to_string(event.aux) +
                   ", past 32 bits");
    }
    check_string(StringId{static_cast<std::uint32_t>(event.aux)}, snapshot, "event " + std::to_string(i));
  }
  if (auto problem = implausible_event(event, i, size_limits(snapshot, event.device), thread_last))
    inconsistent(*problem);
}
}  // namespace

// A branch-free screen of the cheap conditions (a chain of branches per
// event was 7% of a streaming analysis), and the full checks,
// with their messages, only for the events it flags. The streaming reader
// screens while decoding (EventScreen) and comes here only for a block
// that fails. Times are checked per thread from the range's first event
// (the thread table's threads; one sequence where the table is empty).
void detail::validate_events(const Snapshot& snapshot, std::span<const Event> events, std::uint64_t first_index) {
  const EventScreen limits = event_screen(snapshot);
  constexpr auto annotation_begin = static_cast<unsigned>(EventKind::annotation_begin);
  constexpr auto annotation_end = static_cast<unsigned>(EventKind::annotation_end);
  constexpr auto last_block_kind = static_cast<unsigned>(EventKind::merge);  // alloc, frees, split, merge: aux is bytes
  std::vector<std::uint64_t> thread_last(std::max<std::size_t>(snapshot.threads.size(), 1), 0);
  const std::uint64_t threads = thread_last.size();
  for (std::size_t k = 0; k < events.size(); ++k) {
    const Event& event = events[k];
    const auto kind = static_cast<unsigned>(static_cast<std::uint8_t>(event.kind));
    const std::uint64_t slot = snapshot.threads.empty() || event.thread >= threads ? 0 : event.thread;
    const std::uint64_t last = thread_last[slot];
    const bool flagged = (kind >= static_cast<unsigned>(kEventKindCount)) | (event.thread >= limits.thread_limit) |
                         (event.device < 0) |
                         ((event.stack.value != 0) & (event.stack.value >= limits.stack_limit)) |
                         (((kind == annotation_begin) | (kind == annotation_end)) & (event.aux != 0) &
                          (event.aux >= limits.string_limit)) |
                         (event.size > limits.size_limit) | ((kind <= last_block_kind) & (event.aux > limits.size_limit)) |
                         ((event.aux != 0) & !kind_has_aux(static_cast<EventKind>(kind))) |
                         ((kind == static_cast<unsigned>(EventKind::segment_alloc)) & ((event.aux & ~kSegmentFlagsMask) != 0)) |
                         ((kind == static_cast<unsigned>(EventKind::category)) & (event.aux >= events::kAllocationCategoryCount)) |
                         (event.time_ns > kMaxPlausibleTimeNs) | (event.time_ns < last) |
                         ((kind <= static_cast<unsigned>(EventKind::free_completed)) & (event.aux > event.size));
    if (flagged) [[unlikely]]
      validate_event(snapshot, event, first_index + k, last);
    thread_last[slot] = event.time_ns;
  }
}

detail::EventScreen detail::event_screen(const Snapshot& tables) {
  EventScreen screen;
  screen.thread_limit = tables.threads.empty() ? UINT64_MAX : tables.threads.size();
  screen.stack_limit = tables.stacks.size();
  // An annotation's string id must also fit 32 bits (validate_events).
  screen.string_limit = std::min<std::uint64_t>(tables.strings.size(), std::uint64_t{1} << 32);
  // The smallest allocation bound of any device: a figure above it is
  // looked at closely (validate_event), against its own device's bounds.
  screen.size_limit = kMaxPlausibleBytes;
  for (const DeviceInfo& device : tables.devices)
    screen.size_limit = std::min(screen.size_limit, size_limits(tables, device.index).allocation);
  return screen;
}

}  // namespace cachealloc::snapshot
