// The streamed recording's writer thread and the hot path's slow path into
// its queue (stream_recorder.hpp).
#include "stream_recorder.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/text.hpp"
#include "dump_parts.hpp"
#include "event_records.hpp"
#include "ring_hook.hpp"
#include "stack_symbols.hpp"

namespace cachealloc {

namespace {

constexpr auto kCutInterval = std::chrono::milliseconds(20);
// A partial block is written once it waited this long, so that a reader
// following the file sees the run as it goes, and a kill loses little.
constexpr auto kPartialBlockAge = std::chrono::milliseconds(1000);
// The writer's own memory besides the pool: a block of decoded events
// (64 Ki x 56 B), its encoding and compression, the staging copies.
constexpr std::size_t kWriterBytes = std::size_t{8} << 20;

std::atomic<detail::StreamCutHook> g_stream_cut_hook{nullptr};
std::atomic<detail::StreamCutHook> g_stream_locking_hook{nullptr};

std::string valid(std::string text) {
  return snapshot::invalid_utf8_bytes(text) == 0 ? text : snapshot::to_valid_utf8(text);
}

snapshot::DeviceInfo describe(Device& device) {
  snapshot::DeviceInfo info;
  info.index = device.index();
  info.name = valid(device.name());
  try {
    const MemoryInfo memory = device.memory_info();
    info.total_bytes = memory.total;
    info.driver_free_at_dump = memory.free;
    info.driver_total_at_dump = memory.total;
  } catch (const std::exception&) {
  }
  return info;
}

snapshot::Snapshot describe_run(HistoryRecorder::State& s, const HistoryOptions& options) {
  snapshot::Snapshot out;
  out.header = detail::history_header();
  out.devices.push_back(describe(s.allocator.device()));
  detail::history_settings(out.settings, s.allocator.config(), s.allocator.device(), options);
  out.settings["history.stream"] = options.stream.string();
  out.settings["history.stream_when_full"] = to_string(options.stream_when_full);
  out.settings["history.stream_buffer_bytes"] = std::to_string(options.stream_buffer_bytes);
  detail::make_history_text_valid(out);
  return out;
}

}  // namespace

detail::StreamCutHook detail::replace_stream_cut_hook(StreamCutHook hook) noexcept {
  return g_stream_cut_hook.exchange(hook);
}

detail::StreamCutHook detail::replace_stream_locking_hook(StreamCutHook hook) noexcept {
  return g_stream_locking_hook.exchange(hook);
}

StreamWhenFull parse_stream_when_full(std::string_view text) {
  if (text == "wait") return StreamWhenFull::wait;
  if (text == "drop") return StreamWhenFull::drop;
  throw InvalidArgument("unknown stream_when_full '" + std::string(text) + "' (expected wait or drop)");
}

const char* to_string(StreamWhenFull when_full) noexcept { return when_full == StreamWhenFull::drop ? "drop" : "wait"; }

std::size_t stream_chunk_limit(const HistoryOptions& options) {
  return (options.stream_buffer_bytes - kWriterBytes) / sizeof(Chunk) - HistoryRecorder::State::kStreamReserveChunks;
}

// --- the hot path's slow path -----------------------------------------------

namespace {
// A chunk for the queue, or nullptr. Needs ring_lock. Outside a cut the
// chunks in use (queued, or being written) stay within stream_chunk_limit,
// so that the reserve above it is free whenever a cut begins.
Chunk* stream_chunk_locked(HistoryRecorder::State& s, bool cut) noexcept {
  const std::size_t limit = s.stream_chunk_limit + (cut ? HistoryRecorder::State::kStreamReserveChunks : 0);
  if (s.chunks.size() - s.spare.size() >= limit) return nullptr;
  if (!s.spare.empty()) {
    Chunk* chunk = s.spare.back();
    s.spare.pop_back();
    return chunk;
  }
  try {
    s.chunks.push_back(std::unique_ptr<Chunk>(new Chunk));
  } catch (...) {
    return nullptr;
  }
  s.stream_peak_chunks = std::max(s.stream_peak_chunks, s.chunks.size());
  return s.chunks.back().get();
}

void queue_locked(HistoryRecorder::State& s, Chunk& target, const Chunk& staging) {
  std::memcpy(target.words, staging.words, staging.used * sizeof(std::uint64_t));
  target.used = staging.used;
  target.count.store(staging.count.load(std::memory_order_relaxed), std::memory_order_relaxed);
  target.thread = staging.thread;
  target.base_ticks = staging.base_ticks;
  target.newest_ticks = staging.newest_ticks;
  target.sequence = ++s.stream_sequence;
  s.ring.push_back(&target);
}
}  // namespace

void HistoryRecorder::State::flush_to_stream(ThreadSlot& slot) noexcept {
  Chunk& staging = slot.staging;
  bool wake = false;
  for (;;) {
    std::uint64_t spill = 0;  // the spilled chunk's sequence
    {
      std::lock_guard lock(ring_lock);
      const bool cut = stream_cut.load(std::memory_order_acquire);
      if (Chunk* target = stream_chunk_locked(*this, cut)) {
        queue_locked(*this, *target, staging);
        wake = ring.size() * 4 >= stream_chunk_limit;
        break;
      }
      if (stream_drop) {
        evicted += staging.count.load(std::memory_order_relaxed);
        newest_dropped = std::max(newest_dropped, staging.newest_ticks);
        break;
      }
      // The writer is taking every shard lock for a cut and we hold one:
      // waiting would block the cut, which is what frees buffers.
      if (cut)
        spill = ++stream_sequence;
      else
        ++stream_waits;
    }
    if (spill) {
      const bool spilled = stream_writer->spill(staging, spill);
      std::lock_guard lock(ring_lock);
      if (spilled) {
        stream_spilled += staging.count.load(std::memory_order_relaxed);
      } else {  // the disk refused even this: counted
        evicted += staging.count.load(std::memory_order_relaxed);
        newest_dropped = std::max(newest_dropped, staging.newest_ticks);
      }
      break;
    }
    stream_writer->wake();
    const timespec pause{0, 50'000};
    ::nanosleep(&pause, nullptr);
  }
  if (wake) stream_writer->wake();
  staging.clear();
  slot.last_record = ThreadSlot::kNoRecord;
}

void HistoryRecorder::State::flush_to_stream_locked(ThreadSlot& slot) noexcept {
  if (Chunk* target = stream_chunk_locked(*this, true)) {
    queue_locked(*this, *target, slot.staging);
  } else if (!stream_drop && stream_writer->spill(slot.staging, ++stream_sequence)) {
    stream_spilled += slot.staging.count.load(std::memory_order_relaxed);
  } else {
    evicted += slot.staging.count.load(std::memory_order_relaxed);
    newest_dropped = std::max(newest_dropped, slot.staging.newest_ticks);
  }
  slot.staging.clear();
  slot.last_record = ThreadSlot::kNoRecord;
}

StreamStatus HistoryRecorder::stream_status() const {
  State& s = *state_;
  StreamStatus status;
  {
    std::lock_guard control(s.control);
    status = s.stream_writer ? s.stream_writer->status() : s.last_stream_status;
  }
  std::lock_guard lock(s.ring_lock);
  status.active = s.streaming;
  status.dropped_events = s.evicted;
  status.waits = s.stream_waits;
  status.buffer_bytes += s.chunks.size() * sizeof(Chunk);
  status.peak_buffer_bytes = std::max<std::uint64_t>(status.peak_buffer_bytes, s.stream_peak_chunks * sizeof(Chunk) + kWriterBytes);
  return status;
}

// --- the writer ---------------------------------------------------------------

StreamRecorder::StreamRecorder(HistoryRecorder::State& state, const HistoryOptions& options)
    : s_(state), options_(options), spill_(options.stream.parent_path()) {
  file_ = std::make_unique<snapshot::StreamFileWriter>(options.stream);
  block_.reserve(snapshot::kStreamBlockEvents);
  pending_.first_string = strings_size_;
  pending_.first_frame = frames_size_;
  pending_.first_stack = stacks_size_;
  pending_.first_thread = threads_size_;
}

bool StreamRecorder::spill(const Chunk& staging, std::uint64_t sequence) noexcept {
  return spill_.append(staging, sequence);
}

bool StreamRecorder::begin(std::vector<snapshot::Segment> start_layout) {
  try {
    // Blocks alive before the stream began keep their stacks: the tables
    // chunk right after the start chunk adds them.
    for (snapshot::Segment& segment : start_layout) {
      segment.stack = snapshot::StackId{stack_id(segment.stack.value)};
      for (snapshot::Block& block : segment.blocks) block.stack = snapshot::StackId{stack_id(block.stack.value)};
    }
    snapshot::Snapshot head = describe_run(s_, options_);
    head.segments = std::move(start_layout);
    file_->start(head);
    write_block();
  } catch (const std::exception& e) {
    fail(e.what());
    return false;
  } catch (...) {
    fail("unknown error");
    return false;
  }
  thread_ = std::thread([this] { run(); });
  return true;
}

StreamRecorder::~StreamRecorder() { finish(); }

void StreamRecorder::wake() noexcept {
  std::lock_guard lock(mutex_);
  woken_ = true;
  wake_.notify_one();
}

void StreamRecorder::finish() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    finishing_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  finished_ = true;
}

StreamStatus StreamRecorder::status() const {
  std::lock_guard lock(mutex_);
  StreamStatus status;
  status.events_written = events_written_;
  status.bytes_written = bytes_written_;
  status.error = error_;
  status.spilled_chunks = spill_.spilled_chunks();
  return status;
}

void StreamRecorder::run() noexcept {
  bool last = false;
  auto last_write = std::chrono::steady_clock::now();
  while (!last) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, kCutInterval, [&] { return woken_ || finishing_; });
      woken_ = false;
      last = finishing_;
    }
    if (const detail::StreamCutHook hook = g_stream_cut_hook.load(std::memory_order_relaxed)) [[unlikely]]
      hook();
    try {
      cut(last);
      const auto now = std::chrono::steady_clock::now();
      if (last || (!block_.empty() && now - last_write >= kPartialBlockAge)) write_block();
      if (block_.empty()) last_write = now;
      if (last) {
        snapshot::Snapshot trailer = describe_run(s_, options_);
        trailer.stats = std::move(final_stats_);
        add_final_usage(trailer.devices.at(0));
        for (snapshot::Segment& segment : final_layout_) {
          segment.stack = snapshot::StackId{stack_id(segment.stack.value)};
          for (snapshot::Block& block : segment.blocks) block.stack = snapshot::StackId{stack_id(block.stack.value)};
        }
        trailer.segments = std::move(final_layout_);
        {
          std::lock_guard lock(s_.ring_lock);
          trailer.dropped_events = s_.evicted;
        }
        write_block();  // the tables the layout's stacks added
        file_->finish(trailer);
        std::lock_guard lock(mutex_);
        bytes_written_ = file_->bytes_written();
      }
    } catch (const std::exception& e) {
      fail(e.what());
      return;
    } catch (...) {
      fail("unknown error");
      return;
    }
  }
}

