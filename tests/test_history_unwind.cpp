// StackCapture::unwind: stacks through code built without frame pointers
// (PyTorch's libraries under our extension), where the frame-pointer walk stops.
#include <doctest/doctest.h>

#include "allocator_support.hpp"
#include "cachealloc/history.hpp"

using namespace cachealloc;
using snapshot::EventKind;
using test_support::MiB;

namespace {

// Built without a frame pointer, and %rbp zeroed around the call, as code
// that uses %rbp as a general register leaves it: the frame-pointer chain
// ends here, as it does at the first frame of a library built without them.
__attribute__((noinline, optimize("omit-frame-pointer"))) void* allocate_without_frame_pointer(
    CachingAllocator& allocator) {
  void* ptr = nullptr;
  asm volatile("xor %%ebp, %%ebp\n\t" : : : "rbp", "memory");
  ptr = allocator.allocate(MiB);
  asm volatile("" : : : "memory");
  return ptr;
}

__attribute__((noinline)) void* caller_with_frame_pointer(CachingAllocator& allocator) {
  void* ptr = allocate_without_frame_pointer(allocator);
  asm volatile("" : : "r"(ptr) : "memory");
  return ptr;
}

std::size_t depth_of_alloc(StackCapture capture) {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = capture;
  options.max_frames = 64;
  HistoryRecorder recorder(allocator, options);
  void* ptr = caller_with_frame_pointer(allocator);
  const snapshot::Snapshot s = recorder.take_snapshot();
  allocator.deallocate(ptr);
  for (const snapshot::Event& e : s.events) {
    if (e.kind == EventKind::alloc) return s.stacks.at(e.stack.value).frames.size();
  }
  return 0;
}

}  // namespace

TEST_CASE("the unwinder walks through a frame without a frame pointer, where the native walk stops") {
  const std::size_t native = depth_of_alloc(StackCapture::native);
  const std::size_t unwound = depth_of_alloc(StackCapture::unwind);
  MESSAGE("native walk: " << native << " frames, unwinder: " << unwound << " frames");
  // The native walk ends inside the allocator, below the function without a
  // frame pointer; the unwinder reaches this test and the doctest runner.
  CHECK(native >= 1);
  CHECK(unwound >= native + 3);
}

TEST_CASE("stack capture names parse and print") {
  CHECK(parse_stack_capture("unwind") == StackCapture::unwind);
  CHECK(std::string(to_string(StackCapture::unwind)) == "unwind");
  CHECK_THROWS_AS(parse_stack_capture("dwarf"), InvalidArgument);
}
