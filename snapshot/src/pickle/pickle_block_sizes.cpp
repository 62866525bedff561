// The block sizes of a PyTorch trace (pickle_block_sizes.hpp): the
// one-thread pass, and the per-segment pass that gives its answer on threads.
#include "pickle_block_sizes.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <unordered_map>
#include <utility>

#include "cachealloc/snapshot/pickle.hpp"
#include "parallel.hpp"

namespace cachealloc::snapshot::detail {

namespace {

constexpr std::uint64_t kLargePage = 20ull << 20;   // expandable segments of the large pool map this much at a time
constexpr std::uint32_t kNoSegment = 0xffffffffu;

// Address -> value, one entry per live block: open addressing with linear
// probing and backward-shift erase (no tombstones). std::unordered_map spent
// ~15% of reading a 3M-event trace in node allocation and rehashing.
class AddressMap {
 public:
  bool empty() const noexcept { return count_ == 0; }
  // The value at `key`, inserted as `fallback` when absent; `inserted` says which.
  std::uint64_t& at(std::uint64_t key, bool& inserted, std::uint64_t fallback = 0) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (!slot.used) {
        slot = Slot{key, fallback, true};
        ++count_;
        inserted = true;
        return slot.value;
      }
      if (slot.key == key) {
        inserted = false;
        return slot.value;
      }
    }
  }
  std::uint64_t& operator[](std::uint64_t key) {
    bool inserted = false;
    return at(key, inserted);
  }
  bool insert(std::uint64_t key) {
    bool inserted = false;
    at(key, inserted);
    return inserted;
  }
  // Safe from several threads at once while nothing writes the map.
  const std::uint64_t* find(std::uint64_t key) const noexcept {
    if (count_ == 0) return nullptr;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (!slots_[i].used) return nullptr;
      if (slots_[i].key == key) return &slots_[i].value;
    }
  }
  std::uint64_t* find(std::uint64_t key) noexcept {
    return const_cast<std::uint64_t*>(static_cast<const AddressMap&>(*this).find(key));
  }
  bool erase(std::uint64_t key) noexcept {
    if (count_ == 0) return false;
    std::size_t hole = home(key);
    for (;; hole = (hole + 1) & mask_) {
      if (!slots_[hole].used) return false;
      if (slots_[hole].key == key) break;
    }
    // Pull back every later entry of the run that may sit in the hole.
    for (std::size_t next = (hole + 1) & mask_; slots_[next].used; next = (next + 1) & mask_) {
      const std::size_t want = home(slots_[next].key);
      if (((next - want) & mask_) >= ((next - hole) & mask_)) {
        slots_[hole] = slots_[next];
        hole = next;
      }
    }
    slots_[hole].used = false;
    --count_;
    return true;
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    std::uint64_t value = 0;
    bool used = false;
  };
  std::size_t home(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_) & mask_;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::size_t size = std::max<std::size_t>(64, old.size() * 2);
    slots_.assign(size, Slot{});
    mask_ = size - 1;
    shift_ = 64 - std::countr_zero(size);
    count_ = 0;
    for (const Slot& slot : old) {
      if (slot.used) (*this)[slot.key] = slot.value;
    }
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t count_ = 0;
};

// The final layout: blocks still in use by address (the first one listed
// there), segments by address.
class FinalLayout {
 public:
  explicit FinalLayout(std::span<const Segment* const> segments) : segments_(segments) {
    for (const Segment* segment : segments) {
      by_address_.emplace(segment->address, segment);
      for (const Block& block : segment->blocks) {
        bool inserted = false;
        if (block.state != BlockState::inactive && block.state != BlockState::unmapped)
          blocks_.at(block.address, inserted, reinterpret_cast<std::uintptr_t>(&block));
      }
    }
  }
  bool has_blocks() const noexcept { return !blocks_.empty(); }
  const Block* block(std::uint64_t address) const noexcept {
    const std::uint64_t* found = blocks_.find(address);
    return found == nullptr ? nullptr : reinterpret_cast<const Block*>(static_cast<std::uintptr_t>(*found));
  }
  bool large_pool(const Event& segment_alloc) const {
    const auto found = by_address_.find(segment_alloc.address);
    return trace_segment_is_large(found == by_address_.end() ? nullptr : found->second, segment_alloc.size);
  }
  // The pool of the expandable segment a segment_map maps into: the final
  // layout's word where a segment there survives, else the page size (the
  // large pool maps 20 MiB pages, the small pool 2 MiB ones).
  bool map_is_large(const Event& segment_map) const noexcept {
    for (const Segment* segment : segments_) {
      if (segment->expandable && segment_map.address >= segment->address &&
          segment_map.address - segment->address < segment->total_size)
        return segment->large_pool;
    }
    return segment_map.size % kLargePage == 0;
  }

