// Format version 7's chunks: the header, the walk over the chain, reading an
// events chunk, and the layout rebuilt from the events of a stream that
// lost its trailer (stream_format.hpp).
#include "stream_format.hpp"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <optional>

#include "archive.hpp"
#include "format_v3.hpp"
#include "serialize.hpp"

namespace cachealloc::snapshot::detail {
namespace {

template <class T>
void put(std::vector<std::byte>& out, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out[at + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

std::uint32_t crc_of(std::span<const std::byte> header28, std::span<const std::byte> stored) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  crc = ::crc32(crc, reinterpret_cast<const Bytef*>(header28.data()), static_cast<uInt>(header28.size()));
  // zlib's length is 32 bits: feed large payloads in pieces.
  for (std::size_t at = 0; at < stored.size();) {
    const std::size_t piece = std::min<std::size_t>(stored.size() - at, std::size_t{1} << 30);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(stored.data() + at), static_cast<uInt>(piece));
    at += piece;
  }
  return static_cast<std::uint32_t>(crc);
}

ChunkHeader parse_header(std::span<const std::byte> bytes) {
  ChunkHeader h;
  h.kind = static_cast<ChunkKind>(read_u32(bytes, 0));
  h.events = read_u32(bytes, 4);
  h.stored_size = read_u64(bytes, 8);
  h.raw_size = read_u64(bytes, 16);
  h.sequence = read_u32(bytes, 24);
  h.crc = read_u32(bytes, 28);
  return h;
}

std::string chunk_name(std::uint32_t sequence, std::uint64_t offset) {
  return "chunk " + std::to_string(sequence) + " at offset " + std::to_string(offset);
}

// Reads a chunk's stored bytes and checks them; false on a checksum mismatch.
bool read_stored(ByteSource& source, std::uint64_t offset, const ChunkHeader& header,
                 std::span<const std::byte> header_bytes, std::vector<std::byte>& stored) {
  stored.resize(header.stored_size);
  source.read(stored.data(), stored.size(), offset + kChunkHeaderSize);
  return crc_of(header_bytes.first(28), stored) == header.crc;
}

// Whether the bytes of a chunk that ends past the end of the file hold its
// whole zstd frame: a chunk a kill cut short never does (the frame is all of
// its stored bytes), so its header's size lies.
std::optional<std::size_t> complete_frame_in_cut_chunk(ByteSource& source, std::uint64_t offset,
                                                       std::vector<std::byte>& present) {
  present.resize(source.size() - offset - kChunkHeaderSize);
  source.read(present.data(), present.size(), offset + kChunkHeaderSize);
  const std::size_t frame = ZSTD_findFrameCompressedSize(present.data(), present.size());
  if (ZSTD_isError(frame)) return std::nullopt;
  return frame;
}

void decompress(void* context, const std::vector<std::byte>& stored, const ChunkHeader& header,
                std::vector<std::byte>& raw, const std::string& where) {
  // The frame's own content size (the writer always stores it) is checked
  // before anything is allocated: a header that lies about raw_size would
  // otherwise cost up to kMaxChunkRawSize of memory for a few bytes of file.
  const unsigned long long declared = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) inconsistent(where + " does not decompress: not a zstd frame");
  if (declared == ZSTD_CONTENTSIZE_UNKNOWN) inconsistent(where + "'s zstd frame does not state its content size");
  if (declared != header.raw_size) {
    inconsistent(where + " holds " + std::to_string(declared) + " bytes, " + std::to_string(header.raw_size) +
                 " announced");
  }
  raw.resize(header.raw_size);
  const std::size_t got = ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(context), raw.data(), raw.size(),
                                              stored.data(), stored.size());
  if (ZSTD_isError(got)) inconsistent(where + " does not decompress: " + ZSTD_getErrorName(got));
  if (got != raw.size()) {
    inconsistent(where + " holds " + std::to_string(got) + " bytes, " + std::to_string(raw.size()) + " announced");
  }
}

