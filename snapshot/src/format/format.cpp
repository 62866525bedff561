// The snapshot format's bytes: the framing, encode() and decode() of a
// whole snapshot, and the pieces of version 3 that the streaming reader
// shares (format_v3.hpp).
#include "cachealloc/snapshot/format.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "cachealloc/snapshot/ring_start.hpp"

#include "archive.hpp"
#include "format_v3.hpp"
#include "huge_pages.hpp"
#include "serialize.hpp"
#include "stream_format.hpp"

namespace cachealloc::snapshot {
namespace {

// The framing (docs/FORMAT.md, "Framing"). 0x89 is not ASCII, so a text
// tool that strips the high bit breaks the magic; '\n' catches newline
// translation.
constexpr std::array<std::byte, 8> kMagic = {std::byte{0x89}, std::byte{'C'}, std::byte{'A'}, std::byte{'S'},
                                              std::byte{'N'},  std::byte{'A'}, std::byte{'P'}, std::byte{'\n'}};
constexpr std::size_t kVersionOffset = 8;
constexpr std::size_t kReservedOffset = 12;
constexpr std::size_t kBodySizeOffset = 16;
using detail::inconsistent;
using detail::kFramingSize;
using detail::truncated;

template <class T>
void put_le(std::vector<std::byte>& out, std::size_t offset, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
  }
}
template <class T>
T get_le(std::span<const std::byte> bytes, std::size_t offset) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(std::to_integer<T>(bytes[offset + i]) << (8 * i));
  return value;
}

// --- versions ------------------------------------------------------------

// Appends `value` little-endian.
template <class T>
void append_le(std::vector<std::byte>& out, T value) {
  out.resize(out.size() + sizeof(T));
  put_le<T>(out, out.size() - sizeof(T), value);
}

// Version 3: the head, then the events in blocks (docs/FORMAT.md).
Snapshot decode_version3(std::span<const std::byte> body) {
  std::size_t at = 0;
  auto file_offset = [&] { return kFramingSize + at; };
  if (body.size() < 8) inconsistent("the body ends inside the head size");
  const std::uint64_t head_size = detail::read_u64(body, at);
  at += 8;
  if (head_size > body.size() - at) {
    inconsistent("a head of " + std::to_string(head_size) + " bytes at offset " + std::to_string(file_offset()) +
                 " exceeds the " + std::to_string(body.size() - at) + " bytes left");
  }
  Snapshot snapshot = detail::decode_head(body.subspan(at, head_size), file_offset());
  at += head_size;
  if (body.size() - at < detail::kEventSectionHeaderSize) inconsistent("the body ends inside the event section header");
  const detail::EventSectionHeader events =
      detail::parse_event_section_header(body.subspan(at, detail::kEventSectionHeaderSize),
                                         body.size() - at - detail::kEventSectionHeaderSize);
  at += detail::kEventSectionHeaderSize;
  // parse_event_section_header bounded event_count by the bytes left.
  detail::reserve_with_huge_pages(snapshot.events, events.event_count);
  detail::EventColumns columns;
  std::vector<Event> block_events;
  for (std::uint64_t block = 0; block < events.block_count(); ++block) {
    if (body.size() - at < detail::kBlockHeaderSize) inconsistent("the body ends before block " + std::to_string(block));
    const std::uint64_t size = detail::read_u64(body, at);
    at += detail::kBlockHeaderSize;
    if (size > body.size() - at) {
      inconsistent("block " + std::to_string(block) + " of " + std::to_string(size) + " bytes at offset " +
                   std::to_string(file_offset()) + " exceeds the " + std::to_string(body.size() - at) +
                   " bytes left");
    }
    detail::decode_block(body.subspan(at, size), file_offset(), block, events.events_in_block(block), columns,
                         block_events);
    snapshot.events.insert(snapshot.events.end(), block_events.begin(), block_events.end());
    at += size;
  }
  if (at != body.size()) inconsistent(std::to_string(body.size() - at) + " unread bytes at the end of the body");
  return snapshot;
}

// Version 7: the chunks, read through the walk the streaming reader uses.
class BodySource final : public detail::ByteSource {
 public:
  explicit BodySource(std::span<const std::byte> body) : body_(body) {}
  std::uint64_t size() const override { return kFramingSize + body_.size(); }
  void read(void* data, std::size_t size, std::uint64_t offset) override {
    if (size == 0) return;  // an empty chunk's buffer may be null (memcpy's arguments never may)
    std::memcpy(data, body_.data() + (offset - kFramingSize), size);
  }

 private:
  std::span<const std::byte> body_;
};

Snapshot decode_stream(std::span<const std::byte> body) {
  BodySource source(body);
  detail::StreamIndex index = detail::index_stream(source);
  Snapshot snapshot = std::move(index.head);
  detail::reserve_with_huge_pages(snapshot.events, index.event_count);
  detail::ChunkBuffers buffers;
  std::vector<Event> block;
  for (std::size_t i = 0; i < index.chunks.size(); ++i) {
    detail::read_events_chunk(source, index.chunks[i], i, snapshot, buffers, block);
    snapshot.events.insert(snapshot.events.end(), block.begin(), block.end());
  }
  return snapshot;
}