 private:
  std::span<const Segment* const> segments_;
  AddressMap blocks_;
  std::unordered_map<std::uint64_t, const Segment*> by_address_;
};

// One alloc or free of a segment's share of the trace, copied out of the
// events so that a segment's pass reads one contiguous array: a segment's
// events lie scattered through the trace (1 in 20 of them, say), and read in
// place each cost a cache miss. `aux` is the request, and after the pass the
// block size.
struct SegmentEvent {
  std::uint64_t address;
  std::uint64_t aux;
  std::uint32_t index;  // in the trace
  EventKind kind;
};
std::uint64_t& block_size_of(Event& event) noexcept { return event.size; }
std::uint64_t& block_size_of(SegmentEvent& event) noexcept { return event.aux; }
std::size_t trace_index(const Event&, std::size_t k) noexcept { return k; }
std::size_t trace_index(const SegmentEvent& event, std::size_t) noexcept { return event.index; }

// Allocations never freed in the trace are the final layout's blocks, and
// take their size: (trace index, block size) for each, the last event first,
// over `events` in trace order. Only addresses of final blocks can change
// anything, so only they are tracked.
template <class E>
std::vector<std::pair<std::size_t, std::uint64_t>> sized_at_end(std::span<const E> events,
                                                                  const FinalLayout& final_layout) {
  std::vector<std::pair<std::size_t, std::uint64_t>> sized;
  if (!final_layout.has_blocks()) return sized;
  AddressMap freed_later;
  for (std::size_t k = events.size(); k-- > 0;) {
    const E& event = events[k];
    if (event.kind != EventKind::free_completed && event.kind != EventKind::alloc) continue;
    const Block* block = final_layout.block(event.address);
    if (block == nullptr) continue;
    if (event.kind == EventKind::free_completed) freed_later.insert(event.address);
    if (event.kind != EventKind::alloc) continue;
    // The last alloc at this address, still alive.
    if (freed_later.insert(event.address) && block->requested == event.aux)
      sized.emplace_back(trace_index(event, k), block->size);
  }
  return sized;
}

// The forward pass's state for one run of events: the whole trace, or one
// segment's share of it.
class Sizing {
 public:
  Sizing(const BlockPolicy& policy, std::vector<std::pair<std::size_t, std::uint64_t>> at_end)
      : policy_(policy), sizer_(policy), at_end_(std::move(at_end)) {}

  BlockSizer& sizer() noexcept { return sizer_; }
  bool nothing_live() const noexcept { return live_.empty(); }
  std::uint64_t inferred() const noexcept { return inferred_; }
  std::uint64_t contradicted() const noexcept { return contradicted_; }

  // The alloc at trace index `i`.
  template <class E>
  void alloc(E& event, std::size_t i) {
    const std::uint64_t rounded = pytorch_round_size(event.aux, policy_.divisions);
    std::uint64_t& size = block_size_of(event);
    const std::optional<std::uint64_t> exact = sizer_.alloc(event.address, rounded);
    if (!at_end_.empty() && at_end_.back().first == i) {
      // The final layout is PyTorch's own word for this block.
      size = at_end_.back().second;
      at_end_.pop_back();
      if (exact && *exact != size) ++contradicted_;
    } else if (exact) {
      size = *exact;
    } else {
      ++inferred_;  // at least the rounded request
      size = rounded;
    }
    live_[event.address] = size;
  }

