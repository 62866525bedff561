// A streamed recording (HistoryOptions::stream): the background thread that
// takes the recorded chunks, puts their events in time order, symbolizes
// new stacks and appends chunks to the file (cachealloc/snapshot/stream.hpp).
// Private to the recorder library.
//
// The hot path does what it does for the ring: a full staging chunk goes to
// a queue (State::ring, flush_to_stream) instead of overwriting the ring.
// Chunks come from a pool of at most stream_buffer_bytes minus the writer's
// own ~8 MiB; when the pool is exhausted the recording thread waits for the
// writer, or drops the chunk and counts it (StreamWhenFull).
//
// Threads fill their staging chunks independently, so the queue alone is
// not in time order: an idle thread's staging chunk may hold an event older
// than any queued one. The writer therefore works in cuts, as a dump does:
// inside CachingAllocator::layout()'s callback, with every shard lock held,
// it takes the queue and copies every staging chunk; every event of the
// cut is then known, and it merges them by time, thread by thread. A cut
// happens every 20 ms, sooner when the queue is a quarter full. The last
// cut also reads the final layout and stats, and stops recording inside the
// callback, so that the trailer describes exactly the end of the events.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/stream.hpp"
#include "history_state.hpp"
#include "stream_spill.hpp"

namespace cachealloc {

// Pool chunks a stream may take for `options` (State::stream_chunk_limit).
std::size_t stream_chunk_limit(const HistoryOptions& options);

class StreamRecorder {
 public:
  // Creates the file (its framing). Call with every shard lock free.
  // Throws SnapshotError{io}.
  StreamRecorder(HistoryRecorder::State& state, const HistoryOptions& options);
  // Once the recorder streams (State::streaming): writes the start chunk,
  // with `start_layout`, the allocator's layout when the stream's events
  // begin (taken under the same locks as the reset), so that a file that
  // loses its trailer still reads from the right state, then starts the
  // writer thread. False when a write failed: the recording stops (fail()).
  bool begin(std::vector<snapshot::Segment> start_layout);
  // finish() if not done.
  ~StreamRecorder();
  // The last cut (recording stops inside it), the trailer, the join.
  // Never throws: a failure is one line on stderr.
  void finish() noexcept;
  // Wakes the writer (a recording thread found the queue filling).
  void wake() noexcept;
  // Appends a full staging chunk to the spill file (StreamSpill), for a
  // thread that may not wait; false when it cannot. Thread-safe.
  bool spill(const Chunk& staging, std::uint64_t sequence) noexcept;
  StreamStatus status() const;

 private:
  struct Piece {  // a run of records of one thread, in time order
    const std::uint64_t* words;
    std::uint32_t used;
    std::uint64_t base;
    std::uint32_t thread;
    Chunk* pooled;  // returned to the pool once decoded; nullptr for a staging copy
    std::uint64_t sequence;  // State::stream_sequence; kStagingSequence for a staging copy
    const StreamSpill::Piece* spilled = nullptr;  // read back from the spill file
  };
  static constexpr std::uint64_t kStagingSequence = ~std::uint64_t{0};
  void run() noexcept;
  // One line on stderr; recording stops, waiting threads drop from then on.
  void fail(const std::string& why) noexcept;
  // Takes the queue and the staging chunks; `last`: also the final state.
  void cut(bool last);
  void write_cut(std::vector<Piece>& pieces);
  void emit(snapshot::Event event);
  void write_block();
  std::uint32_t stack_id(std::uint32_t internal);
  std::uint32_t string_id(const std::string& text);
  void add_threads(std::uint32_t up_to);

  HistoryRecorder::State& s_;
  HistoryOptions options_;
  std::unique_ptr<snapshot::StreamFileWriter> file_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool finishing_ = false;
  bool finished_ = false;
  bool woken_ = false;
  std::string error_;  // guarded by mutex_

  StreamSpill spill_;
  // The writer thread's own.
  std::vector<std::uint64_t> staging_copy_;
  std::vector<StreamSpill::Piece> spilled_;   // the cut's spilled chunks
  // Each OOM event written: its index in the file, and the (thread, ticks)
  // its NVML reading is keyed by (State::oom_usage); the newest kMaxOomUsage.
  struct OomEvent {
    std::uint64_t index;
    std::uint32_t thread;
    std::uint64_t ticks;
    std::uint64_t ns;
  };
  std::vector<OomEvent> oom_events_;
  std::vector<std::uint64_t> spill_read_;     // one of them, read back
  detail::TickAnchor cut_anchor_;
  long double tick_ns_ = 1.0L;
  std::uint64_t last_ns_ = 0;
  std::vector<snapshot::Event> block_;
  snapshot::TableAppend pending_;
  std::unordered_map<std::uint32_t, std::uint32_t> stacks_;       // recorder id -> file id
  std::unordered_map<std::uintptr_t, std::uint32_t> frames_;      // ip -> file id
  std::unordered_map<std::string, std::uint32_t> strings_;        // text -> file id
  std::unordered_map<std::uint32_t, std::uint32_t> annotation_names_;  // recorder string id -> file id
  std::uint64_t strings_size_ = 1, frames_size_ = 1, stacks_size_ = 1, threads_size_ = 0;
  std::uint64_t events_written_ = 0;  // guarded by mutex_
  std::uint64_t bytes_written_ = 0;   // guarded by mutex_
  // The final state, read in the last cut.
  std::vector<snapshot::Segment> final_layout_;
  std::map<std::string, std::int64_t> final_stats_;
  DeviceUsage final_usage_;
  std::optional<MemoryInfo> final_memory_;
  void add_final_usage(snapshot::DeviceInfo& info) const;
};

}  // namespace cachealloc
