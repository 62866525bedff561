// Each allocator event kind appears in the history where it should, with the
// fields snapshot::EventKind documents.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/history.hpp"

using namespace cachealloc;
using snapshot::EventKind;
using test_support::MiB;

namespace {

HistoryOptions without_stacks() {
  HistoryOptions options;
  options.stacks = StackCapture::none;
  return options;
}

std::vector<snapshot::Event> of_kind(const snapshot::Snapshot& s, EventKind kind) {
  std::vector<snapshot::Event> out;
  for (const auto& e : s.events)
    if (e.kind == kind) out.push_back(e);
  return out;
}

std::vector<EventKind> kinds(const snapshot::Snapshot& s) {
  std::vector<EventKind> out;
  for (const auto& e : s.events) out.push_back(e.kind);
  return out;
}

__attribute__((noinline)) void* allocate_from_a_named_function(CachingAllocator& allocator) {
  void* p = allocator.allocate(4096);
  asm volatile("" ::: "memory");  // keep the call from becoming a tail call
  return p;
}

}  // namespace

TEST_CASE("a cached 20 MiB block serving 6 MiB records a split, then the alloc") {
  // Given a 20 MiB segment whose only block is cached
  CachingAllocator allocator(test_support::simulated());
  allocator.deallocate(allocator.allocate(20 * MiB));
  HistoryRecorder recorder(allocator, without_stacks());
  // When 6 MiB is requested
  void* p = allocator.allocate(6 * MiB);
  // Then the block splits into 6 MiB handed out and 14 MiB kept
  const snapshot::Snapshot s = recorder.take_snapshot();
  CHECK(kinds(s) == std::vector<EventKind>{EventKind::split, EventKind::alloc});
  const snapshot::Event& split = s.events[0];
  CHECK(split.address == test_support::address(p));
  CHECK(split.size == 6 * MiB);
  CHECK(split.aux == 14 * MiB);
  const snapshot::Event& alloc = s.events[1];
  CHECK(alloc.address == test_support::address(p));
  CHECK(alloc.size == 6 * MiB);
  CHECK(alloc.aux == 6 * MiB);
  allocator.deallocate(p);
}

TEST_CASE("freeing the front half of a split block records a merge with the free back half") {
  CachingAllocator allocator(test_support::simulated());
  allocator.deallocate(allocator.allocate(20 * MiB));
  void* p = allocator.allocate(6 * MiB);
  HistoryRecorder recorder(allocator, without_stacks());
  allocator.deallocate(p);
  const snapshot::Snapshot s = recorder.take_snapshot();
  CHECK(kinds(s) == std::vector<EventKind>{EventKind::free_requested, EventKind::free_completed, EventKind::merge});
  const snapshot::Event& merge = s.events[2];
  CHECK(merge.address == test_support::address(p));
  CHECK(merge.size == 20 * MiB);
  CHECK(merge.aux == 14 * MiB);
}

TEST_CASE("freeing a block between two free ones records a merge with each: the lower first, then the upper") {
  // Given a 20 MiB segment split into 4, 6 and 10 MiB blocks, the 4 MiB
  // and the 10 MiB ones free again
  CachingAllocator allocator(test_support::simulated());
  allocator.deallocate(allocator.allocate(20 * MiB));
  void* low = allocator.allocate(4 * MiB);
  void* middle = allocator.allocate(6 * MiB);
  REQUIRE(test_support::address(middle) == test_support::address(low) + 4 * MiB);
  allocator.deallocate(low);
  HistoryRecorder recorder(allocator, without_stacks());
  // When the middle block is freed
  allocator.deallocate(middle);
  // Then it merges with the block below, which keeps its address, and the
  // merged block then with the one above: the whole segment
  const snapshot::Snapshot s = recorder.take_snapshot();
  CHECK(kinds(s) == std::vector<EventKind>{EventKind::free_requested, EventKind::free_completed, EventKind::merge,
                                           EventKind::merge});
  const snapshot::Event& below = s.events[2];
  CHECK(below.address == test_support::address(low));
  CHECK(below.size == 10 * MiB);
  CHECK(below.aux == 4 * MiB);
  const snapshot::Event& above = s.events[3];
  CHECK(above.address == test_support::address(low));
  CHECK(above.size == 20 * MiB);
  CHECK(above.aux == 10 * MiB);
}