  // A free_requested or free_completed: false, leaving its size alone, when
  // the trace never allocated its block.
  template <class E>
  bool free(E& event) {
    if (event.kind == EventKind::free_completed) sizer_.free_completed(event.address);
    std::uint64_t* found = live_.find(event.address);
    if (found == nullptr) return false;
    block_size_of(event) = *found;
    if (event.kind == EventKind::free_completed) live_.erase(event.address);
    return true;
  }

  // A free of a block allocated before the trace began: the final layout's
  // size if it is that block, else the rounded request.
  void free_from_before(Event& event, const FinalLayout& final_layout) {
    const Block* block = final_layout.block(event.address);
    event.size = block != nullptr && block->requested == event.aux ? block->size
                                                                   : pytorch_round_size(event.aux, policy_.divisions);
    if (event.kind == EventKind::free_requested) live_[event.address] = event.size;
  }

 private:
  const BlockPolicy& policy_;
  BlockSizer sizer_;
  std::vector<std::pair<std::size_t, std::uint64_t>> at_end_;  // the last event first
  AddressMap live_;                                            // address -> block size
  std::uint64_t inferred_ = 0;
  std::uint64_t contradicted_ = 0;
};

bool is_free(EventKind kind) noexcept { return kind == EventKind::free_requested || kind == EventKind::free_completed; }

BlockSizeFacts infer_on_one_thread(std::vector<Event>& events, const BlockSizeInput& input,
                                   const FinalLayout& final_layout) {
  Sizing sizing(input.policy, sized_at_end(std::span<const Event>(events), final_layout));
  AddressMap segments_seen;
  BlockSizeFacts facts;
  std::uint64_t last_time = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    Event& event = events[i];
    if (input.clamp_time) {
      event.time_ns = std::max(event.time_ns, last_time);
      last_time = event.time_ns;
    }
    switch (event.kind) {
      case EventKind::segment_alloc: {
        const bool large = final_layout.large_pool(event);
        event.aux = large ? std::uint64_t{segment_flag_large_pool} : std::uint64_t{0};
        segments_seen.insert(event.address);
        sizing.sizer().segment_alloc(event.address, event.size, !large);
        break;
      }
      case EventKind::segment_map:
        event.aux = std::uint64_t{segment_flag_expandable} |
                    (final_layout.map_is_large(event) ? std::uint64_t{segment_flag_large_pool} : 0);
        sizing.sizer().segment_map(event.address, event.size);
        break;
      case EventKind::segment_unmap: sizing.sizer().segment_unmap(event.address, event.size); break;
      case EventKind::alloc: sizing.alloc(event, i); break;
      case EventKind::free_requested:
      case EventKind::free_completed:
        if (!sizing.free(event)) {
          facts.begins_mid_run = true;
          sizing.free_from_before(event, final_layout);
        }
        break;
      case EventKind::segment_release:
        if (!segments_seen.erase(event.address)) facts.begins_mid_run = true;
        sizing.sizer().segment_release(event.address);
        break;
      default: break;
    }
  }
  facts.inferred = sizing.inferred();
  facts.contradicted = sizing.contradicted();
  return facts;
}

// --- the per-segment pass ------------------------------------------------

// One segment the trace made, from its segment_alloc to its release.
struct SegmentLife {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  bool small = false;
  std::size_t born = 0;                                     // its segment_alloc's index
  std::size_t died = std::numeric_limits<std::size_t>::max();  // its segment_release's index, or never
  std::size_t first = 0;                                    // its events' place in the index list
  std::size_t count = 0;
};

// The most segments alive at once, and in all, for the per-segment pass: a
// segment's arrival and departure cost time in the number alive (a sorted
// array), and each range keeps a count per segment. Real runs have a few
// dozen alive and thousands in all; a trace past either is sized on one
// thread, whose cost does not grow with them.
constexpr std::size_t kMaxLiveSegments = 4096;
constexpr std::size_t kMaxSegmentLives = std::size_t{1} << 20;

