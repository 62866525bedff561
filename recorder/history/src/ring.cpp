// The ring of chunks: a thread's full staging chunk moves into it (flush),
// evicting the oldest once the ring is full; and the event counts it keeps.
#include "history_state.hpp"
#include "ring_hook.hpp"

#include <algorithm>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <cstring>
#include <new>

namespace cachealloc {

namespace {

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

// Copies a chunk's records with stores that bypass the cache: the ring's
// chunk is written whole, so reading it in first would only cost time.
void stream_copy(Chunk& to, const Chunk& from) noexcept {
#if defined(__SSE2__)
  const auto* source = reinterpret_cast<const __m128i*>(from.words);
  auto* target = reinterpret_cast<__m128i*>(to.words);
  const std::size_t units = (from.used + 1) / 2;
  // A cache line per iteration: a quarter of the loop's own instructions.
  std::size_t i = 0;
  for (; i + 4 <= units; i += 4) {
    const __m128i a = _mm_load_si128(source + i), b = _mm_load_si128(source + i + 1);
    const __m128i c = _mm_load_si128(source + i + 2), d = _mm_load_si128(source + i + 3);
    _mm_stream_si128(target + i, a);
    _mm_stream_si128(target + i + 1, b);
    _mm_stream_si128(target + i + 2, c);
    _mm_stream_si128(target + i + 3, d);
  }
  for (; i < units; ++i) _mm_stream_si128(target + i, _mm_load_si128(source + i));
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

std::atomic<detail::RingCopyHook> g_ring_copy_hook{nullptr};

}  // namespace

detail::RingCopyHook detail::replace_ring_copy_hook(RingCopyHook hook) noexcept { return g_ring_copy_hook.exchange(hook); }

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

std::size_t HistoryRecorder::State::ring_capacity_locked() const noexcept {
  // Enough chunks for max_entries events however densely they are packed,
  // plus one so that a dump can always keep max_entries whatever the fill
  // of the newest chunks.
  return static_cast<std::size_t>((max_entries + Chunk::kMinEvents - 1) / Chunk::kMinEvents) + 1;
}

void HistoryRecorder::State::flush(ThreadSlot& slot) noexcept {
  if (slot.staging.empty()) return;
  if (streaming) [[unlikely]] {  // set only while every shard lock is held; we hold one
    flush_to_stream(slot);
    return;
  }
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
  if (streaming) [[unlikely]] {
    flush_to_stream_locked(slot);
    return;
  }
  if (Chunk* target = claim_locked(slot)) {
    stream_copy(*target, slot.staging);
    target->busy.store(false, std::memory_order_release);
  }
  slot.staging.clear();
  slot.last_record = ThreadSlot::kNoRecord;
}

std::uint64_t HistoryRecorder::recorded_events() const noexcept {
  State& s = *state_;
  std::lock_guard lock(s.ring_lock);
  std::uint64_t total = s.evicted + s.streamed + s.stream_spilled;
  for (const Chunk* chunk : s.ring) total += chunk->count.load(std::memory_order_relaxed);
  for (const auto& slot : s.slots) total += slot->staging.count.load(std::memory_order_relaxed);
  total += s.annotation_slot->staging.count.load(std::memory_order_relaxed);
  return total;
}

std::uint64_t HistoryRecorder::dropped_events() const noexcept {
  std::lock_guard lock(state_->ring_lock);
  return state_->evicted;
}

}  // namespace cachealloc