TEST_CASE("simulated: a free after record_stream completes only once the other stream's event has") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator, without_stacks());
  const Stream side = device->create_stream();
  void* p = allocator.allocate(1 * MiB);
  allocator.record_stream(p, side);
  allocator.deallocate(p);
  // The free is requested, but the block waits for the event on `side`.
  CHECK(of_kind(recorder.take_snapshot(), EventKind::free_requested).size() == 1);
  CHECK(of_kind(recorder.take_snapshot(), EventKind::free_completed).empty());
  allocator.deallocate(allocator.allocate(4096));  // polls events: still pending
  CHECK(of_kind(recorder.take_snapshot(), EventKind::free_completed).size() == 1);  // only the 4 KiB one
  // When the stream is synchronized, the next allocation completes the free.
  device->synchronize_stream(side);
  void* q = allocator.allocate(4096);
  const snapshot::Snapshot s = recorder.take_snapshot();
  const auto completed = of_kind(s, EventKind::free_completed);
  REQUIRE(completed.size() == 2);
  CHECK(completed[1].address == test_support::address(p));
  CHECK(completed[1].aux == 1 * MiB);
  const auto requested = of_kind(s, EventKind::free_requested);
  CHECK(completed[1].time_ns >= requested[0].time_ns);
  allocator.deallocate(q);
}

TEST_CASE("segment_alloc, segment_release and empty_cache are recorded with their sizes") {
  CachingAllocator allocator(test_support::simulated());
  HistoryRecorder recorder(allocator, without_stacks());
  void* p = allocator.allocate(30 * MiB);
  allocator.deallocate(p);
  allocator.empty_cache();
  const snapshot::Snapshot s = recorder.take_snapshot();
  const auto segments = of_kind(s, EventKind::segment_alloc);
  REQUIRE(segments.size() == 1);
  CHECK(segments[0].size == 30 * MiB);
  CHECK(segments[0].aux == snapshot::segment_flag_large_pool);
  const auto released = of_kind(s, EventKind::segment_release);
  REQUIRE(released.size() == 1);
  CHECK(released[0].address == segments[0].address);
  const auto emptied = of_kind(s, EventKind::empty_cache);
  REQUIRE(emptied.size() == 1);
  CHECK(emptied[0].size == 30 * MiB);
}

TEST_CASE("an OOM under a memory fraction records requested bytes, device free and the cap") {
  auto device = test_support::simulated(1024 * MiB);
  CachingAllocator allocator(device);
  allocator.set_memory_fraction(0.5);
  HistoryRecorder recorder(allocator, without_stacks());
  CHECK_THROWS_AS(allocator.allocate(600 * MiB), OutOfMemoryError);
  const auto ooms = of_kind(recorder.take_snapshot(), EventKind::oom);
  REQUIRE(ooms.size() == 1);
  CHECK(ooms[0].size == 600 * MiB);
  CHECK(ooms[0].aux == 512 * MiB);
  CHECK(ooms[0].address == device->memory_info().free);
}

TEST_CASE("annotations bracket the events of their phase and name it in the string table") {
  CachingAllocator allocator(test_support::simulated());
  HistoryRecorder recorder(allocator, without_stacks());
  void* p = nullptr;
  {
    AnnotationScope step(recorder, "step 3");
    AnnotationScope forward(recorder, "forward");
    p = allocator.allocate(4096);
  }
  allocator.deallocate(p);
  const snapshot::Snapshot s = recorder.take_snapshot();
  REQUIRE(s.events.size() >= 6);
  CHECK(s.events[0].kind == EventKind::annotation_begin);
  CHECK(s.strings.at(s.events[0].aux) == "step 3");
  CHECK(s.events[1].kind == EventKind::annotation_begin);
  CHECK(s.strings.at(s.events[1].aux) == "forward");
  const auto ends = of_kind(s, EventKind::annotation_end);
  REQUIRE(ends.size() == 2);
  CHECK(s.strings.at(ends[0].aux) == "forward");  // innermost first
  CHECK(s.strings.at(ends[1].aux) == "step 3");
  for (std::size_t i = 1; i < s.events.size(); ++i) CHECK(s.events[i].time_ns >= s.events[i - 1].time_ns);
}

