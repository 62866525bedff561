// Live pointer -> block lookup, sharded by address so threads on different
// streams rarely meet on the same lock. Each shard is an open-addressing
// table with linear probing and backward-shift deletion: no allocation per
// insert, and about one cache line touched per lookup.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "spinlock.hpp"

namespace cachealloc::detail {

template <typename Value>
class PointerMap {
 public:
  PointerMap() {
    for (auto& shard : shards_) shard.slots.assign(kInitialSlots, Slot{});
  }

  void insert(std::uintptr_t key, Value* value) {
    Shard& shard = shard_for(key);
    std::lock_guard lock(shard.lock);
    if ((shard.size + 1) * 4 > shard.slots.size() * 3) grow(shard);
    place(shard.slots, key, value);
    ++shard.size;
  }

  Value* find(std::uintptr_t key) {
    Shard& shard = shard_for(key);
    std::lock_guard lock(shard.lock);
    const std::size_t mask = shard.slots.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (shard.slots[i].key == key) return shard.slots[i].value;
      if (shard.slots[i].key == 0) return nullptr;
    }
  }

  // Removes and returns the value, or nullptr when absent.
  Value* take(std::uintptr_t key) {
    Shard& shard = shard_for(key);
    std::lock_guard lock(shard.lock);
    auto& slots = shard.slots;
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
    --shard.size;
    return value;
  }

 private:
  // 1,024 shards: threads on different streams work on different blocks,
  // and those land on shards at random, so T threads share some shard with
  // probability about T^2 / (2 x kShards): 85% for 16 threads with 64
  // shards, about 11% with 1,024. Measured on the H200 (docs/PERFORMANCE.md,
  // "Threads on the H200 after session 7"), this did not change the
  // aggregate at 8 or 16 threads: the shard locks were not what makes every
  // thread slower there.
  static constexpr int kShardBits = 10;
  static constexpr std::size_t kShards = std::size_t{1} << kShardBits;
  static constexpr std::size_t kInitialSlots = 16;

  struct Slot {
    std::uintptr_t key = 0;
    Value* value = nullptr;
  };
  struct alignas(64) Shard {
    Spinlock lock;
    std::size_t size = 0;
    std::vector<Slot> slots;
  };

  static std::size_t hash(std::uintptr_t key) {
    // Blocks are 512-byte aligned: drop the zero bits, then mix.
    std::uint64_t x = key >> 9;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return static_cast<std::size_t>(x);
  }
  // The hash's top bits pick the shard (its low bits pick the slot): blocks
  // at the same offset of different 2 MiB segments share their low address
  // bits, and must not all land on one lock.
  Shard& shard_for(std::uintptr_t key) { return shards_[hash(key) >> (64 - kShardBits)]; }

  static void place(std::vector<Slot>& slots, std::uintptr_t key, Value* value) {
    const std::size_t mask = slots.size() - 1;
    std::size_t i = hash(key) & mask;
    while (slots[i].key != 0) i = (i + 1) & mask;
    slots[i] = Slot{key, value};
  }
  static void grow(Shard& shard) {
    std::vector<Slot> bigger(shard.slots.size() * 2);
    for (const Slot& slot : shard.slots)
      if (slot.key) place(bigger, slot.key, slot.value);
    shard.slots.swap(bigger);
  }

  std::array<Shard, kShards> shards_;
};

}  // namespace cachealloc::detail
