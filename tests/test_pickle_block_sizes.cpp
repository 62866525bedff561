// The block sizes of a PyTorch trace found per segment, on threads
// (snapshot/src/pickle/pickle_block_sizes.cpp): every answer must be the
// one-thread pass's, field for field, and so PyTorch's own figures on real
// runs; where a trace breaks what the split relies on, the one-thread pass
// must be the one that answered.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "allocator_support.hpp"
#include "file_bytes.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "../analyzer/testing/parsers.hpp"

using namespace cachealloc;
using snapshot::Event;
using snapshot::EventKind;
using test_support::MiB;

namespace {

const std::filesystem::path kPytorch = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";

struct Read {
  snapshot::Snapshot snapshot;
  bool per_segment = false;
};

// The pickle read on `threads` threads, the per-segment pass allowed on any
// trace however short.
Read read(std::span<const std::byte> bytes, unsigned threads) {
  snapshot::detail::PickleReadStats stats;
  snapshot::detail::PickleReadOptions options;
  options.threads = threads;
  options.min_parallel_sizing_events = 1;
  options.stats = &stats;
  Read out{snapshot::detail::decode_pytorch_pickle(bytes, options), false};
  out.per_segment = stats.block_sizes_per_segment != 0;
  return out;
}

// Reads on one thread and on `threads`; checks that both give the same
// snapshot and returns whether the per-segment pass gave it.
bool same_on_threads(std::span<const std::byte> bytes, unsigned threads = 4) {
  const Read one = read(bytes, 1);
  REQUIRE_FALSE(one.per_segment);
  const Read many = read(bytes, threads);
  REQUIRE(many.snapshot.events.size() == one.snapshot.events.size());
  for (std::size_t i = 0; i < one.snapshot.events.size(); ++i) {
    CAPTURE(i);
    REQUIRE(many.snapshot.events[i] == one.snapshot.events[i]);
  }
  CHECK(many.snapshot.settings == one.snapshot.settings);
  CHECK(many.snapshot == one.snapshot);
  return many.per_segment;
}

// A trace written by hand: segments and events as PyTorch would list them,
// sizes as requested bytes (the pickle's 'size'), the final layout given.
struct HandTrace {
  snapshot::Snapshot s;
  std::uint64_t time_us = 1000;