// The driver's and NVML's readings at the last cut, as a dump stores them.
void StreamRecorder::add_final_usage(snapshot::DeviceInfo& info) const {
  if (final_memory_) {
    info.total_bytes = final_memory_->total;
    info.driver_free_at_dump = final_memory_->free;
    info.driver_total_at_dump = final_memory_->total;
  }
  const DeviceUsage& u = final_usage_;
  info.usage_note = valid(u.note);
  switch (u.source) {
    case DeviceUsage::Source::nvml: info.usage_source = snapshot::UsageSource::nvml; break;
    case DeviceUsage::Source::simulated: info.usage_source = snapshot::UsageSource::simulated; break;
    case DeviceUsage::Source::unavailable: info.usage_source = snapshot::UsageSource::unavailable; return;
  }
  // The readings taken at OOMs, each at the index its OOM event has in the
  // file (a dump pairs them the same way), then the one at the end.
  std::vector<HistoryRecorder::State::OomUsage> readings;
  {
    std::lock_guard lock(s_.usage_mutex);
    readings = s_.oom_usage;
  }
  for (const HistoryRecorder::State::OomUsage& r : readings) {
    if (r.usage.source == DeviceUsage::Source::unavailable) continue;
    for (const OomEvent& oom : oom_events_) {
      if (oom.ticks != r.ticks || oom.thread != r.thread) continue;
      snapshot::DeviceUsage at_oom = detail::usage_reading(r.usage);
      at_oom.event = oom.index;
      at_oom.time_ns = oom.ns;
      info.usage.push_back(at_oom);
      break;
    }
  }
  std::sort(info.usage.begin(), info.usage.end(),
            [](const snapshot::DeviceUsage& a, const snapshot::DeviceUsage& b) { return a.event < b.event; });
  snapshot::DeviceUsage reading = detail::usage_reading(u);
  reading.time_ns = last_ns_;
  info.usage.push_back(reading);
}

