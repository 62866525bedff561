// The recorder's in-memory event records: what the hot path writes into a
// thread's staging chunk and the ring holds, decoded into snapshot::Event
// only at dump time. Private to the recorder library.
//
// A chunk is an array of 64-bit words holding variable-length records.
// Every record starts with a header word:
//
//   bits 0-4   record kind: an EventKind (0-15), or one of the compounds
//              below (16, 17), or a stream record (18)
//   bit 5      a thread word follows the record's fields (annotation chunk)
//   bit 6      a stack word follows the record's fields
//   bits 8-63  time in ticks relative to Chunk::base_ticks, signed
//
//   event          header, address, size, aux [, stack] [, thread]   4-6 words
//   split_alloc    header, address, size, split's aux (the remainder),
//                  alloc's aux (requested bytes) [, alloc's stack]   5-6 words
//                  = a split and the alloc of its front part, one call
//   free           header, address, size, aux [, stack]              4-5 words
//                  = free_requested and free_completed of one block,
//                  one call (the stack, if any, is free_requested's)
//   stream         header, stream handle                             2 words
//                  the stream of every later record in the chunk
//
// A cached alloc+free pair (split, alloc, free_requested, free_completed,
// merge) is thus 13 words, 104 bytes, against 5 x 56 bytes as
// snapshot::Event: the ring's copy and its memory traffic are 2.7x smaller,
// and a ring of the same memory holds more events (the dump keeps
// max_entries). Both halves of a compound carry the header's time.
#pragma once

#include <cstdint>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::detail {

static_assert(snapshot::kEventKindCount <= 16, "record tags 16-18 follow the event kinds");

enum RecordTag : std::uint64_t {
  kRecordSplitAlloc = 16,  // past the event kinds (at most 16: a kind is 4 bits on disk)
  kRecordFree = 17,
  kRecordStream = 18,
  kRecordKindMask = 0x1f,
  kRecordHasThread = 1u << 5,
  kRecordHasStack = 1u << 6,
  kRecordTagMask = 0xff,
};

// The longest record, a stream record before it included: a chunk with
// fewer free words is flushed before the next event (on_event).
inline constexpr std::uint32_t kMaxRecordWords = 2 + 6;
// Most events, and most words with a stream record, of one on_events call
// written at once (the allocator's batches: a free's two halves and two
// merges); a chunk with fewer free words is flushed first. A longer batch
// is recorded event by event.
inline constexpr std::uint32_t kMaxBatchEvents = 4;
inline constexpr std::uint32_t kMaxBatchWords = 2 + 6 * kMaxBatchEvents;
static_assert(kMaxBatchWords >= kMaxRecordWords);
// Most words one event takes (a stream record and a 5-word event): a full
// chunk holds at least (kWords - kMaxRecordWords + 1) / this many events.
inline constexpr std::uint32_t kMaxWordsPerEvent = 7;

// Times within a chunk are 56-bit signed offsets from its base.
inline bool offset_fits(std::uint64_t ticks, std::uint64_t base) noexcept {
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(ticks - base) + (std::int64_t{1} << 55)) <
         (std::uint64_t{1} << 56);
}
inline std::uint64_t record_header(std::uint64_t tag, std::uint64_t ticks, std::uint64_t base) noexcept {
  return ((ticks - base) << 8) | tag;
}

// Appends the events of `count` words of records to `out`, with `device`
// and, where a record has no thread word, `thread`; only those at or after
// `from_ticks`.
void decode_records(const std::uint64_t* words, std::uint32_t count, std::uint64_t base_ticks, std::int32_t device,
                    std::uint32_t thread, std::vector<snapshot::Event>& out, std::uint64_t from_ticks = 0);
// Appends the time of each event of the records to `out` (a compound's
// twice), for choosing which to decode.
void record_times(const std::uint64_t* words, std::uint32_t count, std::uint64_t base_ticks,
                  std::vector<std::uint64_t>& out);

}  // namespace cachealloc::detail