template <class Archive>
void serialize_tables(Archive& ar, TableAppend& t) {
  ar(t.first_string, t.strings, t.first_frame, t.frames, t.first_stack, t.stacks, t.first_thread, t.threads);
}

void append_tables_to(Snapshot& tables, TableAppend&& append, const std::string& where) {
  auto check = [&](std::uint64_t first, std::size_t size, const char* table) {
    if (first != size) {
      inconsistent(where + " appends to the " + table + " table at " + std::to_string(first) + ", which holds " +
                   std::to_string(size));
    }
  };
  check(append.first_string, tables.strings.size(), "string");
  check(append.first_frame, tables.frames.size(), "frame");
  check(append.first_stack, tables.stacks.size(), "stack");
  check(append.first_thread, tables.threads.size(), "thread");
  std::move(append.strings.begin(), append.strings.end(), std::back_inserter(tables.strings));
  tables.frames.insert(tables.frames.end(), append.frames.begin(), append.frames.end());
  std::move(append.stacks.begin(), append.stacks.end(), std::back_inserter(tables.stacks));
  tables.threads.insert(tables.threads.end(), append.threads.begin(), append.threads.end());
}

}  // namespace

std::vector<std::byte> chunk_header_bytes(const ChunkHeader& header, std::span<const std::byte> stored) {
  std::vector<std::byte> out(kChunkHeaderSize);
  put<std::uint32_t>(out, 0, static_cast<std::uint32_t>(header.kind));
  put<std::uint32_t>(out, 4, header.events);
  put<std::uint64_t>(out, 8, header.stored_size);
  put<std::uint64_t>(out, 16, header.raw_size);
  put<std::uint32_t>(out, 24, header.sequence);
  put<std::uint32_t>(out, 28, crc_of(std::span<const std::byte>(out).first(28), stored));
  return out;
}

std::vector<std::byte> encode_table_append(const TableAppend& tables) {
  std::vector<std::byte> out;
  LittleEndianOutputArchive archive(out);
  serialize_tables(archive, const_cast<TableAppend&>(tables));  // saving only reads
  return out;
}

ChunkBuffers::ChunkBuffers() : decompressor(ZSTD_createDCtx()) {
  if (decompressor == nullptr) throw std::bad_alloc();
}
ChunkBuffers::~ChunkBuffers() { ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(decompressor)); }

