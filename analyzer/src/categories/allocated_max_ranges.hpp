// The bytes per category where allocated was largest in each of a set of
// ranges of events (Categorization::at_allocated_max), summed during
// categorize()'s walk, although an allocation's category is known only once
// the trace frees it (or at the end). Private to analyzer/src/categories.
//
// A range's moment is fixed once the range ends. The allocations alive at
// it are those numbered before it (allocations are numbered in event order)
// and freed after it, so a free adds its bytes to the ranges that ended
// since the allocation was made: one stretch of the ranges ended so far,
// found by binary search and kept as a difference array, plus the open
// range where the allocation is older than its moment so far. Allocations
// alive at the end are added the same way. O(log ranges) a free, O(ranges)
// memory. It sums what at_allocated_max() would walk only where each
// allocation's bytes are its change to allocated: a trace that frees what
// it never made, or makes a block at an address still held, gives up.
//
// The ranges come in advance (categorize(): the rows timeline asks for) or
// as they end (the walk inside the analysis pass: its timeline rows, its
// allocated peak), where open_now(), track() and end_range() drive them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cachealloc/analyzer/categories.hpp"

namespace cachealloc::analyzer::categories {

class AllocatedMaxRanges {
 public:
  explicit AllocatedMaxRanges(std::vector<std::pair<std::size_t, std::size_t>> ranges)
      : ranges_(std::move(ranges)), active_(!ranges_.empty()) {}
  // Ranges given as they end, by open_now(), track() and end_range().
  AllocatedMaxRanges() : active_(true) {}

  bool active() const noexcept { return active_; }
  void give_up() noexcept { active_ = false; }
  const std::vector<std::pair<std::size_t, std::size_t>>& ranges() const noexcept { return ranges_; }

  // The state before the first event: `count` allocations alive, `total` bytes.
  void start(std::size_t count, std::uint64_t total) {
    while (active_ && next_ < ranges_.size() && ranges_[next_].second == kNoEvent) close(count);
    (void)total;
  }

  // An allocation freed by the current event, before after() of it.
  void freed(std::size_t id, std::uint64_t bytes, std::uint64_t requested, Category category) {
    if (!active_) return;
    add_to_ended(id, bytes, requested, category);
    if (open_ && id < open_count_) add(open_bytes_, category, bytes, requested);
  }

  // After event i: `total` allocated, `count` allocations numbered so far.
  [[gnu::always_inline]] inline void after(std::size_t i, std::uint64_t total, std::size_t count) {
    if (!active_ || next_ >= ranges_.size()) return;
    if (open_ && total <= best_ && ranges_[next_].second != i) return;  // most events
    while (next_ < ranges_.size()) {
      const auto [first, last] = ranges_[next_];
      if (!open_) {
        if (first > i) return;
        open_ = true;
        best_ = total, open_count_ = count, open_bytes_ = {};
      } else if (total > best_) {
        best_ = total, open_count_ = count, open_bytes_ = {};
      }
      if (last > i) return;
      ranges_ended(open_count_);
    }
  }

  // Ranges given as they end. A range opens at the state now (`total`
  // allocated, `count` allocations numbered), or at the first event
  // track() sees after the last range ended.
  void open_now(std::uint64_t total, std::size_t count) {
    open_ = true;
    best_ = total, open_count_ = count, open_bytes_ = {};
  }
  [[gnu::always_inline]] inline void track(std::uint64_t total, std::size_t count) {
    if (open_ && total <= best_) return;  // most events
    open_now(total, count);
  }
  void end_range() {
    if (!open_) open_now(0, 0);  // a range of no events: nothing is alive at its moment
    ranges_ended(open_count_);
  }

  // After the last event: ranges still open end at their moment so far,
  // those never reached hold the final state (`count` allocations).
  void end(std::size_t count) {
    if (!active_) return;
    if (open_) ranges_ended(open_count_);
    while (next_ < ranges_.size()) close(count);
  }

  // An allocation alive at the end (after end()).
  void alive_at_end(std::size_t id, std::uint64_t bytes, std::uint64_t requested, Category category) {
    if (active_) add_to_ended(id, bytes, requested, category);
  }

  // Each range's bytes per category (after end() and alive_at_end()).
  std::vector<CategoryBytes> result() const {
    std::vector<CategoryBytes> out(ended_count_.size());
    CategoryBytes running;
    for (std::size_t r = 0; r < out.size(); ++r) {
      for (std::size_t c = 0; c < kCategoryCount; ++c) {
        running.bytes[c] += later_[r].bytes[c];
        running.requested[c] += later_[r].requested[c];
        out[r].bytes[c] = ended_bytes_[r].bytes[c] + running.bytes[c];
        out[r].requested[c] = ended_bytes_[r].requested[c] + running.requested[c];
      }
    }
    return out;
  }

 private:
  void ranges_ended(std::size_t count) {
    ended_count_.push_back(count);
    ended_bytes_.push_back(open_bytes_);
    later_.emplace_back();
    open_ = false;
    ++next_;
  }
  void close(std::size_t count) {
    open_bytes_ = {};
    ranges_ended(count);
  }
  // The ranges ended so far whose moment came after the allocation was
  // made (counts are non-decreasing): a stretch up to the last ended range.
  // Unsigned sums wrap, and the difference array's are exact modulo 2^64.
  void add_to_ended(std::size_t id, std::uint64_t bytes, std::uint64_t requested, Category category) {
    const auto lo = static_cast<std::size_t>(std::upper_bound(ended_count_.begin(), ended_count_.end(), id) -
                                             ended_count_.begin());
    if (lo == ended_count_.size()) return;
    add(later_[lo], category, bytes, requested);
    add(later_[ended_count_.size()], category, 0 - bytes, 0 - requested);
  }
  static void add(CategoryBytes& sums, Category category, std::uint64_t bytes, std::uint64_t requested) {
    const auto c = static_cast<std::size_t>(category);
    sums.bytes[c] += bytes;
    sums.requested[c] += requested;
  }

  std::vector<std::pair<std::size_t, std::size_t>> ranges_;
  bool active_;
  std::size_t next_ = 0;  // the range open or to open next
  bool open_ = false;
  std::uint64_t best_ = 0;         // the open range's largest allocated so far
  std::size_t open_count_ = 0;     // allocations numbered at that moment
  CategoryBytes open_bytes_;       // freed since that moment, of those alive at it
  std::vector<std::size_t> ended_count_;     // per range ended
  std::vector<CategoryBytes> ended_bytes_;   // per range ended: freed while it was open
  std::vector<CategoryBytes> later_ = std::vector<CategoryBytes>(1);  // difference array: freed after the range ended
};

}  // namespace cachealloc::analyzer::categories
