// The event columns: delta + varint coding of Snapshot::events
// (docs/FORMAT.md, "Events"). Private to the snapshot library.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot::detail {

// The event encoding encode_events() writes. It travels as EventColumns'
// class version (serialize.hpp): 1 until format version 1, 2 in format
// versions 2 to 5 (format version 3 writes encoding 2 once per block, the
// predictor starting afresh in each), 3 since format version 6 (no predictor
// maps: cheap to decode). decode_events() reads all three.
inline constexpr std::uint32_t kEventEncoding = 3;

// One byte stream per kind of field, so each stream stays homogeneous: the
// flags repeat the allocator's rhythm, the stack column holds small ids.
struct EventColumns {
  std::uint32_t encoding = kEventEncoding;  // not a column: how to read the columns
  std::uint64_t count = 0;
  std::vector<std::uint8_t> flags;    // one byte per event
  std::vector<std::uint8_t> context;  // only when the flags say thread/device/stream changed
  std::vector<std::uint8_t> time;     // varint time delta per event (v2: per event whose time changed)
  std::vector<std::uint8_t> address;  // varint address delta, when the address mode asks
  std::vector<std::uint8_t> detail;   // one byte per event not predicted from what came before
  std::vector<std::uint8_t> stack;    // varint stack ids, when the detail byte asks
  std::vector<std::uint8_t> size;     // varint sizes, when the detail byte asks
  std::vector<std::uint8_t> aux;      // varint aux values, when the detail byte asks

  friend bool operator==(const EventColumns&, const EventColumns&) = default;
};

// Writes encoding kEventEncoding. Never throws on a valid snapshot; fields out
// of the model's range (a kind above 13) are truncated, which validate()
// rejects before we get here.
EventColumns encode_events(std::span<const Event> events);
// The same in encoding 2 or 3 (tests and benchmarks: files as format
// versions 2 to 5 wrote them). Throws SnapshotError{inconsistent} for any
// other encoding.
EventColumns encode_events(std::span<const Event> events, std::uint32_t encoding);

// Reads encoding 1, 2 or 3 (columns.encoding). Throws SnapshotError{inconsistent}
// when the columns do not describe exactly `count` events, or name an
// encoding it does not know. Runs in O(count) time and memory, whatever the
// input.
std::vector<Event> decode_events(const EventColumns& columns);
// The cheap half of validate_events()' checks, done while decoding: the
// streaming reader's blocks of 65,536 events (3.5 MiB) outgrow the cache, so
// a separate pass over them cost a second read of every block from memory
// (6% of a streaming analysis). The decoder sets `flagged` when an
// event fails one of them (a kind past the last, a thread, stack or, for an
// annotation, string past its table); the caller then runs
// validate_events() over the block, for its messages. Encodings 1 and 2
// always set it.
struct EventScreen {
  std::uint64_t thread_limit = UINT64_MAX;  // the thread table's size, UINT64_MAX when it is empty
  std::uint64_t stack_limit = 0;            // the stack table's size
  std::uint64_t string_limit = 0;           // the string table's size, at most 2^32
  // The smallest device's allocation bound (invariants.hpp): a size, or the
  // bytes in an alloc's, free's, split's or merge's aux, above it is flagged,
  // as is a time past 2^62 ns or before the previous event's.
  std::uint64_t size_limit = UINT64_MAX;
  bool flagged = false;
};
// decode_events() into `out` (resized to the count), reusing its storage:
// the streaming reader decodes every block into one buffer. `screen`, when
// not null, is filled in as EventScreen says.
void decode_events_into(const EventColumns& columns, std::vector<Event>& out, EventScreen* screen = nullptr);

}  // namespace cachealloc::snapshot::detail