void StreamRecorder::fail(const std::string& why) noexcept {
  {
    std::lock_guard lock(mutex_);
    error_ = why;
  }
  std::fprintf(stderr, "cachealloc: cannot write the memory stream %s: %s; deactivating history recording\n",
               options_.stream.c_str(), why.c_str());
  {
    // Threads waiting for room drop from now on; what is queued goes back.
    std::lock_guard lock(s_.ring_lock);
    s_.stream_drop = true;
    s_.recording.store(false, std::memory_order_release);
    for (Chunk* chunk : s_.ring) {
      s_.evicted += chunk->count.load(std::memory_order_relaxed);
      chunk->clear();
      s_.spare.push_back(chunk);
    }
    s_.ring.clear();
    s_.evicted += s_.stream_spilled;
    s_.stream_spilled = 0;
    spill_.take();
  }
  s_.deactivated.store(true, std::memory_order_relaxed);
}

void StreamRecorder::cut(bool last) {
  std::vector<Piece> pieces;
  std::vector<std::size_t> copy_offsets;
  staging_copy_.clear();
  s_.stream_cut.store(true, std::memory_order_release);
  if (const detail::StreamCutHook hook = g_stream_locking_hook.load(std::memory_order_relaxed)) [[unlikely]]
    hook();
  std::vector<snapshot::Segment> layout;
  try {
    layout = s_.allocator.layout([&] {
      if (last) {
        s_.recording.store(false, std::memory_order_release);
        final_stats_ = s_.allocator.stats().to_map();
        final_usage_ = s_.allocator.device().usage();
        try {
          final_memory_ = s_.allocator.device().memory_info();
        } catch (const std::exception&) {
        }
      }
      std::lock_guard lock(s_.ring_lock);
      for (Chunk* chunk : s_.ring) {
        pieces.push_back(Piece{chunk->words, chunk->used, chunk->base_ticks, chunk->thread, chunk, chunk->sequence});
        s_.streamed += chunk->count.load(std::memory_order_relaxed);
      }
      s_.ring.clear();
      s_.streamed += s_.stream_spilled;
      s_.stream_spilled = 0;
      std::size_t words = s_.annotation_slot->staging.used;
      for (const auto& slot : s_.slots) words += slot->staging.used;
      staging_copy_.reserve(words);
      auto take = [&](ThreadSlot& slot) {
        Chunk& staging = slot.staging;
        if (staging.empty()) return;
        copy_offsets.push_back(staging_copy_.size());
        pieces.push_back(Piece{nullptr, staging.used, staging.base_ticks, staging.thread, nullptr, kStagingSequence});
        staging_copy_.insert(staging_copy_.end(), staging.words, staging.words + staging.used);
        s_.streamed += staging.count.load(std::memory_order_relaxed);
        staging.clear();
        slot.last_record = ThreadSlot::kNoRecord;
      };
      for (auto& slot : s_.slots) take(*slot);
      take(*s_.annotation_slot);
      spilled_ = spill_.take();  // no thread spills meanwhile: spilling takes a shard lock or ring_lock
      cut_anchor_ = detail::TickAnchor::now(s_.tick_source());
      if (last) s_.streaming = false;
    });
  } catch (...) {
    s_.stream_cut.store(false, std::memory_order_release);
    throw;
  }
  s_.stream_cut.store(false, std::memory_order_release);
  if (last) final_layout_ = std::move(layout);
  std::size_t copy = 0;
  for (Piece& piece : pieces)
    if (piece.pooled == nullptr) piece.words = staging_copy_.data() + copy_offsets[copy++];
  for (std::size_t i = 0; i < spilled_.size(); ++i) {
    const StreamSpill::Piece& spilled = spilled_[i];
    pieces.push_back(Piece{nullptr, spilled.used, spilled.base_ticks, spilled.thread, nullptr, spilled.sequence, &spilled});
  }
  const detail::TickAnchor& start = s_.anchor;
  tick_ns_ = cut_anchor_.ticks > start.ticks ? static_cast<long double>(cut_anchor_.ns - start.ns) /
                                                   static_cast<long double>(cut_anchor_.ticks - start.ticks)
                                             : 1.0L;
  write_cut(pieces);
}

