// The per-thread stack cache in front of the recorder's stack table
// (recorder/history/src/stack_capture.hpp, StackCache): whatever it hits or
// misses, every event's stack in the dump must be the stack its thread was
// in. Ground truth is the thread's own frame-pointer walk at the call site,
// taken by the test, not the recorder's output.
#include <doctest/doctest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/history.hpp"

using namespace cachealloc;
using snapshot::EventKind;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kIterations = 300;
#else
constexpr int kIterations = 3000;
#endif

// What one allocation should carry: the leaf that called allocate(), and the
// return addresses above the leaf (descend's levels and the caller of the
// chain), innermost first, from the test's own walk.
struct Expected {
  int leaf = 0;
  std::vector<std::uintptr_t> above_leaf;
};

// The return addresses of this function's callers: [0] is the return into
// the caller, [1] into its caller, and so on, `count` of them. Every frame
// walked here is test code built with frame pointers.
__attribute__((noinline)) void walk_callers(std::uintptr_t* out, int count) {
  auto fp = reinterpret_cast<const std::uintptr_t*>(__builtin_frame_address(0));
  for (int i = 0; i < count; ++i) {
    out[i] = fp[1];
    fp = reinterpret_cast<const std::uintptr_t*>(fp[0]);
  }
  asm volatile("" : : : "memory");
}

// Four leaves: stacks of the same depth through different leaves have the
// same frame count and differ in one frame, the kind a cache that compared
// too little would confuse.
template <int Leaf>
__attribute__((noinline)) void* leaf(CachingAllocator& allocator, Expected& expected, int depth) {
  std::uintptr_t frames[64];
  // [0]: into this leaf; then depth + 1 levels of descend; then the chain's caller.
  walk_callers(frames, depth + 3);
  expected.leaf = Leaf;
  expected.above_leaf.assign(frames + 1, frames + depth + 3);
  void* ptr = allocator.allocate(512);
  asm volatile("" : : "r"(ptr) : "memory");
  return ptr;
}

using Leaf = void* (*)(CachingAllocator&, Expected&, int);
const Leaf kLeaves[] = {&leaf<0>, &leaf<1>, &leaf<2>, &leaf<3>};

__attribute__((noinline)) void* descend(CachingAllocator& allocator, Expected& expected, int leaf_index, int depth,
                                        int left) {
  void* ptr = left == 0 ? kLeaves[leaf_index](allocator, expected, depth)
                        : descend(allocator, expected, leaf_index, depth, left - 1);
  asm volatile("" : : "r"(ptr) : "memory");  // not a tail call: each level keeps its frame
  return ptr;
}

__attribute__((noinline)) void* allocate_at(CachingAllocator& allocator, Expected& expected, int leaf_index,
                                            int depth) {
  void* ptr = descend(allocator, expected, leaf_index, depth, depth);
  asm volatile("" : : "r"(ptr) : "memory");
  return ptr;
}

// Which leaf holds `ip`: the one that starts nearest below it.
int leaf_holding(std::uintptr_t ip) {
  int best = -1;
  std::uintptr_t best_start = 0;
  for (int i = 0; i < 4; ++i) {
    const auto start = reinterpret_cast<std::uintptr_t>(kLeaves[i]);
    if (start <= ip && start >= best_start) {
      best = i;
      best_start = start;
    }
  }
  return best;
}

std::vector<std::uintptr_t> frames_of(const snapshot::Snapshot& s, snapshot::StackId id) {
  std::vector<std::uintptr_t> out;
  if (!id || id.value >= s.stacks.size()) return out;
  for (snapshot::FrameId f : s.stacks[id.value].frames) out.push_back(s.frames.at(f.value).ip);
  return out;
}

// The dumped stack holds the expected frames, right above a frame in the
// expected leaf.
bool matches(const std::vector<std::uintptr_t>& dumped, const Expected& expected) {
  const auto& want = expected.above_leaf;
  if (dumped.size() < want.size() + 1) return false;
  for (std::size_t j = 1; j + want.size() <= dumped.size(); ++j) {
    if (!std::equal(want.begin(), want.end(), dumped.begin() + static_cast<std::ptrdiff_t>(j))) continue;
    if (leaf_holding(dumped[j - 1]) == expected.leaf) return true;
  }
  return false;
}

std::uint64_t os_thread_id() { return static_cast<std::uint64_t>(::syscall(SYS_gettid)); }

