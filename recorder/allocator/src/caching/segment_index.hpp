// Which pool owns a device address, found without a lock: a radix table of
// 2 MiB granules, each naming the one owner whose segment covers it.
//
// A free finds its block's pool here, then the block in that pool's own
// table under that shard's lock, which the free takes anyway. So the cached
// path shares no lock with threads on other streams, and touches no table
// the other pools write.
//
// Writers (a segment reserved, mapped or released: slow-path device calls)
// hold the index's mutex. Readers load three atomics. A granule covered by
// two segments (only when a device hands out segments not aligned to
// 2 MiB) holds kShared, and its look-ups search the extents under the
// mutex. An owner found here is a hint that is exact for every live block:
// a live block's granule was filled when its memory was reserved or
// mapped, and it changes only to kShared or back to the same owner while
// the segment lives. Tables are freed only with the index.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

namespace cachealloc::detail {

template <class Owner>
class SegmentIndex {
 public:
  SegmentIndex() = default;
  SegmentIndex(const SegmentIndex&) = delete;
  SegmentIndex& operator=(const SegmentIndex&) = delete;
  ~SegmentIndex() {
    for (auto& slot : root_) delete slot.load(std::memory_order_relaxed);
  }

  // Registers [base, base + size) as `owner`'s. With fill, every granule is
  // filled at once; without (an expandable segment's reserved range), only
  // the parts later given to fill().
  void add(std::uintptr_t base, std::size_t size, Owner* owner, bool fill_now = true) {
    std::lock_guard lock(mutex_);
    extents_[base] = Extent{size, owner};
    if (fill_now) fill_locked(base, size);
  }

  // Fills the granules of [begin, begin + size), which lies in a registered
  // extent (an expandable segment's newly mapped memory).
  void fill(std::uintptr_t begin, std::size_t size) {
    std::lock_guard lock(mutex_);
    fill_locked(begin, size);
  }

  // Forgets the extent at `base` and clears its granules.
  void remove(std::uintptr_t base) {
    std::lock_guard lock(mutex_);
    auto it = extents_.find(base);
    if (it == extents_.end()) return;
    const std::size_t size = it->second.size;
    extents_.erase(it);
    for_each_granule(base, size, /*create=*/false, [&](std::atomic<std::uintptr_t>& slot, std::uintptr_t granule) {
      slot.store(owner_of(granule), std::memory_order_release);
    });
  }

  // The owner of the extent holding `address`, or nullptr.
  Owner* find(std::uintptr_t address) const noexcept {
    const std::uintptr_t granule = address >> kGranuleBits;
    if (granule >> (3 * kLevelBits)) [[unlikely]]
      return find_locked(address);
    const Mid* mid = root_[granule >> (2 * kLevelBits)].load(std::memory_order_acquire);
    if (!mid) return nullptr;
    const Leaf* leaf = mid->slots[(granule >> kLevelBits) & kLevelMask].load(std::memory_order_acquire);
    if (!leaf) return nullptr;
    const std::uintptr_t entry = leaf->slots[granule & kLevelMask].load(std::memory_order_acquire);
    if (entry == kShared) [[unlikely]]
      return find_locked(address);
    return reinterpret_cast<Owner*>(entry);
  }

 private:
  static constexpr int kGranuleBits = 21;  // 2 MiB: the smallest segment
  static constexpr int kLevelBits = 12;    // three levels: addresses below 2^57
  static constexpr std::uintptr_t kLevelMask = (std::uintptr_t{1} << kLevelBits) - 1;
  static constexpr std::size_t kFanout = std::size_t{1} << kLevelBits;
  static constexpr std::uintptr_t kShared = 1;

  struct Extent {
    std::size_t size;
    Owner* owner;
  };
  struct Leaf {
    std::array<std::atomic<std::uintptr_t>, kFanout> slots{};
  };
  struct Mid {
    std::array<std::atomic<Leaf*>, kFanout> slots{};
    ~Mid() {
      for (auto& slot : slots) delete slot.load(std::memory_order_relaxed);
    }
  };

  // Under mutex_: what granule `granule` should hold given the extents now.
  std::uintptr_t owner_of(std::uintptr_t granule) const {
    const std::uintptr_t lower = granule << kGranuleBits;
    const std::uintptr_t upper = lower + (std::uintptr_t{1} << kGranuleBits);
    auto it = extents_.upper_bound(lower);
    if (it != extents_.begin()) {
      auto before = std::prev(it);
      if (before->first + before->second.size > lower) it = before;
    }
    Owner* found = nullptr;
    for (; it != extents_.end() && it->first < upper; ++it) {
      if (found) return kShared;
      found = it->second.owner;
    }
    return reinterpret_cast<std::uintptr_t>(found);
  }

  void fill_locked(std::uintptr_t begin, std::size_t size) {
    for_each_granule(begin, size, /*create=*/true, [&](std::atomic<std::uintptr_t>& slot, std::uintptr_t granule) {
      slot.store(owner_of(granule), std::memory_order_release);
    });
  }

  // Calls f(slot, granule) for each granule of [begin, begin + size) below
  // 2^57 (higher ones are always searched under the mutex). With create,
  // missing tables are made; without, granules with none are skipped.
  template <class F>
  void for_each_granule(std::uintptr_t begin, std::size_t size, bool create, F f) {
    if (size == 0) return;
    const std::uintptr_t first = begin >> kGranuleBits;
    const std::uintptr_t last = (begin + size - 1) >> kGranuleBits;
    for (std::uintptr_t granule = first; granule <= last && !(granule >> (3 * kLevelBits));) {
      auto& mid_slot = root_[granule >> (2 * kLevelBits)];
      Mid* mid = mid_slot.load(std::memory_order_relaxed);
      if (!mid && create) {
        mid = new Mid;
        mid_slot.store(mid, std::memory_order_release);
      }
      const std::uintptr_t leaf_span = std::uintptr_t{1} << kLevelBits;
      const std::uintptr_t next_leaf = (granule | (leaf_span - 1)) + 1;
      if (!mid) {
        granule = (granule | ((leaf_span << kLevelBits) - 1)) + 1;  // the next mid's first granule
        continue;
      }
      auto& leaf_slot = mid->slots[(granule >> kLevelBits) & kLevelMask];
      Leaf* leaf = leaf_slot.load(std::memory_order_relaxed);
      if (!leaf && create) {
        leaf = new Leaf;
        leaf_slot.store(leaf, std::memory_order_release);
      }
      if (!leaf) {
        granule = next_leaf;
        continue;
      }
      for (; granule <= last && granule < next_leaf; ++granule) f(leaf->slots[granule & kLevelMask], granule);
    }
  }

  Owner* find_locked(std::uintptr_t address) const noexcept {
    std::lock_guard lock(mutex_);
    auto it = extents_.upper_bound(address);
    if (it == extents_.begin()) return nullptr;
    --it;
    return address - it->first < it->second.size ? it->second.owner : nullptr;
  }

  std::array<std::atomic<Mid*>, kFanout> root_{};
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, Extent> extents_;
};

}  // namespace cachealloc::detail
