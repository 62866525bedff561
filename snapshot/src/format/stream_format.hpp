// Format version 7's chunks (docs/FORMAT.md, "Version 7"): their header,
// the chain walk that indexes a streamed file, and reading one events chunk.
// Shared by decode() (bytes in memory), SnapshotReader (a file, one chunk
// at a time) and StreamFileWriter. Private to the snapshot library.
//
//   chunk header, 32 bytes, little-endian
//    0  u32 kind          1 start, 2 tables, 3 events, 4 trailer
//    4  u32 events        events in an events chunk, else 0
//    8  u64 stored_size   bytes of the zstd frame that follows
//   16  u64 raw_size      bytes of its content
//   24  u32 sequence      the chunk's index in the file, from 0
//   28  u32 crc32         zlib's crc32 of bytes 0-27, then of the stored bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "cachealloc/snapshot/model.hpp"
#include "cachealloc/snapshot/stream.hpp"
#include "event_codec.hpp"

namespace cachealloc::snapshot::detail {

enum class ChunkKind : std::uint32_t { start = 1, tables = 2, events = 3, trailer = 4 };
inline constexpr std::size_t kChunkHeaderSize = 32;
// The largest chunk content a reader decompresses: an events chunk of 4 Mi
// events stays far below it; a hostile raw_size cannot ask for more.
inline constexpr std::uint64_t kMaxChunkRawSize = std::uint64_t{1} << 30;
// The framing's body_size of a streamed file: the writer cannot know it.
inline constexpr std::uint64_t kStreamedBodySize = ~std::uint64_t{0};

struct ChunkHeader {
  ChunkKind kind{};
  std::uint32_t events = 0;
  std::uint64_t stored_size = 0;
  std::uint64_t raw_size = 0;
  std::uint32_t sequence = 0;
  std::uint32_t crc = 0;
};
// The header's 32 bytes, with `crc` covering them and `stored`.
std::vector<std::byte> chunk_header_bytes(const ChunkHeader& header, std::span<const std::byte> stored);

// A tables chunk's content.
std::vector<std::byte> encode_table_append(const TableAppend& tables);

// Random access to the file's bytes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::uint64_t size() const = 0;
  // Exactly `size` bytes at `offset` (the caller checked they exist).
  virtual void read(void* data, std::size_t size, std::uint64_t offset) = 0;
};

struct StreamEventChunk {
  std::uint64_t offset = 0;  // of the chunk header
  ChunkHeader header;
  std::uint64_t first_event = 0;
};

struct StreamIndex {
  Snapshot head;  // header, devices, settings, tables; the trailer's final state when complete
  std::vector<StreamEventChunk> chunks;
  std::uint64_t event_count = 0;
  bool complete = false;
};

// Walks the chunk chain after the framing. Checks each header's fields (its
// stored size against zstd's bound for its content) before its size against
// the file, and the checksum of every chunk it decompresses (all but events
// chunks, which read_events_chunk() checks). Without a trailer, the walk
// stops at the first chunk cut short or at a damaged last chunk, every
// events chunk before it is decoded once (damage there is inconsistent) to
// rebuild the final layout from the events, and
// head.settings[kStreamNoteSetting] says so. A file that ends before its
// start chunk is complete is truncated. Throws SnapshotError
// (inconsistent, truncated) as decode() does; validates the head.
StreamIndex index_stream(ByteSource& source);

// Reusable buffers for read_events_chunk().
struct ChunkBuffers {
  std::vector<std::byte> stored;
  std::vector<std::byte> raw;
  EventColumns columns;
  void* decompressor = nullptr;  // ZSTD_DCtx, owned
  ChunkBuffers();
  ~ChunkBuffers();
  ChunkBuffers(const ChunkBuffers&) = delete;
  ChunkBuffers& operator=(const ChunkBuffers&) = delete;
};
// Reads, checks and decodes events chunk `index` into `out` (its events
// checked against `tables` as read_block() does).
void read_events_chunk(ByteSource& source, const StreamEventChunk& chunk, std::size_t index,
                       const Snapshot& tables, ChunkBuffers& buffers, std::vector<Event>& out);

// The layout that `events` build from an empty allocator, on every device
// (a stream without its trailer starts at the start of the run). Feed
// blocks in order, then take().
class LayoutFromEvents {
 public:
  // The layout the events start from: a stream's start chunk's, for a
  // recording that began mid-run (before any add()).
  void seed(const std::vector<Segment>& start);
  void add(std::span<const Event> events);
  std::vector<Segment> take();

 private:
  struct SegmentInfo {
    std::uint64_t total_size = 0;
    std::uint64_t stream = 0;
    bool large_pool = false;
    bool expandable = false;
    StackId stack{};
  };
  struct BlockInfo {
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    StackId stack{};
    BlockState state = BlockState::active_allocated;
  };
  std::map<std::pair<std::int32_t, std::uint64_t>, SegmentInfo> segments_;
  std::map<std::pair<std::int32_t, std::uint64_t>, BlockInfo> blocks_;
  std::map<std::pair<std::int32_t, std::uint64_t>, std::uint64_t> mapped_;  // expandable: mapped ranges
};

}  // namespace cachealloc::snapshot::detail