// The segments alive at one point, by address, for finding the one that
// holds an address: a sorted array (a few dozen segments, changed rarely).
class LiveSegments {
 public:
  struct Entry {
    std::uint64_t start;
    std::uint64_t end;
    std::uint32_t life;
  };
  std::size_t size() const noexcept { return entries_.size(); }
  // Entries in any order, sorted once.
  void assign(std::vector<Entry> entries) {
    entries_ = std::move(entries);
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) { return a.start < b.start; });
  }
  void add(const SegmentLife& life, std::uint32_t id) {
    const auto at = std::upper_bound(entries_.begin(), entries_.end(), life.start,
                                     [](std::uint64_t a, const Entry& e) { return a < e.start; });
    entries_.insert(at, Entry{life.start, life.end, id});
  }
  void remove(std::uint32_t id) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [id](const Entry& e) { return e.life == id; }),
                   entries_.end());
  }
  // The entry whose range holds `address`, or nullptr. A search without
  // branches on the data: the trace's allocations hop between segments at
  // random, and std::upper_bound's mispredicted branches made this the
  // pass's largest cost.
  const Entry* holding(std::uint64_t address) const noexcept {
    std::size_t size = entries_.size();
    if (size == 0) return nullptr;
    const Entry* base = entries_.data();
    // The last entry starting at or below `address` (or the first entry).
    while (size > 1) {
      const std::size_t half = size / 2;
      base = base[half].start <= address ? base + half : base;
      size -= half;
    }
    return base->start <= address && address < base->end ? base : nullptr;
  }
  const Entry* starting_at(std::uint64_t address) const noexcept {
    const Entry* e = holding(address);
    return e != nullptr && e->start == address ? e : nullptr;
  }
  bool overlaps(std::uint64_t start, std::uint64_t end) const noexcept {
    const auto at = std::lower_bound(entries_.begin(), entries_.end(), end,
                                     [](const Entry& e, std::uint64_t a) { return e.start < a; });
    return at != entries_.begin() && std::prev(at)->end > start;
  }

 private:
  std::vector<Entry> entries_;
};

// What the per-segment pass gave up on: the one-thread pass answers.
struct GiveWay {};

// Calls body(r) for r in [0, ranges), one range per thread; an exception
// (out of memory) sets `failed` instead.
template <class Body>
void each_range(std::size_t ranges, std::atomic<bool>& failed, Body&& body) {
  parallel_ranges(ranges, static_cast<unsigned>(ranges), 1, [&](std::size_t begin, std::size_t end) {
    try {
      for (std::size_t r = begin; r < end; ++r) body(r);
    } catch (...) {
      failed = true;
    }
  });
}

