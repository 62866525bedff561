#include "cachealloc/snapshot/invariants.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "cachealloc/snapshot/text.hpp"

namespace cachealloc::snapshot {
namespace {

std::string bound_text(const SizeLimits& limits, std::int32_t device, bool segment) {
  if (limits.device_total == 0)
    return "more than 2^50 bytes, where the file records no device total";
  return std::string("more than ") + (segment ? "twice " : "") + "device " + std::to_string(device) +
         "'s total of " + std::to_string(limits.device_total) + " bytes";
}

std::optional<std::string> segments_problem(const Snapshot& snapshot, const std::vector<Segment>& segments,
                                            const std::string& suffix) {
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& segment = segments[s];
    const std::string where = "segment " + std::to_string(s) + suffix;
    if (segment.device < 0) return where + " is on device " + std::to_string(segment.device) + "; device indices start at 0";
    if (segment.total_size > UINT64_MAX - segment.address) return where + " wraps around the address space";
    if (const SizeLimits limits = size_limits(snapshot, segment.device); segment.total_size > limits.segment)
      return where + " holds " + std::to_string(segment.total_size) + " bytes, " +
             bound_text(limits, segment.device, true);
    std::uint64_t cursor = segment.address;
    const std::uint64_t end = segment.address + segment.total_size;
    for (std::size_t b = 0; b < segment.blocks.size(); ++b) {
      const Block& block = segment.blocks[b];
      const std::string which = "block " + std::to_string(b) + " of " + where;
      if (block.address < segment.address || block.address > end || block.size > end - block.address)
        return which + " lies outside its segment";
      if (block.address < cursor) return which + " overlaps the block before it";
      // Only an expandable segment unmaps part of its range.
      if (block.state == BlockState::unmapped && !segment.expandable)
        return which + " is unmapped, but its segment is not expandable";
      if (block.address > cursor) return which + " leaves a gap of " + std::to_string(block.address - cursor) +
                                         " bytes before it: the block sizes do not add up to the segment's";
      // A block in use is rounded up from its request, never down.
      if (block.state != BlockState::inactive && block.requested > block.size)
        return which + " requests " + std::to_string(block.requested) + " bytes, more than its " +
               std::to_string(block.size);
      cursor = block.address + block.size;
    }
    if (cursor != end) {
      return where + "'s blocks cover " + std::to_string(cursor - segment.address) + " of its " +
             std::to_string(segment.total_size) + " bytes: the block sizes do not add up to the segment's";
    }
  }
  // Overlap between segments of one device: sorted by (device, address),
  // each must end at or before the next begins.
  std::vector<std::size_t> order(segments.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return segments[a].device != segments[b].device ? segments[a].device < segments[b].device
                                                    : segments[a].address < segments[b].address;
  });
  // A device's segments together within the bound of one: each is within
  // it (at most 2^51), so the running sum is refused before it can wrap.
  std::uint64_t device_reserved = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const Segment& segment = segments[order[k]];
    if (k == 0 || segments[order[k - 1]].device != segment.device) device_reserved = 0;
    device_reserved += segment.total_size;
    if (const SizeLimits limits = size_limits(snapshot, segment.device); device_reserved > limits.segment)
      return "the segments of device " + std::to_string(segment.device) + suffix + " hold " +
             std::to_string(device_reserved) + " bytes from segment " + std::to_string(order[k]) + " on, " +
             bound_text(limits, segment.device, true);
  }
  for (std::size_t k = 1; k < order.size(); ++k) {
    const Segment& before = segments[order[k - 1]];
    const Segment& after = segments[order[k]];
    if (before.device == after.device && after.address < before.address + before.total_size) {
      return "segment " + std::to_string(order[k]) + suffix + " (device " + std::to_string(after.device) +
             ") overlaps segment " + std::to_string(order[k - 1]);
    }
  }
  return std::nullopt;
}

std::optional<std::string> text_problem(const std::string& text, const std::string& where) {
  if (invalid_utf8_bytes(text) == 0) return std::nullopt;
  return where + " is not valid UTF-8";
}

}  // namespace

SizeLimits size_limits(const Snapshot& snapshot, std::int32_t device) {
  SizeLimits limits;
  for (const DeviceInfo& info : snapshot.devices) {
    if (info.index != device || info.total_bytes == 0 || info.total_bytes > kMaxPlausibleBytes) continue;
    limits.device_total = info.total_bytes;
    limits.allocation = info.total_bytes;
    limits.segment = 2 * info.total_bytes;
  }
  return limits;
}

