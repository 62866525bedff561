// The category of each active block as the page's replay meets it: at its
// alloc event, or, for blocks alive before the first event, by address.
// categorize() records allocations in event order, those alive before the
// first event first and in the order Replay::for_each_allocated visits them,
// so one forward cursor over its allocations follows the html report's own
// replay without a per-event table (memory: one entry per live block).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/analyzer/replay.hpp"

namespace cachealloc::analyzer::html {

class BlockCategories {
 public:
  // `start`: the replay before its first event, as categorize() started.
  BlockCategories(const Categorization& categorization, const Replay& start) : c_(categorization) {
    start.for_each_allocated([&](const Replay::LiveBlock& block) {
      const std::uint8_t category = next_ < c_.allocations.size() && c_.allocations[next_].alloc_event == kNoEvent
                                        ? code(c_.allocations[next_++])
                                        : kOther;
      live_[block.address] = category;
    });
  }

  // The category of the allocation event `event` made at `address`; an alloc
  // that changed nothing (a damaged trace) is `other`.
  std::uint8_t on_alloc(std::size_t event, std::uint64_t address) {
    while (next_ < c_.allocations.size() &&
           (c_.allocations[next_].alloc_event == kNoEvent || c_.allocations[next_].alloc_event < event))
      ++next_;
    std::uint8_t category = kOther;
    if (next_ < c_.allocations.size() && c_.allocations[next_].alloc_event == event) category = code(c_.allocations[next_++]);
    live_[address] = category;
    return category;
  }
  void on_free_completed(std::uint64_t address) { live_.erase(address); }
  std::uint8_t of(std::uint64_t address) const {
    const auto it = live_.find(address);
    return it == live_.end() ? kOther : it->second;
  }

 private:
  static constexpr std::uint8_t kOther = static_cast<std::uint8_t>(Category::other);
  static std::uint8_t code(const CategorizedAllocation& a) { return static_cast<std::uint8_t>(a.category.category); }
  const Categorization& c_;
  std::size_t next_ = 0;
  std::unordered_map<std::uint64_t, std::uint8_t> live_;
};

}  // namespace cachealloc::analyzer::html
