// The clocks event times are read from: the tick sources (TSC, CLOCK_MONOTONIC,
// the coarse kernel tick) and the anchors that turn ticks into ns at dump time.
// Private to the recorder library.
#pragma once

#include <cstdint>

namespace cachealloc::detail {

std::uint64_t monotonic_ns() noexcept;
// The kernel's last tick, read from the vDSO's data page: ~1-3 ns, no TSC.
std::uint64_t coarse_ns() noexcept;

// Event times on the hot path are raw ticks: the TSC where it is invariant
// (constant_tsc and nonstop_tsc: same rate on every core, through sleep
// states), which costs ~20 ns less per event than clock_gettime on the VMs we
// measured; CLOCK_MONOTONIC ns elsewhere. Ticks become CLOCK_MONOTONIC ns at
// dump time, by the line through two (ticks, ns) points: one from start(),
// one from the dump. The transform is increasing, so order is kept.
bool tsc_is_invariant() noexcept;

// Where event ticks come from, fixed at start() (HistoryOptions::clock).
enum class TickSource : std::uint8_t { tsc, monotonic, coarse };

// The ordered read, for events whose time must follow a device call (a new
// segment or mapping): RDTSCP waits until every earlier instruction has
// executed. A plain RDTSC may execute early, while an earlier
// compare-and-swap still waits for its cache line.
inline std::uint64_t now_ticks(TickSource source) noexcept {
#if defined(__x86_64__)
  if (source == TickSource::tsc) [[likely]] {
    unsigned int core;
    return __builtin_ia32_rdtscp(&core);
  }
#endif
  // CLOCK_MONOTONIC for coarse too: the ordered read follows a device call,
  // and must not fall behind another pool's event in the same tick (those
  // are at most the tick plus their count in ns, below CLOCK_MONOTONIC).
  return monotonic_ns();
}
// The unordered read, for events whose order the allocator's order words
// give (AllocatorEvent::order): RDTSC may execute before the lock
// acquisition before it completes, and so read a time before the previous
// holder's last event, but the event's time is then raised above that
// holder's, which the shard's word holds. RDTSCP waits for every earlier
// instruction; on the H200 host and the dev VM it is most of an event's cost.
inline std::uint64_t now_ticks_unordered(TickSource source) noexcept {
#if defined(__x86_64__)
  if (source == TickSource::tsc) [[likely]]
    return __builtin_ia32_rdtsc();
#endif
  if (source == TickSource::coarse) return coarse_ns();
  return monotonic_ns();
}
struct TickAnchor {
  std::uint64_t ticks = 0;
  std::uint64_t ns = 0;
  static TickAnchor now(TickSource source) noexcept { return TickAnchor{now_ticks(source), monotonic_ns()}; }
};

}  // namespace cachealloc::detail
