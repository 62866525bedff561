// Test support: builds small, self-consistent snapshots in code.
//
// TraceBuilder is a deliberately naive model of the caching allocator (a
// vector of blocks per segment, linear scans), written independently of
// Replay, so that "the replayed layout equals the stored one" tests two
// implementations against each other. The caller picks every address; the
// builder emits the events the recorder would (split and merge included) and,
// at build(), the final layout and tables.
//
// Header-only and used by tests/test_analyzer_*.cpp only, until our generator
// cachealloc-synthetic writes the golden inputs to testdata/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer::testing {

class TraceBuilder {
 public:
  using Block = snapshot::Block;
  using BlockState = snapshot::BlockState;
  using EventKind = snapshot::EventKind;

  explicit TraceBuilder(std::int32_t device = 0, std::uint64_t device_total = 80ull << 30) : device_(device) {
    snapshot_.header.source = "cachealloc";
    snapshot_.header.writer_version = "test";
    snapshot_.header.program = "train.py";
    snapshot_.header.pid = 4242;
    snapshot_.devices.push_back(snapshot::DeviceInfo{device, "simulated", device_total, device_total / 2, device_total, {}, {}, {}});
    snapshot_.settings["max_split_size_mb"] = "unlimited";
  }

  // Interns a stack of function names, innermost first. Names in
  // cachealloc:: mimic the recorder's own frames.
  snapshot::StackId stack(const std::vector<std::string>& functions) {
    snapshot::Stack stack;
    for (const std::string& function : functions) {
      snapshot::Frame frame;
      frame.ip = 0x400000 + snapshot_.frames.size() * 16;
      frame.function = string(function);
      frame.file = string(function.rfind("cachealloc::", 0) == 0 ? "allocator.cpp" : "model.py");
      frame.line = static_cast<std::uint32_t>(10 + snapshot_.frames.size());
      frame.module = string(function.rfind("cachealloc::", 0) == 0 ? "libcachealloc.so" : "python");
      snapshot_.frames.push_back(frame);
      stack.frames.push_back(snapshot::FrameId{static_cast<std::uint32_t>(snapshot_.frames.size() - 1)});
    }
    snapshot_.stacks.push_back(stack);
    return snapshot::StackId{static_cast<std::uint32_t>(snapshot_.stacks.size() - 1)};
  }

  // Interns a stack of (function, file) frames, innermost first: a file
  // ending in .py is a Python frame, any other a native one.
  snapshot::StackId stack_of(const std::vector<std::pair<std::string, std::string>>& frames) {
    snapshot::Stack stack;
    for (const auto& [function, file] : frames) {
      snapshot::Frame frame;
      frame.ip = file.ends_with(".py") ? 0 : 0x400000 + snapshot_.frames.size() * 16;
      frame.function = string(function);
      frame.file = string(file);
      frame.line = static_cast<std::uint32_t>(10 + snapshot_.frames.size());
      snapshot_.frames.push_back(frame);
      stack.frames.push_back(snapshot::FrameId{static_cast<std::uint32_t>(snapshot_.frames.size() - 1)});
    }
    snapshot_.stacks.push_back(stack);
    return snapshot::StackId{static_cast<std::uint32_t>(snapshot_.stacks.size() - 1)};
  }

  snapshot::StringId string(const std::string& text) {
    for (std::size_t i = 0; i < snapshot_.strings.size(); ++i) {
      if (snapshot_.strings[i] == text) return snapshot::StringId{static_cast<std::uint32_t>(i)};
    }
    snapshot_.strings.push_back(text);
    return snapshot::StringId{static_cast<std::uint32_t>(snapshot_.strings.size() - 1)};
  }