TEST_CASE("every event carries the device, the stream and the recording thread") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator, without_stacks());
  const Stream stream = device->create_stream();
  allocator.deallocate(allocator.allocate(4096, stream));
  const snapshot::Snapshot s = recorder.take_snapshot();
  REQUIRE(!s.events.empty());
  for (const auto& e : s.events) {
    CHECK(e.device == device->index());
    CHECK(e.stream == stream.handle);
    REQUIRE(e.thread < s.threads.size());
    CHECK(s.threads[e.thread] != 0);
  }
}

TEST_CASE("native stacks name the function, file and line that allocated") {
  CachingAllocator allocator(test_support::simulated());
  HistoryOptions options;
  options.stacks = StackCapture::native;
  HistoryRecorder recorder(allocator, options);
  void* p = allocate_from_a_named_function(allocator);
  const snapshot::Snapshot s = recorder.take_snapshot();
  const auto allocs = of_kind(s, EventKind::alloc);
  REQUIRE(allocs.size() == 1);
  REQUIRE(allocs[0].stack);
  const snapshot::Stack& stack = s.stacks.at(allocs[0].stack.value);
  REQUIRE(stack.frames.size() >= 3);
  bool found = false;
  for (snapshot::FrameId id : stack.frames) {
    const snapshot::Frame& frame = s.frames.at(id.value);
    const std::string function = s.strings.at(frame.function.value);
    if (function.find("allocate_from_a_named_function") == std::string::npos) continue;
    found = true;
#if CACHEALLOC_TEST_DEBUG_INFO  // file and line need DWARF line tables (-g)
    CHECK(s.strings.at(frame.file.value).find("test_history_events.cpp") != std::string::npos);
    CHECK(frame.line > 0);
#endif
    CHECK(!s.strings.at(frame.module.value).empty());
  }
  CHECK(found);
  // The live block in the layout points at the same stack.
  bool block_found = false;
  for (const auto& segment : s.segments)
    for (const auto& block : segment.blocks)
      if (block.address == test_support::address(p)) {
        block_found = true;
        CHECK(block.stack == allocs[0].stack);
      }
  CHECK(block_found);
  allocator.deallocate(p);
}

TEST_CASE("the same call site interns one stack; frees get none unless stacks_on_free") {
  CachingAllocator allocator(test_support::simulated());
  allocator.deallocate(allocator.allocate(4096));  // from here on every alloc takes the cached path
  HistoryOptions options;
  options.stacks = StackCapture::native;
  HistoryRecorder recorder(allocator, options);
  for (int i = 0; i < 3; ++i) allocator.deallocate(allocate_from_a_named_function(allocator));
  snapshot::Snapshot s = recorder.take_snapshot();
  auto allocs = of_kind(s, EventKind::alloc);
  REQUIRE(allocs.size() == 3);
  CHECK(allocs[0].stack == allocs[1].stack);
  CHECK(allocs[1].stack == allocs[2].stack);
  CHECK(s.stacks.size() == 2);  // the placeholder and the one stack
  for (const auto& e : of_kind(s, EventKind::free_requested)) CHECK(!e.stack);

  options.stacks_on_free = true;
  recorder.start(options);
  allocator.deallocate(allocate_from_a_named_function(allocator));
  s = recorder.take_snapshot();
  for (const auto& e : of_kind(s, EventKind::free_requested)) CHECK(e.stack);
}