// One branch per top-level body layout this reader understands. A per-type
// change is handled by that type's cereal class version instead
// (serialize.hpp): version 2 changed only the event encoding, which travels
// as EventColumns' class version, so it shares version 1's branch.
Snapshot decode_body(std::uint32_t version, std::span<const std::byte> body) {
  Snapshot snapshot;
  switch (version) {
    case 1:
    case 2: {
      detail::BoundedInputArchive archive(body, kFramingSize);
      try {
        archive(snapshot);
      } catch (const cereal::Exception& error) {
        inconsistent(error.what());
      }
      if (archive.remaining() != 0) {
        inconsistent(std::to_string(archive.remaining()) + " unread bytes at the end of the body");
      }
      break;
    }
    // Version 4 only adds the ring start to the head, which SnapshotHead's
    // class version tells decode_head().
    case 3:
    case 4:
    // Version 5 only adds NVML's readings to DeviceInfo (its class version).
    case 5:
    // Version 6 only changes the event encoding (EventColumns' class version).
    case 6: snapshot = decode_version3(body); break;
    // Version 7: a streamed recording, a chain of chunks (stream_format.hpp).
    case 7: snapshot = decode_stream(body); break;
    default: inconsistent("format version " + std::to_string(version) + " does not exist");
  }
  snapshot.header.format_version = version;
  return snapshot;
}

// Writes a u64 placeholder, runs `write`, then stores the bytes it appended
// in the placeholder.
template <class Write>
void sized_section(std::vector<std::byte>& out, Write&& write) {
  const std::size_t size_at = out.size();
  append_le<std::uint64_t>(out, 0);
  write();
  put_le<std::uint64_t>(out, size_at, out.size() - size_at - 8);
}

// Version 5's layout is version 6's but for the event encoding.
std::vector<std::byte> encode_framed(const Snapshot& snapshot, std::uint32_t version = kWholeFormatVersion) {
  if (version != kWholeFormatVersion && version != 5) {
    inconsistent("format version " + std::to_string(version) + " cannot be written");
  }
  const std::uint32_t encoding = version == 5 ? 2 : detail::kEventEncoding;
  std::vector<std::byte> out(kFramingSize);
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  put_le<std::uint32_t>(out, kVersionOffset, version);
  put_le<std::uint32_t>(out, kReservedOffset, 0);
  sized_section(out, [&] {
    // Saving only reads through the pointer.
    detail::SnapshotHead head{const_cast<Snapshot*>(&snapshot)};
    // Derived here, once, so every writer (the recorder's dump, convert)
    // stores it; one backward pass over the events in memory per device.
    std::vector<RingStart> derived;
    if (snapshot.ring_start.empty() && snapshot.dropped_events > 0) {
      derived = derive_ring_starts(snapshot);
      head.ring_start = &derived;
    }
    detail::LittleEndianOutputArchive archive(out);
    archive(head);
  });
  const std::span<const Event> events(snapshot.events);
  append_le<std::uint64_t>(out, events.size());
  append_le<std::uint32_t>(out, detail::kBlockEvents);
  for (std::size_t first = 0; first < events.size(); first += detail::kBlockEvents) {
    const std::size_t count = std::min<std::size_t>(detail::kBlockEvents, events.size() - first);
    sized_section(out, [&] {
      // A fresh archive per block: each block carries EventColumns' class
      // version and decodes alone.
      const std::size_t class_version_at = out.size();
      detail::LittleEndianOutputArchive archive(out);
      archive(detail::encode_events(events.subspan(first, count), encoding));
      // The archive opens with EventColumns' class version (u32), which
      // names the encoding: the older one is written by hand.
      if (encoding != detail::kEventEncoding) put_le<std::uint32_t>(out, class_version_at, encoding);
    });
  }
  put_le<std::uint64_t>(out, kBodySizeOffset, out.size() - kFramingSize);
  return out;
}

}  // namespace

std::vector<std::byte> encode(const Snapshot& snapshot) {
  validate(snapshot);
  return encode_framed(snapshot);
}

std::vector<std::byte> detail::encode_unvalidated(const Snapshot& snapshot) { return encode_framed(snapshot); }

std::vector<std::byte> detail::encode_as_version(const Snapshot& snapshot, std::uint32_t format_version) {
  validate(snapshot);
  return encode_framed(snapshot, format_version);
}

bool has_snapshot_magic(std::span<const std::byte> bytes) noexcept {
  return bytes.size() >= kMagic.size() && std::equal(kMagic.begin(), kMagic.end(), bytes.begin());
}