  TraceBuilder& segment(std::uint64_t address, std::uint64_t size, bool large_pool = true) {
    snapshot::Segment segment{device_, 0, address, size, large_pool, false, {}, {}};
    segment.blocks.push_back(Block{address, size, 0, BlockState::inactive, {}});
    segments_[address] = segment;
    emit(EventKind::segment_alloc, address, size, large_pool ? std::uint64_t{snapshot::segment_flag_large_pool} : 0);
    return *this;
  }

  TraceBuilder& release(std::uint64_t address) {
    auto it = segments_.find(address);
    if (it == segments_.end()) throw std::logic_error("release of an unknown segment");
    for (const Block& block : it->second.blocks) {
      if (block.state != BlockState::inactive) throw std::logic_error("release of a segment in use");
    }
    emit(EventKind::segment_release, address, it->second.total_size, 0);
    segments_.erase(it);
    return *this;
  }

  TraceBuilder& alloc(std::uint64_t address, std::uint64_t size, std::uint64_t requested, snapshot::StackId stack = {}) {
    auto& blocks = segment_of(address).blocks;
    auto it = std::find_if(blocks.begin(), blocks.end(),
                           [&](const Block& b) { return b.address <= address && address < b.address + b.size; });
    if (it == blocks.end() || it->state != BlockState::inactive || address + size > it->address + it->size)
      throw std::logic_error("alloc outside a free block");
    if (it->address < address) {
      Block tail{address, it->address + it->size - address, 0, BlockState::inactive, {}};
      it->size = address - it->address;
      it = blocks.insert(it + 1, tail);
    }
    if (it->size > size) {
      emit(EventKind::split, address, size, it->size - size);
      Block tail{address + size, it->size - size, 0, BlockState::inactive, {}};
      it->size = size;
      it = blocks.insert(it + 1, tail) - 1;
    }
    it->state = BlockState::active_allocated;
    it->requested = requested;
    it->stack = stack;
    emit(EventKind::alloc, address, size, requested, stack);
    return *this;
  }

  // `stack`: where the free ran (PyTorch records it); none: the block's own.
  TraceBuilder& free_requested(std::uint64_t address, snapshot::StackId stack = {}) {
    Block& block = block_at(address);
    if (block.state != BlockState::active_allocated) throw std::logic_error("free of a block not allocated");
    block.state = BlockState::active_pending_free;
    emit(EventKind::free_requested, address, block.size, block.requested, stack ? stack : block.stack);
    return *this;
  }

  TraceBuilder& free_completed(std::uint64_t address) {
    Block& block = block_at(address);
    if (block.state != BlockState::active_pending_free) throw std::logic_error("free_completed without request");
    emit(EventKind::free_completed, address, block.size, block.requested, block.stack);
    block.state = BlockState::inactive;
    block.requested = 0;
    block.stack = {};
    auto& blocks = segment_of(address).blocks;
    for (std::size_t i = 0; i + 1 < blocks.size();) {
      if (blocks[i].state == BlockState::inactive && blocks[i + 1].state == BlockState::inactive) {
        emit(EventKind::merge, blocks[i].address, blocks[i].size + blocks[i + 1].size, blocks[i + 1].size);
        blocks[i].size += blocks[i + 1].size;
        blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      } else {
        ++i;
      }
    }
    return *this;
  }

  TraceBuilder& free(std::uint64_t address, snapshot::StackId stack = {}) {
    return free_requested(address, stack).free_completed(address);
  }

  TraceBuilder& oom(std::uint64_t requested, std::uint64_t device_free, std::uint64_t cap = 0) {
    return emit(EventKind::oom, device_free, requested, cap);
  }
  TraceBuilder& empty_cache(std::uint64_t released) { return emit(EventKind::empty_cache, 0, released, 0); }
  TraceBuilder& begin(const std::string& name) { return emit(EventKind::annotation_begin, 0, 0, string(name).value); }
  TraceBuilder& end(const std::string& name) { return emit(EventKind::annotation_end, 0, 0, string(name).value); }

