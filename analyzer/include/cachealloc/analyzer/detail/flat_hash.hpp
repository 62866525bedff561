// An open-addressing hash map from a 64-bit key to a 32-bit value, for the
// replay's address lookups. std::unordered_map costs a heap allocation per
// insert and a pointer chase per lookup; at 30M events/s we can afford
// neither. Linear probing over one array, backward-shift deletion (no
// tombstones, so lookups stay short after millions of insert/erase pairs).
// Memory: 16 bytes per slot, at most 4x the live entries after growth.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cachealloc::analyzer::detail {

class FlatHashMap {
 public:
  static constexpr std::uint32_t kMissing = 0xffffffffu;

  FlatHashMap() { rehash(16); }

  std::uint32_t find(std::uint64_t key) const noexcept {
    std::size_t slot = home(key);
    while (slots_[slot].value != kMissing) {
      if (slots_[slot].key == key) return slots_[slot].value;
      slot = (slot + 1) & mask_;
    }
    return kMissing;
  }

  // Inserts or overwrites.
  void insert(std::uint64_t key, std::uint32_t value) {
    // At most half full: erase's backward shift walks the whole probe run,
    // and runs grow quickly past 1/2 (16 bytes a slot; live blocks are few).
    if ((size_ + 1) * 2 > capacity()) [[unlikely]]
      rehash(capacity() * 2);
    std::size_t slot = home(key);
    while (slots_[slot].value != kMissing) {
      if (slots_[slot].key == key) {
        slots_[slot].value = value;
        return;
      }
      slot = (slot + 1) & mask_;
    }
    slots_[slot] = Slot{key, value};
    ++size_;
  }

  // Returns false when `key` was absent.
  bool erase(std::uint64_t key) noexcept {
    std::size_t slot = home(key);
    while (true) {
      if (slots_[slot].value == kMissing) return false;
      if (slots_[slot].key == key) break;
      slot = (slot + 1) & mask_;
    }
    // Backward shift: pull later members of the probe run into the hole.
    std::size_t hole = slot;
    std::size_t next = (hole + 1) & mask_;
    while (slots_[next].value != kMissing) {
      const std::size_t ideal = home(slots_[next].key);
      // `next` may move into `hole` only when its ideal slot is not cyclically in (hole, next].
      const bool stays = ((next - ideal) & mask_) < ((next - hole) & mask_);
      if (!stays) {
        slots_[hole] = slots_[next];
        hole = next;
      }
      next = (next + 1) & mask_;
    }
    slots_[hole].value = kMissing;
    --size_;
    return true;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return slots_.size(); }

 private:
  std::size_t home(std::uint64_t key) const noexcept {
    // Fibonacci hashing: block addresses are multiples of 512, so the low bits
    // carry no information and must not pick the slot.
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
  }

  void rehash(std::size_t new_capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(new_capacity, Slot{});
    mask_ = new_capacity - 1;
    shift_ = 64;
    for (std::size_t c = new_capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.value != kMissing) insert(slot.key, slot.value);
    }
  }

  // Key and value side by side: a probe touches one cache line, not two.
  struct Slot {
    std::uint64_t key = 0;
    std::uint32_t value = kMissing;
  };
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

}  // namespace cachealloc::analyzer::detail