// The allocs of thread `tid` in the snapshot, in the order the thread made them.
std::vector<const snapshot::Event*> allocs_of(const snapshot::Snapshot& s, std::uint64_t tid) {
  std::vector<const snapshot::Event*> out;
  for (const snapshot::Event& e : s.events)
    if (e.kind == EventKind::alloc && e.thread < s.threads.size() && s.threads[e.thread] == tid) out.push_back(&e);
  return out;
}

HistoryOptions native_options() {
  HistoryOptions options;
  options.stacks = StackCapture::native;
  options.max_frames = 64;
  options.max_entries = 1u << 20;
  return options;
}

}  // namespace

TEST_CASE("given 8 threads recording 40 distinct stacks and one they all share, when dumped, then every alloc has the "
          "stack its thread was in") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryRecorder recorder(allocator, native_options());
  constexpr int kThreads = 8;
  std::vector<std::vector<Expected>> expected(kThreads);
  std::vector<std::uint64_t> tids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      tids[t] = os_thread_id();
      expected[t].resize(kIterations);
      for (int i = 0; i < kIterations; ++i) {
        // Even iterations: the stack every thread shares (leaf 0, depth 3).
        // Odd ones: 4 leaves x 10 depths, in an order that differs by thread,
        // more stacks than the cache has entries, so that they collide in it.
        const int pick = (i / 2 * 7 + t * 3) % 40;
        const int leaf_index = i % 2 == 0 ? 0 : pick % 4;
        const int depth = i % 2 == 0 ? 3 : pick / 4;
        void* ptr = allocate_at(allocator, expected[t][i], leaf_index, depth);
        allocator.deallocate(ptr);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const snapshot::Snapshot s = recorder.take_snapshot();
  REQUIRE(s.dropped_events == 0);
  std::set<std::uint32_t> alloc_stacks;
  for (int t = 0; t < kThreads; ++t) {
    const auto allocs = allocs_of(s, tids[t]);
    REQUIRE(allocs.size() == static_cast<std::size_t>(kIterations));
    int wrong = 0;
    for (int i = 0; i < kIterations; ++i) {
      const auto dumped = frames_of(s, allocs[i]->stack);
      alloc_stacks.insert(allocs[i]->stack.value);
      if (!matches(dumped, expected[t][i])) {
        if (wrong++ == 0)
          FAIL_CHECK("thread " << t << " alloc " << i << " (leaf " << expected[t][i].leaf << ", "
                               << expected[t][i].above_leaf.size() << " frames above it): dumped stack of "
                               << dumped.size() << " frames does not hold them");
      }
      // Each stack must fit the cache (StackCache::kMaxFrames, 64), or this test would not exercise it.
      CHECK(dumped.size() <= 64);
    }
    CHECK(wrong == 0);
  }
  // 40 call paths (the shared one among them), each a distinct stack; an
  // alloc that had to create the segment comes from another place in the
  // allocator, a stack of its own.
  MESSAGE(alloc_stacks.size() << " distinct alloc stacks");
  CHECK(alloc_stacks.size() >= 40);
}

TEST_CASE("given a recorder restarted or replaced, when the same stacks are recorded again, then their ids resolve to "
          "their own frames in the new dump") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  std::vector<Expected> before(2);
  {
    HistoryRecorder first(allocator, native_options());
    allocator.deallocate(allocate_at(allocator, before[0], 1, 2));
    allocator.deallocate(allocate_at(allocator, before[1], 2, 5));
    first.stop();
  }
  // A new recorder (quite likely at the old one's address): new stacks
  // first, so that the table's ids differ from the first recorder's, then
  // the stacks the first one saw, which a stale cache would answer.
  auto check_round = [&](HistoryRecorder& recorder, const char* what) {
    std::vector<Expected> expected(4);
    allocator.deallocate(allocate_at(allocator, expected[0], 3, 7));
    allocator.deallocate(allocate_at(allocator, expected[1], 0, 4));
    allocator.deallocate(allocate_at(allocator, expected[2], 1, 2));
    allocator.deallocate(allocate_at(allocator, expected[3], 2, 5));
    const snapshot::Snapshot s = recorder.take_snapshot();
    const auto allocs = allocs_of(s, os_thread_id());
    REQUIRE(allocs.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO(what << ", alloc " << i);
      CHECK(matches(frames_of(s, allocs[i]->stack), expected[i]));
    }
  };
  auto second = std::make_unique<HistoryRecorder>(allocator, native_options());
  check_round(*second, "new recorder");
  // Stop and start again: the ring is cleared, and the stacks still resolve.
  second->stop();
  second->start(native_options());
  check_round(*second, "restarted recorder");
}
