// HistoryRecorder: the hot path (on_event, annotations) and the ring.
// Building the snapshot is in history_dump.cpp.
#include "history_state.hpp"
#include "ring_hook.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <cstring>
#include <ctime>
#include <new>

#include "cachealloc/errors.hpp"

namespace cachealloc {

using snapshot::EventKind;

namespace detail {

namespace {
std::mutex g_threads_mutex;
std::vector<std::uint64_t> g_threads;

std::uint32_t register_thread() noexcept {
  const auto tid = static_cast<std::uint64_t>(::syscall(SYS_gettid));
  std::lock_guard lock(g_threads_mutex);
  try {
    g_threads.push_back(tid);
  } catch (...) {
    return 0;  // out of memory: attribute to the first thread rather than fail
  }
  return static_cast<std::uint32_t>(g_threads.size() - 1);
}
}  // namespace

std::uint32_t thread_index() noexcept {
  thread_local const std::uint32_t index = register_thread();
  return index;
}

std::vector<std::uint64_t> registered_threads() {
  std::lock_guard lock(g_threads_mutex);
  return g_threads;
}

namespace {
std::uint64_t clock_ns(clockid_t clock) noexcept {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}
}  // namespace

// CLOCK_MONOTONIC through the vDSO: ~20 ns and no system call, the clock the
// snapshot model names, comparable across processes and with other tools'
// traces, and immune to the TSC calibration and migration questions that an
// rdtsc-based clock would raise for a gain of ~10 ns per event.
std::uint64_t monotonic_ns() noexcept { return clock_ns(CLOCK_MONOTONIC); }

// The kernel's last tick, read from the vDSO's data page: ~1-3 ns, no TSC.
std::uint64_t coarse_ns() noexcept { return clock_ns(CLOCK_MONOTONIC_COARSE); }

bool tsc_is_invariant() noexcept {
  static const bool invariant = [] {
#if defined(__x86_64__)
    std::FILE* cpuinfo = std::fopen("/proc/cpuinfo", "r");
    if (!cpuinfo) return false;
    char line[4096];
    bool constant = false, nonstop = false, rdtscp = false;  // now_ticks() reads it with RDTSCP
    while (std::fgets(line, sizeof(line), cpuinfo)) {
      if (std::strncmp(line, "flags", 5) != 0) continue;
      constant = std::strstr(line, " constant_tsc") != nullptr;
      nonstop = std::strstr(line, " nonstop_tsc") != nullptr;
      rdtscp = std::strstr(line, " rdtscp") != nullptr;
      break;
    }
    std::fclose(cpuinfo);
    return constant && nonstop && rdtscp;
#else
    return false;
#endif
  }();
  return invariant;
}

}  // namespace detail

namespace {

void validate(const HistoryOptions& options) {
  if (options.max_entries == 0) throw InvalidArgument("record_history: max_entries must be at least 1");
  if (options.max_frames == 0 || options.max_frames > detail::kMaxStackFrames)
    throw InvalidArgument("record_history: max_frames must be within [1, " +
                          std::to_string(detail::kMaxStackFrames) + "], not " + std::to_string(options.max_frames));
}

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

// Open annotations of this thread, innermost last, for annotate_end().
struct OpenAnnotation {
  const void* recorder;
  std::uint32_t name;
};
thread_local std::vector<OpenAnnotation> t_open_annotations;

}  // namespace

StackCapture parse_stack_capture(std::string_view text) {
  if (text == "none") return StackCapture::none;
  if (text == "native") return StackCapture::native;
  if (text == "unwind") return StackCapture::unwind;
  throw InvalidArgument("unknown stack capture '" + std::string(text) + "' (expected none, native or unwind)");
}

HistoryClock parse_history_clock(std::string_view text) {
  if (text == "precise") return HistoryClock::precise;
  if (text == "coarse") return HistoryClock::coarse;
  throw InvalidArgument("unknown history clock '" + std::string(text) + "' (expected precise or coarse)");
}

const char* to_string(HistoryClock clock) noexcept { return clock == HistoryClock::coarse ? "coarse" : "precise"; }

const char* to_string(StackCapture capture) noexcept {
  switch (capture) {
    case StackCapture::native: return "native";
    case StackCapture::unwind: return "unwind";
    case StackCapture::none: break;
  }
  return "none";
}

namespace {
std::atomic<std::uint64_t> g_next_recorder_id{1};
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

// An empty chunk from the spares, or a new one. Needs ring_lock.
Chunk* take_chunk(std::vector<Chunk*>& spare, std::vector<std::unique_ptr<Chunk>>& chunks) noexcept {
  if (!spare.empty()) {
    Chunk* chunk = spare.back();
    spare.pop_back();
    return chunk;
  }
  try {
    // Default-initialized: the 16 KiB of records are not zeroed (the copy
    // into the chunk writes what is read).
    chunks.push_back(std::unique_ptr<Chunk>(new Chunk));
    return chunks.back().get();
  } catch (...) {
    return nullptr;
  }
}
}  // namespace

HistoryRecorder::State::State(CachingAllocator& a)
    : allocator(a), id(g_next_recorder_id.fetch_add(1)), use_tsc(detail::tsc_is_invariant()) {}

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

namespace {
// Copies a chunk's records with stores that bypass the cache: the ring's
// chunk is written whole, so reading it in first would only cost time.
void stream_copy(Chunk& to, const Chunk& from) noexcept {
#if defined(__SSE2__)
  const auto* source = reinterpret_cast<const __m128i*>(from.words);
  auto* target = reinterpret_cast<__m128i*>(to.words);
  const std::size_t units = (from.used + 1) / 2;
  for (std::size_t i = 0; i < units; ++i) _mm_stream_si128(target + i, _mm_load_si128(source + i));
  _mm_sfence();
#else
  std::memcpy(to.words, from.words, from.used * sizeof(std::uint64_t));
#endif
  to.used = from.used;
  to.count.store(from.count.load(std::memory_order_relaxed), std::memory_order_relaxed);
  to.thread = from.thread;
  to.base_ticks = from.base_ticks;
  to.newest_ticks = from.newest_ticks;
}
}  // namespace

Chunk* HistoryRecorder::State::claim_locked(ThreadSlot& slot) noexcept {
  const std::size_t capacity = ring_capacity_locked();
  Chunk* target = nullptr;
  if (ring.size() < capacity) {
    target = take_chunk(spare, chunks);
    if (target) ring.push_back(target);
  } else {
    Chunk* oldest = ring[next % ring.size()];
    // Another thread may still be copying into it, if the ring went round
    // during that copy (a ring of a few chunks): it holds no lock we hold.
    while (oldest->busy.load(std::memory_order_acquire)) CACHEALLOC_CPU_RELAX();
    const std::uint32_t dropped = oldest->count.load(std::memory_order_relaxed);
    evicted += dropped;
    if (dropped) newest_dropped = std::max(newest_dropped, oldest->newest_ticks);
    target = oldest;
  }
  if (target) {
    target->busy.store(true, std::memory_order_relaxed);
    ++next;
  } else {  // out of memory for a chunk: these events are lost, and recording stops
    evicted += slot.staging.count.load(std::memory_order_relaxed);
    newest_dropped = std::max(newest_dropped, slot.staging.newest_ticks);
    deactivate("cannot allocate a chunk of the event ring (out of memory)");
  }
  return target;
}

namespace {
std::atomic<detail::RingCopyHook> g_ring_copy_hook{nullptr};
}  // namespace

detail::RingCopyHook detail::replace_ring_copy_hook(RingCopyHook hook) noexcept { return g_ring_copy_hook.exchange(hook); }

void detail::set_thread_clock_skew(std::int64_t ticks) noexcept { t_state.clock_skew = static_cast<std::uint64_t>(ticks); }

std::size_t HistoryRecorder::State::ring_capacity_locked() const noexcept {
  // Enough chunks for max_entries events however densely they are packed,
  // plus one so that a dump can always keep max_entries whatever the fill
  // of the newest chunks.
  return static_cast<std::size_t>((max_entries + Chunk::kMinEvents - 1) / Chunk::kMinEvents) + 1;
}

void HistoryRecorder::State::flush(ThreadSlot& slot) noexcept {
  if (slot.staging.empty()) return;
  Chunk* target = nullptr;
  // While the ring grows, a new chunk is allocated outside ring_lock, so
  // that threads do not queue behind one another's malloc; its pages are
  // first touched by the copy, also outside the lock, in parallel.
  std::unique_ptr<Chunk> fresh;
  bool allocation_failed = false;
  {
    std::unique_lock lock(ring_lock);
    for (;;) {
      if (fresh) {
        try {
          chunks.push_back(std::move(fresh));
          spare.push_back(chunks.back().get());
        } catch (...) {
          fresh.reset();
          allocation_failed = true;
        }
      }
      // Out of memory for a chunk: claim_locked finds none, and says so.
      if (!spare.empty() || ring.size() >= ring_capacity_locked() || allocation_failed) {
        target = claim_locked(slot);
        break;
      }
      lock.unlock();
      fresh.reset(new (std::nothrow) Chunk);
      allocation_failed = !fresh;
      lock.lock();
    }
  }
  if (const detail::RingCopyHook hook = g_ring_copy_hook.load(std::memory_order_relaxed)) [[unlikely]]
    hook();
  if (target) {
    stream_copy(*target, slot.staging);
    target->busy.store(false, std::memory_order_release);
  }
  slot.staging.clear();
  slot.last_record = ThreadSlot::kNoRecord;
}

void HistoryRecorder::State::flush_locked(ThreadSlot& slot) noexcept {
  if (slot.staging.empty()) return;
  if (Chunk* target = claim_locked(slot)) {
    stream_copy(*target, slot.staging);
    target->busy.store(false, std::memory_order_release);
  }
  slot.staging.clear();
  slot.last_record = ThreadSlot::kNoRecord;
}

void HistoryRecorder::State::deactivate(const char* why) noexcept {
  recording.store(false, std::memory_order_release);
  if (!deactivated.exchange(true, std::memory_order_acq_rel))
    std::fprintf(stderr, "cachealloc: %s; deactivating history recording\n", why);
}

void HistoryRecorder::State::append_direct(const snapshot::Event& event) noexcept {
  std::lock_guard lock(ring_lock);
  ThreadSlot& slot = *annotation_slot;
  Chunk& chunk = slot.staging;
  if (!chunk.empty() && !detail::offset_fits(event.time_ns, chunk.base_ticks)) flush_locked(slot);
  if (chunk.empty()) {
    chunk.base_ticks = chunk.newest_ticks = event.time_ns;
    chunk.words[chunk.used++] = detail::record_header(detail::kRecordStream, event.time_ns, chunk.base_ticks);
    chunk.words[chunk.used++] = event.stream;
    slot.stream = event.stream;
  } else if (slot.stream != event.stream) {
    chunk.words[chunk.used++] = detail::record_header(detail::kRecordStream, event.time_ns, chunk.base_ticks);
    chunk.words[chunk.used++] = event.stream;
    slot.stream = event.stream;
  }
  // Threads append here in the order they take ring_lock, not of their
  // times: the newest is the largest.
  chunk.newest_ticks = std::max(chunk.newest_ticks, event.time_ns);
  std::uint64_t* record = chunk.words + chunk.used;
  const bool has_stack = event.stack.value != 0;
  record[0] = detail::record_header(static_cast<std::uint64_t>(event.kind) | detail::kRecordHasThread |
                                        (has_stack ? std::uint64_t{detail::kRecordHasStack} : 0),
                                    event.time_ns, chunk.base_ticks);
  record[1] = event.address;
  record[2] = event.size;
  record[3] = event.aux;
  std::uint32_t words = 4;
  if (has_stack) record[words++] = event.stack.value;
  record[words++] = event.thread;
  chunk.used += words;
  chunk.count.store(chunk.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (chunk.used + detail::kMaxRecordWords > Chunk::kWords) flush_locked(slot);
}

std::uint32_t HistoryRecorder::State::string_id(std::string_view text) {
  std::lock_guard lock(strings_mutex);
  auto [it, inserted] = string_ids.try_emplace(std::string(text), static_cast<std::uint32_t>(strings.size()));
  if (inserted) strings.emplace_back(text);
  return it->second;
}

// What nvidia-smi would show at this OOM. Runs under the pool lock of the
// failed allocation, which an OOM holds anyway; NVML takes 0.1-1 ms.
void HistoryRecorder::State::record_oom_usage(std::uint32_t thread, std::uint64_t at_ticks) noexcept {
  try {
    OomUsage reading{thread, at_ticks, allocator.device().usage()};
    std::lock_guard lock(usage_mutex);
    if (oom_usage.size() >= kMaxOomUsage) oom_usage.erase(oom_usage.begin());
    oom_usage.push_back(std::move(reading));
  } catch (...) {
    // Out of memory for the reading: the OOM keeps its event, without NVML's figures.
  }
}

void HistoryRecorder::State::request_oom_dump() noexcept {
  std::lock_guard lock(oom_mutex);
  if (!oom_worker.joinable()) return;
  oom_requested = true;
  ++oom_requests;
  oom_cv.notify_all();
}

HistoryRecorder::HistoryRecorder(CachingAllocator& allocator, const HistoryOptions& options)
    : state_(std::make_unique<State>(allocator)) {
  state_->device = allocator.device().index();
  if (options.enabled) {
    start(options);
  } else {
    validate(options);
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
  validate(options);
  State& s = *state_;
  std::lock_guard control(s.control);
  // Reset while every pool lock is held, so that no event is in flight.
  s.allocator.layout([&] {
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
  });
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
  s.deactivated.store(false, std::memory_order_relaxed);
  s.recording.store(true, std::memory_order_release);
  s.allocator.set_observer(this);
}

void HistoryRecorder::stop() noexcept {
  State& s = *state_;
  s.recording.store(false, std::memory_order_release);
  s.allocator.set_observer(nullptr);
  // Every on_event runs under a pool lock, so once layout() has held them
  // all, no call is left in flight and the caller may destroy us.
  try {
    (void)s.allocator.layout();
  } catch (...) {
  }
}

bool HistoryRecorder::recording() const noexcept { return state_->recording.load(std::memory_order_acquire); }

// The time of an event: one clock read per critical section (the split
// before an alloc and the merges after a free continue the call's first
// event). Reading the clock costs more than the rest of an event, and the
// ordered read (RDTSCP) about twice the unordered one, so the order comes
// from the allocator's order words instead (AllocatorEvent::order): each
// event is later than the pool's last, than the allocator's last event of
// no one pool, and than this thread's last. Only a new segment or mapping,
// whose address the device may just have taken back from another pool,
// reads the ordered clock.
static_assert(detail::kMaxBatchEvents == AllocatorEventBatch::kCapacity);

inline __attribute__((always_inline)) std::uint64_t HistoryRecorder::State::event_time(
    const AllocatorEvent& event) noexcept {
  const detail::TickSource source = tick_source();
  if (t_state.call_source != source) [[unlikely]] {
    t_state.call_source = source;
    t_state.call_time = 0;
  }
  std::uint64_t t = t_state.call_time;
  if (!event.continues_call) {
    const bool after_device_call = event.kind == EventKind::segment_alloc || event.kind == EventKind::segment_map;
    const std::uint64_t now =
        (after_device_call ? detail::now_ticks(source) : detail::now_ticks_unordered(source)) + t_state.clock_skew;
    t = std::max(t, now);
  }
  if (event.order_floor && t <= *event.order_floor) t = *event.order_floor + 1;
  if (event.order) {
    // Strictly after the pool's last event, unless that was this call's
    // previous event, on the same word: one call's events share its time.
    const bool own_last = event.continues_call && event.order == t_state.last_order && *event.order == t;
    if (t <= *event.order && !own_last) t = *event.order + 1;
    *event.order = t;
  }
  t_state.last_order = event.order;
  t_state.call_time = t;
  return t;
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
// no shared line (StackCache).
__attribute__((noinline)) std::uint32_t HistoryRecorder::State::capture_stack(ThreadSlot& slot,
                                                                                          StackCapture capture) noexcept {
  std::uintptr_t frames[detail::kMaxStackFrames];
  const std::uint32_t frame_limit = max_frames.load(std::memory_order_relaxed);
  const std::uint32_t depth = capture == StackCapture::native ? detail::capture_native_stack(frames, frame_limit)
                                                              : detail::capture_unwound_stack(frames, frame_limit);
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

// One call for the events of one critical section of one pool: the cached
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
  const bool on_free = s.stacks_on_free.load(std::memory_order_relaxed);
  std::uint32_t alloc_id = 0;
  std::uint32_t recorded = 0;
  std::uint64_t* record = chunk.words + chunk.used;
  const std::uint64_t header = (t - chunk.base_ticks) << 8;
  for (std::uint32_t i = 0; i < count;) {
    const AllocatorEventBatch::Item& e = batch.items[i];
    const AllocatorEventBatch::Item* next = i + 1 < count ? &batch.items[i + 1] : nullptr;
    record[1] = e.address;
    record[2] = e.size;
    record[3] = e.aux;
    if (next && e.kind == EventKind::split && next->kind == EventKind::alloc && next->address == e.address &&
        next->size == e.size) {
      const std::uint32_t stack = capture != StackCapture::none ? s.capture_stack(*slot, capture) : 0;
      record[0] = header | detail::kRecordSplitAlloc | (stack ? std::uint64_t{detail::kRecordHasStack} : 0);
      record[4] = next->aux;
      record[5] = stack;
      record += stack ? 6 : 5;
      alloc_id = stack;
      recorded += 2;
      i += 2;
      continue;
    }
    const std::uint32_t stack =
        capture != StackCapture::none && wants_stack(e.kind, on_free) ? s.capture_stack(*slot, capture) : 0;
    const std::uint64_t stack_flag = stack ? std::uint64_t{detail::kRecordHasStack} : 0;
    record[4] = stack;
    if (next && e.kind == EventKind::free_requested && next->kind == EventKind::free_completed &&
        next->address == e.address && next->size == e.size && next->aux == e.aux) {
      record[0] = header | detail::kRecordFree | stack_flag;
      record += stack ? 5 : 4;
      recorded += 2;
      i += 2;
      continue;
    }
    record[0] = header | static_cast<std::uint64_t>(e.kind) | stack_flag;
    record += stack ? 5 : 4;
    if (e.kind == EventKind::alloc) alloc_id = stack;
    ++recorded;
    ++i;
  }
  chunk.used = static_cast<std::uint32_t>(record - chunk.words);
  chunk.count.store(chunk.count.load(std::memory_order_relaxed) + recorded, std::memory_order_relaxed);
  slot->last_record = ThreadSlot::kNoRecord;
  return alloc_id;
}

void HistoryRecorder::annotate_begin(std::string_view name) noexcept {
  State& s = *state_;
  if (!s.recording.load(std::memory_order_relaxed)) return;
  try {
    const std::uint32_t id = s.string_id(name);
    t_open_annotations.push_back(OpenAnnotation{this, id});
    snapshot::Event record;
    record.kind = EventKind::annotation_begin;
    record.device = s.device;
    record.thread = detail::thread_index();
    record.time_ns = detail::now_ticks(s.tick_source());
    record.aux = id;
    s.append_direct(record);
  } catch (...) {
    // Out of memory for a name: the phase goes unmarked, the program goes on.
  }
}

void HistoryRecorder::annotate_end() noexcept {
  State& s = *state_;
  auto& open = t_open_annotations;
  for (auto it = open.rbegin(); it != open.rend(); ++it) {
    if (it->recorder != this) continue;
    const std::uint32_t id = it->name;
    open.erase(std::next(it).base());
    if (!s.recording.load(std::memory_order_relaxed)) return;
    snapshot::Event record;
    record.kind = EventKind::annotation_end;
    record.device = s.device;
    record.thread = detail::thread_index();
    record.time_ns = detail::now_ticks(s.tick_source());
    record.aux = id;
    s.append_direct(record);
    return;
  }
}

std::uint64_t HistoryRecorder::recorded_events() const noexcept {
  State& s = *state_;
  std::lock_guard lock(s.ring_lock);
  std::uint64_t total = s.evicted;
  for (const Chunk* chunk : s.ring) total += chunk->count.load(std::memory_order_relaxed);
  for (const auto& slot : s.slots) total += slot->staging.count.load(std::memory_order_relaxed);
  total += s.annotation_slot->staging.count.load(std::memory_order_relaxed);
  return total;
}

std::uint64_t HistoryRecorder::dropped_events() const noexcept {
  std::lock_guard lock(state_->ring_lock);
  return state_->evicted;
}

HistoryOptions HistoryRecorder::options() const {
  std::lock_guard lock(state_->control);
  return state_->options;
}

void HistoryRecorder::oom_dump_loop() noexcept {
  State& s = *state_;
  std::unique_lock lock(s.oom_mutex);
  for (;;) {
    s.oom_cv.wait(lock, [&] { return s.oom_requested || s.quitting; });
    if (!s.oom_requested) return;
    s.oom_requested = false;
    s.oom_busy = true;
    const std::uint64_t covers = s.oom_requests;  // this dump answers every request so far
    std::filesystem::path path;
    try {
      path = s.oom_dump_path;
    } catch (...) {
    }
    lock.unlock();
    // Blocks until the allocator thread that reported the OOM has left its locks.
    if (!path.empty()) dump_snapshot(path);
    lock.lock();
    s.oom_busy = false;
    s.oom_dumped = covers;
    s.oom_cv.notify_all();
  }
}

void HistoryRecorder::flush() noexcept {
  State& s = *state_;
  std::unique_lock lock(s.oom_mutex);
  // Waits for the requests made before this call only: under OOMs that keep
  // coming (a loop that retries), waiting for an idle worker could be forever.
  const std::uint64_t target = s.oom_requests;
  s.oom_cv.wait(lock, [&] { return s.oom_dumped >= target || !s.oom_worker.joinable(); });
}

AnnotationScope::AnnotationScope(std::string_view name) noexcept {
  try {
    recorder_ = &global_history();
    recorder_->annotate_begin(name);
  } catch (...) {
    recorder_ = nullptr;
  }
}

}  // namespace cachealloc
