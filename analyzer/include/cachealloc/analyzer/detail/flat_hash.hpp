// The replay's address lookups: block and segment start address -> id. The
// snapshot library's open-addressing map (cachealloc/snapshot/detail/
// flat_map.hpp) kept at most half full, behind the interface the replay's hot
// path reads best: an id or kMissing rather than a pointer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cachealloc/snapshot/detail/flat_map.hpp"

namespace cachealloc::analyzer::detail {

class FlatHashMap {
 public:
  static constexpr std::uint32_t kMissing = 0xffffffffu;

  std::uint32_t find(std::uint64_t key) const noexcept {
    const std::uint32_t* found = map_.find(key);
    return found == nullptr ? kMissing : *found;
  }
  // Inserts or overwrites.
  void insert(std::uint64_t key, std::uint32_t value) { map_.insert(key, value); }
  // Returns false when `key` was absent.
  bool erase(std::uint64_t key) noexcept { return map_.erase(key); }
  std::size_t size() const noexcept { return map_.size(); }

 private:
  snapshot::detail::FlatMap<std::uint32_t, 50> map_;
};

}  // namespace cachealloc::analyzer::detail
