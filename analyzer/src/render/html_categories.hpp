// The category of each active block as the page's replay meets it: a
// Categorization::Follower given the same events, in the same order, says
// which allocation each alloc made (memory: one entry per live block, and
// the follower's replay where the trace is long).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "cachealloc/analyzer/categories.hpp"

namespace cachealloc::analyzer::html {

class BlockCategories {
 public:
  explicit BlockCategories(const Categorization& categorization)
      : device_(categorization.device), follower_(categorization) {
    for (const CategoryChange& change : follower_.start())
      if (!change.freed) live_[change.address] = code(change);
  }

  // Takes every event of the trace, from the first, in order. Returns the
  // category of the allocation an alloc of the device made (`other` for an
  // alloc that changed nothing, a damaged trace, and for other events).
  std::uint8_t on_event(std::size_t index, const snapshot::Event& e) {
    follower_.on_event(index, e);
    if (e.device != device_) return kOther;
    if (e.kind == snapshot::EventKind::alloc) {
      const CategoryChange* change = follower_.change();
      const std::uint8_t category = change != nullptr && !change->freed ? code(*change) : kOther;
      live_[e.address] = category;
      return category;
    }
    if (e.kind == snapshot::EventKind::free_completed) live_.erase(e.address);
    return kOther;
  }
  std::uint8_t of(std::uint64_t address) const {
    const auto it = live_.find(address);
    return it == live_.end() ? kOther : it->second;
  }

 private:
  static constexpr std::uint8_t kOther = static_cast<std::uint8_t>(Category::other);
  static std::uint8_t code(const CategoryChange& c) { return static_cast<std::uint8_t>(c.category.category); }
  std::int32_t device_;
  Categorization::Follower follower_;
  std::unordered_map<std::uint64_t, std::uint8_t> live_;
};

}  // namespace cachealloc::analyzer::html