StreamIndex index_stream(ByteSource& source) {
  StreamIndex index;
  Snapshot tables;
  std::optional<Snapshot> start;
  ChunkBuffers buffers;
  const std::uint64_t size = source.size();
  std::uint64_t at = kFramingSize;
  std::uint32_t sequence = 0;
  std::string tail;  // why the walk stopped before a trailer, when it did
  std::array<std::byte, kChunkHeaderSize> header_bytes{};
  while (at < size) {
    const std::string where = chunk_name(sequence, at);
    if (size - at < kChunkHeaderSize) {
      tail = where + " ends inside its header";
      break;
    }
    source.read(header_bytes.data(), header_bytes.size(), at);
    const ChunkHeader header = parse_header(header_bytes);
    // The header's checksum covers its payload too, so it cannot vouch for
    // the header alone. A header present whole was written whole (each
    // chunk is one write(2)), so every field is checked before the chunk's
    // size is held against the file: a size a damaged header made absurd is
    // refused, never taken for a recording cut short.
    if (header.sequence != sequence) {
      inconsistent(where + " is numbered " + std::to_string(header.sequence));
    }
    if (header.raw_size > kMaxChunkRawSize) {
      inconsistent(where + " announces " + std::to_string(header.raw_size) + " bytes; a reader takes up to " +
                   std::to_string(kMaxChunkRawSize));
    }
    if ((header.kind == ChunkKind::start) != (sequence == 0)) {
      inconsistent(where + (sequence == 0 ? " is not the start chunk" : " is a second start chunk"));
    }
    if (header.kind != ChunkKind::start && header.kind != ChunkKind::tables && header.kind != ChunkKind::events &&
        header.kind != ChunkKind::trailer) {
      inconsistent(where + " is of unknown kind " + std::to_string(static_cast<std::uint32_t>(header.kind)));
    }
    if (header.kind == ChunkKind::events && (header.events == 0 || header.events > kMaxBlockEvents)) {
      inconsistent(where + " holds " + std::to_string(header.events) + " events; a chunk holds 1 to " +
                   std::to_string(kMaxBlockEvents));
    }
    // The writer's frame never exceeds zstd's bound for its content.
    if (const std::size_t bound = ZSTD_compressBound(header.raw_size); header.stored_size > bound) {
      inconsistent(where + " stores " + std::to_string(header.stored_size) + " bytes; a zstd frame of " +
                   std::to_string(header.raw_size) + " bytes takes at most " + std::to_string(bound));
    }
    if (header.stored_size > size - at - kChunkHeaderSize) {
      if (const auto frame = complete_frame_in_cut_chunk(source, at, buffers.stored)) {
        inconsistent(where + " stores " + std::to_string(header.stored_size) + " bytes, but its zstd frame ends after " +
                     std::to_string(*frame));
      }
      tail = where + " ends " + std::to_string(header.stored_size - (size - at - kChunkHeaderSize)) +
             " bytes short";
      break;
    }
    const bool last = at + kChunkHeaderSize + header.stored_size == size;
    if (header.kind == ChunkKind::events) {
      index.chunks.push_back(StreamEventChunk{at, header, index.event_count});
      index.event_count += header.events;
    } else {
      if (!read_stored(source, at, header, header_bytes, buffers.stored)) {
        if (last) {
          tail = where + " fails its checksum";
          break;
        }
        inconsistent(where + " fails its checksum");
      }
      decompress(buffers.decompressor, buffers.stored, header, buffers.raw, where);
      switch (header.kind) {
        case ChunkKind::start:
        case ChunkKind::trailer: {
          Snapshot head = decode_head(buffers.raw, at + kChunkHeaderSize);
          if (header.kind == ChunkKind::start) {
            start = std::move(head);
          } else {
            index.head = std::move(head);
            index.complete = true;
          }
          break;
        }
        case ChunkKind::tables: {
          TableAppend append;
          BoundedInputArchive archive(buffers.raw, at + kChunkHeaderSize);
          try {
            serialize_tables(archive, append);
          } catch (const cereal::Exception& error) {
            inconsistent(error.what());
          }
          if (archive.remaining() != 0) inconsistent(std::to_string(archive.remaining()) + " unread bytes in " + where);
          append_tables_to(tables, std::move(append), where);
          break;
        }
        default: break;  // events chunks are indexed above; no other kind gets here
      }
    }
    at += kChunkHeaderSize + header.stored_size;
    ++sequence;
    if (index.complete) break;
  }
  if (index.complete && at != size) {
    inconsistent(std::to_string(size - at) + " bytes follow the trailer at offset " + std::to_string(at));
  }

  if (!start) {
    // Nothing usable was recorded: not even the devices and settings.
    truncated("the stream ends before its start chunk is complete" + (tail.empty() ? "" : ": " + tail));
  }
  if (!index.complete) {
    index.head = std::move(*start);
    index.head.strings = tables.strings;
    index.head.frames = tables.frames;
    index.head.stacks = tables.stacks;
    index.head.threads = tables.threads;
    // The final layout went down with the trailer: rebuild it from the
    // events, which start from the start chunk's layout (empty unless the
    // recording began mid-run). A stack of that layout that its tables
    // chunk did not live to add is unknown (0). Only the file's last chunk
    // may fail its checksum (a kill mid-write); damage anywhere before it
    // is refused, as in a complete file.
    for (Segment& segment : index.head.segments) {
      if (segment.stack.value >= tables.stacks.size()) segment.stack = {};
      for (Block& block : segment.blocks)
        if (block.stack.value >= tables.stacks.size()) block.stack = {};
    }
    LayoutFromEvents layout;
    layout.seed(index.head.segments);
    std::vector<Event> events;
    for (std::size_t i = 0; i < index.chunks.size(); ++i) {
      const StreamEventChunk& chunk = index.chunks[i];
      if (tail.empty() && chunk.offset + kChunkHeaderSize + chunk.header.stored_size == size) {
        source.read(header_bytes.data(), header_bytes.size(), chunk.offset);
        if (!read_stored(source, chunk.offset, chunk.header, header_bytes, buffers.stored)) {
          tail = chunk_name(chunk.header.sequence, chunk.offset) + " fails its checksum";
          index.event_count = chunk.first_event;
          index.chunks.resize(i);
          break;
        }
      }
      read_events_chunk(source, chunk, i, index.head, buffers, events);
      layout.add(events);
    }
    index.head.segments = layout.take();
    const std::string kept =
        index.chunks.empty()
            ? std::string("no chunk of events was complete (0 events)")
            : "events up to chunk " + std::to_string(index.chunks.back().header.sequence) + " (" +
                  std::to_string(index.event_count) + " events)";
    index.head.settings[kStreamNoteSetting] =
        "the recording ended without its trailer (killed?): " + kept + (tail.empty() ? "" : "; " + tail);
  } else {
    index.head.strings = std::move(tables.strings);
    index.head.frames = std::move(tables.frames);
    index.head.stacks = std::move(tables.stacks);
    index.head.threads = std::move(tables.threads);
  }
  for (const DeviceInfo& device : index.head.devices) {
    for (const DeviceUsage& usage : device.usage) {
      if (usage.event != kUsageAtDump && usage.event >= index.event_count) {
        inconsistent("device " + std::to_string(device.index) + " has a usage reading at event " +
                     std::to_string(usage.event) + " of " + std::to_string(index.event_count));
      }
    }
  }
  validate(index.head);
  index.head.header.format_version = kStreamFormatVersion;
  return index;
}

