// An open-addressing hash map from a 64-bit key to a small value: the event
// encodings (event_encoding2.cpp, event_encoding3.cpp), the ring-start
// derivation (ring_start.cpp) and the analyzer's replay (analyzer/detail/flat_hash.hpp)
// all use it. An implementation detail of the libraries, not an API.
//
// Why not std::unordered_map: it costs a node allocation per insert, a free
// per erase and a pointer chase and an integer division per lookup, which
// was over half of the decoder's time. Here: linear probing over one array
// of {key, value} slots, Fibonacci hashing (addresses are multiples of 512,
// so the low bits must not pick the slot), backward-shift deletion (no
// tombstones, so probe runs stay short after millions of insert/erase
// pairs). One key value (kEmptyKey) marks empty slots; the map keeps an
// entry under that key aside, so every 64-bit key works.
//
// Memory: a slot per entry over a load of at most MaxLoadPercent (3/4 by
// default; the replay, which erases as often as it inserts, keeps 1/2, since
// an erase's backward shift walks the whole probe run and runs grow quickly
// past half full), so at most 2 x 100/MaxLoadPercent x sizeof(Slot) x (live
// entries), and the table only grows with inserts: bounded by the number of
// inserts. Pointers and references into the map stay valid until the next
// insert or erase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cachealloc::snapshot::detail {

template <class Value, unsigned MaxLoadPercent = 75>
class FlatMap {
  static_assert(MaxLoadPercent > 0 && MaxLoadPercent < 100);

 public:
  FlatMap() { rehash(kInitialCapacity); }

  const Value* find(std::uint64_t key) const noexcept {
    if (key == kEmptyKey) [[unlikely]]
      return has_empty_key_ ? &empty_key_value_ : nullptr;
    std::size_t slot = home(key);
    while (true) {
      const Slot& at = slots_[slot];
      if (at.key == key) return &at.value;
      if (at.key == kEmptyKey) return nullptr;
      slot = (slot + 1) & mask_;
    }
  }

  // The value of `key`, inserted as Value{} when absent.
  Value& find_or_insert(std::uint64_t key) {
    if (key == kEmptyKey) [[unlikely]] {
      if (!has_empty_key_) empty_key_value_ = Value{};
      has_empty_key_ = true;
      return empty_key_value_;
    }
    if (full()) [[unlikely]]
      rehash(slots_.size() * 2);
    std::size_t slot = home(key);
    while (true) {
      Slot& at = slots_[slot];
      if (at.key == key) return at.value;
      if (at.key == kEmptyKey) {
        at.key = key;
        at.value = Value{};
        ++size_;
        return at.value;
      }
      slot = (slot + 1) & mask_;
    }
  }

  // Inserts or overwrites.
  void insert(std::uint64_t key, const Value& value) {
    if (key == kEmptyKey) [[unlikely]] {
      has_empty_key_ = true;
      empty_key_value_ = value;
      return;
    }
    if (full()) [[unlikely]]
      rehash(slots_.size() * 2);
    std::size_t slot = home(key);
    while (true) {
      Slot& at = slots_[slot];
      if (at.key == key) {
        at.value = value;
        return;
      }
      if (at.key == kEmptyKey) {
        at.key = key;
        at.value = value;
        ++size_;
        return;
      }
      slot = (slot + 1) & mask_;
    }
  }

  std::size_t size() const noexcept { return size_ + (has_empty_key_ ? 1 : 0); }

  // Returns false when `key` was absent.
  bool erase(std::uint64_t key) noexcept {
    if (key == kEmptyKey) [[unlikely]] {
      const bool had = has_empty_key_;
      has_empty_key_ = false;
      return had;
    }
    std::size_t hole = home(key);
    while (true) {
      if (slots_[hole].key == kEmptyKey) return false;
      if (slots_[hole].key == key) break;
      hole = (hole + 1) & mask_;
    }
    // Backward shift: pull later members of the probe run into the hole,
    // each only if its home slot is not cyclically in (hole, next].
    std::size_t next = (hole + 1) & mask_;
    while (slots_[next].key != kEmptyKey) {
      const std::size_t ideal = home(slots_[next].key);
      if (((next - ideal) & mask_) >= ((next - hole) & mask_)) {
        slots_[hole] = slots_[next];
        hole = next;
      }
      next = (next + 1) & mask_;
    }
    slots_[hole].key = kEmptyKey;
    --size_;
    return true;
  }

 private:
  static constexpr std::uint64_t kEmptyKey = ~std::uint64_t{0};
  static constexpr std::size_t kInitialCapacity = 64;

  struct Slot {
    std::uint64_t key = kEmptyKey;
    Value value{};
  };

  bool full() const noexcept { return (size_ + 1) * 100 > slots_.size() * MaxLoadPercent; }

  std::size_t home(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
  }

  void rehash(std::size_t capacity) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.key != kEmptyKey) insert(slot.key, slot.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
  bool has_empty_key_ = false;
  Value empty_key_value_{};
};

}  // namespace cachealloc::snapshot::detail
