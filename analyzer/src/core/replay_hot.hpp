// The per-event half of Replay, inline so that the analysis loop
// (analysis.cpp) and Replay itself compile it into their own loops: at ~30 ns
// per event a call per handler is a measurable share. Private to analyzer/;
// include only from .cpp files.
#pragma once

#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/analyzer/detail/flat_hash.hpp"

namespace cachealloc::analyzer {

namespace hot {
inline bool is_active(snapshot::BlockState state) noexcept {
  return state == snapshot::BlockState::active_allocated || state == snapshot::BlockState::active_pending_free;
}
}  // namespace hot

// Forced inline: the compiler otherwise keeps it a call per event, whose
// prologue and epilogue alone were ~15 instructions of ~100.
[[gnu::always_inline]] inline void Replay::apply_inline(const snapshot::Event& event) {
  last_touched_stack_ = kNone;
  const bool mine = event.device == device_;
  switch (event.kind) {
    case snapshot::EventKind::alloc:
      if (mine) on_alloc(event);
      break;
    case snapshot::EventKind::free_requested:
      if (mine) on_free_requested(event.address);
      break;
    case snapshot::EventKind::free_completed:
      if (mine) on_free_completed(event.address);
      break;
    case snapshot::EventKind::segment_alloc:
      if (mine)
        on_segment_alloc(event.address, event.size, event.stream, (event.aux & snapshot::segment_flag_large_pool) != 0,
                         (event.aux & snapshot::segment_flag_expandable) != 0, event.stack);
      break;
    case snapshot::EventKind::segment_release:
      if (mine) on_segment_release(event.address);
      break;
    case snapshot::EventKind::segment_map:
      if (mine) on_segment_map(event);
      break;
    case snapshot::EventKind::segment_unmap:
      if (mine) on_segment_unmap(event.address, event.size);
      break;
    // Annotations belong to the whole program, not to one device. They and
    // the kinds below change no total, so the totals stay as possible as
    // they were (the constructor checked the first ones): no check, which
    // saves its five compares on a third of the events.
    case snapshot::EventKind::annotation_begin:
      annotations_.push_back(snapshot::StringId{static_cast<std::uint32_t>(event.aux)});
      ++applied_;
      return;
    case snapshot::EventKind::annotation_end:
      on_annotation_end(snapshot::StringId{static_cast<std::uint32_t>(event.aux)});
      ++applied_;
      return;
    default:
      // split and merge are implied by alloc and free; the rest do not change memory
      ++applied_;
      return;
  }
  // Five compares and one predictable branch per event that may change the
  // totals (replay.hpp, "Impossible states").
  if (impossible(totals_)) [[unlikely]]
    refuse_impossible_state();
  ++applied_;
}

inline void Replay::on_alloc(const snapshot::Event& event) {
  const std::uint64_t address = event.address;
  std::uint64_t size = event.size;
  std::uint32_t id = block_at_.find(address);
  if (id != kNone && blocks_[id].state == snapshot::BlockState::inactive && blocks_[id].size >= size) {
    // The common case: the allocator hands out the front of a free block.
    // In a large pool it keeps a tail of 1 MiB or less with the block (it
    // never splits so little off): a size a PyTorch trace could only infer
    // from the request (the segment predates the trace) is the whole block.
    if (blocks_[id].size > size) {
      const SegmentNode& segment = segments_[blocks_[id].segment];
      if (inferred_sizes_ && segment.large_pool && !segment.expandable && blocks_[id].size - size <= kUnsplitTail)
        size = blocks_[id].size;
      else
        split_block(id, address + size);
    }
  } else {
    if (id != kNone && hot::is_active(blocks_[id].state)) {
      ++anomalies_.alloc_outside_free_block;
      return;
    }
    const std::uint32_t sid = id != kNone ? blocks_[id].segment : segment_containing(address);
    id = sid == kNone ? kNone : isolate(sid, address, size, snapshot::BlockState::inactive);
    if (id == kNone) {
      ++anomalies_.alloc_outside_free_block;
      return;
    }
  }
  BlockNode& b = blocks_[id];
  SegmentNode& s = segments_[b.segment];
  segment_leave(s);
  b.state = snapshot::BlockState::active_allocated;
  b.requested = event.aux;
  b.stack = event.stack;
  s.inactive -= size;
  s.active += size;
  s.allocated += size;
  s.requested += event.aux;
  ++s.active_blocks;
  s.largest_free_stale = s.free_chunks_stale = true;
  segment_enter(s);
  totals_.allocated += size;
  totals_.requested += event.aux;
  totals_.active += size;
  add_live(event.stack, size);
}

inline void Replay::on_free_requested(std::uint64_t address) {
  const std::uint32_t id = block_at_.find(address);
  if (id == kNone || blocks_[id].state != snapshot::BlockState::active_allocated) {
    if (id == kNone || blocks_[id].state != snapshot::BlockState::active_pending_free) ++anomalies_.free_of_unknown_block;
    return;
  }
  BlockNode& b = blocks_[id];
  SegmentNode& s = segments_[b.segment];
  pending_address_ = address;
  pending_id_ = id;
  b.state = snapshot::BlockState::active_pending_free;
  s.allocated -= b.size;
  totals_.allocated -= b.size;
  remove_live(b.stack, b.size);
}

inline void Replay::on_free_completed(std::uint64_t address) {
  std::uint32_t id = pending_address_ == address && pending_id_ != kNone && blocks_[pending_id_].live &&
                             blocks_[pending_id_].address == address
                         ? pending_id_
                         : block_at_.find(address);
  if (id == kNone || !hot::is_active(blocks_[id].state)) {
    ++anomalies_.free_of_unknown_block;
    return;
  }
  // A free that never waited for stream events may skip free_requested.
  if (blocks_[id].state == snapshot::BlockState::active_allocated) on_free_requested(address);
  BlockNode& b = blocks_[id];
  SegmentNode& s = segments_[b.segment];
  const std::uint64_t size = b.size;
  segment_leave(s);
  // PyTorch keeps a pending block's request in requested_bytes until the
  // block is freed for good (free_block), as it keeps it in active_bytes.
  s.requested -= b.requested;
  totals_.requested -= b.requested;
  b.state = snapshot::BlockState::inactive;
  b.requested = 0;
  b.stack = {};
  s.active -= size;
  s.inactive += size;
  --s.active_blocks;
  s.largest_free_stale = s.free_chunks_stale = true;
  coalesce(id);
  segment_enter(s);
  totals_.active -= size;
}

inline std::uint32_t Replay::new_block() {
  std::uint32_t id;
  if (!free_blocks_.empty()) {
    id = free_blocks_.back();
    free_blocks_.pop_back();
    blocks_[id] = BlockNode{};
  } else {
    id = static_cast<std::uint32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  blocks_[id].live = true;
  return id;
}

inline void Replay::drop_block(std::uint32_t id) {
  block_at_.erase(blocks_[id].address);
  blocks_[id].live = false;
  free_blocks_.push_back(id);
}

inline std::uint32_t Replay::split_block(std::uint32_t id, std::uint64_t at) {
  const std::uint32_t tail = new_block();  // may move blocks_: no references across this line
  BlockNode& head = blocks_[id];
  BlockNode& t = blocks_[tail];
  t.address = at;
  t.size = head.address + head.size - at;
  t.state = head.state;
  t.segment = head.segment;
  t.prev = id;
  t.next = head.next;
  head.size = at - head.address;
  if (head.next != kNone) blocks_[head.next].prev = tail;
  head.next = tail;
  ++segments_[head.segment].block_count;
  block_at_.insert(at, tail);
  return tail;
}

inline std::uint32_t Replay::coalesce(std::uint32_t id) {
  BlockNode& b = blocks_[id];
  SegmentNode& s = segments_[b.segment];
  const std::uint32_t next = b.next;
  if (next != kNone && blocks_[next].state == b.state) {
    b.size += blocks_[next].size;
    b.next = blocks_[next].next;
    if (b.next != kNone) blocks_[b.next].prev = id;
    --s.block_count;
    drop_block(next);
  }
  const std::uint32_t prev = b.prev;
  if (prev != kNone && blocks_[prev].state == b.state) {
    BlockNode& p = blocks_[prev];
    p.size += b.size;
    p.next = b.next;
    if (b.next != kNone) blocks_[b.next].prev = prev;
    --s.block_count;
    drop_block(id);
    return prev;
  }
  return id;
}

inline void Replay::segment_leave(const SegmentNode& segment) noexcept {
  if (segment.active_blocks == 0) cached_unsplit_ -= segment.inactive;
  else if (!segment.expandable) totals_.inactive_split -= segment.inactive;
}

inline void Replay::segment_enter(const SegmentNode& segment) noexcept {
  if (segment.active_blocks == 0) cached_unsplit_ += segment.inactive;
  else if (!segment.expandable) totals_.inactive_split += segment.inactive;
}

inline std::optional<Replay::LiveBlock> Replay::allocated_at(std::uint64_t address) const {
  const std::uint32_t id = block_at_.find(address);
  if (id == kNone || blocks_[id].state != snapshot::BlockState::active_allocated) return std::nullopt;
  const BlockNode& b = blocks_[id];
  return LiveBlock{b.address, b.size, b.requested, b.stack};
}

inline void Replay::add_live(snapshot::StackId stack, std::uint64_t bytes) {
  if (stack.value >= live_bytes_by_stack_.size()) {
    live_bytes_by_stack_.resize(stack.value + 1, 0);
    live_blocks_by_stack_.resize(stack.value + 1, 0);
  }
  live_bytes_by_stack_[stack.value] += bytes;
  ++live_blocks_by_stack_[stack.value];
  last_touched_stack_ = stack.value;
}

inline void Replay::remove_live(snapshot::StackId stack, std::uint64_t bytes) {
  live_bytes_by_stack_[stack.value] -= bytes;
  --live_blocks_by_stack_[stack.value];
  last_touched_stack_ = stack.value;
}

}  // namespace cachealloc::analyzer
