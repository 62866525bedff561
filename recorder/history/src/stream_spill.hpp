// Where a streamed recording puts a full staging chunk when it may neither
// take a buffer nor wait: an unlinked file beside the stream. Private to the
// recorder library.
//
// A recording thread waits for the writer while holding its shard lock.
// During a cut the writer is taking every shard lock, so a thread that
// waited there would block the cut, and the cut is what frees buffers: it
// takes a reserve of buffers instead, and once that is gone it appends its
// chunk here (one pwrite of at most 16 KiB). The cut takes the spilled
// chunks with the queue, so memory stays within the stream's buffers and,
// in `wait` mode, nothing is lost however long the cut takes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <vector>

namespace cachealloc {

struct Chunk;

class StreamSpill {
 public:
  struct Piece {  // one spilled chunk
    std::uint64_t offset = 0;  // in the file, bytes
    std::uint32_t used = 0;    // words
    std::uint32_t count = 0;   // events
    std::uint32_t thread = 0;
    std::uint64_t base_ticks = 0;
    std::uint64_t sequence = 0;  // State::stream_sequence
  };

  // Opens an unlinked file in `directory` (nothing on disk until a spill).
  // Never throws: a file that cannot be made leaves append() failing.
  explicit StreamSpill(const std::filesystem::path& directory) noexcept;
  ~StreamSpill();
  StreamSpill(const StreamSpill&) = delete;
  StreamSpill& operator=(const StreamSpill&) = delete;

  // Appends the chunk's words; false when the file cannot take them (the
  // caller then drops them and counts them). Thread-safe; a leaf lock.
  bool append(const Chunk& chunk, std::uint64_t sequence) noexcept;
  // The pieces spilled since the last take, oldest first.
  std::vector<Piece> take();
  // Reads a taken piece's words into `out` (resized). Throws SnapshotError{io}.
  void read(const Piece& piece, std::vector<std::uint64_t>& out) const;
  // Once every taken piece has been read: when nothing was spilled since,
  // empties the file, so that it holds at most one cut's spills.
  void recycle() noexcept;
  std::uint64_t spilled_chunks() const noexcept;
  std::uint64_t pending_events() const noexcept;  // spilled, not yet taken

 private:
  int fd_ = -1;
  mutable std::mutex mutex_;
  std::uint64_t end_ = 0;  // guarded by mutex_
  std::vector<Piece> pieces_;
  std::uint64_t pending_events_ = 0;
  std::uint64_t spilled_chunks_ = 0;
};

}  // namespace cachealloc