// Merges the cut's pieces by time: each thread's pieces are in time order
// (a thread's clock never goes back), so a merge of one cursor per thread.
void StreamRecorder::write_cut(std::vector<Piece>& pieces) {
  struct Cursor {
    std::vector<const Piece*> pieces;
    std::size_t next = 0;
    std::vector<snapshot::Event> events;
    std::size_t at = 0;
  };
  std::vector<Cursor> cursors;
  std::unordered_map<std::uint32_t, std::size_t> by_thread;
  for (const Piece& piece : pieces) {
    auto [it, inserted] = by_thread.try_emplace(piece.thread, cursors.size());
    if (inserted) cursors.emplace_back();
    cursors[it->second].pieces.push_back(&piece);
  }
  // Queued, spilled, then staging: a thread's pieces in the order it made them.
  for (Cursor& c : cursors)
    std::stable_sort(c.pieces.begin(), c.pieces.end(),
                     [](const Piece* a, const Piece* b) { return a->sequence < b->sequence; });
  auto refill = [&](Cursor& c) {
    while (c.at == c.events.size() && c.next < c.pieces.size()) {
      const Piece& piece = *c.pieces[c.next++];
      c.events.clear();
      c.at = 0;
      const std::uint64_t* words = piece.words;
      if (piece.spilled) {
        spill_.read(*piece.spilled, spill_read_);
        words = spill_read_.data();
      }
      detail::decode_records(words, piece.used, piece.base, s_.device, piece.thread, c.events);
      if (piece.pooled) {
        std::lock_guard lock(s_.ring_lock);
        piece.pooled->clear();
        s_.spare.push_back(piece.pooled);
      }
    }
    return c.at < c.events.size();
  };
  std::vector<Cursor*> live;
  for (Cursor& c : cursors)
    if (refill(c)) live.push_back(&c);
  while (!live.empty()) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < live.size(); ++i)
      if (live[i]->events[live[i]->at].time_ns < live[best]->events[live[best]->at].time_ns) best = i;
    Cursor& c = *live[best];
    emit(c.events[c.at++]);
    if (!refill(c)) live.erase(live.begin() + static_cast<std::ptrdiff_t>(best));
  }
  if (!spilled_.empty()) {
    spilled_.clear();
    spill_.recycle();
  }
}

