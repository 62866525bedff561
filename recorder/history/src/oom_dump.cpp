// What an OOM event sets off besides its record: the NVML reading at the
// OOM, and the snapshot the OOM-dump thread writes (HistoryOptions::dump_on_oom).
#include "history_state.hpp"

namespace cachealloc {

// What nvidia-smi would show at this OOM. Runs under the shard lock of the
// failed allocation, which an OOM holds anyway; NVML takes 0.1-1 ms.
void HistoryRecorder::State::record_oom_usage(std::uint32_t thread, std::uint64_t at_ticks) noexcept {
  try {
    OomUsage reading{thread, at_ticks, allocator.device().usage()};
    std::lock_guard lock(usage_mutex);
    if (oom_usage.size() >= kMaxOomUsage) oom_usage.erase(oom_usage.begin());
    oom_usage.push_back(std::move(reading));
  } catch (...) {
    // Out of memory for the reading: the OOM keeps its event, without NVML's figures.
  }
}

void HistoryRecorder::State::request_oom_dump() noexcept {
  std::lock_guard lock(oom_mutex);
  if (!oom_worker.joinable()) return;
  oom_requested = true;
  ++oom_requests;
  oom_cv.notify_all();
}

void HistoryRecorder::oom_dump_loop() noexcept {
  State& s = *state_;
  std::unique_lock lock(s.oom_mutex);
  for (;;) {
    s.oom_cv.wait(lock, [&] { return s.oom_requested || s.quitting; });
    if (!s.oom_requested) return;
    s.oom_requested = false;
    s.oom_busy = true;
    const std::uint64_t covers = s.oom_requests;  // this dump answers every request so far
    std::filesystem::path path;
    try {
      path = s.oom_dump_path;
    } catch (...) {
    }
    lock.unlock();
    // Blocks until the allocator thread that reported the OOM has left its locks.
    if (!path.empty()) dump_snapshot(path);
    lock.lock();
    s.oom_busy = false;
    s.oom_dumped = covers;
    s.oom_cv.notify_all();
  }
}

void HistoryRecorder::flush() noexcept {
  State& s = *state_;
  std::unique_lock lock(s.oom_mutex);
  // Waits for the requests made before this call only: under OOMs that keep
  // coming (a loop that retries), waiting for an idle worker could be forever.
  const std::uint64_t target = s.oom_requests;
  s.oom_cv.wait(lock, [&] { return s.oom_dumped >= target || !s.oom_worker.joinable(); });
}

}  // namespace cachealloc
