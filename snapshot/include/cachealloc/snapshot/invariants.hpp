// The invariants every reader holds a snapshot to, whatever its format.
//
// Our format's reader (format.hpp) and the PyTorch pickle reader (pickle.hpp)
// both call layout_problem() on what they decoded, so a file that breaks the
// model's promises is refused the same way whichever format carries it; the
// analyzer then relies on them without checking again:
//   - no device index is negative (a segment's, a device's, an event's:
//     the analyzer's options take -1 for "every device");
//   - no segment wraps around the address space (address + total_size fits);
//   - the segments of one device do not overlap;
//   - each segment's blocks are in address order, inside the segment, apart,
//     and their sizes add up to the segment's: they tile it from its address;
//   - only an expandable segment holds unmapped blocks;
//   - the same for each ring-start layout (RingStart::segments);
//   - all text (the string table, the header, device names and notes, the
//     settings) is valid UTF-8 (RFC 3629, text.hpp). Python's pickle.loads
//     refuses a string that is not; the recorder writes only valid text;
//   - figures are plausible: no device total above 2^50 bytes (1 PiB), no
//     segment above twice its device's total (an expandable segment reserves
//     1 1/8 of the device as address space), or above 2^50 where the file
//     records no total. Events are held to the same bounds
//     (implausible_event(), called by validate_events()): no allocation,
//     free, split, merge or empty_cache above the device's total (2^50
//     without one), no segment event above the segment bound, no OOM request
//     above 2^50, no time past 2^62 ns, no thread's time before its
//     previous event's, and no aux figure on a kind that has none
//     (kind_has_aux()). Sums of such figures cannot wrap 64 bits.
//
// Cost: O(segments log segments + blocks + bytes of text), no allocation
// beyond one index per layout. Thread safety: pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// The first broken invariant, described on one line without the file's own
// bytes (e.g. "segment 3 (device 0) overlaps segment 2"), or nothing when
// the snapshot holds them all. The events are not looked at.
std::optional<std::string> layout_problem(const Snapshot& snapshot);

// The plausibility bounds above.
inline constexpr std::uint64_t kMaxPlausibleBytes = std::uint64_t{1} << 50;
inline constexpr std::uint64_t kMaxPlausibleTimeNs = std::uint64_t{1} << 62;

// What one allocation and one segment of `device` may hold: the device's
// total and twice it where the snapshot records one, else 2^50 both.
struct SizeLimits {
  std::uint64_t allocation = kMaxPlausibleBytes;
  std::uint64_t segment = kMaxPlausibleBytes;
  std::uint64_t device_total = 0;  // 0: not recorded
};
SizeLimits size_limits(const Snapshot& snapshot, std::int32_t device);

// Whether events of `kind` carry an aux figure (events.hpp): segment_release,
// segment_unmap, empty_cache and snapshot have none, and hold 0 there.
// The flags a segment_alloc's aux may hold (events.hpp): any other bit is
// read by no report and has no place in PyTorch's trace.
inline constexpr std::uint64_t kSegmentFlagsMask = segment_flag_large_pool | segment_flag_expandable;

constexpr bool kind_has_aux(EventKind kind) noexcept {
  return kind != EventKind::segment_release && kind != EventKind::segment_unmap && kind != EventKind::empty_cache &&
         kind != EventKind::snapshot;
}

// The first figure of event `index` past its bound, on one line naming the
// index and the figure ("event 2 holds 18446744073709551615 bytes, more
// than device 0's total of 34359738368 bytes"), or nothing. `thread_last`:
// the time of the previous event of the event's thread (0 for its first).
std::optional<std::string> implausible_event(const Event& event, std::uint64_t index, const SizeLimits& limits,
                                             std::uint64_t thread_last);

}  // namespace cachealloc::snapshot
