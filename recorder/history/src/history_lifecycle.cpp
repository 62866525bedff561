// The recorder's life: construction, start() (which resets the ring and
// picks the clock), stop(), destruction, and deactivate() for failures.
#include <cstdio>

#include "history_options.hpp"
#include "history_state.hpp"
#include "stream_recorder.hpp"

namespace cachealloc {

namespace {
std::atomic<std::uint64_t> g_next_recorder_id{1};
}  // namespace

HistoryRecorder::State::State(CachingAllocator& a)
    : allocator(a), id(g_next_recorder_id.fetch_add(1)), use_tsc(detail::tsc_is_invariant()) {}

void HistoryRecorder::State::deactivate(const char* why) noexcept {
  recording.store(false, std::memory_order_release);
  if (!deactivated.exchange(true, std::memory_order_acq_rel))
    std::fprintf(stderr, "cachealloc: %s; deactivating history recording\n", why);
}

HistoryRecorder::HistoryRecorder(CachingAllocator& allocator, const HistoryOptions& options)
    : state_(std::make_unique<State>(allocator)) {
  state_->device = allocator.device().index();
  if (options.enabled) {
    start(options);
  } else {
    detail::validate(options);
    std::lock_guard lock(state_->control);
    state_->options = options;
  }
}

HistoryRecorder::~HistoryRecorder() {
  stop();
  {
    std::lock_guard lock(state_->oom_mutex);
    state_->quitting = true;
    state_->oom_cv.notify_all();
  }
  if (state_->oom_worker.joinable()) state_->oom_worker.join();
}

void HistoryRecorder::start(const HistoryOptions& options) {
  if (!options.enabled) {
    stop();
    return;
  }
  detail::validate(options);
  State& s = *state_;
  std::lock_guard control(s.control);
  // A stream in progress gets its trailer first; the new one's file is
  // created before anything changes, so that a path that cannot be written
  // leaves the recorder as it was.
  if (s.stream_writer) {
    s.stream_writer->finish();
    s.last_stream_status = s.stream_writer->status();
    s.stream_writer.reset();
  }
  std::unique_ptr<StreamRecorder> stream;
  if (!options.stream.empty()) stream = std::make_unique<StreamRecorder>(s, options);
  // Reset while every shard lock is held, so that no event is in flight;
  // the layout is the one the stream's events start from.
  std::vector<layout::Segment> start_layout = s.allocator.layout([&] {
    std::lock_guard lock(s.ring_lock);
    for (Chunk* chunk : s.ring) {
      chunk->clear();
      s.spare.push_back(chunk);
    }
    s.ring.clear();
    for (auto& slot : s.slots) {
      slot->staging.clear();
      slot->last_record = ThreadSlot::kNoRecord;
      slot->stacks.clear();
    }
    s.annotation_slot->staging.clear();
    s.next = 0;
    s.evicted = 0;
    s.newest_dropped = 0;
    s.max_entries = options.max_entries;
    s.ticks.store(options.clock == HistoryClock::coarse ? detail::TickSource::coarse
                  : s.use_tsc                             ? detail::TickSource::tsc
                                                          : detail::TickSource::monotonic,
                  std::memory_order_relaxed);
    s.anchor = detail::TickAnchor::now(s.tick_source());
    s.streaming = stream != nullptr;
    s.stream_drop = options.stream_when_full == StreamWhenFull::drop;
    s.stream_chunk_limit = stream ? stream_chunk_limit(options) : 0;
    s.stream_peak_chunks = s.chunks.size();
    s.streamed = 0;
    s.stream_waits = 0;
  });
  bool stream_began = true;
  if (stream) {
    s.stream_writer = std::move(stream);
    stream_began = s.stream_writer->begin(std::move(start_layout));
  }
  {
    std::lock_guard lock(s.usage_mutex);
    s.oom_usage.clear();
  }
  s.options = options;
  s.stacks.store(options.stacks, std::memory_order_relaxed);
  s.max_frames.store(options.max_frames, std::memory_order_relaxed);
  s.stacks_on_free.store(options.stacks_on_free, std::memory_order_relaxed);
  {
    // control -> oom_mutex, the documented order (history_state.hpp). The
    // worker reads the path here, under oom_mutex alone, never `control`.
    std::lock_guard lock(s.oom_mutex);
    s.oom_dump_path = options.dump_on_oom;
    if (!options.dump_on_oom.empty() && !s.oom_worker.joinable()) {
      s.oom_worker = std::thread([this] { oom_dump_loop(); });
    }
  }
  if (!stream_began) return;  // the start chunk could not be written: fail() said so, and stopped
  s.deactivated.store(false, std::memory_order_relaxed);
  s.recording.store(true, std::memory_order_release);
  s.allocator.set_observer(this);
}

void HistoryRecorder::stop() noexcept {
  State& s = *state_;
  {
    // The stream's last cut stops recording at the moment its trailer describes.
    std::lock_guard control(s.control);
    if (s.stream_writer) {
      s.stream_writer->finish();
      s.last_stream_status = s.stream_writer->status();
      s.stream_writer.reset();
    }
  }
  s.recording.store(false, std::memory_order_release);
  s.allocator.set_observer(nullptr);
  // Every on_event runs under a shard lock, so once layout() has held them
  // all, no call is left in flight and the caller may destroy us.
  try {
    (void)s.allocator.layout();
  } catch (...) {
  }
}

bool HistoryRecorder::recording() const noexcept { return state_->recording.load(std::memory_order_acquire); }

}  // namespace cachealloc
