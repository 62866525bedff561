// Memory history: a ring of allocator events with native stacks (and an
// interpreter's frames, such as Python's), dumped as a snapshot
// (cachealloc/snapshot/format.hpp).
//
// HistoryRecorder is a layer, not part of the allocator: it is an
// AllocatorObserver that CachingAllocator::set_observer installs. When no
// recorder is installed the allocator pays one atomic load per event.
//
// What the hot path does per event (docs/PERFORMANCE.md has the figures):
//   - reads the clock once per allocator call (the invariant TSC where there
//     is one, else CLOCK_MONOTONIC; converted to CLOCK_MONOTONIC ns at dump;
//     or, with HistoryClock::coarse, CLOCK_MONOTONIC_COARSE); the other
//     events of the call share that time;
//   - with stacks == native, walks the frame-pointer chain (~1 ns a frame)
//     and interns the return addresses in a lock-sharded table, so each
//     unique stack is stored once and the event carries a small id;
//   - with python frames (set_frame_source), asks the frame source for the
//     interpreter's frames (CPython's: ~3 ns a frame) and interns them in
//     the same stack;
//   - writes the event into the calling thread's staging chunk, with no
//     lock; a full chunk is copied into a ring of chunks (one short lock per
//     256 events) that overwrites the oldest when full and counts what it
//     drops. A dump merges the ring and the staging chunks by time.
// Symbolizing (function, file, line, module) happens once per unique frame,
// at dump time.
//
// Native stacks need frame pointers: build code whose frames you want to see
// with -fno-omit-frame-pointer (our own targets are). The walk stops at the
// first frame that does not look like one (outside the thread's stack, not
// increasing, misaligned), so code without frame pointers shortens a stack
// but never crashes the walk. When the walk finds fewer than two frames it
// falls back to the DWARF unwinder (~4 us).
//
// Failure policy: recording never takes down the host program. A dump that
// cannot be written prints one line on stderr and switches recording off.
//
// Thread safety: every member function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "cachealloc/allocator.hpp"
#include "cachealloc/cachealloc.h"  // cachealloc_frame_source: one definition for C and C++
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc {

enum class StackCapture : std::uint8_t {
  none,    // events carry no stack (StackId 0)
  native,  // raw return addresses, symbolized at dump
  // The DWARF unwinder for every stack (~3-5 us each instead of ~20 ns): it
  // walks through code built without frame pointers, where the native walk
  // stops, e.g. PyTorch's own libraries under our PyTorch extension.
  unwind,
  // The interpreter's frames alone, from the frame source set_frame_source()
  // installed (Python's: libcachealloc_python), innermost first: PyTorch's
  // stacks='python'. An event on a thread that runs no interpreter code, or
  // with no frame source set, has no stack.
  python,
  // native (or unwind) frames innermost first, up to the first frame inside
  // the interpreter (FrameSource's interpreter_code), then the interpreter's
  // frames: PyTorch's stacks='all'. A thread that runs no interpreter code
  // keeps its native frames whole. max_frames counts both kinds.
  native_python,
  unwind_python,
};

// Parses "none", "native", "unwind", "python", "native+python" or
// "unwind+python". Throws InvalidArgument naming the value.
StackCapture parse_stack_capture(std::string_view text);
const char* to_string(StackCapture capture) noexcept;
// `capture` with the interpreter's frames added: none -> python, native ->
// native_python, unwind -> unwind_python; the others as they are.
StackCapture with_interpreter_frames(StackCapture capture) noexcept;

// The clock that times events.
enum class HistoryClock : std::uint8_t {
  // The invariant TSC where there is one (else CLOCK_MONOTONIC), to the
  // nanosecond. One read per allocator call: ~21 ns on the H200 host, about
  // half of what recording costs a cached alloc+free pair there.
  precise,
  // CLOCK_MONOTONIC_COARSE: ~1-3 ns a read, but only to the kernel's tick
  // (clock_getres says; 1-4 ms on common kernels, in the snapshot's settings
  // as history.clock_resolution_ns). The order of events stays exact: events
  // within one tick take the tick's time plus 1 ns per event of the pool.
  // Lifetimes and windows shorter than a tick read as 0 to a few ns. New
  // segments and mappings, and annotations, still read CLOCK_MONOTONIC.
  coarse,
};
// Parses "precise" or "coarse". Throws InvalidArgument naming the value.
HistoryClock parse_history_clock(std::string_view text);
const char* to_string(HistoryClock clock) noexcept;

// What a streamed recording does when the disk cannot keep up and its
// buffers are full.
enum class StreamWhenFull : std::uint8_t {
  wait,  // the recording thread waits for the writer (the program slows down)
  drop,  // the events are dropped and counted (HistoryRecorder::stream_status)
};
// Parses "wait" or "drop". Throws InvalidArgument naming the value.
StreamWhenFull parse_stream_when_full(std::string_view text);
const char* to_string(StreamWhenFull when_full) noexcept;

struct HistoryOptions {
  // false: record_history() stops recording, as stop_history() does.
  bool enabled = true;
  // Ring capacity in events (at least 1): a dump keeps the newest max_entries.
  // The ring is sized for the densest records (7 words an event), about 56 B
  // per entry; cached-path events take about 21 B, so it usually holds more.
  std::size_t max_entries = 1'000'000;
  StackCapture stacks = StackCapture::native;
  // Innermost frames kept per stack (1..256).
  std::uint32_t max_frames = 32;
  // Also capture a stack for free_requested events (allocs, segment
  // allocations, OOMs and empty_cache always get one when stacks != none).
  bool stacks_on_free = false;
  HistoryClock clock = HistoryClock::precise;
  // When not empty, an OOM event triggers a dump to this path. The dump runs
  // on a helper thread once the allocator has released its locks (an observer
  // may not call back into the allocator); flush() waits for it.
  std::filesystem::path dump_on_oom;
  // When not empty, every event is also written to this file while the run
  // goes on, from a background thread: a streamed recording (format version
  // 7, cachealloc/snapshot/stream.hpp) that keeps every event of a run of
  // any length, whatever max_entries. stop() (or the next start()) writes
  // its trailer, the final layout and stats. After a kill the file still
  // reads up to its last complete chunk. The ring then holds only the
  // events not yet written.
  std::filesystem::path stream;
  // The stream's buffers, all told (recorded events waiting for the writer,
  // and the writer's own): at least 16 MiB.
  std::size_t stream_buffer_bytes = std::size_t{64} << 20;
  StreamWhenFull stream_when_full = StreamWhenFull::wait;
};

// A streamed recording's progress (HistoryRecorder::stream_status).
struct StreamStatus {
  bool active = false;               // a stream is being written
  std::uint64_t events_written = 0;  // events in the file's chunks
  std::uint64_t bytes_written = 0;
  std::uint64_t dropped_events = 0;  // StreamWhenFull::drop, or buffers exhausted
  std::uint64_t waits = 0;           // times a recording thread waited for the writer
  std::uint64_t buffer_bytes = 0;    // event buffers held now
  std::uint64_t peak_buffer_bytes = 0;  // the most they ever held
  // Full buffers a recording thread wrote to an unlinked file beside the
  // stream instead of waiting: the writer was taking the allocator's locks
  // for a cut (a thread waiting there would block it) and the reserve was gone.
  std::uint64_t spilled_chunks = 0;
  std::string error;                 // why the stream stopped, when it failed
};

class HistoryRecorder final : public AllocatorObserver {
 public:
  // Records the events of `allocator`, which must outlive the recorder.
  // Starts recording at once when options.enabled. Throws InvalidArgument
  // for out-of-range options.
  explicit HistoryRecorder(CachingAllocator& allocator, const HistoryOptions& options = {});
  // Stops recording and waits for any OOM dump in progress.
  ~HistoryRecorder() override;
  HistoryRecorder(const HistoryRecorder&) = delete;
  HistoryRecorder& operator=(const HistoryRecorder&) = delete;

  // (Re)starts recording with `options`: clears the ring and the dropped
  // count, keeps interned stacks (live blocks may still refer to them).
  // options.enabled == false is stop(). Throws InvalidArgument.
  void start(const HistoryOptions& options);
  // Stops recording; what was recorded stays available to take_snapshot().
  // Returns once no event is being recorded on any thread.
  void stop() noexcept;
  bool recording() const noexcept;

  // Marks the start and end of a phase ("step 3", "forward"). Ends pair with
  // the innermost open begin of the calling thread. Ignored while not recording.
  void annotate_begin(std::string_view name) noexcept;
  void annotate_end() noexcept;

  // Records what the allocation starting at `address` holds (a category
  // event), for a program that learns it after the allocation was made: a
  // parameter's storage, a gradient after it was accumulated, optimizer
  // state after a step. `address` must be what the allocator returned for
  // a live allocation; the analyzer ignores (and counts) a tag at any other
  // address, and the last tag before the allocation's free wins. Recorded
  // on the calling thread, after the events the thread recorded before.
  // Ignored while not recording. Thread-safe.
  void tag_category(std::uintptr_t address, events::AllocationCategory category) noexcept;

  // Builds the snapshot: header, device, settings, stats, the layout, the
  // ring oldest first, and the symbolized tables. The layout, the stats and
  // the events describe the same moment, even while other threads allocate
  // (see history_dump.cpp, "the cut"). Throws std::exception subclasses
  // (device errors, bad_alloc).
  snapshot::Snapshot take_snapshot() const;
  // take_snapshot() + snapshot::write_snapshot() (atomic: a temporary file
  // beside `path`, fsync, rename, so `path` is always the previous complete
  // snapshot or this one, even after SIGKILL). Never throws: on failure (an
  // unwritable path, a full disk, a write error, out of memory) prints one
  // line on stderr, stops recording, and returns false. A symbolizer that
  // fails on some frame does the same after the file is written, with those
  // frames as bare addresses.
  //
  // Recording also stops by itself, with one line on stderr, when memory for
  // the event ring or a thread's buffer cannot be allocated; recording() then
  // turns false and the allocator goes on serving as before.
  bool dump_snapshot(const std::filesystem::path& path) noexcept;

  // Waits until the dumps of the OOMs reported before this call have been
  // written (not for those of later OOMs). Thread-safe.
  void flush() noexcept;

  // Events appended since start(), and those lost to ring overflow.
  std::uint64_t recorded_events() const noexcept;
  std::uint64_t dropped_events() const noexcept;
  HistoryOptions options() const;
  // The streamed recording's progress (HistoryOptions::stream). Thread-safe.
  StreamStatus stream_status() const;

  // AllocatorObserver: called by the allocator under its shard lock.
  std::uint32_t on_event(const AllocatorEvent& event) noexcept override;
  std::uint32_t on_events(const AllocatorEventBatch& batch) noexcept override;
  std::uint32_t on_alloc(const AllocatorEventOrigin& origin, bool continues_call, std::uintptr_t address,
                         std::size_t size, std::size_t requested, std::size_t split_rest) noexcept override;
  void on_free(const AllocatorEventOrigin& origin, bool continues_call, bool requested_too, std::uintptr_t address,
               std::size_t size, std::size_t requested, const AllocatorMerge* merges,
               std::uint32_t merge_count) noexcept override;

  struct State;

 private:
  void oom_dump_loop() noexcept;
  std::unique_ptr<State> state_;
};

// Marks a phase for the lifetime of the scope.
class AnnotationScope {
 public:
  AnnotationScope(HistoryRecorder& recorder, std::string_view name) noexcept : recorder_(&recorder) {
    recorder_->annotate_begin(name);
  }
  // On the process-wide recorder (global_history()).
  explicit AnnotationScope(std::string_view name) noexcept;
  ~AnnotationScope() {
    if (recorder_) recorder_->annotate_end();
  }
  AnnotationScope(const AnnotationScope&) = delete;
  AnnotationScope& operator=(const AnnotationScope&) = delete;

 private:
  HistoryRecorder* recorder_ = nullptr;
};

// --- An interpreter's frames (Python's) ------------------------------------

// Installs the process-wide source of interpreter frames that the captures
// with python in their name record (StackCapture); nullptr removes it.
// `source` is copied. The history library never sees the interpreter: the
// source (cachealloc.h, cachealloc_frame_source, which says what each
// function must do) hands out opaque tokens on the hot path and describes
// them at dump time. Python's is libcachealloc_python (python/src/).
// Recording threads switch to the new source at their next event; tokens
// recorded from an earlier source are still described by it, so a dump
// after a switch names every frame. Throws InvalidArgument when capture or
// describe is null, or after 64 different sources in one process.
// Thread-safe.
void set_frame_source(const cachealloc_frame_source* source);

// --- The process-wide default, behind the C ABI (cachealloc.h) -------------

// The process-wide allocator, created on first use on
// make_device_from_environment() with config_from_environment(). Never
// destroyed, so it stays usable from static destructors and foreign runtimes.
// Throws DeviceError or ConfigError when it cannot be created (and again on
// the next call). When CACHEALLOC_HISTORY is set, its creation also starts
// that recording, which exit() ends with the stream's trailer; a stream file
// that cannot be created is one line on stderr, and the allocator serves on
// unrecorded.
CachingAllocator& global_allocator();
// The recorder of global_allocator(), created (not recording) on first use.
HistoryRecorder& global_history();

// CACHEALLOC_HISTORY: a streamed recording of the process-wide allocator,
// started when global_allocator() is created, with no change to the program.
// Its syntax is CACHEALLOC_CONF's, comma-separated key:value pairs:
//   stream:/tmp/run.{pid}.bin,stacks:none,when_full:drop
// stream (required) is the file; "{pid}" in it becomes the process id, so
// that processes sharing the environment write files of their own. The
// others are optional: stacks (none, native, unwind, python, native+python,
// unwind+python), max_frames (1..256),
// stacks_on_free (true, false), clock (precise, coarse), when_full (wait,
// drop), buffer_mb (at least 16). A path cannot hold a comma.
inline constexpr const char* kHistoryEnvironment = "CACHEALLOC_HISTORY";
// Parses that syntax into options whose stream is set (the pid not yet
// expanded). Throws ConfigError, one line naming CACHEALLOC_HISTORY, the key
// and the value, for an unknown key, a malformed pair, a bad value or a
// missing stream.
HistoryOptions parse_history_setting(std::string_view text);
// `pattern` with every "{pid}" replaced by `pid` and every "{device}" by
// `device`.
std::filesystem::path expand_stream_path(std::string_view pattern, long pid, int device);

// Shorthands for global_history(). record_history throws InvalidArgument and
// whatever global_allocator() throws; the others never throw.
void record_history(const HistoryOptions& options);
void stop_history() noexcept;
void annotate_begin(std::string_view name) noexcept;
void annotate_end() noexcept;
void tag_category(std::uintptr_t address, events::AllocationCategory category) noexcept;
bool dump_snapshot(const std::filesystem::path& path) noexcept;

}  // namespace cachealloc
