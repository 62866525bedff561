// libFuzzer target: convert's round trip on whatever load() accepts.
//   - ours: what encode() writes decodes to the same snapshot, whole (the
//     format version aside, and the ring start encode() derives);
//   - a pickle: what encode_pytorch_pickle() writes reads back through the
//     pickle reader to the same layout (segments and blocks, stacks compared
//     by their frames) and the same events PyTorch's format has, in order;
//     a pickle read comes back whole. A trace entry's size is a request,
//     so a block size PyTorch's policy does not give from it is inferred
//     again (the reader counts those, block_sizes.*).
// Our writer may not refuse a snapshot load() accepted (load() validated
// it); the pickle writer refuses only what PyTorch's format cannot hold, in
// one line. Each loss convert reports is one printable line, and the count
// of records the pickle reader skipped is one exactly when the input has
// it. A refusal of the input must be a SnapshotError of one line.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace cachealloc::snapshot;

using FrameText = std::tuple<std::string, std::uint32_t, std::string>;

std::vector<FrameText> frames_of(const Snapshot& s, StackId id) {
  std::vector<FrameText> out;
  if (id.value >= s.stacks.size()) return out;
  for (const FrameId f : s.stacks[id.value].frames) {
    const Frame& frame = s.frames[f.value];
    out.emplace_back(s.strings[frame.file.value], frame.line, s.strings[frame.function.value]);
  }
  return out;
}

// The events a pickle holds as trace entries (annotations go to
// external_annotations, split, merge, empty_cache and category have no entry).
bool is_trace_entry(EventKind kind) {
  return kind != EventKind::split && kind != EventKind::merge && kind != EventKind::empty_cache &&
         kind != EventKind::annotation_begin && kind != EventKind::annotation_end && kind != EventKind::category;
}

// Segments by device, then address: PyTorch's format lists each device's
// apart, so the order across devices is the writer's, not the file's.
std::vector<const Segment*> by_device(const Snapshot& s) {
  std::vector<const Segment*> out;
  for (const Segment& segment : s.segments) out.push_back(&segment);
  std::stable_sort(out.begin(), out.end(), [](const Segment* a, const Segment* b) {
    return std::tie(a->device, a->address) < std::tie(b->device, b->address);
  });
  return out;
}

void same_layout(const Snapshot& original, const Snapshot& back) {
  if (back.segments.size() != original.segments.size()) std::abort();
  const std::vector<const Segment*> original_segments = by_device(original), back_segments = by_device(back);
  for (std::size_t i = 0; i < original.segments.size(); ++i) {
    const Segment& a = *original_segments[i];
    const Segment& b = *back_segments[i];
    if (std::tie(a.device, a.stream, a.address, a.total_size, a.large_pool, a.expandable) !=
        std::tie(b.device, b.stream, b.address, b.total_size, b.large_pool, b.expandable))
      std::abort();
    if (frames_of(original, a.stack) != frames_of(back, b.stack)) std::abort();
    if (a.blocks.size() != b.blocks.size()) std::abort();
    for (std::size_t k = 0; k < a.blocks.size(); ++k) {
      if (std::tie(a.blocks[k].address, a.blocks[k].size, a.blocks[k].state) !=
          std::tie(b.blocks[k].address, b.blocks[k].size, b.blocks[k].state))
        std::abort();
      // PyTorch's requested_size is 0 for a free block, whatever ours held.
      if (a.blocks[k].state != BlockState::inactive && a.blocks[k].requested != b.blocks[k].requested) std::abort();
      if (frames_of(original, a.blocks[k].stack) != frames_of(back, b.blocks[k].stack)) std::abort();
    }
  }
}

void same_trace_entries(const Snapshot& original, const Snapshot& back, bool pools_named) {
  const auto setting = [&](const char* key) {
    const auto it = back.settings.find(key);
    return it == back.settings.end() ? std::string("0") : it->second;
  };
  const bool sizes_inferred = setting("block_sizes.inferred") != "0" || setting("block_sizes.contradicted") != "0";
  std::vector<const Event*> expected;
  for (const Event& e : original.events) {
    if (is_trace_entry(e.kind)) expected.push_back(&e);
  }
  std::vector<const Event*> got;
  for (const Event& e : back.events) {
    if (is_trace_entry(e.kind)) got.push_back(&e);
  }
  if (got.size() != expected.size()) std::abort();
  std::map<std::int32_t, std::uint64_t> last_time;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Event& a = *expected[i];
    const Event& b = *got[i];
    if (std::tie(a.kind, a.device, a.stream, a.address) != std::tie(b.kind, b.device, b.stream, b.address)) std::abort();
    // A block's size comes back when PyTorch's policy gives it from the
    // request; the reader counts the sizes it had to infer otherwise.
    const bool block_size = a.kind == EventKind::alloc || a.kind == EventKind::free_requested ||
                            a.kind == EventKind::free_completed;
    if (a.size != b.size && !(block_size && sizes_inferred)) std::abort();
    // PyTorch's time_us: whole microseconds, which the reader keeps in order
    // on each device (a later entry is never earlier).
    if (b.time_ns % 1000 != 0 || b.time_ns < a.time_ns / 1000 * 1000 || b.time_ns < last_time[b.device]) std::abort();
    last_time[b.device] = b.time_ns;
    // PyTorch's trace names no pool for a map; the reader supplies the flags.
    // An OOM's allocator cap has no place either (a loss convert names).
    // A segment_alloc's pool is inferred again; convert names those it gets wrong.
    const bool pool_named = a.kind == EventKind::segment_alloc && pools_named;
    if (a.kind != EventKind::segment_map && a.kind != EventKind::oom && a.aux != b.aux && !pool_named) std::abort();
    if (a.kind == EventKind::oom && b.aux != 0) std::abort();
    if (frames_of(original, a.stack) != frames_of(back, b.stack)) std::abort();
  }
}

