// The recorder's in-memory event records (recorder/history/src/event_records.hpp):
// whatever the hot path folds, packs or splits across chunks, the dump gives
// back exactly the events the allocator reported, in its order.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/history.hpp"

using namespace cachealloc;
using snapshot::EventKind;
using test_support::MiB;

namespace {

// Events a real allocator call could not make, and some it makes: pairs that
// fold (split then alloc of its front part, free_requested then
// free_completed of the same block) and near misses that must not (another
// address, size or requested count, or a new call between them), across
// streams that change often, with values up to 64 bits.
std::vector<AllocatorEvent> random_events(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto value = [&] {
    switch (rng() % 4) {
      case 0: return rng() % 4096;
      case 1: return rng();
      case 2: return std::numeric_limits<std::uint64_t>::max() - rng() % 3;
      default: return (rng() % (1u << 20)) * 512;
    }
  };
  const std::uint64_t streams[] = {0, 7, 0x7fff'ffff'ffff, std::numeric_limits<std::uint64_t>::max()};
  std::vector<AllocatorEvent> out;
  std::uint64_t stream = 0;
  while (out.size() < count) {
    if (rng() % 16 == 0) stream = streams[rng() % 4];
    AllocatorEvent first{};
    first.stream = Stream{stream};
    first.address = value();
    first.size = value();
    first.aux = value();
    AllocatorEvent second = first;
    second.continues_call = rng() % 8 != 0;
    const unsigned shape = rng() % 6;
    if (shape == 0) {
      first.kind = EventKind::split;
      second.kind = EventKind::alloc;
      second.aux = value();  // requested, not the remainder
    } else if (shape == 1) {
      first.kind = EventKind::free_requested;
      second.kind = EventKind::free_completed;
    } else if (shape == 2) {  // near misses
      first.kind = rng() % 2 ? EventKind::split : EventKind::free_requested;
      second.kind = first.kind == EventKind::split ? EventKind::alloc : EventKind::free_completed;
      switch (rng() % 3) {
        case 0: second.address ^= 512; break;
        case 1: second.size += 512; break;
        default: second.aux ^= 1; break;
      }
    } else {
      first.kind = static_cast<EventKind>(rng() % 11);  // alloc .. oom
      if (first.kind == EventKind::oom) first.kind = EventKind::merge;  // an oom would ask for a dump
      second.kind = EventKind::merge;
    }
    first.continues_call = rng() % 4 != 0 && first.kind != EventKind::segment_alloc &&
                           first.kind != EventKind::segment_map;
    out.push_back(first);
    out.push_back(second);
  }
  out.front().continues_call = false;  // a thread's first event reads the clock
  return out;
}

bool carries_stack(EventKind kind, bool on_free) {
  return kind == EventKind::alloc || kind == EventKind::segment_alloc || kind == EventKind::empty_cache ||
         (on_free && kind == EventKind::free_requested);
}

// The dump holds exactly `events`, field for field and in order, with a
// stack where one is due and times that never go back. Returns how many
// carry a stack.
std::size_t check_dumped(const snapshot::Snapshot& s, const std::vector<AllocatorEvent>& events, std::int32_t device,
                         StackCapture stacks, bool on_free) {
  REQUIRE(s.dropped_events == 0);
  REQUIRE(s.events.size() == events.size());
  std::size_t stacked = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const snapshot::Event& got = s.events[i];
    const AllocatorEvent& want = events[i];
    CAPTURE(i);
    REQUIRE(got.kind == want.kind);
    CHECK(got.stream == want.stream.handle);
    CHECK(got.address == want.address);
    CHECK(got.size == want.size);
    CHECK(got.aux == want.aux);
    CHECK(got.device == device);
    CHECK((got.stack.value != 0) == (stacks != StackCapture::none && carries_stack(want.kind, on_free)));
    stacked += got.stack.value != 0;
    if (i > 0) CHECK(got.time_ns >= s.events[i - 1].time_ns);
  }
  return stacked;
}

// A recorder whose allocator never reports to it: the test feeds it events
// directly (one thread: the observer's lock rule has no one to exclude).
struct DirectlyFed {
  static HistoryOptions options(StackCapture stacks, bool on_free) {
    HistoryOptions o;
    o.stacks = stacks;
    o.stacks_on_free = on_free;
    o.max_entries = 1u << 20;
    return o;
  }
  DirectlyFed(StackCapture stacks, bool on_free)
      : allocator(test_support::simulated(64 * MiB)), recorder(allocator, options(stacks, on_free)) {
    allocator.set_observer(nullptr);
  }
  CachingAllocator allocator;
  HistoryRecorder recorder;
};

}  // namespace