void read_events_chunk(ByteSource& source, const StreamEventChunk& chunk, std::size_t index, const Snapshot& tables,
                       ChunkBuffers& buffers, std::vector<Event>& out) {
  std::array<std::byte, kChunkHeaderSize> header_bytes{};
  source.read(header_bytes.data(), header_bytes.size(), chunk.offset);
  const std::string where = chunk_name(chunk.header.sequence, chunk.offset);
  if (!read_stored(source, chunk.offset, chunk.header, header_bytes, buffers.stored)) {
    inconsistent(where + " fails its checksum");
  }
  decompress(buffers.decompressor, buffers.stored, chunk.header, buffers.raw, where);
  EventScreen screen = event_screen(tables);
  decode_block(buffers.raw, chunk.offset + kChunkHeaderSize, index, chunk.header.events, buffers.columns, out,
               &screen);
  if (screen.flagged) validate_events(tables, out, chunk.first_event);
}

// --- the layout from the events --------------------------------------------

void LayoutFromEvents::seed(const std::vector<Segment>& start) {
  for (const Segment& segment : start) {
    const std::int32_t device = segment.device;
    if (!segment.expandable) {
      segments_[{device, segment.address}] =
          SegmentInfo{segment.total_size, segment.stream, segment.large_pool, false, segment.stack};
    } else {
      // One segment per mapped range, as add() keeps them: the runs of
      // blocks that are not unmapped.
      std::uint64_t begin = segment.address, end = segment.address;
      auto close = [&] {
        if (end > begin) {
          mapped_[{device, begin}] = end;
          segments_[{device, begin}] = SegmentInfo{end - begin, segment.stream, segment.large_pool, true, segment.stack};
        }
      };
      for (const Block& block : segment.blocks) {
        if (block.state == BlockState::unmapped) {
          close();
          begin = end = block.address + block.size;
        } else {
          if (end == begin) begin = end = block.address;
          end = block.address + block.size;
        }
      }
      if (segment.blocks.empty()) end = segment.address + segment.total_size;
      close();
    }
    for (const Block& block : segment.blocks) {
      if (block.state == BlockState::active_allocated || block.state == BlockState::active_pending_free)
        blocks_[{device, block.address}] = BlockInfo{block.size, block.requested, block.stack, block.state};
    }
  }
}

