// The hot path: on_event and on_events, which write an allocator event into
// the calling thread's staging chunk under the caller's shard lock, and what
// they inline (the thread's slot, the event's time, room in the chunk).
#include "frame_sources.hpp"
#include "history_state.hpp"
#include "ring_hook.hpp"

#include <algorithm>

namespace cachealloc {

using snapshot::EventKind;

namespace {

bool wants_stack(EventKind kind, bool stacks_on_free) noexcept {
  switch (kind) {
    case EventKind::alloc:
    case EventKind::segment_alloc:
    case EventKind::oom:
    case EventKind::empty_cache:
      return true;
    case EventKind::free_requested:
      return stacks_on_free;
    default:
      return false;
  }
}

// The calling thread's hot-path state: its slot for the recorder it last
// recorded for, and the time of its current allocator call. initial-exec
// TLS: a plain %fs-relative access, not a __tls_get_addr call per event.
struct ThreadState {
  std::uint64_t recorder = 0;
  ThreadSlot* slot = nullptr;
  std::uint64_t call_time = 0;
  std::uint64_t clock_skew = 0;  // detail::set_thread_clock_skew (tests)
  const std::uint64_t* last_order = nullptr;  // the order word of this thread's last event
  // The tick source call_time was read from: a restart with another clock
  // starts the thread's times afresh (TSC ticks and ns are not comparable).
  detail::TickSource call_source = detail::TickSource::tsc;
};
thread_local ThreadState t_state __attribute__((tls_model("initial-exec")));

}  // namespace

inline ThreadSlot* HistoryRecorder::State::slot() noexcept {
  if (t_state.recorder == id) [[likely]]
    return t_state.slot;
  return new_slot();
}

ThreadSlot* HistoryRecorder::State::new_slot() noexcept {
  try {
    auto fresh = std::make_unique<ThreadSlot>();
    fresh->thread = detail::thread_index();
    fresh->staging.thread = fresh->thread;
    std::lock_guard lock(ring_lock);
    slots.push_back(std::move(fresh));
    t_state.recorder = id;
    t_state.slot = slots.back().get();
    return t_state.slot;
  } catch (...) {
    // Out of memory: the event is lost, recording stops, the program goes on.
    deactivate("cannot allocate a thread's event buffer (out of memory)");
    return nullptr;
  }
}

void detail::set_thread_clock_skew(std::int64_t ticks) noexcept { t_state.clock_skew = static_cast<std::uint64_t>(ticks); }

// The time of an event: one clock read per critical section (the split
// before an alloc and the merges after a free continue the call's first
// event). Reading the clock costs more than the rest of an event, and the
// ordered read (RDTSCP) about twice the unordered one, so the order comes
// from the allocator's order words instead (AllocatorEvent::order): each
// event is later than the shard's last, than the allocator's last event of
// no one shard, and than this thread's last. Only a new segment or mapping,
// whose address the device may just have taken back from another pool,
// reads the ordered clock.
inline __attribute__((always_inline)) std::uint64_t HistoryRecorder::State::event_time(
    bool continues_call, bool after_device_call, std::uint64_t* order, const std::uint64_t* order_floor) noexcept {
  const detail::TickSource source = tick_source();
  if (t_state.call_source != source) [[unlikely]] {
    t_state.call_source = source;
    t_state.call_time = 0;
  }
  std::uint64_t t = t_state.call_time;
  if (!continues_call) {
    const std::uint64_t now =
        (after_device_call ? detail::now_ticks(source) : detail::now_ticks_unordered(source)) + t_state.clock_skew;
    t = std::max(t, now);
  }
  if (order_floor && t <= *order_floor) t = *order_floor + 1;
  if (order) {
    // Strictly after the shard's last event, unless that was this call's
    // previous event, on the same word: one call's events share its time.
    const bool own_last = continues_call && order == t_state.last_order && *order == t;
    if (t <= *order && !own_last) t = *order + 1;
    *order = t;
  }
  t_state.last_order = order;
  t_state.call_time = t;
  return t;
}
inline __attribute__((always_inline)) std::uint64_t HistoryRecorder::State::event_time(
    const AllocatorEvent& event) noexcept {
  const bool after_device_call = event.kind == EventKind::segment_alloc || event.kind == EventKind::segment_map;
  return event_time(event.continues_call, after_device_call, event.order, event.order_floor);
}

// Room for `words` more words of records in the slot's chunk (a new chunk
// when it is full, or when the thread slept for months and `t` no longer
// fits the base), and a stream record first when the stream changes.
inline __attribute__((always_inline)) void HistoryRecorder::State::make_room(ThreadSlot& slot, std::uint64_t t,
                                                                              std::uint64_t stream,
                                                                              std::uint32_t words) noexcept {
  Chunk& chunk = slot.staging;
  if (chunk.used + words > Chunk::kWords || !detail::offset_fits(t, chunk.base_ticks)) [[unlikely]]
    flush(slot);
  if (chunk.empty() || slot.stream != stream) [[unlikely]] {
    if (chunk.empty()) chunk.base_ticks = t;
    chunk.words[chunk.used] = detail::record_header(detail::kRecordStream, t, chunk.base_ticks);
    chunk.words[chunk.used + 1] = stream;
    chunk.used += 2;
    slot.stream = stream;
    slot.last_record = ThreadSlot::kNoRecord;
  }
  chunk.newest_ticks = t;
}

// The calling thread's stack, interned: the thread's cache first, no lock,
// no shared line (StackCache). The interpreter's frames, where the capture
// asks for them, follow the native ones as tagged tokens (frame_sources.hpp).
__attribute__((noinline)) std::uint32_t HistoryRecorder::State::capture_stack(ThreadSlot& slot,
                                                                                          StackCapture capture) noexcept {
  std::uintptr_t frames[detail::kMaxStackFrames];
  const std::uint32_t frame_limit = max_frames.load(std::memory_order_relaxed);
  std::uint32_t depth = 0;
  switch (capture) {
    case StackCapture::native:
    case StackCapture::native_python: depth = detail::capture_native_stack(frames, frame_limit); break;
    case StackCapture::unwind:
    case StackCapture::unwind_python: depth = detail::capture_unwound_stack(frames, frame_limit); break;
    case StackCapture::none:
    case StackCapture::python: break;
  }
  if (capture == StackCapture::python || capture == StackCapture::native_python ||
      capture == StackCapture::unwind_python) {
    if (const detail::InstalledFrameSource* source = detail::installed_frame_source())
      depth = detail::append_interpreter_frames(*source, frames, depth, frame_limit);
    if (depth == 0) return 0;  // a thread that runs no interpreter code: no stack, as PyTorch records it
  }
  return slot.stacks.intern(table, frames, depth);
}

inline __attribute__((always_inline)) std::uint32_t HistoryRecorder::State::record(ThreadSlot& slot_ref,
                                                                                   const AllocatorEvent& event) noexcept {
  State& s = *this;
  ThreadSlot* const slot = &slot_ref;
  const std::uint64_t t = event_time(event);
  Chunk& chunk = slot->staging;
  // Room for the longest record (and a stream record) first, so that a
  // record can be written, and the previous one extended, without checks.
  make_room(*slot, t, event.stream.handle, detail::kMaxRecordWords);

  std::uint32_t stack = 0;
  if (const StackCapture capture = s.stacks.load(std::memory_order_relaxed);
      capture != StackCapture::none && wants_stack(event.kind, s.stacks_on_free.load(std::memory_order_relaxed)))
    stack = capture_stack(*slot, capture);
  const std::uint64_t stack_flag = stack ? std::uint64_t{detail::kRecordHasStack} : 0;

  // Fold the event into the previous record of the same call where the
  // record format has a compound for the pair (event_records.hpp).
  const std::uint32_t count = chunk.count.load(std::memory_order_relaxed);
  if (event.continues_call && slot->last_record != ThreadSlot::kNoRecord) {
    std::uint64_t* previous = chunk.words + slot->last_record;
    const std::uint64_t tag = previous[0] & detail::kRecordTagMask;
    if (event.kind == EventKind::alloc && tag == static_cast<std::uint64_t>(EventKind::split) &&
        previous[1] == event.address && previous[2] == event.size) {
      previous[0] = (previous[0] & ~std::uint64_t{detail::kRecordTagMask}) | detail::kRecordSplitAlloc | stack_flag;
      previous[4] = event.aux;
      previous[5] = stack;  // within the chunk: the record was written with kMaxRecordWords free
      chunk.used += stack ? 2 : 1;
      chunk.count.store(count + 1, std::memory_order_relaxed);
      slot->last_record = ThreadSlot::kNoRecord;
      return stack;
    }
    if (event.kind == EventKind::free_completed &&
        (tag & ~std::uint64_t{detail::kRecordHasStack}) == static_cast<std::uint64_t>(EventKind::free_requested) &&
        previous[1] == event.address && previous[2] == event.size && previous[3] == event.aux) {
      previous[0] = (previous[0] & ~std::uint64_t{detail::kRecordKindMask}) | detail::kRecordFree;
      chunk.count.store(count + 1, std::memory_order_relaxed);
      slot->last_record = ThreadSlot::kNoRecord;
      return 0;
    }
  }
  std::uint64_t* record = chunk.words + chunk.used;
  record[0] = detail::record_header(static_cast<std::uint64_t>(event.kind) | stack_flag, t, chunk.base_ticks);
  record[1] = event.address;
  record[2] = event.size;
  record[3] = event.aux;
  record[4] = stack;
  slot->last_record = chunk.used;
  chunk.used += stack ? 5 : 4;
  chunk.count.store(count + 1, std::memory_order_relaxed);
  if (event.kind == EventKind::oom) [[unlikely]] {
    s.record_oom_usage(slot->thread, t);
    s.request_oom_dump();
  }
  return stack;
}

std::uint32_t HistoryRecorder::on_event(const AllocatorEvent& event) noexcept {
  State& s = *state_;
  if (!s.recording.load(std::memory_order_relaxed)) return 0;
  ThreadSlot* slot = s.slot();
  if (!slot) [[unlikely]]
    return 0;
  return s.record(*slot, event);
}

static_assert(detail::kMaxBatchEvents == AllocatorEventBatch::kCapacity);

// One call for the events of one critical section of one shard: the cached
// path's split and alloc, a free's halves and its merges. The check, the
// slot, the time, the room and the stream once for all of them, and the
// compounds (event_records.hpp) written whole instead of folded.
std::uint32_t HistoryRecorder::on_events(const AllocatorEventBatch& batch) noexcept {
  State& s = *state_;
  if (!s.recording.load(std::memory_order_relaxed)) return 0;
  ThreadSlot* slot = s.slot();
  if (!slot) [[unlikely]]
    return 0;
  const std::uint32_t count = batch.count;
  if (count == 0 || count > AllocatorEventBatch::kCapacity) [[unlikely]]
    return 0;
  // One time for all: the later events continue the call on the same order
  // word, so event_time would give each the first one's.
  AllocatorEvent first{batch.items[0].kind, batch.stream, 0, 0, 0, batch.continues_call};
  first.order = batch.order;
  first.order_floor = batch.order_floor;
  const std::uint64_t t = s.event_time(first);
  s.make_room(*slot, t, batch.stream.handle, detail::kMaxBatchWords);
  Chunk& chunk = slot->staging;
  const StackCapture capture = s.stacks.load(std::memory_order_relaxed);
  const AllocatorEventBatch::Item* const items = batch.items;
  std::uint32_t alloc_id = 0;
  std::uint32_t i = 0;
  std::uint64_t* record = chunk.words + chunk.used;
  const std::uint64_t header = (t - chunk.base_ticks) << 8;
  // The allocator's batches open with the pair a compound holds (a split
  // and its alloc, a free's two halves), then merges: the compound is
  // looked for there only, and the rest written as plain records, which
  // decode to the same events as a compound would.
  if (count >= 2 && items[0].address == items[1].address && items[0].size == items[1].size) {
    if (items[0].kind == EventKind::split && items[1].kind == EventKind::alloc) {
      const std::uint32_t stack = capture != StackCapture::none ? s.capture_stack(*slot, capture) : 0;
      record[0] = header | detail::kRecordSplitAlloc | (stack ? std::uint64_t{detail::kRecordHasStack} : 0);
      record[1] = items[0].address;
      record[2] = items[0].size;
      record[3] = items[0].aux;
      record[4] = items[1].aux;
      record[5] = stack;
      record += stack ? 6 : 5;
      alloc_id = stack;
      i = 2;
    } else if (items[0].kind == EventKind::free_requested && items[1].kind == EventKind::free_completed &&
               items[0].aux == items[1].aux) {
      const std::uint32_t stack =
          capture != StackCapture::none && s.stacks_on_free.load(std::memory_order_relaxed)
              ? s.capture_stack(*slot, capture)
              : 0;
      record[0] = header | detail::kRecordFree | (stack ? std::uint64_t{detail::kRecordHasStack} : 0);
      record[1] = items[0].address;
      record[2] = items[0].size;
      record[3] = items[0].aux;
      record[4] = stack;
      record += stack ? 5 : 4;
      i = 2;
    }
  }
  for (; i < count; ++i) {
    const AllocatorEventBatch::Item& e = items[i];
    const std::uint32_t stack =
        capture != StackCapture::none && wants_stack(e.kind, s.stacks_on_free.load(std::memory_order_relaxed))
            ? s.capture_stack(*slot, capture)
            : 0;
    record[0] = header | static_cast<std::uint64_t>(e.kind) | (stack ? std::uint64_t{detail::kRecordHasStack} : 0);
    record[1] = e.address;
    record[2] = e.size;
    record[3] = e.aux;
    record[4] = stack;
    record += stack ? 5 : 4;
    if (e.kind == EventKind::alloc) alloc_id = stack;
  }
  chunk.used = static_cast<std::uint32_t>(record - chunk.words);
  chunk.count.store(chunk.count.load(std::memory_order_relaxed) + count, std::memory_order_relaxed);
  slot->last_record = ThreadSlot::kNoRecord;
  return alloc_id;
}

// The cached path's alloc (after its split) and free (with its merges), as
// on_events would write their batches, without a batch to read: the
// allocator's hottest calls.
std::uint32_t HistoryRecorder::on_alloc(const AllocatorEventOrigin& origin, bool continues_call,
                                        std::uintptr_t address, std::size_t size, std::size_t requested,
                                        std::size_t split_rest) noexcept {
  State& s = *state_;
  if (!s.recording.load(std::memory_order_relaxed)) return 0;
  ThreadSlot* const slot = s.slot();
  if (!slot) [[unlikely]]
    return 0;
  const std::uint64_t t = s.event_time(continues_call, false, origin.order, origin.order_floor);
  s.make_room(*slot, t, origin.stream.handle, detail::kMaxBatchWords);
  Chunk& chunk = slot->staging;
  const StackCapture capture = s.stacks.load(std::memory_order_relaxed);
  const std::uint32_t stack = capture != StackCapture::none ? s.capture_stack(*slot, capture) : 0;
  std::uint64_t* const record = chunk.words + chunk.used;
  const std::uint64_t header =
      ((t - chunk.base_ticks) << 8) | (stack ? std::uint64_t{detail::kRecordHasStack} : 0);
  record[1] = address;
  record[2] = size;
  std::uint32_t words = 0;
  if (split_rest != 0) {
    record[0] = header | detail::kRecordSplitAlloc;
    record[3] = split_rest;
    record[4] = requested;
    record[5] = stack;
    words = 5;
  } else {
    record[0] = header | static_cast<std::uint64_t>(EventKind::alloc);
    record[3] = requested;
    record[4] = stack;
    words = 4;
  }
  chunk.used += words + (stack ? 1 : 0);
  chunk.count.store(chunk.count.load(std::memory_order_relaxed) + (split_rest != 0 ? 2 : 1),
                    std::memory_order_relaxed);
  slot->last_record = ThreadSlot::kNoRecord;
  return stack;
}

void HistoryRecorder::on_free(const AllocatorEventOrigin& origin, bool continues_call, bool requested_too,
                              std::uintptr_t address, std::size_t size, std::size_t requested,
                              const AllocatorMerge* merges, std::uint32_t merge_count) noexcept {
  State& s = *state_;
  if (!s.recording.load(std::memory_order_relaxed)) return;
  ThreadSlot* const slot = s.slot();
  if (!slot) [[unlikely]]
    return;
  if (merge_count > 2) [[unlikely]]
    merge_count = 2;  // a free has two neighbours
  const std::uint64_t t = s.event_time(continues_call, false, origin.order, origin.order_floor);
  s.make_room(*slot, t, origin.stream.handle, detail::kMaxBatchWords);
  Chunk& chunk = slot->staging;
  const StackCapture capture = s.stacks.load(std::memory_order_relaxed);
  // Only the free_requested takes a stack, and only with stacks_on_free.
  const std::uint32_t stack = requested_too && capture != StackCapture::none &&
                                      s.stacks_on_free.load(std::memory_order_relaxed)
                                  ? s.capture_stack(*slot, capture)
                                  : 0;
  const std::uint64_t time_bits = (t - chunk.base_ticks) << 8;
  std::uint64_t* record = chunk.words + chunk.used;
  record[0] = time_bits | (requested_too ? std::uint64_t{detail::kRecordFree}
                                         : static_cast<std::uint64_t>(EventKind::free_completed)) |
              (stack ? std::uint64_t{detail::kRecordHasStack} : 0);
  record[1] = address;
  record[2] = size;
  record[3] = requested;
  record[4] = stack;
  record += stack ? 5 : 4;
  for (std::uint32_t i = 0; i < merge_count; ++i) {
    record[0] = time_bits | static_cast<std::uint64_t>(EventKind::merge);
    record[1] = merges[i].address;
    record[2] = merges[i].size;
    record[3] = merges[i].absorbed;
    record += 4;
  }
  chunk.used = static_cast<std::uint32_t>(record - chunk.words);
  chunk.count.store(chunk.count.load(std::memory_order_relaxed) + (requested_too ? 2 : 1) + merge_count,
                    std::memory_order_relaxed);
  slot->last_record = ThreadSlot::kNoRecord;
}

// A category event goes into the calling thread's own chunk, at a time no
// earlier than the thread's last event, so that it follows the thread's
// alloc of the same block in the ring's and the stream's order even where
// the clock (coarse) stamps both alike; annotations' shared chunk would only
// order it by time. Outside any shard lock, so ring_lock guards the chunk
// against a cut or a dump reading it (both read stagings under ring_lock).
void HistoryRecorder::tag_category(std::uintptr_t address, events::AllocationCategory category) noexcept {
  State& s = *state_;
  if (!s.recording.load(std::memory_order_relaxed)) return;
  ThreadSlot* const slot = s.slot();
  if (!slot) [[unlikely]]
    return;
  std::lock_guard lock(s.ring_lock);
  if (!s.recording.load(std::memory_order_relaxed)) return;
  const detail::TickSource source = s.tick_source();
  if (t_state.call_source != source) {
    t_state.call_source = source;
    t_state.call_time = 0;
  }
  const std::uint64_t t = std::max(detail::now_ticks(source) + t_state.clock_skew, t_state.call_time);
  t_state.call_time = t;
  Chunk& chunk = slot->staging;
  if (chunk.used + detail::kMaxRecordWords > Chunk::kWords || !detail::offset_fits(t, chunk.base_ticks))
    s.flush_locked(*slot);
  if (chunk.empty()) {
    chunk.base_ticks = t;
    chunk.words[chunk.used++] = detail::record_header(detail::kRecordStream, t, chunk.base_ticks);
    chunk.words[chunk.used++] = slot->stream;
  }
  chunk.newest_ticks = std::max(chunk.newest_ticks, t);
  std::uint64_t* record = chunk.words + chunk.used;
  record[0] = detail::record_header(static_cast<std::uint64_t>(EventKind::category), t, chunk.base_ticks);
  record[1] = address;
  record[2] = 0;
  record[3] = static_cast<std::uint64_t>(category);
  chunk.used += 4;
  chunk.count.store(chunk.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  slot->last_record = ThreadSlot::kNoRecord;
  if (chunk.used + detail::kMaxRecordWords > Chunk::kWords) s.flush_locked(*slot);
}

}  // namespace cachealloc
