// Where the analyzer gets a snapshot's events: all in memory, or block by
// block from a file (snapshot::SnapshotReader), so a report over a large
// file keeps only its own state and one block.
//
// Every report takes an EventSource. head() is everything but the events
// (tables, final layout, header); its `events` member is never read through
// a source. Events come in blocks, forwards or backwards: replay walks them
// forwards, derive_initial_layout backwards.
//
// Thread safety: none; a source and the spans it returns belong to one thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "cachealloc/snapshot/model.hpp"
#include "cachealloc/snapshot/reader.hpp"

namespace cachealloc::analyzer {

class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual const snapshot::Snapshot& head() const = 0;
  virtual std::size_t event_count() const = 0;
  virtual std::size_t block_count() const = 0;
  // The index of the block's first event; block_begin(block_count()) is event_count().
  virtual std::size_t block_begin(std::size_t block) const = 0;
  // The events of `block`, valid until the next call. Throws SnapshotError
  // when a file's block is damaged.
  virtual std::span<const snapshot::Event> block(std::size_t block) = 0;
  // Another source over the same events for another thread, which reads
  // its blocks while this one reads its own (the parallel analysis), or
  // nullptr when there is none. It shares head() with this one and must not
  // outlive it. Called on this source's thread, before the others start.
  virtual std::unique_ptr<EventSource> open_another() { return nullptr; }
};

// A snapshot already in memory; blocks are views of its events, no copy,
// of `block_events` events each (> 0; tests cut them small).
class SnapshotEvents final : public EventSource {
 public:
  explicit SnapshotEvents(const snapshot::Snapshot& snapshot, std::size_t block_events = kBlock)
      : snapshot_(snapshot), block_(std::max<std::size_t>(block_events, 1)) {}
  const snapshot::Snapshot& head() const override { return snapshot_; }
  std::size_t event_count() const override { return snapshot_.events.size(); }
  std::size_t block_count() const override { return (snapshot_.events.size() + block_ - 1) / block_; }
  std::size_t block_begin(std::size_t block) const override {
    return std::min(block * block_, snapshot_.events.size());
  }
  std::span<const snapshot::Event> block(std::size_t block) override {
    const std::size_t begin = block_begin(block);
    return std::span<const snapshot::Event>(snapshot_.events).subspan(begin, block_begin(block + 1) - begin);
  }
  std::unique_ptr<EventSource> open_another() override {
    return std::make_unique<SnapshotEvents>(snapshot_, block_);
  }

 private:
  static constexpr std::size_t kBlock = std::size_t{1} << 16;
  const snapshot::Snapshot& snapshot_;
  std::size_t block_;
};

// A file, read through snapshot::SnapshotReader: for format version 3 or
// newer, one block in memory at a time; for anything else the whole file
// (reader.hpp). Throws SnapshotError as snapshot::load() does.
//
// Decoding a block costs about three times what the analysis does with it.
// With `decode_threads` > 0, blocks read in order (a replay) are decoded
// ahead on that many threads of their own, each with its own reader, so the
// analysis on the calling thread (one core) is not held up by decoding;
// 0 decodes on the calling thread only. Memory: one decoded block per
// decoding thread plus one, ~3.5 MiB each. Blocks asked for out of order
// (the backward pass) are decoded on the calling thread.
class FileEvents final : public EventSource {
 public:
  explicit FileEvents(const std::filesystem::path& path, unsigned decode_threads = 0);
  ~FileEvents() override;
  FileEvents(const FileEvents&) = delete;
  FileEvents& operator=(const FileEvents&) = delete;
  const snapshot::Snapshot& head() const override { return reader_.head(); }
  std::size_t event_count() const override { return static_cast<std::size_t>(reader_.event_count()); }
  std::size_t block_count() const override { return reader_.block_count(); }
  std::size_t block_begin(std::size_t block) const override {
    return static_cast<std::size_t>(reader_.block_first_event(block));
  }
  std::span<const snapshot::Event> block(std::size_t block) override;
  // A streamed file: a reader of its own on the same file, sharing this
  // one's head and block index (SnapshotReader::open_sibling), one block at
  // a time, nothing decoded ahead; a file held in memory: a view of this
  // one's events.
  std::unique_ptr<EventSource> open_another() override;
  bool streaming() const noexcept { return reader_.streaming(); }

  // What the command line offers by default: one decoding thread per spare
  // core of this process's CPU affinity mask, at most 4 (on the H200 host 4
  // keep up with the analysis; 3 do not, 6 or 8 add nothing:
  // docs/PERFORMANCE.md). Under `taskset -c 1`, none.
  static unsigned default_decode_threads() noexcept;

 private:
  struct Sibling {};
  FileEvents(const FileEvents& other, Sibling);
  class Prefetch;
  std::filesystem::path path_;
  snapshot::SnapshotReader reader_;
  std::vector<snapshot::Event> buffer_;
  unsigned decode_threads_ = 0;
  std::unique_ptr<Prefetch> prefetch_;
};

// Calls visit(index, event) for each event of [begin, end) in order, block
// by block, until it returns false. The one walk over a window that reports
// share; the analysis's own hot loop keeps its specialised copy.
template <class Visit>
void for_each_event(EventSource& source, std::size_t begin, std::size_t end, Visit&& visit) {
  for (std::size_t b = 0; b < source.block_count() && source.block_begin(b) < end; ++b) {
    const std::size_t base = source.block_begin(b);
    if (source.block_begin(b + 1) <= begin) continue;
    const std::span<const snapshot::Event> events = source.block(b);
    const std::size_t from = begin > base ? begin - base : 0;
    const std::size_t to = events.size() < end - base ? events.size() : end - base;
    for (std::size_t j = from; j < to; ++j)
      if (!visit(base + j, events[j])) return;
  }
}

}  // namespace cachealloc::analyzer
