// Annotations: named phases a program marks (annotate_begin/annotate_end),
// recorded outside the allocator's locks into the annotation chunk, and the
// table of their names.
#include "history_state.hpp"

#include <algorithm>
#include <iterator>

namespace cachealloc {

using snapshot::EventKind;

namespace {

// Open annotations of this thread, innermost last, for annotate_end().
struct OpenAnnotation {
  const void* recorder;
  std::uint32_t name;
};
thread_local std::vector<OpenAnnotation> t_open_annotations;

}  // namespace

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
  if (auto it = string_ids.find(text); it != string_ids.end()) return it->second;
  const auto added = static_cast<std::uint32_t>(strings.size());
  strings.emplace_back(text);
  try {
    string_ids.emplace(strings.back(), added);
  } catch (...) {
    strings.pop_back();
    throw;
  }
  return added;
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

AnnotationScope::AnnotationScope(std::string_view name) noexcept {
  try {
    recorder_ = &global_history();
    recorder_->annotate_begin(name);
  } catch (...) {
    recorder_ = nullptr;
  }
}

}  // namespace cachealloc
