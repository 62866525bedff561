// Splitting a loop over threads, for the pickle reader's passes over
// millions of trace entries.
#pragma once

#include <cstdint>

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

#include "cachealloc/snapshot/detail/cores.hpp"
#include "huge_pages.hpp"

namespace cachealloc::snapshot::detail {

// The pickle reader's threads: one per usable core (cores.hpp), at most 16.
inline unsigned reader_threads() noexcept { return std::min(usable_cores(), 16u); }

// Calls body(begin, end) for `threads` contiguous ranges covering [0, count),
// the last on the calling thread, and returns when all are done. Ranges
// under `min_range` items are merged: threads are not worth starting for
// less. `body` must not throw (catch inside and report after); a thread that
// cannot be started runs its range on the calling thread instead.
template <class Body>
void parallel_ranges(std::size_t count, unsigned threads, std::size_t min_range, Body&& body) {
  const std::size_t ranges =
      std::max<std::size_t>(1, std::min<std::size_t>(threads, count / std::max<std::size_t>(min_range, 1)));
  std::vector<std::thread> workers;
  std::size_t begin = 0;
  for (std::size_t r = 0; r + 1 < ranges; ++r) {
    const std::size_t end = count / ranges * (r + 1);
    try {
      workers.emplace_back([&body, begin, end] { body(begin, end); });
    } catch (...) {
      body(begin, end);
    }
    begin = end;
  }
  body(begin, count);
  for (std::thread& worker : workers) worker.join();
}

}  // namespace cachealloc::snapshot::detail