std::optional<BlockSizeFacts> infer_per_segment(std::vector<Event>& events, const BlockSizeInput& input,
                                                const FinalLayout& final_layout) {
  const std::size_t n = events.size();
  if (input.threads < 2 || n < std::max<std::size_t>(input.min_parallel_events, 1) || input.policy.expandable_segments ||
      n >= kNoSegment)
    return std::nullopt;
  const std::size_t ranges = std::max<std::size_t>(1, std::min<std::size_t>(input.threads, n / 4096));
  std::vector<std::size_t> cut(ranges + 1);
  for (std::size_t r = 0; r <= ranges; ++r) cut[r] = n / ranges * r;
  cut[ranges] = n;

  // Pass 1, on threads: each range's segment events and latest time.
  std::vector<std::vector<std::uint32_t>> segment_events(ranges);
  std::vector<std::uint64_t> latest(ranges, 0);
  std::atomic<bool> give_way{false};
  each_range(ranges, give_way, [&](std::size_t r) {
    std::uint64_t newest = 0;
    for (std::size_t i = cut[r]; i < cut[r + 1]; ++i) {
      const Event& event = events[i];
      newest = std::max(newest, event.time_ns);
      switch (event.kind) {
        case EventKind::segment_alloc:
        case EventKind::segment_release: segment_events[r].push_back(static_cast<std::uint32_t>(i)); break;
        case EventKind::segment_map:
        case EventKind::segment_unmap: give_way = true; return;
        default: break;
      }
    }
    latest[r] = newest;
  });
  if (give_way) return std::nullopt;

  // The segments' lives, in order, on this thread: segment events are few.
  BlockSizeFacts facts;
  std::vector<SegmentLife> lives;
  {
    LiveSegments alive;
    AddressMap segments_seen;
    for (const auto& list : segment_events) {
      for (const std::uint32_t i : list) {
        Event& event = events[i];
        if (event.kind == EventKind::segment_alloc) {
          const bool large = final_layout.large_pool(event);
          event.aux = large ? std::uint64_t{segment_flag_large_pool} : std::uint64_t{0};
          segments_seen.insert(event.address);
          if (event.size == 0) continue;  // BlockSizer makes nothing of it
          if (event.address + event.size < event.address || alive.overlaps(event.address, event.address + event.size))
            return std::nullopt;  // reported twice, or overlapping: the one-thread pass's rules
          if (lives.size() >= kMaxSegmentLives || alive.size() >= kMaxLiveSegments) return std::nullopt;
          lives.push_back(SegmentLife{event.address, event.address + event.size, !large, i});
          alive.add(lives.back(), static_cast<std::uint32_t>(lives.size() - 1));
        } else {
          if (!segments_seen.erase(event.address)) facts.begins_mid_run = true;
          if (const LiveSegments::Entry* e = alive.starting_at(event.address)) {
            lives[e->life].died = i;
            alive.remove(e->life);
          } else if (alive.holding(event.address) != nullptr) {
            return std::nullopt;  // a release inside a segment: the one-thread pass's rules
          }
        }
      }
    }
  }
  if (lives.empty()) return std::nullopt;
  // Each range's first time floor: the latest time before it.
  std::vector<std::uint64_t> floor(ranges, 0);
  for (std::size_t r = 1; r < ranges; ++r) floor[r] = std::max(floor[r - 1], latest[r - 1]);

  // Pass 2, on threads: each alloc and free's segment, counted per range and
  // segment, and parked in the event's size (every alloc and free gets its
  // size later, from this pass or the one-thread pass); times clamped.
  std::vector<std::vector<std::uint32_t>> counts(ranges);
  each_range(ranges, give_way, [&](std::size_t r) {
    std::vector<std::uint32_t>& count = counts[r];
    count.assign(lives.size(), 0);
    LiveSegments alive;
    const std::size_t begin = cut[r];
    std::vector<LiveSegments::Entry> at_begin;
    for (std::size_t s = 0; s < lives.size(); ++s) {
      if (lives[s].born < begin && lives[s].died >= begin)
        at_begin.push_back(LiveSegments::Entry{lives[s].start, lives[s].end, static_cast<std::uint32_t>(s)});
    }
    alive.assign(std::move(at_begin));
    std::uint64_t last_time = floor[r];
    const LiveSegments::Entry* last = nullptr;
    for (std::size_t i = begin; i < cut[r + 1]; ++i) {
      Event& event = events[i];
      if (input.clamp_time) {
        event.time_ns = std::max(event.time_ns, last_time);
        last_time = event.time_ns;
      }
      if (event.kind == EventKind::alloc || is_free(event.kind)) {
        if (last == nullptr || event.address < last->start || event.address >= last->end) {
          last = alive.holding(event.address);
          if (last == nullptr) {
            give_way = true;  // outside every segment the trace made
            return;
          }
        }
        event.size = last->life;
        ++count[last->life];
      } else if (event.kind == EventKind::segment_alloc) {
        last = nullptr;  // entries move
        // The life born here, if any (a zero-size segment has none).
        const auto born = std::lower_bound(lives.begin(), lives.end(), i,
                                           [](const SegmentLife& l, std::size_t at) { return l.born < at; });
        if (born != lives.end() && born->born == i) alive.add(*born, static_cast<std::uint32_t>(born - lives.begin()));
      } else if (event.kind == EventKind::segment_release) {
        last = nullptr;
        const LiveSegments::Entry* e = alive.starting_at(event.address);
        if (e != nullptr && lives[e->life].died == i) alive.remove(e->life);
      }
    }
  });
  if (give_way) return std::nullopt;

  // Each segment's events, in trace order, contiguous: its place in
  // `records`, then each range's share of it (`counts` becomes where each
  // range writes).
  std::size_t total = 0;
  for (std::size_t s = 0; s < lives.size(); ++s) {
    lives[s].first = total;
    for (std::size_t r = 0; r < ranges; ++r) total += std::exchange(counts[r][s], static_cast<std::uint32_t>(total));
    lives[s].count = total - lives[s].first;
  }
  // Left uninitialized: the threads below fault its pages in as they fill them.
  const std::unique_ptr<SegmentEvent[]> records = std::make_unique_for_overwrite<SegmentEvent[]>(total);
  advise_huge_pages(records.get(), total * sizeof(SegmentEvent));
  const std::vector<std::vector<std::uint32_t>> starts = counts;
  each_range(ranges, give_way, [&](std::size_t r) {
    std::vector<std::uint32_t>& next = counts[r];
    for (std::size_t i = cut[r]; i < cut[r + 1]; ++i) {
      const Event& event = events[i];
      if (event.kind == EventKind::alloc || is_free(event.kind))
        records[next[event.size]++] = SegmentEvent{event.address, event.aux, static_cast<std::uint32_t>(i), event.kind};
    }
  });
  if (give_way) return std::nullopt;

  // Pass 3, on threads: each segment sized on its own, the largest first.
  std::vector<std::uint32_t> by_size(lives.size());
  for (std::size_t s = 0; s < lives.size(); ++s) by_size[s] = static_cast<std::uint32_t>(s);
  std::sort(by_size.begin(), by_size.end(), [&](std::uint32_t a, std::uint32_t b) { return lives[a].count > lives[b].count; });
  std::atomic<std::size_t> next_segment{0};
  std::atomic<std::uint64_t> inferred{0};
  std::atomic<std::uint64_t> contradicted{0};
  const unsigned workers = static_cast<unsigned>(std::min<std::size_t>(input.threads, lives.size()));
  parallel_ranges(workers, workers, 1, [&](std::size_t, std::size_t) {
    try {
      for (std::size_t k = next_segment++; k < by_size.size() && !give_way; k = next_segment++) {
        const SegmentLife& life = lives[by_size[k]];
        const std::span<SegmentEvent> mine(records.get() + life.first, life.count);
        Sizing sizing(input.policy, sized_at_end(std::span<const SegmentEvent>(mine), final_layout));
        sizing.sizer().segment_alloc(life.start, life.end - life.start, life.small);
        for (SegmentEvent& event : mine) {
          if (event.kind == EventKind::alloc) {
            sizing.alloc(event, event.index);
          } else if (!sizing.free(event)) {
            throw GiveWay{};  // a block the segment never handed out
          }
        }
        if (life.died != std::numeric_limits<std::size_t>::max() && !sizing.nothing_live())
          throw GiveWay{};  // released with blocks still allocated
        inferred += sizing.inferred();
        contradicted += sizing.contradicted();
      }
    } catch (...) {  // GiveWay, or out of memory: the one-thread pass decides
      give_way = true;
    }
  });
  if (give_way) return std::nullopt;

  // The sizes back into the events, range by range as they were read out.
  each_range(ranges, give_way, [&](std::size_t r) {
    std::vector<std::uint32_t> next = starts[r];
    for (std::size_t i = cut[r]; i < cut[r + 1]; ++i) {
      Event& event = events[i];
      if (event.kind == EventKind::alloc || is_free(event.kind)) event.size = records[next[event.size]++].aux;
    }
  });
  if (give_way) return std::nullopt;  // some sizes are still segment numbers: the one-thread pass writes them all
  facts.inferred = inferred;
  facts.contradicted = contradicted;
  facts.per_segment = true;
  return facts;
}

}  // namespace

BlockSizeFacts infer_block_sizes(std::vector<Event>& events, const BlockSizeInput& input) {
  const FinalLayout final_layout(input.segments);
  std::optional<BlockSizeFacts> facts;
  try {
    facts = infer_per_segment(events, input, final_layout);
  } catch (const std::bad_alloc&) {
    // The index arrays did not fit: the one-thread pass needs none.
  }
  return facts ? *facts : infer_on_one_thread(events, input, final_layout);
}

}  // namespace cachealloc::snapshot::detail