std::uint32_t detail::check_framing(std::span<const std::byte> bytes, std::uint64_t total_size) {
  if (total_size == 0) truncated("the input is empty");
  const std::size_t magic_bytes = std::min(bytes.size(), kMagic.size());
  if (!std::equal(kMagic.begin(), kMagic.begin() + static_cast<std::ptrdiff_t>(magic_bytes), bytes.begin())) {
    throw SnapshotError(ErrorCode::not_a_snapshot, "not a cachealloc snapshot");
  }
  if (bytes.size() < kReservedOffset) truncated("the input ends inside the magic and version");
  const auto version = get_le<std::uint32_t>(bytes, kVersionOffset);
  // Checked before anything else a newer writer may have changed.
  if (version > kFormatVersion) {
    throw SnapshotError(ErrorCode::newer_version, "snapshot format version " + std::to_string(version) +
                                                      " is newer than this reader supports (" +
                                                      std::to_string(kFormatVersion) + "); upgrade cachealloc");
  }
  if (bytes.size() < kFramingSize) {
    truncated(std::to_string(total_size) + " bytes is shorter than the " + std::to_string(kFramingSize) +
              "-byte header");
  }
  if (const auto reserved = get_le<std::uint32_t>(bytes, kReservedOffset); reserved != 0) {
    inconsistent("reserved header field is " + std::to_string(reserved) + ", not 0");
  }
  const auto body_size = get_le<std::uint64_t>(bytes, kBodySizeOffset);
  // A streamed file's writer cannot know its size: its chunks end it.
  if (version == kStreamFormatVersion) {
    if (body_size != detail::kStreamedBodySize) {
      inconsistent("a streamed snapshot announces a body of " + std::to_string(body_size) + " bytes, not 2^64 - 1");
    }
    return version;
  }
  const std::uint64_t present = total_size - kFramingSize;
  if (body_size > present) {
    truncated("the header announces a body of " + std::to_string(body_size) + " bytes but only " +
              std::to_string(present) + " follow");
  }
  if (body_size < present) {
    inconsistent(std::to_string(present - body_size) + " bytes follow the " + std::to_string(body_size) +
                 "-byte body the header announces");
  }
  return version;
}

Snapshot decode(std::span<const std::byte> bytes) {
  const std::uint32_t version =
      detail::check_framing(bytes.first(std::min(bytes.size(), kFramingSize)), bytes.size());
  Snapshot snapshot = decode_body(version, bytes.subspan(kFramingSize));
  validate(snapshot);
  return snapshot;
}

Snapshot detail::decode_unvalidated(std::span<const std::byte> bytes) {
  const std::uint32_t version =
      detail::check_framing(bytes.first(std::min(bytes.size(), kFramingSize)), bytes.size());
  return decode_body(version, bytes.subspan(kFramingSize));
}

// --- version 3 pieces (format_v3.hpp) --------------------------------------

void detail::inconsistent(const std::string& what) {
  throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: " + what);
}
void detail::truncated(const std::string& what) {
  throw SnapshotError(ErrorCode::truncated, "truncated snapshot: " + what);
}

std::uint64_t detail::read_u64(std::span<const std::byte> bytes, std::size_t offset) {
  return get_le<std::uint64_t>(bytes, offset);
}
std::uint32_t detail::read_u32(std::span<const std::byte> bytes, std::size_t offset) {
  return get_le<std::uint32_t>(bytes, offset);
}

Snapshot detail::decode_head(std::span<const std::byte> bytes, std::size_t file_offset) {
  Snapshot snapshot;
  BoundedInputArchive archive(bytes, file_offset);
  SnapshotHead head{&snapshot};
  try {
    archive(head);
  } catch (const cereal::Exception& error) {
    inconsistent(error.what());
  }
  if (archive.remaining() != 0) {
    inconsistent(std::to_string(archive.remaining()) + " unread bytes at the end of the head");
  }
  return snapshot;
}

detail::EventSectionHeader detail::parse_event_section_header(std::span<const std::byte> bytes,
                                                              std::uint64_t remaining) {
  EventSectionHeader header{read_u64(bytes, 0), read_u32(bytes, 8)};
  // Every event takes at least its flag byte: this bounds what a reader
  // reserves for the events by the size of the input.
  if (header.event_count > remaining) {
    inconsistent(std::to_string(header.event_count) + " events declared but only " + std::to_string(remaining) +
                 " bytes follow");
  }
  if (header.event_count != 0 && (header.block_events == 0 || header.block_events > kMaxBlockEvents)) {
    inconsistent("blocks of " + std::to_string(header.block_events) + " events; a reader takes 1 to " +
                 std::to_string(kMaxBlockEvents));
  }
  return header;
}

void detail::decode_block(std::span<const std::byte> bytes, std::size_t file_offset, std::uint64_t block,
                          std::uint64_t expected_events, EventColumns& columns, std::vector<Event>& out,
                          EventScreen* screen) {
  BoundedInputArchive archive(bytes, file_offset);
  try {
    archive(columns);
  } catch (const cereal::Exception& error) {
    inconsistent(error.what());
  }
  if (archive.remaining() != 0) {
    inconsistent(std::to_string(archive.remaining()) + " unread bytes at the end of block " + std::to_string(block));
  }
  decode_events_into(columns, out, screen);  // checks the count against the columns first
  if (columns.count != expected_events) {
    inconsistent("block " + std::to_string(block) + " holds " + std::to_string(columns.count) + " events, " +
                 std::to_string(expected_events) + " expected");
  }
}

}  // namespace cachealloc::snapshot
