// The pieces of format version 3 (docs/FORMAT.md, "Version 3") shared by the
// whole-file decoder (format.cpp) and the streaming reader (reader.cpp), so
// the two accept and reject exactly the same files; the event checks are in
// validate.cpp. Private to the snapshot library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cachealloc/snapshot/model.hpp"
#include "event_codec.hpp"

namespace cachealloc::snapshot::detail {

// Events per block as written. A block's columns and codec state start
// afresh, so one block decodes alone: 64 Ki events is about 250 KB of
// columns and 3.5 MiB of decoded events, and the reset costs under 0.1% in
// size (docs/FORMAT.md, "Version history").
inline constexpr std::uint32_t kBlockEvents = 65536;
// The largest block a reader accepts, so a hostile block size cannot make
// it decode a block into more memory than a few hundred MiB.
inline constexpr std::uint32_t kMaxBlockEvents = std::uint32_t{1} << 22;

inline constexpr std::size_t kFramingSize = 24;

[[noreturn]] void inconsistent(const std::string& what);
[[noreturn]] void truncated(const std::string& what);

// Checks the framing. `prefix` is the first min(24, total_size) bytes of the
// input and `total_size` its length; returns the format version. Throws as
// decode() documents: truncated, not_a_snapshot, newer_version, inconsistent.
std::uint32_t check_framing(std::span<const std::byte> prefix, std::uint64_t total_size);

std::uint64_t read_u64(std::span<const std::byte> bytes, std::size_t offset);
std::uint32_t read_u32(std::span<const std::byte> bytes, std::size_t offset);

// The head section: everything but the events. `file_offset` only makes
// messages point at the right byte. Throws inconsistent unless the bytes
// hold exactly one SnapshotHead.
Snapshot decode_head(std::span<const std::byte> head, std::size_t file_offset);

// The event section's fixed part, after the head.
struct EventSectionHeader {
  std::uint64_t event_count = 0;
  std::uint32_t block_events = 0;  // events in every block but the last
  std::uint64_t block_count() const noexcept {
    return event_count == 0 ? 0 : (event_count + block_events - 1) / block_events;
  }
  std::uint64_t events_in_block(std::uint64_t block) const noexcept {
    const std::uint64_t first = block * block_events;
    return event_count - first < block_events ? event_count - first : block_events;
  }
};
inline constexpr std::size_t kEventSectionHeaderSize = 12;
inline constexpr std::size_t kBlockHeaderSize = 8;
// `bytes` holds the 12 header bytes; `remaining` counts the bytes after them.
EventSectionHeader parse_event_section_header(std::span<const std::byte> bytes, std::uint64_t remaining);

// Decodes block `block` (its columns, without the 8-byte size before them)
// into `out`, reusing `columns` and `out`'s storage. Throws inconsistent when
// the bytes are not exactly one EventColumns of `expected_events` events.
// `screen`: as decode_events_into.
void decode_block(std::span<const std::byte> bytes, std::size_t file_offset, std::uint64_t block,
                  std::uint64_t expected_events, EventColumns& columns, std::vector<Event>& out,
                  EventScreen* screen = nullptr);
// An EventScreen for `tables`' thread and stack tables.
EventScreen event_screen(const Snapshot& tables);

// validate()'s checks of events, against the tables of `tables` (its own
// events are ignored); `first_index` numbers the events in messages.
void validate_events(const Snapshot& tables, std::span<const Event> events, std::uint64_t first_index);

}  // namespace cachealloc::snapshot::detail
