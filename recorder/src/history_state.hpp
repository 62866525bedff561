// The state behind HistoryRecorder, shared by history.cpp (hot path) and
// history_dump.cpp (snapshots). Private to the recorder library.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cachealloc/history.hpp"
#include "spinlock.hpp"
#include "stack_capture.hpp"

namespace cachealloc {

namespace detail {
// A small index per OS thread, process-wide, assigned on the thread's first event.
std::uint32_t thread_index() noexcept;
// OS thread ids by index.
std::vector<std::uint64_t> registered_threads();
std::uint64_t monotonic_ns() noexcept;

// Event times on the hot path are raw ticks: the TSC where it is invariant
// (constant_tsc and nonstop_tsc: same rate on every core, through sleep
// states), which costs ~20 ns less per event than clock_gettime on the VMs we
// measured; CLOCK_MONOTONIC ns elsewhere. Ticks become CLOCK_MONOTONIC ns at
// dump time, by the line through two (ticks, ns) points: one from start(),
// one from the dump. The transform is increasing, so order is kept.
bool tsc_is_invariant() noexcept;
inline std::uint64_t now_ticks(bool use_tsc) noexcept {
#if defined(__x86_64__)
  if (use_tsc) [[likely]]
    return __builtin_ia32_rdtsc();
#endif
  return monotonic_ns();
}
struct TickAnchor {
  std::uint64_t ticks = 0;
  std::uint64_t ns = 0;
  static TickAnchor now(bool use_tsc) noexcept { return TickAnchor{now_ticks(use_tsc), monotonic_ns()}; }
};
}  // namespace detail

struct HistoryRecorder::State {
  explicit State(CachingAllocator& a) : allocator(a), use_tsc(detail::tsc_is_invariant()) {}

  // Appends under the ring lock, overwriting the oldest event when full.
  void append(snapshot::Event& event, bool from_allocator) noexcept;
  // Annotation names; ids are those of the snapshot's string table.
  std::uint32_t string_id(std::string_view text);
  void request_oom_dump() noexcept;

  CachingAllocator& allocator;
  std::int32_t device = 0;
  const bool use_tsc;  // the tick source, fixed for the recorder's life

  // Read on the hot path.
  std::atomic<bool> recording{false};
  std::atomic<StackCapture> stacks{StackCapture::none};
  std::atomic<std::uint32_t> max_frames{32};
  std::atomic<bool> stacks_on_free{false};

  mutable std::mutex control;  // start/stop and options
  HistoryOptions options;

  // The ring. Event number q (counting from start()) lives in ring[q % size]
  // while q >= appended - size.
  mutable detail::Spinlock ring_lock;
  std::vector<snapshot::Event> ring;
  std::size_t head = 0;  // == appended % ring.size()
  std::uint64_t appended = 0;
  std::uint64_t allocator_appended = 0;  // appended minus annotations
  std::uint64_t last_time = 0;           // ticks
  detail::TickAnchor anchor;             // taken at start()

  detail::StackTable table;

  mutable std::mutex strings_mutex;
  std::vector<std::string> strings{std::string()};
  std::unordered_map<std::string, std::uint32_t> string_ids;

  std::mutex oom_mutex;
  std::condition_variable oom_cv;
  bool oom_requested = false;
  bool oom_busy = false;
  bool quitting = false;
  std::thread oom_worker;
};

}  // namespace cachealloc
