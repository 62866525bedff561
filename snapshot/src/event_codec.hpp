// The event columns: delta + varint coding of Snapshot::events
// (docs/FORMAT.md, "Events"). Private to the snapshot library.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot::detail {

// One byte stream per kind of field, so each stream stays homogeneous: the
// flags repeat the allocator's rhythm, the stack column holds small ids.
struct EventColumns {
  std::uint64_t count = 0;
  std::vector<std::uint8_t> flags;    // one byte per event
  std::vector<std::uint8_t> context;  // only when the flags say thread/device/stream changed
  std::vector<std::uint8_t> time;     // varint time delta per event
  std::vector<std::uint8_t> address;  // varint address delta, when the address mode asks
  std::vector<std::uint8_t> detail;   // one byte per event not predicted from its live block
  std::vector<std::uint8_t> stack;    // varint stack ids, when the detail byte asks
  std::vector<std::uint8_t> size;     // varint sizes, when the detail byte asks
  std::vector<std::uint8_t> aux;      // varint aux values, when the detail byte asks

  friend bool operator==(const EventColumns&, const EventColumns&) = default;
};

// Never throws on a valid snapshot; fields out of the model's range (a kind
// above 15) are truncated, which validate() rejects before we get here.
EventColumns encode_events(std::span<const Event> events);

// Throws SnapshotError{inconsistent} when the columns do not describe exactly
// `count` events. Runs in O(count) time and memory, whatever the input.
std::vector<Event> decode_events(const EventColumns& columns);

}  // namespace cachealloc::snapshot::detail
