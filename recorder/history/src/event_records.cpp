// Decoding the recorder's event records (event_records.hpp) at dump time.
#include "event_records.hpp"

namespace cachealloc::detail {

namespace {
// The words a record takes, and its time: the one place the layout of
// event_records.hpp is read, for both walks below.
std::uint32_t record_length(std::uint64_t tag) noexcept {
  const std::uint64_t kind = tag & kRecordKindMask;
  if (kind == kRecordStream) return 2;
  return 4 + (kind == kRecordSplitAlloc) + ((tag & kRecordHasStack) != 0) + ((tag & kRecordHasThread) != 0);
}
std::uint64_t record_ticks(std::uint64_t header, std::uint64_t base_ticks) noexcept {
  return base_ticks + static_cast<std::uint64_t>(static_cast<std::int64_t>(header) >> 8);
}
}  // namespace

void decode_records(const std::uint64_t* words, std::uint32_t count, std::uint64_t base_ticks, std::int32_t device,
                    std::uint32_t thread, std::vector<snapshot::Event>& out, std::uint64_t from_ticks) {
  std::uint64_t stream = 0;
  for (std::uint32_t i = 0; i < count; i += record_length(words[i] & kRecordTagMask)) {
    const std::uint64_t header = words[i];
    const std::uint64_t tag = header & kRecordTagMask;
    const std::uint64_t kind = tag & kRecordKindMask;
    if (kind == kRecordStream) {
      stream = words[i + 1];
      continue;
    }
    snapshot::Event event;
    event.device = device;
    event.thread = thread;
    event.time_ns = record_ticks(header, base_ticks);
    event.stream = stream;
    event.address = words[i + 1];
    event.size = words[i + 2];
    event.aux = words[i + 3];
    std::uint32_t next = i + 4;
    std::uint64_t second_aux = 0;
    if (kind == kRecordSplitAlloc) second_aux = words[next++];
    if (tag & kRecordHasStack) event.stack = snapshot::StackId{static_cast<std::uint32_t>(words[next++])};
    if (tag & kRecordHasThread) event.thread = static_cast<std::uint32_t>(words[next++]);
    if (event.time_ns < from_ticks) continue;
    if (kind == kRecordSplitAlloc) {
      snapshot::Event split = event;
      split.kind = snapshot::EventKind::split;
      split.stack = snapshot::StackId{};
      out.push_back(split);
      event.kind = snapshot::EventKind::alloc;
      event.aux = second_aux;
      out.push_back(event);
    } else if (kind == kRecordFree) {
      event.kind = snapshot::EventKind::free_requested;
      out.push_back(event);
      event.kind = snapshot::EventKind::free_completed;
      event.stack = snapshot::StackId{};
      out.push_back(event);
    } else {
      event.kind = static_cast<snapshot::EventKind>(kind);
      out.push_back(event);
    }
  }
}

void record_times(const std::uint64_t* words, std::uint32_t count, std::uint64_t base_ticks,
                  std::vector<std::uint64_t>& out) {
  for (std::uint32_t i = 0; i < count; i += record_length(words[i] & kRecordTagMask)) {
    const std::uint64_t kind = words[i] & kRecordKindMask;
    if (kind == kRecordStream) continue;
    const std::uint64_t ticks = record_ticks(words[i], base_ticks);
    out.push_back(ticks);
    if (kind == kRecordSplitAlloc || kind == kRecordFree) out.push_back(ticks);
  }
}

}  // namespace cachealloc::detail