void StreamRecorder::emit(snapshot::Event event) {
  const std::uint64_t ticks = event.time_ns;
  const detail::TickAnchor& start = s_.anchor;
  const auto delta = static_cast<long double>(static_cast<std::int64_t>(event.time_ns - start.ticks));
  std::uint64_t ns = start.ns + static_cast<std::uint64_t>(static_cast<std::int64_t>(delta * tick_ns_));
  // Cuts convert with the line through the start and their own anchor, and
  // an event may be stamped a hair before the cut it missed: times never
  // go back in the file.
  ns = std::max(ns, last_ns_);
  last_ns_ = ns;
  event.time_ns = ns;
  if (event.stack.value != 0) event.stack = snapshot::StackId{stack_id(event.stack.value)};
  if (event.kind == snapshot::EventKind::annotation_begin || event.kind == snapshot::EventKind::annotation_end) {
    const auto name = static_cast<std::uint32_t>(event.aux);
    auto it = annotation_names_.find(name);
    if (it == annotation_names_.end()) {
      std::string text;
      {
        std::lock_guard lock(s_.strings_mutex);
        if (name < s_.strings.size()) text = s_.strings[name];
      }
      // A string of its own, not deduplicated against the symbols'
      // (strings_): the recorder already gives one name one id, and a run
      // that names every step afresh ("step 41") would otherwise keep each
      // name twice more for the whole run.
      const auto id = static_cast<std::uint32_t>(text.empty() ? 0 : strings_size_++);
      if (id) pending_.strings.push_back(valid(std::move(text)));
      it = annotation_names_.emplace(name, id).first;
    }
    event.aux = it->second;
  }
  if (event.thread >= threads_size_) add_threads(event.thread);
  if (event.kind == snapshot::EventKind::oom) {
    // For the trailer's readings at OOMs; as many as the recorder keeps.
    if (oom_events_.size() == HistoryRecorder::State::kMaxOomUsage) oom_events_.erase(oom_events_.begin());
    oom_events_.push_back(OomEvent{file_->events_written() + block_.size(), event.thread, ticks, event.time_ns});
  }
  block_.push_back(event);
  if (block_.size() == snapshot::kStreamBlockEvents) write_block();
}

