// Category events (HistoryRecorder::tag_category, cachealloc_tag_category):
// a tag reaches the ring and a stream after the alloc it names, with its
// address and code, whatever the clock; none while not recording.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/cachealloc.h"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/reader.hpp"

using namespace cachealloc;
using events::AllocationCategory;
using snapshot::EventKind;
using test_support::KiB;
using test_support::MiB;

namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::path(CACHEALLOC_BINARY_DIR) / ("test_history_categories_" + name);
}

// The index of the first event of `kind` at `address`; events.size() when none.
std::size_t find(const std::vector<snapshot::Event>& events, EventKind kind, std::uint64_t address) {
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == kind && events[i].address == address) return i;
  return events.size();
}

// Two allocations tagged after they were made, one tagged twice, one freed,
// and a tag before recording starts.
struct Tagged {
  std::uint64_t parameter = 0;
  std::uint64_t gradient = 0;
};
Tagged tag_workload(CachingAllocator& allocator, HistoryRecorder& recorder) {
  void* early = allocator.allocate(64 * KiB);
  recorder.stop();
  recorder.tag_category(reinterpret_cast<std::uintptr_t>(early), AllocationCategory::other);  // not recording
  HistoryOptions options = recorder.options();
  options.enabled = true;
  recorder.start(options);
  void* parameter = allocator.allocate(3 * MiB);
  recorder.tag_category(reinterpret_cast<std::uintptr_t>(parameter), AllocationCategory::parameter);
  void* gradient = allocator.allocate(512 * KiB);
  recorder.tag_category(reinterpret_cast<std::uintptr_t>(gradient), AllocationCategory::temporary);
  recorder.tag_category(reinterpret_cast<std::uintptr_t>(gradient), AllocationCategory::gradient);
  allocator.deallocate(gradient);
  allocator.deallocate(early);
  return {reinterpret_cast<std::uint64_t>(parameter), reinterpret_cast<std::uint64_t>(gradient)};
}

void check_tags(const std::vector<snapshot::Event>& events, const Tagged& tagged) {
  std::size_t tags = 0;
  for (const snapshot::Event& e : events) tags += e.kind == EventKind::category;
  CHECK(tags == 3);
  const std::size_t parameter_alloc = find(events, EventKind::alloc, tagged.parameter);
  const std::size_t parameter_tag = find(events, EventKind::category, tagged.parameter);
  REQUIRE(parameter_tag < events.size());
  CHECK(parameter_alloc < parameter_tag);
  CHECK(events[parameter_tag].aux == static_cast<std::uint64_t>(AllocationCategory::parameter));
  CHECK(events[parameter_tag].size == 0);
  const std::size_t gradient_alloc = find(events, EventKind::alloc, tagged.gradient);
  const std::size_t gradient_tag = find(events, EventKind::category, tagged.gradient);
  const std::size_t gradient_free = find(events, EventKind::free_requested, tagged.gradient);
  REQUIRE(gradient_free < events.size());
  CHECK(gradient_alloc < gradient_tag);
  CHECK(events[gradient_tag].aux == static_cast<std::uint64_t>(AllocationCategory::temporary));
  CHECK(events[gradient_tag + 1].kind == EventKind::category);
  CHECK(events[gradient_tag + 1].aux == static_cast<std::uint64_t>(AllocationCategory::gradient));
  CHECK(gradient_tag + 1 < gradient_free);
  for (std::size_t i = 1; i < events.size(); ++i) CHECK(events[i - 1].time_ns <= events[i].time_ns);
}

}  // namespace

TEST_CASE("a category tag reaches the ring after its alloc, in the order tagged, with either clock") {
  for (const HistoryClock clock : {HistoryClock::precise, HistoryClock::coarse}) {
    CAPTURE(to_string(clock));
    // Given a recording, with allocations tagged right after they were made
    auto device = test_support::simulated();
    CachingAllocator allocator(device);
    HistoryOptions options;
    options.clock = clock;
    HistoryRecorder recorder(allocator, options);
    const Tagged tagged = tag_workload(allocator, recorder);

    // When the snapshot is taken and written
    const snapshot::Snapshot s = recorder.take_snapshot();
    const auto path = temp_path("ring.snap");
    snapshot::write_snapshot(s, path);

    // Then each tag follows its alloc, the second tag of one block after the
    // first and before its free, and the tag made while stopped is absent
    check_tags(s.events, tagged);
    CHECK(snapshot::read_snapshot(path).events == s.events);
    std::filesystem::remove(path);
  }
}

TEST_CASE("a category tag reaches a stream after its alloc") {
  // Given a streamed recording with tagged allocations
  const auto path = temp_path("stream.snap");
  std::filesystem::remove(path);
  Tagged tagged;
  {
    auto device = test_support::simulated();
    CachingAllocator allocator(device);
    HistoryOptions options;
    options.stream = path;
    options.clock = HistoryClock::coarse;
    HistoryRecorder recorder(allocator, options);
    tagged = tag_workload(allocator, recorder);
    recorder.stop();
  }
  // When the stream is read
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  // Then its tags are where the ring has them
  check_tags(s.events, tagged);
  std::filesystem::remove(path);
}

