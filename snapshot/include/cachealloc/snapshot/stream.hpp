// A streamed recording (format version 7, docs/FORMAT.md "Version 7"): a
// snapshot written while the run goes on, as a chain of self-contained,
// checksummed, zstd-compressed chunks appended to one file:
//
//   framing · start · (tables | events)* · trailer
//
// The start chunk holds the header, the devices, the settings and the
// layout when the stream began (empty for an empty allocator); a tables
// chunk appends to the string, frame, stack and thread tables; an events
// chunk holds one block of events (at most kStreamBlockEvents, encoding 3,
// decodable alone); the trailer holds the final layout and stats. Each
// chunk is written with one write(2), so after a kill -9 the file ends at a
// chunk boundary or inside the last chunk, and a reader reads every chunk
// before it (SnapshotReader, decode()), noting that the trailer is missing.
//
// Thread safety: a StreamFileWriter belongs to one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// The format version a streamed recording is written as.
inline constexpr std::uint32_t kStreamFormatVersion = 7;
// Events per events chunk as written (a reader accepts up to 4 Mi).
inline constexpr std::uint32_t kStreamBlockEvents = 65536;

// What a tables chunk appends: entries from index first_* on of each table.
// A reader checks that each first_* equals the table's size so far.
struct TableAppend {
  std::uint64_t first_string = 0;
  std::vector<std::string> strings;
  std::uint64_t first_frame = 0;
  std::vector<Frame> frames;
  std::uint64_t first_stack = 0;
  std::vector<Stack> stacks;
  std::uint64_t first_thread = 0;
  std::vector<std::uint64_t> threads;
  bool empty() const noexcept { return strings.empty() && frames.empty() && stacks.empty() && threads.empty(); }
};

// The note a reader sets (in settings, kStreamNoteSetting) on a stream that
// ends without its trailer.
inline constexpr const char* kStreamNoteSetting = "stream.note";

class StreamFileWriter {
 public:
  // Creates (or truncates) `path` and writes the framing and the start
  // chunk (start() below). Throws SnapshotError{io} naming the path.
  StreamFileWriter(const std::filesystem::path& path, const Snapshot& start);
  // Creates (or truncates) `path` and writes the framing only: start() must
  // come next, before anything else is appended. Throws SnapshotError{io}.
  explicit StreamFileWriter(const std::filesystem::path& path);
  // Writes the start chunk: start.header, start.devices, start.settings and
  // start.segments, the layout when the stream begins (a recording started
  // mid-run), whose stacks the first tables chunk may add (the rest of
  // `start` is ignored). Throws SnapshotError: io, or inconsistent when
  // the start chunk is written already.
  void start(const Snapshot& start);
  // Closes the file without a trailer (as a crash would leave it) unless
  // finish() ran. Never throws.
  ~StreamFileWriter();
  StreamFileWriter(const StreamFileWriter&) = delete;
  StreamFileWriter& operator=(const StreamFileWriter&) = delete;

  // Appends a tables chunk (nothing when `tables` is empty). Throws
  // SnapshotError: io, or inconsistent when a first_* is not the size the
  // tables have reached.
  void append_tables(const TableAppend& tables);
  // Appends the events in chunks of kStreamBlockEvents. Their stacks,
  // threads and annotation strings must be in the tables appended before.
  // Times must not decrease. Throws SnapshotError{io}.
  void append_events(std::span<const Event> events);
  // Writes the trailer from `final_state`: devices, settings, stats,
  // segments, dropped_events (its header, tables and events are ignored),
  // fsyncs and closes the file. Throws SnapshotError{io}.
  void finish(const Snapshot& final_state);

  std::uint64_t bytes_written() const noexcept { return bytes_; }
  std::uint64_t events_written() const noexcept { return events_; }
  std::uint64_t chunks_written() const noexcept { return sequence_; }

 private:
  void write_chunk(std::uint32_t kind, std::uint32_t events, const std::vector<std::byte>& raw);
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
  std::uint64_t events_ = 0;
  std::uint32_t sequence_ = 0;
  std::uint64_t strings_ = 1, frames_ = 1, stacks_ = 1, threads_ = 0;  // table sizes so far
  void* compressor_ = nullptr;  // ZSTD_CCtx
  std::vector<std::byte> compressed_;
};

}  // namespace cachealloc::snapshot