void StreamRecorder::write_block() {
  if (!pending_.empty()) {
    file_->append_tables(pending_);
    pending_ = snapshot::TableAppend{};
  }
  pending_.first_string = strings_size_;
  pending_.first_frame = frames_size_;
  pending_.first_stack = stacks_size_;
  pending_.first_thread = threads_size_;
  if (block_.empty()) return;
  file_->append_events(block_);
  block_.clear();
  std::lock_guard lock(mutex_);
  events_written_ = file_->events_written();
  bytes_written_ = file_->bytes_written();
}

std::uint32_t StreamRecorder::string_id(const std::string& text) {
  if (text.empty()) return 0;
  auto [it, inserted] = strings_.try_emplace(text, static_cast<std::uint32_t>(strings_size_));
  if (inserted) {
    pending_.strings.push_back(text);
    ++strings_size_;
  }
  return it->second;
}

std::uint32_t StreamRecorder::stack_id(std::uint32_t internal) {
  if (internal == 0) return 0;
  if (auto it = stacks_.find(internal); it != stacks_.end()) return it->second;
  // A stack this stream has not seen: its frames, looked up by id.
  snapshot::Stack stack;
  for (std::uintptr_t ip : s_.table.frames_of(internal)) {
    auto [frame, inserted] = frames_.try_emplace(ip, static_cast<std::uint32_t>(frames_size_));
    if (inserted) {
      const detail::SymbolizedFrame symbol = detail::symbolize(ip);
      snapshot::Frame f;
      f.ip = symbol.interpreter ? 0 : ip;
      f.function = snapshot::StringId{string_id(valid(symbol.function))};
      f.file = snapshot::StringId{string_id(valid(symbol.file))};
      f.line = symbol.line;
      f.module = snapshot::StringId{string_id(valid(symbol.module))};
      pending_.frames.push_back(f);
      ++frames_size_;
    }
    stack.frames.push_back(snapshot::FrameId{frame->second});
  }
  const auto id = static_cast<std::uint32_t>(stacks_size_++);
  pending_.stacks.push_back(std::move(stack));
  stacks_.emplace(internal, id);
  return id;
}

void StreamRecorder::add_threads(std::uint32_t up_to) {
  const std::vector<std::uint64_t> threads = detail::registered_threads();
  for (std::size_t i = threads_size_; i < threads.size(); ++i) pending_.threads.push_back(threads[i]);
  threads_size_ = std::max<std::uint64_t>(threads_size_, threads.size());
  // A thread the registry does not know yet (it cannot happen: an index is
  // registered before its first event): id 0 keeps the table consistent.
  while (threads_size_ <= up_to) {
    pending_.threads.push_back(0);
    ++threads_size_;
  }
}

}  // namespace cachealloc