TEST_CASE("cachealloc_tag_category takes a category's name and refuses any other on one line") {
  setenv("CACHEALLOC_DEVICE", "simulated", 1);
  cachealloc_history_options options;
  cachealloc_history_options_init(&options);
  options.max_entries = 1000;
  REQUIRE(cachealloc_record_history(&options) == CACHEALLOC_OK);
  void* p = cachealloc_malloc(1 << 20, 0);
  REQUIRE(p != nullptr);
  CHECK(cachealloc_tag_category(p, "optimizer_state") == CACHEALLOC_OK);
  CHECK(cachealloc_tag_category(p, "optimizer state") == CACHEALLOC_INVALID_ARGUMENT);
  const std::string error = cachealloc_last_error();
  CHECK(error.find("\"optimizer state\"") != std::string::npos);
  CHECK(error.find('\n') == std::string::npos);
  CHECK(cachealloc_tag_category(p, nullptr) == CACHEALLOC_INVALID_ARGUMENT);
  const auto path = temp_path("c_abi.snap");
  REQUIRE(cachealloc_dump_snapshot(path.c_str()) == CACHEALLOC_OK);
  cachealloc_free(p, 1 << 20, 0);
  cachealloc_stop_history();
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  const std::size_t tag = find(s.events, EventKind::category, reinterpret_cast<std::uint64_t>(p));
  REQUIRE(tag < s.events.size());
  CHECK(s.events[tag].aux == static_cast<std::uint64_t>(AllocationCategory::optimizer_state));
  CHECK(find(s.events, EventKind::alloc, reinterpret_cast<std::uint64_t>(p)) < tag);
  std::filesystem::remove(path);
}

TEST_CASE("cachealloc-synthetic --exact-categories tags its model's state with the bytes it requested") {
  // Given a run of the synthetic loop that tags its allocations
  const std::filesystem::path out = temp_path("synthetic.bin");
  const std::string command = (std::filesystem::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-synthetic").string() +
                              " --events 20000 --seed 3 --threads 1 --stacks none --exact-categories -f -o " +
                              out.string() + " >/dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  // The model it keeps to the end: 8 parameters of (i + 1) MiB + 1000 i + 4
  // bytes, a gradient of each, and Adam's two moments of each.
  std::uint64_t parameters = 0;
  for (std::uint64_t i = 0; i < 8; ++i) parameters += (i + 1) * MiB + 1000 * i + 4;

  // When its events are replayed: each tag names the allocation live at its address
  const snapshot::Snapshot s = snapshot::read_snapshot(out);
  std::map<std::uint64_t, std::pair<std::uint64_t, int>> live;  // address -> (requested, category; -1 untagged)
  std::size_t tags = 0, stray = 0;
  for (const snapshot::Event& e : s.events) {
    if (e.kind == EventKind::alloc) live[e.address] = {e.aux, -1};
    if (e.kind == EventKind::free_requested) live.erase(e.address);
    if (e.kind != EventKind::category) continue;
    ++tags;
    const auto it = live.find(e.address);
    if (it == live.end()) ++stray;
    else it->second.second = static_cast<int>(e.aux);
  }
  std::map<int, std::uint64_t> requested_at_end;
  for (const auto& [address, allocation] : live) requested_at_end[allocation.second] += allocation.first;

  // Then every tag names a live allocation, and what is tagged at the end is the model's state
  CHECK(tags > 3 * 8);
  CHECK(stray == 0);
  CHECK(requested_at_end[static_cast<int>(AllocationCategory::parameter)] == parameters);
  CHECK(requested_at_end[static_cast<int>(AllocationCategory::gradient)] == parameters);
  CHECK(requested_at_end[static_cast<int>(AllocationCategory::optimizer_state)] == 2 * parameters);
  CHECK(requested_at_end.count(static_cast<int>(AllocationCategory::activation)) == 0);

  // And a pickle of it, which has no place for them, is written with them named among its losses
  const std::filesystem::path pickle = temp_path("synthetic.pickle");
  const std::filesystem::path notes = temp_path("synthetic.notes");
  const std::string convert = (std::filesystem::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-analyze").string() +
                              " convert " + out.string() + " -f -o " + pickle.string() + " 2>" + notes.string();
  CHECK(std::system(convert.c_str()) == 0);
  std::ifstream lines(notes);
  const std::string said((std::istreambuf_iterator<char>(lines)), std::istreambuf_iterator<char>());
  CHECK(said.find(std::to_string(tags) + " category events") != std::string::npos);
  for (const auto& path : {pickle, notes}) std::filesystem::remove(path);
  std::filesystem::remove(out);
}