void LayoutFromEvents::add(std::span<const Event> events) {
  for (const Event& e : events) {
    const std::pair<std::int32_t, std::uint64_t> key{e.device, e.address};
    switch (e.kind) {
      case EventKind::alloc:
        blocks_[key] = BlockInfo{e.size, e.aux, e.stack, BlockState::active_allocated};
        break;
      case EventKind::free_requested:
        if (auto it = blocks_.find(key); it != blocks_.end()) it->second.state = BlockState::active_pending_free;
        break;
      case EventKind::free_completed: blocks_.erase(key); break;
      case EventKind::segment_alloc:
        segments_[key] = SegmentInfo{e.size, e.stream, (e.aux & segment_flag_large_pool) != 0, false, e.stack};
        break;
      case EventKind::segment_release: segments_.erase(key); break;
      case EventKind::segment_map: {
        // Expandable segments, one segment per mapped range (PyTorch's
        // spelling, which the analyzer compares in): join the neighbours.
        std::uint64_t begin = e.address, end = e.address + e.size;
        auto next = mapped_.lower_bound(key);
        if (next != mapped_.begin()) {
          auto before = std::prev(next);
          if (before->first.first == e.device && before->second == begin) {
            begin = before->first.second;
            mapped_.erase(before);
          }
        }
        next = mapped_.find({e.device, end});
        if (next != mapped_.end()) {
          end = next->second;
          mapped_.erase(next);
        }
        mapped_[{e.device, begin}] = end;
        segments_[{e.device, begin}] =
            SegmentInfo{end - begin, e.stream, (e.aux & segment_flag_large_pool) != 0, true, e.stack};
        break;
      }
      case EventKind::segment_unmap: {
        auto it = mapped_.upper_bound(key);
        if (it == mapped_.begin()) break;
        --it;
        const std::int32_t device = it->first.first;
        const std::uint64_t begin = it->first.second, end = it->second;
        if (device != e.device || e.address >= end) break;
        const SegmentInfo info = segments_[{device, begin}];
        mapped_.erase(it);
        segments_.erase({device, begin});
        if (begin < e.address) {
          mapped_[{device, begin}] = e.address;
          segments_[{device, begin}] = SegmentInfo{e.address - begin, info.stream, info.large_pool, true, info.stack};
        }
        if (e.address + e.size < end) {
          mapped_[{device, e.address + e.size}] = end;
          segments_[{device, e.address + e.size}] =
              SegmentInfo{end - e.address - e.size, info.stream, info.large_pool, true, info.stack};
        }
        break;
      }
      default: break;
    }
  }
}

std::vector<Segment> LayoutFromEvents::take() {
  std::vector<Segment> out;
  auto block = blocks_.begin();
  for (const auto& [key, info] : segments_) {
    const auto [device, address] = key;
    const std::uint64_t end = address + info.total_size;
    Segment segment{device, info.stream, address, info.total_size, info.large_pool, info.expandable, info.stack, {}};
    while (block != blocks_.end() && block->first < key) ++block;  // in no segment: left out
    std::uint64_t cursor = address;
    for (; block != blocks_.end() && block->first.first == device && block->first.second < end; ++block) {
      const std::uint64_t at = block->first.second;
      if (at < cursor || at + block->second.size > end) continue;  // overlaps: the trace contradicts itself
      if (at > cursor) segment.blocks.push_back(Block{cursor, at - cursor, 0, BlockState::inactive, {}});
      segment.blocks.push_back(Block{at, block->second.size, block->second.requested, block->second.state,
                                     block->second.stack});
      cursor = at + block->second.size;
    }
    if (cursor < end) segment.blocks.push_back(Block{cursor, end - cursor, 0, BlockState::inactive, {}});
    out.push_back(std::move(segment));
  }
  segments_.clear();
  blocks_.clear();
  mapped_.clear();
  return out;
}

}  // namespace cachealloc::snapshot::detail