  TraceBuilder& emit(EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t aux,
                     snapshot::StackId stack = {}) {
    snapshot::Event event;
    event.kind = kind;
    event.device = device_;
    event.stack = stack;
    event.time_ns = time_ns_;
    event.address = address;
    event.size = size;
    event.aux = aux;
    time_ns_ += step_ns_;
    snapshot_.events.push_back(event);
    return *this;
  }

  // Simulates a ring overflow: the first `count` events are lost.
  TraceBuilder& drop_first(std::size_t count) {
    count = std::min(count, snapshot_.events.size());
    snapshot_.events.erase(snapshot_.events.begin(), snapshot_.events.begin() + static_cast<std::ptrdiff_t>(count));
    snapshot_.dropped_events += count;
    return *this;
  }

  // The start of the first free block of at least `size` bytes, trying the
  // segment at `hint` first; 0 when none fits.
  std::uint64_t first_fit(std::uint64_t size, std::size_t hint = 0) const {
    if (segments_.empty()) return 0;
    auto fits = [&](const snapshot::Segment& segment) -> std::uint64_t {
      for (const Block& block : segment.blocks) {
        if (block.state == BlockState::inactive && block.size >= size) return block.address;
      }
      return 0;
    };
    auto it = segments_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(hint % segments_.size()));
    if (std::uint64_t address = fits(it->second)) return address;
    for (const auto& [address, segment] : segments_) {
      if (std::uint64_t found = fits(segment)) return found;
    }
    return 0;
  }
  // Segments whose blocks are all free, by address.
  std::vector<std::uint64_t> idle_segments() const {
    std::vector<std::uint64_t> result;
    for (const auto& [address, segment] : segments_) {
      if (segment.blocks.size() == 1 && segment.blocks[0].state == BlockState::inactive) result.push_back(address);
    }
    return result;
  }
  std::size_t segment_count() const { return segments_.size(); }

  std::size_t event_count() const { return snapshot_.events.size(); }
  std::uint64_t now_ns() const { return time_ns_; }

  // The snapshot with the final layout and the stats a recorder would write.
  snapshot::Snapshot build() const {
    snapshot::Snapshot result = snapshot_;
    std::int64_t allocated = 0;
    std::int64_t reserved = 0;
    for (const auto& [address, segment] : segments_) {
      result.segments.push_back(segment);
      reserved += static_cast<std::int64_t>(segment.total_size);
      for (const Block& block : segment.blocks) {
        if (block.state == BlockState::active_allocated) allocated += static_cast<std::int64_t>(block.size);
      }
    }
    result.stats["allocated_bytes.all.current"] = allocated;
    result.stats["reserved_bytes.all.current"] = reserved;
    return result;
  }

 private:
  snapshot::Segment& segment_of(std::uint64_t address) {
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) throw std::logic_error("address outside any segment");
    --it;
    if (address >= it->first + it->second.total_size) throw std::logic_error("address outside any segment");
    return it->second;
  }
  Block& block_at(std::uint64_t address) {
    for (Block& block : segment_of(address).blocks) {
      if (block.address == address) return block;
    }
    throw std::logic_error("no block at address");
  }

  std::int32_t device_;
  std::uint64_t time_ns_ = 1'000'000'000;
  std::uint64_t step_ns_ = 1'000;
  std::map<std::uint64_t, snapshot::Segment> segments_;
  snapshot::Snapshot snapshot_;
};