TEST_CASE("history clocks parse by name, and an unknown name is refused naming it") {
  CHECK(parse_history_clock("precise") == HistoryClock::precise);
  CHECK(parse_history_clock("coarse") == HistoryClock::coarse);
  CHECK(std::string(to_string(parse_history_clock(to_string(HistoryClock::coarse)))) == "coarse");
  CHECK_THROWS_WITH_AS(parse_history_clock("fast"), doctest::Contains("'fast'"), InvalidArgument);
  CHECK_THROWS_AS(parse_history_clock(""), InvalidArgument);
}

TEST_CASE("the dump gives back every reported event field for field, folded or not, across many chunks") {
  for (const StackCapture stacks : {StackCapture::none, StackCapture::native}) {
    for (const bool on_free : {false, true}) {
      CAPTURE(std::string(to_string(stacks)));
      CAPTURE(on_free);
      // Given a recorder whose allocator never runs, fed events directly
      // (one thread: on_event's lock rule has no one to exclude)
      DirectlyFed fed(stacks, on_free);
      CachingAllocator& allocator = fed.allocator;
      HistoryRecorder& recorder = fed.recorder;
      const std::vector<AllocatorEvent> events = random_events(40'000, 11 + on_free);
      std::uint64_t order = 0;
      for (AllocatorEvent event : events) {
        event.order = &order;
        recorder.on_event(event);
      }
      // When it is dumped
      const snapshot::Snapshot s = recorder.take_snapshot();
      // Then the events are those reported, in order, with times that never
      // go back
      const std::size_t stacked = check_dumped(s, events, allocator.device().index(), stacks, on_free);
      if (stacks != StackCapture::none) CHECK(stacked > 0);
      // and the order word holds the last event's time
      CHECK(order > 0);
    }
  }
}

TEST_CASE("events reported in batches (on_events) dump as the same events as one on_event call each") {
  // The allocator reports a critical section's events in one call: a split
  // with its alloc, a free's halves with its merges. Given batches of those
  // shapes, near misses among them (another address, size or requested
  // count), on streams that change between batches
  std::mt19937_64 rng(5);
  std::vector<AllocatorEventBatch> batches;
  std::vector<AllocatorEvent> expected;
  std::uint64_t order = 0;
  for (int b = 0; b < 20'000; ++b) {
    AllocatorEventBatch batch;
    batch.stream = Stream{rng() % 3 == 0 ? rng() : 0};
    batch.continues_call = rng() % 4 == 0;
    batch.order = &order;
    const std::uint64_t address = (rng() % (1u << 20)) * 512;
    const std::uint64_t size = (1 + rng() % 2048) * 512;
    const std::uint64_t requested = size - rng() % 512;
    auto near = [&](std::uint64_t value) { return rng() % 10 == 0 ? value + 512 : value; };
    using Item = AllocatorEventBatch::Item;
    if (rng() % 2 == 0) {
      if (rng() % 3 != 0) batch.items[batch.count++] = Item{EventKind::split, address, size, rng() % (1u << 30)};
      batch.items[batch.count++] = Item{EventKind::alloc, near(address), near(size), requested};
    } else {
      if (rng() % 3 != 0) batch.items[batch.count++] = Item{EventKind::free_requested, address, size, requested};
      batch.items[batch.count++] = Item{EventKind::free_completed, near(address), size, near(requested)};
      const int merges = static_cast<int>(rng() % 3);
      for (int m = 0; m < merges; ++m)
        batch.items[batch.count++] = Item{EventKind::merge, address - 512 * m, size + 4096, 4096};
    }
    for (std::uint32_t i = 0; i < batch.count; ++i) expected.push_back(batch.event(i));
    batches.push_back(batch);
  }
  for (const StackCapture stacks : {StackCapture::none, StackCapture::native}) {
    for (const bool on_free : {false, true}) {
      CAPTURE(std::string(to_string(stacks)));
      CAPTURE(on_free);
      DirectlyFed fed(stacks, on_free);
      CachingAllocator& allocator = fed.allocator;
      HistoryRecorder& recorder = fed.recorder;
      // When each batch is reported in one call
      std::uint32_t stacked_allocs = 0;
      for (const AllocatorEventBatch& batch : batches) {
        const std::uint32_t id = recorder.on_events(batch);
        bool has_alloc = false;
        for (std::uint32_t i = 0; i < batch.count; ++i) has_alloc |= batch.items[i].kind == EventKind::alloc;
        // the alloc's stack id comes back, as on_event's would
        CHECK((id != 0) == (has_alloc && stacks != StackCapture::none));
        stacked_allocs += id != 0;
      }
      // Then the dump holds every event, field for field, in the order reported
      const snapshot::Snapshot s = recorder.take_snapshot();
      check_dumped(s, expected, allocator.device().index(), stacks, on_free);
      if (stacks != StackCapture::none) CHECK(stacked_allocs > 0);
    }
  }
}

TEST_CASE("the cached path's calls (on_alloc, on_free) dump as the same events as the batches they stand for") {
  // The allocator reports its cached alloc and free with their fields as
  // arguments. Given calls of every shape (with and without a split, with
  // and without the free_requested, 0-2 merges) on streams that change
  std::mt19937_64 rng(9);
  struct Call {
    bool alloc;
    AllocatorEventOrigin origin;
    bool continues_call;
    bool first_too;  // the split, or the free_requested
    std::uint64_t address, size, requested, split_rest;
    AllocatorMerge merges[2];
    std::uint32_t merge_count;
  };
  std::uint64_t order = 0;
  std::uint64_t floor = 0;
  std::vector<Call> calls;
  std::vector<AllocatorEvent> expected;
  for (int c = 0; c < 20'000; ++c) {
    Call call{};
    call.alloc = rng() % 2 == 0;
    call.origin = AllocatorEventOrigin{Stream{rng() % 3 == 0 ? rng() : 0}, &order, &floor};
    call.continues_call = rng() % 4 == 0;
    call.first_too = rng() % 3 != 0;
    call.address = (rng() % (1u << 20)) * 512;
    call.size = (1 + rng() % 2048) * 512;
    call.requested = call.size - rng() % 512;
    call.split_rest = call.alloc && call.first_too ? (1 + rng() % 4096) * 512 : 0;
    call.merge_count = call.alloc ? 0 : static_cast<std::uint32_t>(rng() % 3);
    for (std::uint32_t m = 0; m < call.merge_count; ++m)
      call.merges[m] = AllocatorMerge{call.address - 512 * m, call.size + 4096 * (m + 1), 4096};
    AllocatorEvent event{EventKind::alloc, call.origin.stream, call.address, call.size, 0, call.continues_call};
    auto add = [&](EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t aux) {
      event.kind = kind;
      event.address = address;
      event.size = size;
      event.aux = aux;
      expected.push_back(event);
      event.continues_call = true;  // the rest continue the first one's call
    };
    if (call.alloc) {
      if (call.split_rest != 0) add(EventKind::split, call.address, call.size, call.split_rest);
      add(EventKind::alloc, call.address, call.size, call.requested);
    } else {
      if (call.first_too) add(EventKind::free_requested, call.address, call.size, call.requested);
      add(EventKind::free_completed, call.address, call.size, call.requested);
      for (std::uint32_t m = 0; m < call.merge_count; ++m)
        add(EventKind::merge, call.merges[m].address, call.merges[m].size, call.merges[m].absorbed);
    }
    calls.push_back(call);
  }
  for (const StackCapture stacks : {StackCapture::none, StackCapture::native}) {
    for (const bool on_free : {false, true}) {
      CAPTURE(std::string(to_string(stacks)));
      CAPTURE(on_free);
      DirectlyFed fed(stacks, on_free);
      CachingAllocator& allocator = fed.allocator;
      HistoryRecorder& recorder = fed.recorder;
      // When each is reported through the recorder's own calls
      std::uint32_t stacked_allocs = 0;
      for (const Call& call : calls) {
        if (call.alloc) {
          const std::uint32_t id = recorder.on_alloc(call.origin, call.continues_call, call.address, call.size,
                                                     call.requested, call.split_rest);
          // the alloc's stack id comes back
          CHECK((id != 0) == (stacks != StackCapture::none));
          stacked_allocs += id != 0;
        } else {
          recorder.on_free(call.origin, call.continues_call, call.first_too, call.address, call.size,
                           call.requested, call.merges, call.merge_count);
        }
      }
      // Then the dump holds every event, field for field, in order, as the
      // batches the base class would have built
      const snapshot::Snapshot s = recorder.take_snapshot();
      check_dumped(s, expected, allocator.device().index(), stacks, on_free);
      if (stacks != StackCapture::none) CHECK(stacked_allocs > 0);
    }
  }
}
