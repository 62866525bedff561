// Reading a snapshot's events block by block, so that a tool's memory grows
// with what it keeps, not with the file.
//
// A streamed recording (format version 7, stream.hpp) streams the same way,
// a chunk for a block; one that lost its trailer reads up to its last
// complete chunk, with head().settings[kStreamNoteSetting] saying so.
//
// For a file of format version 3 (docs/FORMAT.md) the reader holds the head
// (tables, final layout, header; about the size of the tables), an index of
// 16 bytes per block, and one block at a time: its bytes (~250 KB) and its
// decoded events (64 Ki x 56 B = 3.5 MiB). It reads with fread/fseek, never
// the whole file and never mmap.
//
// Every other input (format versions 1 and 2, PyTorch pickles, a pipe or "-",
// a gzip or zstd file) goes
// through load(): the whole snapshot is then decoded into memory, which
// costs memory proportional to the file, and blocks are slices of it.
// streaming() says which case holds.
//
// Errors: the same SnapshotErrors as load() and decode(), with the same
// checks: open() checks the framing, the head and every block's declared
// size against what remains of the file; read_block() checks the block's
// columns and its events against the head's tables. io names the path.
// Thread safety: none; one reader per thread. Distinct readers of one file
// are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

class SnapshotReader {
 public:
  SnapshotReader();
  // open(path).
  explicit SnapshotReader(const std::filesystem::path& path);
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  // Opens `path`, reads and validates everything but the events, and
  // indexes the blocks. Throws SnapshotError; the reader is then closed.
  void open(const std::filesystem::path& path);
  // Opens the file `other` streams (other.streaming()) for reading on
  // another thread, with other's head and block index instead of reading and
  // checking them again: a file handle and block buffers of its own, nothing
  // else. `other` must stay open, and outlive this reader.
  void open_sibling(const SnapshotReader& other);

  // Everything except the events: Snapshot::events is empty.
  // header.format_version is the version read.
  const Snapshot& head() const noexcept { return shared_head_ != nullptr ? *shared_head_ : head_; }
  // False when the whole file was loaded into memory (see the top).
  bool streaming() const noexcept { return file_ != nullptr; }

  std::uint64_t event_count() const noexcept { return event_count_; }
  std::size_t block_count() const noexcept { return block_first_.size(); }
  // The index of block `block`'s first event; block_first_event(block_count())
  // is event_count().
  std::uint64_t block_first_event(std::size_t block) const noexcept {
    return block < block_first_.size() ? block_first_[block] : event_count_;
  }

  // Decodes block `block` (< block_count()) into `out`, replacing its
  // contents and reusing its storage. Any order: a backward pass reads the
  // blocks from last to first.
  void read_block(std::size_t block, std::vector<Event>& out);
  // When !streaming(): block `block` (< block_count()) of the events in
  // memory, without a copy; valid until the next open().
  std::span<const Event> loaded_block(std::size_t block) const noexcept {
    const auto first = static_cast<std::size_t>(block_first_event(block));
    return std::span<const Event>(events_).subspan(first, static_cast<std::size_t>(block_first_event(block + 1)) - first);
  }
  // The next block after the last one read (the first after open() or
  // rewind()); false, with `out` empty, after the last.
  bool next_block(std::vector<Event>& out);
  void rewind() noexcept { next_ = 0; }

 private:
  void open_streaming(const std::filesystem::path& path, std::uint64_t file_size);
  void read_exactly(void* data, std::size_t size, std::uint64_t offset);

  Snapshot head_;
  const Snapshot* shared_head_ = nullptr;  // open_sibling(): the other reader's head
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::uint64_t event_count_ = 0;
  std::vector<std::uint64_t> block_first_;   // first event of each block
  std::vector<std::uint64_t> block_offset_;  // file offset of each block's columns
  std::vector<std::uint64_t> block_size_;    // their size in bytes
  std::size_t next_ = 0;
  // Streaming: one block's bytes and columns, reused.
  std::vector<std::byte> bytes_;
  struct Columns;
  std::unique_ptr<Columns> columns_;
  // Loaded: every event, for versions 1 and 2 and pickles.
  std::vector<Event> events_;
  // Format version 7 (a streamed recording, stream.hpp): where each events
  // chunk lies, shared with siblings, and this reader's buffers.
  struct StreamChunks;
  std::shared_ptr<const StreamChunks> stream_chunks_;
  struct StreamBuffers;
  std::unique_ptr<StreamBuffers> stream_buffers_;
  void open_stream(std::uint64_t file_size);
};

}  // namespace cachealloc::snapshot
