// Live pointer -> block lookup of one shard, under that shard's lock: an
// open-addressing table with linear probing and backward-shift deletion, so
// no allocation per insert and about one cache line touched per lookup.
// Each shard has its own (a free finds the shard through SegmentIndex), so a
// thread on one stream never touches another stream's table.
//
// At most an eighth of the slots are used: 128 bytes per live block. At up
// to three quarters, a take (the probe, then the backward shift, which walks
// to the end of the cluster) costs 81 instructions and 2.6 mispredicted
// branches in the mixed workload (callgrind's branch simulation), and the
// workload's step 150 ns on a 2-core x86 machine; at a quarter, 43
// instructions, 1.3 mispredictions and 133 ns; at an eighth, 128 ns, and
// 118 ns with the large pool binned (docs/PERFORMANCE.md, "On a 2-core x86
// machine").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cachealloc::detail {

template <typename Value>
class PointerMap {
 public:
  PointerMap() : slots_(kInitialSlots) {}

  void insert(std::uintptr_t key, Value* value) {
    if ((size_ + 1) * kSlotsPerEntry > slots_.size()) grow();
    place(slots_, key, value);
    ++size_;
  }

  Value* find(std::uintptr_t key) const noexcept {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  // Removes and returns the value, or nullptr when absent.
  Value* take(std::uintptr_t key) noexcept {
    auto& slots = slots_;
    const std::size_t mask = slots.size() - 1;
    std::size_t i = hash(key) & mask;
    for (;; i = (i + 1) & mask) {
      if (slots[i].key == key) break;
      if (slots[i].key == 0) return nullptr;
    }
    Value* value = slots[i].value;
    // Backward-shift deletion keeps probe chains intact without tombstones.
    for (std::size_t j = (i + 1) & mask; slots[j].key != 0; j = (j + 1) & mask) {
      const std::size_t home = hash(slots[j].key) & mask;
      // Movable when the hole at i lies on j's probe path from its home.
      if (((j - home) & mask) >= ((j - i) & mask)) {
        slots[i] = slots[j];
        i = j;
      }
    }
    slots[i] = Slot{};
    --size_;
    return value;
  }

  std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::size_t kInitialSlots = 16;
  static constexpr std::size_t kSlotsPerEntry = 8;

  struct Slot {
    std::uintptr_t key = 0;
    Value* value = nullptr;
  };

  static std::size_t hash(std::uintptr_t key) noexcept {
    // Blocks are 512-byte aligned: drop the zero bits, then mix.
    std::uint64_t x = key >> 9;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return static_cast<std::size_t>(x);
  }

  static void place(std::vector<Slot>& slots, std::uintptr_t key, Value* value) {
    const std::size_t mask = slots.size() - 1;
    std::size_t i = hash(key) & mask;
    while (slots[i].key != 0) i = (i + 1) & mask;
    slots[i] = Slot{key, value};
  }
  void grow() {
    std::vector<Slot> bigger(slots_.size() * 2);
    for (const Slot& slot : slots_)
      if (slot.key) place(bigger, slot.key, slot.value);
    slots_.swap(bigger);
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace cachealloc::detail