// `count` blocks of 512 B allocated, each freed while in use by another
// stream (its free_completed waits) with an allocation after every second
// free, then each completion followed by a reuse of its block; completed in
// the order requested, or with the second half reversed (count / 2 queues of
// waiting frees). One 2 MiB small-pool segment when it fits, else a large one.
inline snapshot::Snapshot waiting_frees_trace(std::uint64_t count, bool reversed_half) {
  constexpr std::uint64_t kBase = 0x7f0000000000, kBlock = 512, kSegment = 2 << 20;
  TraceBuilder trace;
  const std::uint64_t bytes = 2 * count * kBlock;
  trace.segment(kBase, (bytes + kSegment - 1) / kSegment * kSegment, bytes > kSegment);
  for (std::uint64_t i = 0; i < count; ++i) trace.alloc(kBase + i * kBlock, kBlock, kBlock);
  std::vector<std::uint64_t> order;
  for (std::uint64_t i = 0; i < count; ++i) {
    trace.free_requested(kBase + i * kBlock);
    order.push_back(i);
    if (i % 2 == 1) trace.alloc(kBase + (count + i / 2) * kBlock, kBlock, kBlock);
  }
  if (reversed_half) std::reverse(order.begin() + static_cast<std::ptrdiff_t>(count / 2), order.end());
  for (const std::uint64_t i : order) trace.free_completed(kBase + i * kBlock).alloc(kBase + i * kBlock, kBlock, kBlock);
  return trace.build();
}

// A random but consistent trace of about `target_events` events: allocations
// of 512 B .. 4 MiB from `max_segments` segments of 20 MiB, frees in random
// order (some of them deferred, as with stream uses), an idle segment
// released now and then, annotations and one OOM. Deterministic per seed.
inline snapshot::Snapshot random_trace(std::uint64_t seed, std::size_t target_events, std::size_t max_segments = 32,
                                       std::size_t stack_count = 12) {
  TraceBuilder builder;
  std::mt19937_64 rng(seed);
  std::vector<snapshot::StackId> stacks;
  for (std::size_t i = 0; i < stack_count; ++i) {
    stacks.push_back(builder.stack({"cachealloc::CachingAllocator::malloc", "cachealloc::record_alloc",
                                    "layer" + std::to_string(i) + "_forward", "train_step", "main"}));
  }
  constexpr std::uint64_t kSegmentSize = 20ull << 20;
  std::uint64_t next_segment = 0x7f0000000000ull;
  std::vector<std::uint64_t> live;
  std::vector<std::uint64_t> pending;
  bool in_phase = false;
  bool oom_done = false;
  auto free_one = [&] {
    if (live.empty()) return;
    const std::size_t pick = rng() % live.size();
    const std::uint64_t address = live[pick];
    live[pick] = live.back();
    live.pop_back();
    if (rng() % 8 == 0) {
      builder.free_requested(address);
      pending.push_back(address);
    } else {
      builder.free(address);
    }
  };
  while (builder.event_count() < target_events) {
    const unsigned roll = static_cast<unsigned>(rng() % 1000);
    if (!pending.empty() && roll % 3 == 0) {
      builder.free_completed(pending.back());
      pending.pop_back();
    } else if (roll < 520 || live.size() < 8) {
      const std::uint64_t size = ((rng() % (4ull << 20)) / 512 + 1) * 512;
      const std::uint64_t requested = size - rng() % 512;
      std::uint64_t address = builder.first_fit(size, static_cast<std::size_t>(rng()));
      if (address == 0) {
        if (builder.segment_count() >= max_segments) {
          free_one();
          continue;
        }
        builder.segment(next_segment, kSegmentSize);
        address = next_segment;
        next_segment += kSegmentSize * 2;
      }
      builder.alloc(address, size, requested, stacks[rng() % stacks.size()]);
      live.push_back(address);
    } else if (roll < 990) {
      free_one();
    } else if (roll < 994) {
      const std::vector<std::uint64_t> idle = builder.idle_segments();
      if (!idle.empty()) builder.release(idle[rng() % idle.size()]);
    } else if (roll < 998) {
      in_phase ? builder.end("forward") : builder.begin("forward");
      in_phase = !in_phase;
    } else if (!oom_done && builder.event_count() > target_events / 2) {
      builder.oom(64ull << 20, 1ull << 20, 0);
      oom_done = true;
    }
  }
  return builder.build();
}

}  // namespace cachealloc::analyzer::testing