std::optional<std::string> implausible_event(const Event& event, std::uint64_t index, const SizeLimits& limits,
                                             std::uint64_t thread_last) {
  const std::string which = "event " + std::to_string(index);
  if (event.device < 0) return which + " is on device " + std::to_string(event.device) + "; device indices start at 0";
  if (event.time_ns > kMaxPlausibleTimeNs)
    return which + " is at " + std::to_string(event.time_ns) + " ns, past 2^62 ns";
  if (event.time_ns < thread_last)
    return which + " is at " + std::to_string(event.time_ns) + " ns, before its thread's previous event at " +
           std::to_string(thread_last) + " ns";
  const auto too_large = [&](std::uint64_t bytes, const char* what, bool segment) -> std::optional<std::string> {
    const std::uint64_t bound = segment ? limits.segment : limits.allocation;
    if (bytes <= bound) return std::nullopt;
    return which + " (" + std::string(to_string(event.kind)) + ") " + what + " " + std::to_string(bytes) +
           " bytes, " + bound_text(limits, event.device, segment);
  };
  // Kinds with no aux (events.hpp): a figure there is read by no report and
  // has no place in PyTorch's trace, so convert could not keep it.
  if (event.aux != 0 && !kind_has_aux(event.kind))
    return which + " (" + std::string(to_string(event.kind)) + ") has an aux figure of " + std::to_string(event.aux) +
           ", which its kind does not have";
  if (event.kind == EventKind::category && event.aux >= events::kAllocationCategoryCount)
    return which + " (category) has category code " + std::to_string(event.aux) + ", past the last (" +
           std::to_string(events::kAllocationCategoryCount - 1) + ", other)";
  if (event.kind == EventKind::segment_alloc && (event.aux & ~kSegmentFlagsMask) != 0)
    return which + " (segment_alloc) has flags " + std::to_string(event.aux) + ", bits other than large pool (1) and expandable (2)";
  switch (event.kind) {
    case EventKind::alloc:
    case EventKind::free_requested:
    case EventKind::free_completed:
      if (auto problem = too_large(event.size, "holds", false)) return problem;
      if (auto problem = too_large(event.aux, "requests", false)) return problem;
      // A block is rounded up from its request, never down.
      if (event.aux > event.size)
        return which + " (" + std::string(to_string(event.kind)) + ") holds " + std::to_string(event.size) +
               " bytes, fewer than the " + std::to_string(event.aux) + " it requests";
      return std::nullopt;
    case EventKind::split:
    case EventKind::merge:
      // An expandable segment's unmapped remainder is split and merged too.
      if (auto problem = too_large(event.size, "holds", true)) return problem;
      return too_large(event.aux, "moves", true);
    case EventKind::empty_cache: return too_large(event.size, "releases", false);
    case EventKind::segment_alloc:
    case EventKind::segment_release:
    case EventKind::segment_map:
    case EventKind::segment_unmap: return too_large(event.size, "holds", true);
    default: break;
  }
  if (event.size > kMaxPlausibleBytes)
    return which + " (" + std::string(to_string(event.kind)) + ") names " + std::to_string(event.size) +
           " bytes, more than 2^50";
  return std::nullopt;
}

std::optional<std::string> layout_problem(const Snapshot& snapshot) {
  for (const DeviceInfo& device : snapshot.devices) {
    const std::string where = "device " + std::to_string(device.index);
    if (device.index < 0) return where + " has a negative index; device indices start at 0";
    for (const auto& [figure, name] : {std::pair{device.total_bytes, "total"},
                                       std::pair{device.driver_total_at_dump, "driver total"}}) {
      if (figure > kMaxPlausibleBytes)
        return where + "'s " + name + " of " + std::to_string(figure) + " bytes is more than 2^50 bytes";
    }
    for (const DeviceUsage& usage : device.usage) {
      if (usage.device_total > kMaxPlausibleBytes)
        return where + "'s usage reading of a total of " + std::to_string(usage.device_total) +
               " bytes is more than 2^50 bytes";
    }
  }
  if (auto problem = segments_problem(snapshot, snapshot.segments, "")) return problem;
  for (std::size_t r = 0; r < snapshot.ring_start.size(); ++r) {
    if (auto problem =
            segments_problem(snapshot, snapshot.ring_start[r].segments, " of ring start " + std::to_string(r)))
      return problem;
  }
  for (std::size_t i = 0; i < snapshot.strings.size(); ++i) {
    if (auto problem = text_problem(snapshot.strings[i], "string " + std::to_string(i))) return problem;
  }
  const Header& header = snapshot.header;
  for (const auto& [text, name] : {std::pair{&header.writer_version, "the writer version"},
                                  std::pair{&header.source, "the source"}, std::pair{&header.program, "the program"},
                                  std::pair{&header.host, "the host"}}) {
    if (auto problem = text_problem(*text, name)) return problem;
  }
  for (std::size_t i = 0; i < header.arguments.size(); ++i) {
    if (auto problem = text_problem(header.arguments[i], "argument " + std::to_string(i))) return problem;
  }
  for (const DeviceInfo& device : snapshot.devices) {
    const std::string where = "device " + std::to_string(device.index);
    if (auto problem = text_problem(device.name, where + "'s name")) return problem;
    if (auto problem = text_problem(device.usage_note, where + "'s usage note")) return problem;
  }
  for (const auto& [key, value] : snapshot.settings) {
    if (auto problem = text_problem(key, "a setting's name")) return problem;
    if (auto problem = text_problem(value, "setting " + printable(key.substr(0, 64)))) return problem;
  }
  return std::nullopt;
}

}  // namespace cachealloc::snapshot