  HandTrace() {
    s.header.source = "cachealloc";
    s.devices = {snapshot::DeviceInfo{}};
  }
  void event(EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t requested = 0) {
    Event e;
    e.kind = kind;
    e.time_ns = ++time_us * 1000;
    e.address = address;
    e.size = size;
    e.aux = requested;
    s.events.push_back(e);
  }
  void segment(std::uint64_t address, std::uint64_t size) {
    event(EventKind::segment_alloc, address, size, size > 2 * MiB ? std::uint64_t{snapshot::segment_flag_large_pool} : 0);
  }
  void alloc(std::uint64_t address, std::uint64_t block, std::uint64_t requested) {
    event(EventKind::alloc, address, block, requested);
  }
  void free(std::uint64_t address, std::uint64_t block, std::uint64_t requested) {
    event(EventKind::free_requested, address, block, requested);
    event(EventKind::free_completed, address, block, requested);
  }
  // The final layout: each segment one free block.
  void final_free_segment(std::uint64_t address, std::uint64_t size) {
    snapshot::Segment segment{0, 0, address, size, size > 2 * MiB, false, {}, {}};
    segment.blocks.push_back(snapshot::Block{address, size, 0, snapshot::BlockState::inactive, {}});
    s.segments.push_back(segment);
  }
  // Unvalidated: some traces here step back in time, as PyTorch's may.
  std::vector<std::byte> pickle() const { return snapshot::detail::encode_pytorch_pickle_unvalidated(s); }
};

constexpr std::uint64_t kBase = 0x7f0000000000;

// Two 20 MiB segments, allocations in both, everything freed, one segment
// released: a trace the per-segment pass takes.
HandTrace well_formed() {
  HandTrace t;
  t.segment(kBase, 20 * MiB);
  t.segment(kBase + 64 * MiB, 20 * MiB);
  for (int round = 0; round < 3; ++round) {
    t.alloc(kBase, 3 * MiB, 3 * MiB - 5);
    t.alloc(kBase + 64 * MiB, 5 * MiB, 5 * MiB - 7);
    t.alloc(kBase + 3 * MiB, 2 * MiB, 2 * MiB);
    t.free(kBase, 3 * MiB, 3 * MiB - 5);
    t.free(kBase + 64 * MiB, 5 * MiB, 5 * MiB - 7);
    t.free(kBase + 3 * MiB, 2 * MiB, 2 * MiB);
  }
  t.event(EventKind::segment_release, kBase + 64 * MiB, 20 * MiB);
  t.final_free_segment(kBase, 20 * MiB);
  return t;
}

// A random training-like run through our allocator (PyTorch's policy, row
// for row), on the simulated device, recorded and written as PyTorch's
// pickle: many segments of both pools, splits, merges, oversize blocks,
// empty_cache, a second stream, blocks still live at the dump.
std::vector<std::byte> allocator_run(std::uint32_t seed, const std::string& conf) {
  auto device = test_support::simulated();
  CachingAllocator allocator(device, parse_config(conf));
  HistoryOptions options;
  options.stacks = StackCapture::none;
  HistoryRecorder recorder(allocator, options);
  std::mt19937_64 random(seed);
  const Stream side = device->create_stream();
  std::vector<void*> live;
  for (int i = 0; i < 6000; ++i) {
    const std::uint64_t pick = random() % 100;
    const std::size_t bytes = pick < 50   ? 1 + random() % (64 * 1024)
                              : pick < 85 ? 1 + random() % (4 * MiB)
                                          : 1 + random() % (40 * MiB);
    live.push_back(allocator.allocate(bytes, random() % 4 == 0 ? side : Stream{}));
    if (live.size() > 48) {
      const std::size_t victim = random() % live.size();
      allocator.deallocate(live[victim]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    if (i == 3000) allocator.empty_cache();
  }
  live.resize(live.size() / 2);  // the rest stay live at the dump
  (void)live;
  return snapshot::encode_pytorch_pickle(recorder.take_snapshot());
}

analyzer::testing::Json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return analyzer::testing::parse_json(text.str());
}

}  // namespace

TEST_CASE("every real PyTorch snapshot gets the one-thread pass's block sizes on threads, and PyTorch's figures") {
  std::size_t per_segment = 0;
  std::size_t compared = 0;
  for (const auto& folder : {kPytorch, kPytorch / "corpus"}) {
    for (const auto& file : std::filesystem::directory_iterator(folder)) {
      if (file.path().extension() != ".pickle") continue;
      CAPTURE(file.path().string());
      // given a pickle PyTorch wrote
      const std::vector<std::byte> bytes = test_support::file_bytes(file.path());
      // when read on one thread and on four, then the block sizes agree
      const bool split = same_on_threads(bytes);
      per_segment += split ? 1 : 0;
      // and where the per-segment pass answered, the analysis of its
      // snapshot gives PyTorch's own figures at the dump (its peaks there
      // are since the run's last reset_peak_memory_stats():
      // test_pytorch_ground_truth compares them step by step)
      std::filesystem::path stats = file.path();
      stats.replace_extension(".stats.json");
      if (!split || !std::filesystem::exists(stats)) continue;
      const analyzer::testing::Json truth = read_json(stats);
      const analyzer::testing::Json& dump = truth.has("dump") ? truth["dump"] : truth;
      const analyzer::Analysis a = analyzer::analyze(read(bytes, 4).snapshot, {});
      if (a.truncated()) continue;
      const auto check = [&dump](const char* key, std::uint64_t ours) {
        CAPTURE(key);
        if (dump.has(key)) CHECK(ours == static_cast<std::uint64_t>(dump[key].number()));
      };
      check("allocated_bytes.all.current", a.totals_at_end.allocated);
      check("reserved_bytes.all.current", a.totals_at_end.reserved);
      check("active_bytes.all.current", a.totals_at_end.active);
      check("requested_bytes.all.current", a.totals_at_end.requested);
      check("inactive_split_bytes.all.current", a.cache_at_end.inactive_split);
      ++compared;
    }
  }
  // the corpus's complete, non-expandable runs take the per-segment pass
  CHECK(per_segment >= 5);
  CHECK(compared >= 3);
}

TEST_CASE("runs of PyTorch's policy over many segments are sized per segment exactly as on one thread") {
  for (const std::string conf : {"", "max_split_size_mb:40", "roundup_power2_divisions:4", "garbage_collection_threshold:0.5"}) {
    for (std::uint32_t seed = 1; seed <= 3; ++seed) {
      CAPTURE(conf);
      CAPTURE(seed);
      const std::vector<std::byte> bytes = allocator_run(seed, conf);
      CHECK(same_on_threads(bytes, 2 + seed));
      // nothing was left unexplained: the sizes are the allocator's blocks
      const Read many = read(bytes, 3);
      CHECK(many.snapshot.settings.at("block_sizes.inferred") == "0");
    }
  }
}

TEST_CASE("a trace the per-segment pass takes: two segments, one released, the final layout") {
  const HandTrace t = well_formed();
  CHECK(same_on_threads(t.pickle()));
  const Read many = read(t.pickle(), 4);
  CHECK(many.snapshot.settings.at("block_sizes.inferred") == "0");
  CHECK(many.snapshot.settings.count("trace_may_begin_mid_run") == 0);
}

TEST_CASE("times that go back are raised to the latest before them across every range, as on one thread") {
  // given a long trace (several ranges of 4,096 events) whose clock steps back now and then
  HandTrace t;
  t.time_us = 1'000'000;  // steps back never below 0
  t.segment(kBase, 20 * MiB);
  for (int round = 0; round < 1500; ++round) {
    if (round % 97 == 0) t.time_us -= 5000;
    t.alloc(kBase, 3 * MiB, 3 * MiB - round);
    t.alloc(kBase + 3 * MiB, 1 * MiB, 1 * MiB - 512);
    t.free(kBase, 3 * MiB, 3 * MiB - round);
    t.free(kBase + 3 * MiB, 1 * MiB, 1 * MiB - 512);
  }
  t.final_free_segment(kBase, 20 * MiB);
  // when read on threads, then the times are the one-thread pass's, never decreasing
  CHECK(same_on_threads(t.pickle(), 4));
  const snapshot::Snapshot s = read(t.pickle(), 4).snapshot;
  CHECK(std::is_sorted(s.events.begin(), s.events.end(),
                       [](const Event& a, const Event& b) { return a.time_ns < b.time_ns; }));
}

TEST_CASE("blocks still live at the dump take the final layout's size on threads as on one thread") {
  HandTrace t;
  t.segment(kBase, 20 * MiB);
  t.alloc(kBase, 3 * MiB, 3 * MiB - 5);
  t.alloc(kBase + 3 * MiB, 4 * MiB, 4 * MiB - 100);
  t.free(kBase, 3 * MiB, 3 * MiB - 5);
  t.alloc(kBase, 3 * MiB, 3 * MiB - 9);
  // requested_free then a pending free at the dump
  t.event(EventKind::free_requested, kBase + 3 * MiB, 4 * MiB, 4 * MiB - 100);
  snapshot::Segment segment{0, 0, kBase, 20 * MiB, true, false, {}, {}};
  segment.blocks.push_back(snapshot::Block{kBase, 3 * MiB, 3 * MiB - 9, snapshot::BlockState::active_allocated, {}});
  segment.blocks.push_back(
      snapshot::Block{kBase + 3 * MiB, 4 * MiB, 4 * MiB - 100, snapshot::BlockState::active_pending_free, {}});
  segment.blocks.push_back(snapshot::Block{kBase + 7 * MiB, 13 * MiB, 0, snapshot::BlockState::inactive, {}});
  t.s.segments.push_back(segment);
  CHECK(same_on_threads(t.pickle()));
}

TEST_CASE("an allocation the layout cannot explain but the final layout holds takes its size on threads") {
  // given an allocation inside a block (no free block starts there), still live at the dump
  HandTrace t;
  t.segment(kBase, 20 * MiB);
  t.alloc(kBase + 1 * MiB, 2 * MiB, 1 * MiB + 1);
  snapshot::Segment segment{0, 0, kBase, 20 * MiB, true, false, {}, {}};
  segment.blocks.push_back(snapshot::Block{kBase, 1 * MiB, 0, snapshot::BlockState::inactive, {}});
  segment.blocks.push_back(snapshot::Block{kBase + 1 * MiB, 2 * MiB, 1 * MiB + 1, snapshot::BlockState::active_allocated, {}});
  segment.blocks.push_back(snapshot::Block{kBase + 3 * MiB, 17 * MiB, 0, snapshot::BlockState::inactive, {}});
  t.s.segments.push_back(segment);
  // when read on threads, then it has the final layout's 2 MiB, not its rounded request, as on one thread
  CHECK(same_on_threads(t.pickle()));
  const snapshot::Snapshot s = read(t.pickle(), 4).snapshot;
  CHECK(s.events[1].size == 2 * MiB);
  CHECK(s.settings.at("block_sizes.inferred") == "0");
}

TEST_CASE("a trace the split cannot vouch for is sized by the one-thread pass") {
  SUBCASE("a segment released with a block allocated, its address live again at the dump") {
    // One thread: the second allocation is the one alive at the end, and
    // takes the final layout's word; the first keeps its own block.
    HandTrace t;
    t.segment(kBase, 20 * MiB);
    t.alloc(kBase, 1 * MiB + 512, 1 * MiB + 1);
    t.event(EventKind::segment_release, kBase, 20 * MiB);
    t.segment(kBase, 20 * MiB);
    t.alloc(kBase, 1 * MiB + 512, 1 * MiB + 1);
    snapshot::Segment segment{0, 0, kBase, 20 * MiB, true, false, {}, {}};
    segment.blocks.push_back(snapshot::Block{kBase, 2 * MiB, 1 * MiB + 1, snapshot::BlockState::active_allocated, {}});
    segment.blocks.push_back(snapshot::Block{kBase + 2 * MiB, 18 * MiB, 0, snapshot::BlockState::inactive, {}});
    t.s.segments.push_back(segment);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
  SUBCASE("an allocation outside every segment the trace made (it began mid-run)") {
    HandTrace t = well_formed();
    t.alloc(kBase + 200 * MiB, 2 * MiB, 2 * MiB - 1);
    t.free(kBase + 200 * MiB, 2 * MiB, 2 * MiB - 1);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
  SUBCASE("a segment released with a block still allocated") {
    HandTrace t;
    t.segment(kBase, 20 * MiB);
    t.alloc(kBase, 3 * MiB, 3 * MiB);
    t.event(EventKind::segment_release, kBase, 20 * MiB);
    t.segment(kBase, 20 * MiB);
    t.free(kBase, 3 * MiB, 3 * MiB);
    t.final_free_segment(kBase, 20 * MiB);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
  SUBCASE("a free of a block the segment never handed out") {
    HandTrace t = well_formed();
    t.free(kBase + 5 * MiB, 2 * MiB, 2 * MiB);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
  SUBCASE("a segment reported twice") {
    HandTrace t = well_formed();
    t.segment(kBase, 20 * MiB);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
  SUBCASE("segments that overlap") {
    HandTrace t = well_formed();
    t.segment(kBase + 10 * MiB, 20 * MiB);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
  SUBCASE("a release inside a segment, not at its start") {
    HandTrace t = well_formed();
    t.alloc(kBase, 3 * MiB, 3 * MiB);
    t.alloc(kBase + 3 * MiB, 3 * MiB, 3 * MiB);
    t.event(EventKind::segment_release, kBase + 3 * MiB, 17 * MiB);
    t.free(kBase, 3 * MiB, 3 * MiB);
    CHECK_FALSE(same_on_threads(t.pickle()));
  }
}

namespace {

// `count` 2 MiB segments, at falling addresses, all alive at once, each with
// one allocation freed again.
HandTrace segments_alive_at_once(std::uint64_t count) {
  HandTrace t;
  for (std::uint64_t k = count; k-- > 0;) {
    t.segment(kBase + k * 4 * MiB, 2 * MiB);
    t.alloc(kBase + k * 4 * MiB, 4096, 4000);
    t.free(kBase + k * 4 * MiB, 4096, 4000);
  }
  for (std::uint64_t k = 0; k < count; ++k) t.final_free_segment(kBase + k * 4 * MiB, 2 * MiB);
  return t;
}

}  // namespace

TEST_CASE("thousands of segments alive at once are sized by the one-thread pass, whose cost does not grow with them") {
  // given more segments alive at once than the per-segment pass follows
  // (each arrival costs it time in the number alive), when read on threads,
  // then the one-thread pass answers, and alike
  CHECK_FALSE(same_on_threads(segments_alive_at_once(5000).pickle()));
  // and a few hundred alive at once still take the per-segment pass
  CHECK(same_on_threads(segments_alive_at_once(300).pickle()));
}

TEST_CASE("real PyTorch runs with expandable segments are sized by the one-thread pass") {
  for (const char* name : {"corpus/expandable.pickle", "corpus/expandable_maxsplit.pickle", "varlen_expandable_maxsplit.pickle"}) {
    CAPTURE(name);
    CHECK_FALSE(same_on_threads(test_support::file_bytes(kPytorch / name)));
  }
}