// The snapshot with its string, frame and stack tables rebuilt in the order
// the layout and the events first use them: two readings of the same content
// compare equal whatever order their tables were filled in (a pickle's memo
// decides the reader's order, and our writer memoizes otherwise).
Snapshot with_tables_in_use_order(const Snapshot& s) {
  Snapshot out = s;
  out.strings.assign(1, std::string());
  out.frames.assign(1, Frame{});
  out.stacks.assign(1, Stack{});
  std::map<std::uint32_t, std::uint32_t> strings, frames, stacks;
  const auto string_id = [&](StringId id) {
    if (id.value == 0 || id.value >= s.strings.size()) return id;
    const auto [it, added] = strings.emplace(id.value, static_cast<std::uint32_t>(out.strings.size()));
    if (added) out.strings.push_back(s.strings[id.value]);
    return StringId{it->second};
  };
  const auto frame_id = [&](FrameId id) {
    if (id.value == 0 || id.value >= s.frames.size()) return id;
    const auto found = frames.find(id.value);
    if (found != frames.end()) return FrameId{found->second};
    Frame frame = s.frames[id.value];
    frame.function = string_id(frame.function);
    frame.file = string_id(frame.file);
    frame.module = string_id(frame.module);
    frames.emplace(id.value, static_cast<std::uint32_t>(out.frames.size()));
    out.frames.push_back(frame);
    return FrameId{frames.at(id.value)};
  };
  const auto stack_id = [&](StackId id) {
    if (id.value == 0 || id.value >= s.stacks.size()) return id;
    const auto found = stacks.find(id.value);
    if (found != stacks.end()) return StackId{found->second};
    Stack stack;
    for (const FrameId f : s.stacks[id.value].frames) stack.frames.push_back(frame_id(f));
    stacks.emplace(id.value, static_cast<std::uint32_t>(out.stacks.size()));
    out.stacks.push_back(stack);
    return StackId{stacks.at(id.value)};
  };
  const auto renumber = [&](std::vector<Segment>& segments) {
    for (Segment& segment : segments) {
      segment.stack = stack_id(segment.stack);
      for (Block& block : segment.blocks) block.stack = stack_id(block.stack);
    }
  };
  renumber(out.segments);
  for (RingStart& start : out.ring_start) renumber(start.segments);
  for (Event& e : out.events) {
    e.stack = stack_id(e.stack);
    if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end)
      e.aux = string_id(StringId{static_cast<std::uint32_t>(e.aux)}).value;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes = cachealloc::fuzz::as_bytes(data, size);
  const std::optional<Snapshot> snapshot = cachealloc::fuzz::load_small(bytes);
  if (!snapshot) return 0;
  // convert -o FILE.bin: the same snapshot but for the format version (the
  // current one is written) and the ring start, which encode() derives when
  // the reader left it empty; a second trip changes nothing at all.
  Snapshot ours = decode(encode(*snapshot));
  Snapshot expected = *snapshot;
  expected.header.format_version = ours.header.format_version;
  if (expected.ring_start.empty()) expected.ring_start = ours.ring_start;
  if (ours != expected) std::abort();
  if (decode(encode(ours)) != ours) std::abort();
  // convert -o FILE.pickle
  bool skipped_named = false, cap_named = false, pools_named = false;
  for (const std::string& loss : pickle_conversion_losses(*snapshot)) {
    cachealloc::fuzz::check_line(loss);
    skipped_named = skipped_named || loss.starts_with("the count of trace records skipped");
    cap_named = cap_named || loss.starts_with("the allocator cap of");
    pools_named = pools_named || loss.starts_with("the pool flags of");
  }
  if (skipped_named != (snapshot->settings.count(kSkippedRecordsSetting) != 0)) std::abort();
  const bool capped = std::any_of(snapshot->events.begin(), snapshot->events.end(),
                                  [](const Event& e) { return e.kind == EventKind::oom && e.aux != 0; });
  if (cap_named != capped) std::abort();
  std::vector<std::byte> pickle;
  try {
    pickle = encode_pytorch_pickle(*snapshot);
  } catch (const SnapshotError& error) {
    // What PyTorch's format cannot hold (a device index past its per-device
    // lists) is refused, in one line, as convert prints it.
    cachealloc::fuzz::check_message(error.what());
    return 0;
  }
  const Snapshot back = decode_pytorch_pickle(pickle);
  if (has_pickle_header(bytes)) {
    // The records the reader skipped (unknown actions) are not written, and
    // neither is the count of them: a loss convert names (above).
    if (back.settings.count(kSkippedRecordsSetting) != 0) std::abort();
    Snapshot expected = *snapshot;
    expected.settings.erase(kSkippedRecordsSetting);
    if (with_tables_in_use_order(back) != with_tables_in_use_order(expected)) std::abort();
  } else {
    same_layout(*snapshot, back);
    same_trace_entries(*snapshot, back, pools_named);
  }
  return 0;
}
