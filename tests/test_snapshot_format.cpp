// The binary snapshot format (snapshot/src/format/, docs/FORMAT.md):
// round trips, every rejection, atomic writes and compactness.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/invariants.hpp"
#include "cachealloc/snapshot/ring_start.hpp"
#include "cachealloc/snapshot/stream.hpp"

namespace fs = std::filesystem;
using namespace cachealloc::snapshot;

namespace {

// --- builders --------------------------------------------------------------

Snapshot make_rich_snapshot() {
  Snapshot s;
  s.header.format_version = kWholeFormatVersion;
  s.header.writer_version = "0.1.0";
  s.header.source = "cachealloc";
  s.header.dump_time_unix_ns = 1'700'000'000'123'456'789ULL;
  s.header.program = "/usr/bin/python3";
  s.header.arguments = {"train.py", "--batch", "64", ""};
  s.header.pid = 4242;
  s.header.host = "node-7";
  s.devices = {{0, "NVIDIA H200", 150'000'000'000ULL, 100'000'000'000ULL, 150'000'000'000ULL, UsageSource::nvml,
                "driver 580.95.05",
                {DeviceUsage{kUsageAtDump, 77, true, 51'000'000'000ULL, 52'000'000'000ULL, 600'000'000ULL,
                             150'700'000'000ULL, 1, 1'000'000'000ULL}}},
               {1, "simulated", 1ULL << 34, 1ULL << 33, 1ULL << 34, {}, {}, {}}};
  s.settings = {{"max_split_size_mb", "128"}, {"config", "expandable_segments:True,max_split_size_mb:128"}};
  s.stats = {{"allocated_bytes.all.current", 1 << 20}, {"num_ooms", 1}, {"negative.for.test", -5}};
  s.strings = {"", "forward", "model.py", "libtorch.so", "step", "matmul"};
  s.frames = {Frame{}, Frame{0x7f00'1234'5678ULL, StringId{1}, StringId{2}, 17, StringId{3}},
              Frame{0x7f00'1234'9999ULL, StringId{5}, StringId{}, 0, StringId{3}},
              Frame{0x4242ULL, StringId{}, StringId{}, 0, StringId{}}};
  s.stacks = {Stack{}, Stack{{FrameId{1}, FrameId{2}}}, Stack{{FrameId{3}}}, Stack{{FrameId{2}, FrameId{1}, FrameId{3}}}};
  s.threads = {12345, 12346, 99};
  const std::uint64_t base = 0x7f00'0000'0000ULL;
  s.segments = {
      Segment{0, 0, base, 2 << 20, false, false, StackId{1},
              {Block{base, 512, 300, BlockState::active_allocated, StackId{1}},
               Block{base + 512, 1024, 1000, BlockState::active_pending_free, StackId{2}},
               Block{base + 1536, (2 << 20) - 1536, 0, BlockState::inactive, StackId{}}}},
      Segment{1, 0xdead, 0x7e00'0000'0000ULL, 20 << 20, true, true, StackId{3},
              {Block{0x7e00'0000'0000ULL, 2 << 20, 2 << 20, BlockState::active_allocated, StackId{3}},
               Block{0x7e00'0020'0000ULL, 18 << 20, 0, BlockState::unmapped, StackId{}}}},
  };
  s.dropped_events = 77;
  std::uint64_t t = 1'000'000;
  auto add = [&](EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t aux, std::uint32_t stack,
                 std::int32_t device = 0, std::uint32_t thread = 0, std::uint64_t stream = 0) {
    t += 123;
    s.events.push_back(Event{kind, device, thread, StackId{stack}, t, stream, address, size, aux});
  };
  add(EventKind::segment_alloc, base, 2 << 20, 0, 1);
  add(EventKind::split, base, 512, (2 << 20) - 512, 1);
  add(EventKind::alloc, base, 512, 300, 1);
  add(EventKind::split, base + 512, 1024, (2 << 20) - 1536, 2);
  add(EventKind::alloc, base + 512, 1024, 1000, 2, 0, 1);
  add(EventKind::free_requested, base + 512, 1024, 1000, 2, 0, 1, 7);
  add(EventKind::free_completed, base + 512, 1024, 1000, 2, 0, 2, 7);
  add(EventKind::merge, base + 512, (2 << 20) - 512, (2 << 20) - 1536, 2);
  add(EventKind::segment_alloc, 0x7e00'0000'0000ULL, 20 << 20, segment_flag_large_pool | segment_flag_expandable, 3,
      1, 0, 0xdead);
  add(EventKind::segment_map, 0x7e00'0000'0000ULL, 2 << 20, 0, 3, 1, 0, 0xdead);
  add(EventKind::segment_unmap, 0x7e00'0020'0000ULL, 2 << 20, 0, 0, 1);
  add(EventKind::segment_release, 0x7d00'0000'0000ULL, 2 << 20, 0, 0, 2);
  add(EventKind::empty_cache, 0, 2 << 20, 0, 0);
  add(EventKind::oom, 1 << 20, 1ULL << 40, 0, 3);
  add(EventKind::annotation_begin, 0, 0, 4, 0);
  add(EventKind::annotation_end, 0, 0, 4, 0);
  add(EventKind::snapshot, 0, 0, 0, 0);
  // What the writer would store for the 77 dropped events, so that the
  // snapshot round-trips as it is.
  s.ring_start = derive_ring_starts(s);
  return s;
}

// How the events of one allocator call are stamped.
struct TraceConventions {
  // PyTorch's trace gives a free the stack of its block; our recorder
  // captures stacks only on the allocating calls.
  bool frees_carry_stacks = true;
  // Our recorder reads the clock once per allocator call, so a split and its
  // alloc, or a free and its merges, share one timestamp.
  bool one_time_per_call = false;
};

// A trace shaped like the recorder's output: a small caching allocator with
// best-fit reuse, splitting and coalescing drives the events, so addresses,
// sizes and stacks repeat the way a training loop makes them repeat.
Snapshot make_realistic_trace(std::size_t event_count, std::uint64_t seed, TraceConventions conventions = {}) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  std::uniform_real_distribution<double> unit(0.0, 1.0);

  Snapshot s;
  s.header.format_version = kWholeFormatVersion;
  s.header.source = "cachealloc";
  s.devices = {{0, "simulated", 80ULL << 30, 0, 80ULL << 30, {}, {}, {}}};
  s.threads = {1001, 1002, 1003};
  for (int i = 1; i <= 500; ++i) s.strings.push_back("function_" + std::to_string(i));
  for (std::uint32_t i = 1; i <= 2000; ++i) {
    s.frames.push_back(Frame{0x5500'0000'0000ULL + i * 64, StringId{1 + i % 500}, StringId{}, i, StringId{}});
  }
  constexpr std::uint32_t kSites = 300;
  struct Site {
    std::uint64_t requested;
    bool dynamic;  // dynamic shapes: a different size on every call
  };
  std::vector<Site> sites;
  for (std::uint32_t i = 0; i < kSites; ++i) {
    Stack stack;
    const auto depth = uniform(8, 30);
    for (std::uint64_t d = 0; d < depth; ++d) stack.frames.push_back(FrameId{static_cast<std::uint32_t>(uniform(1, 2000))});
    s.stacks.push_back(stack);
    const auto magnitude = uniform(8, 24);
    sites.push_back(Site{(std::uint64_t{1} << magnitude) + uniform(0, std::uint64_t{1} << magnitude), chance(0.2)});
  }

  struct Live {
    std::uint64_t address, size, requested;
    StackId stack;
  };
  struct Pending {
    Live block;
    std::uint64_t countdown;
  };
  std::map<std::uint64_t, std::uint64_t> free_by_address;
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_by_size;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> segments;
  std::vector<Live> live;
  std::vector<Pending> pending;
  std::uint64_t next_segment = 0x7f00'0000'0000ULL;
  std::uint64_t time = 5'000'000'000ULL;
  std::uint32_t thread = 0;
  std::uint64_t stream = 0;
  bool growing = true;

  bool call_started = true;  // the next event begins an allocator call
  auto emit = [&](EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t aux, StackId stack) {
    if (call_started || !conventions.one_time_per_call) {
      time += static_cast<std::uint64_t>(std::exp(std::log(50.0) + unit(rng) * (std::log(2000.0) - std::log(50.0))));
    }
    call_started = false;
    const bool is_free = kind == EventKind::free_requested || kind == EventKind::free_completed ||
                         kind == EventKind::merge;
    if (is_free && !conventions.frees_carry_stacks) stack = StackId{};
    s.events.push_back(Event{kind, 0, thread, stack, time, stream, address, size, aux});
  };
  auto add_free = [&](std::uint64_t address, std::uint64_t size) {
    free_by_address[address] = size;
    free_by_size.insert({size, address});
  };
  auto remove_free = [&](std::uint64_t address, std::uint64_t size) {
    free_by_address.erase(address);
    free_by_size.erase({size, address});
  };
  auto complete_free = [&](const Live& block) {
    emit(EventKind::free_completed, block.address, block.size, block.requested, block.stack);
    std::uint64_t address = block.address;
    std::uint64_t size = block.size;
    if (auto next = free_by_address.find(address + size); next != free_by_address.end()) {
      const std::uint64_t absorbed = next->second;
      remove_free(next->first, absorbed);
      size += absorbed;
      emit(EventKind::merge, address, size, absorbed, block.stack);
    }
    if (auto prev = free_by_address.lower_bound(address); prev != free_by_address.begin()) {
      --prev;
      if (prev->first + prev->second == address) {
        const std::uint64_t prev_address = prev->first;
        const std::uint64_t prev_size = prev->second;
        remove_free(prev_address, prev_size);
        emit(EventKind::merge, prev_address, prev_size + size, size, block.stack);
        address = prev_address;
        size += prev_size;
      }
    }
    add_free(address, size);
  };

  std::uint64_t next_annotation = 3000;
  while (s.events.size() < event_count) {
    if (chance(0.01)) thread = static_cast<std::uint32_t>(uniform(0, 2));
    if (chance(0.02)) stream = uniform(0, 3) * 0x1000;
    for (std::size_t i = 0; i < pending.size();) {
      if (--pending[i].countdown == 0) {
        const Live block = pending[i].block;
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        call_started = true;
        complete_free(block);
      } else {
        ++i;
      }
    }
    if (s.events.size() >= next_annotation) {
      const StringId name{static_cast<std::uint32_t>(uniform(1, 20))};
      call_started = true;
      emit(EventKind::annotation_begin, 0, 0, name.value, StackId{});
      call_started = true;
      emit(EventKind::annotation_end, 0, 0, name.value, StackId{});
      next_annotation += uniform(1000, 5000);
    }
    if (chance(0.00002)) {  // empty_cache: release every wholly free segment
      call_started = true;
      std::uint64_t released = 0;
      for (std::size_t i = 0; i < segments.size();) {
        const auto [base, size] = segments[i];
        if (auto whole = free_by_address.find(base); whole != free_by_address.end() && whole->second == size) {
          remove_free(base, size);
          emit(EventKind::segment_release, base, size, 0, StackId{});
          released += size;
          segments.erase(segments.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      emit(EventKind::empty_cache, 0, released, 0, StackId{});
    }
    call_started = true;
    if (chance(0.000005)) emit(EventKind::oom, 1ULL << 30, 1ULL << 32, 0, StackId{1});

    call_started = true;
    if (live.size() >= 300) growing = false;
    if (live.size() <= 60) growing = true;
    if (live.empty() || chance(growing ? 0.6 : 0.4)) {
      const auto site_index = static_cast<std::uint32_t>(kSites * std::pow(unit(rng), 2.5));
      const Site& site = sites[site_index];
      const StackId stack{site_index + 1};
      const std::uint64_t requested = site.dynamic ? uniform(site.requested / 2, site.requested * 2) : site.requested;
      const std::uint64_t size = (requested + 511) / 512 * 512;
      auto fit = free_by_size.lower_bound({size, 0});
      if (fit == free_by_size.end()) {
        const std::uint64_t two_mib = 2 << 20;
        const std::uint64_t segment_size =
            size <= (1 << 20) ? two_mib : size < (10 << 20) ? 20 << 20 : (size + two_mib - 1) / two_mib * two_mib;
        const std::uint64_t base = next_segment;
        next_segment += segment_size + two_mib;  // a gap: neighbours never coalesce across segments
        emit(EventKind::segment_alloc, base, segment_size, segment_size > two_mib ? std::uint64_t{segment_flag_large_pool} : 0, stack);
        segments.push_back({base, segment_size});
        add_free(base, segment_size);
        fit = free_by_size.lower_bound({size, 0});
      }
      const auto [block_size, address] = *fit;
      remove_free(address, block_size);
      if (block_size > size) {
        emit(EventKind::split, address, size, block_size - size, stack);
        add_free(address + size, block_size - size);
      }
      emit(EventKind::alloc, address, size, requested, stack);
      live.push_back(Live{address, size, requested, stack});
    } else {
      // Most frees hit a recent temporary; some a long-lived tensor.
      const std::size_t index = live.size() > 8 && chance(0.7) ? live.size() - 1 - uniform(0, 7)
                                                                : static_cast<std::size_t>(uniform(0, live.size() - 1));
      const Live block = live[index];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
      emit(EventKind::free_requested, block.address, block.size, block.requested, block.stack);
      if (chance(0.8)) {
        complete_free(block);
      } else {
        pending.push_back(Pending{block, uniform(1, 30)});
      }
    }
  }
  s.events.resize(event_count);
  return s;
}

// --- helpers ---------------------------------------------------------------

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void put_u32(std::vector<std::byte>& bytes, std::size_t offset, std::uint32_t value) {
  for (std::size_t i = 0; i < 4; ++i) bytes[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}
void put_u64(std::vector<std::byte>& bytes, std::size_t offset, std::uint64_t value) {
  for (std::size_t i = 0; i < 8; ++i) bytes[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

ErrorCode decode_error(std::span<const std::byte> bytes, std::string* message = nullptr) {
  try {
    (void)decode(bytes);
  } catch (const SnapshotError& error) {
    if (message != nullptr) *message = error.what();
    return error.code();
  }
  FAIL("decode accepted the input");
  return ErrorCode::unsupported;
}

// A fresh directory per test, removed at the end.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    path_ = fs::temp_directory_path() / ("cachealloc-format-test-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_)) names.push_back(entry.path().filename().string());
    return names;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

constexpr std::size_t kBodySizeOffset = 16;
constexpr std::size_t kVersionOffset = 8;

}  // namespace

// --- round trips -------------------------------------------------------------

TEST_CASE("a rich snapshot survives a round trip unchanged") {
  // Given a snapshot with every event kind, block state, table and device
  const Snapshot original = make_rich_snapshot();
  // When it is encoded and decoded
  const Snapshot decoded = decode(encode(original));
  // Then nothing changed
  CHECK(decoded.header == original.header);
  CHECK(decoded.segments == original.segments);
  CHECK(decoded.events == original.events);
  CHECK(decoded == original);
}

TEST_CASE("a default snapshot survives a round trip") {
  Snapshot original;
  original.header.format_version = kWholeFormatVersion;
  CHECK(decode(encode(original)) == original);
}

TEST_CASE("decode reports the format version the file was written with") {
  // Given a snapshot whose header does not claim a version
  Snapshot original = make_rich_snapshot();
  original.header.format_version = 0;
  // When it round-trips, then the reader fills in the file's version
  CHECK(decode(encode(original)).header.format_version == kWholeFormatVersion);
}

TEST_CASE("events with unusual field values survive a round trip") {
  // Given events the recorder never writes: time going backwards, unaligned
  // and extreme addresses, negative devices, repeats that do not match
  Snapshot original;
  original.header.format_version = kWholeFormatVersion;
  original.stacks = {Stack{}, Stack{}, Stack{}};
  const std::uint64_t max = UINT64_MAX;
  original.events = {
      Event{EventKind::alloc, -3, 7, StackId{2}, max, max, max, max, max},
      Event{EventKind::free_requested, INT32_MIN, UINT32_MAX, StackId{2}, 0, 0, max, max, max},
      Event{EventKind::free_completed, INT32_MAX, 0, StackId{1}, 5, 1, max, max - 1, 3},
      Event{EventKind::alloc, 0, 0, StackId{}, 5, 1, 1, 0, 1},
      Event{EventKind::alloc, 0, 0, StackId{}, 4, 1, 513, 513, 1024},
      Event{EventKind::free_completed, 0, 0, StackId{}, 4, 1, 513, 513, 1024},
      Event{EventKind::free_completed, 0, 0, StackId{}, 4, 1, 513, 513, 1024},
      Event{EventKind::split, 0, 0, StackId{1}, 1, 0, 0, 1ULL << 63, 1ULL << 63},
  };
  // (the readers refuse such figures, invariants.hpp: the codec is held to them alone)
  CHECK(detail::decode_unvalidated(detail::encode_unvalidated(original)) == original);
}

TEST_CASE("random events with valid references survive a round trip") {
  // Given many snapshots of random events drawn from small value sets, so
  // that the codec's predictions both hit and miss
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    Snapshot original;
    original.header.format_version = kWholeFormatVersion;
    original.stacks.resize(6);
    original.threads = {1, 2, 3};
    auto pick = [&](std::initializer_list<std::uint64_t> values) {
      return *(values.begin() + static_cast<std::ptrdiff_t>(rng() % values.size()));
    };
    const std::size_t count = rng() % 64;
    for (std::size_t i = 0; i < count; ++i) {
      Event e;
      e.kind = static_cast<EventKind>(rng() % kEventKindCount);
      e.device = static_cast<std::int32_t>(pick({0, 0, 1, static_cast<std::uint64_t>(-1)}));
      e.thread = static_cast<std::uint32_t>(rng() % 3);
      e.stack = StackId{static_cast<std::uint32_t>(rng() % 6)};
      e.time_ns = pick({0, 100, 1000, 1ULL << 40, UINT64_MAX});
      e.stream = pick({0, 0, 7});
      e.address = pick({0, 512, 1024, 1025, 0x7f00'0000'0000ULL, UINT64_MAX});
      e.size = pick({0, 512, 4096, 4095, UINT64_MAX});
      e.aux = e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end ? 0
                                                                                            : pick({0, 300, 512, 4096, 4095, UINT64_MAX});
      original.events.push_back(e);
    }
    // When encoded and decoded (by the codec alone: times of 2^64 - 1 and
    // out of order are refused by the readers), then nothing changed
    REQUIRE(detail::decode_unvalidated(detail::encode_unvalidated(original)) == original);
  }
}

TEST_CASE("a realistic trace of 1M events costs at most 6 bytes per event") {
  // Given a 1M-event trace shaped like the recorder's output
  const auto started = std::chrono::steady_clock::now();
  const Snapshot trace = make_realistic_trace(1'000'000, 2024);
  Snapshot tables_only = trace;
  tables_only.events.clear();
  // When it is encoded
  const std::vector<std::byte> bytes = encode(trace);
  const std::size_t event_bytes = bytes.size() - encode(tables_only).size();
  const double per_event = static_cast<double>(event_bytes) / static_cast<double>(trace.events.size());
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  MESSAGE("realistic trace: " << trace.events.size() << " events, " << event_bytes << " bytes of events, "
                              << per_event << " bytes/event; generate+encode took " << elapsed << " ms");
  // Then the events cost at most 6 bytes each and decode back exactly
  CHECK(per_event <= 6.0);
  CHECK(decode(bytes) == trace);
}

TEST_CASE("a recorder-shaped trace of 1M events, stackless frees and one time per call, costs at most 5 bytes per event") {
  // Given the same workload stamped as our recorder stamps it: stacks only on
  // allocating calls, one clock read per allocator call
  const Snapshot trace = make_realistic_trace(1'000'000, 2024, TraceConventions{false, true});
  Snapshot tables_only = trace;
  tables_only.events.clear();
  // When it is encoded
  const std::vector<std::byte> bytes = encode(trace);
  const std::size_t event_bytes = bytes.size() - encode(tables_only).size();
  const double per_event = static_cast<double>(event_bytes) / static_cast<double>(trace.events.size());
  MESSAGE("recorder-shaped trace: " << per_event << " bytes/event");
  // Then a free repeats its block without paying for the stack it lacks, a
  // shared time costs no byte, and everything decodes back exactly
  CHECK(per_event <= 5.0);
  CHECK(decode(bytes) == trace);
}

// --- rejections --------------------------------------------------------------

TEST_CASE("bytes without our magic are not a cachealloc snapshot") {
  // Given a file that starts like something else
  std::vector<std::byte> bytes = encode(make_rich_snapshot());
  bytes[1] = std::byte{'X'};
  // When decoded, then it is rejected with the one-line message
  std::string message;
  CHECK(decode_error(bytes, &message) == ErrorCode::not_a_snapshot);
  CHECK(message == "not a cachealloc snapshot");
  CHECK_FALSE(has_snapshot_magic(bytes));

  const std::string text = "{\"segments\": []}";
  std::vector<std::byte> json(text.size());
  std::memcpy(json.data(), text.data(), text.size());
  CHECK(decode_error(json) == ErrorCode::not_a_snapshot);
}

TEST_CASE("has_snapshot_magic recognizes what encode writes") {
  const std::vector<std::byte> bytes = encode(Snapshot{});
  CHECK(has_snapshot_magic(bytes));
  CHECK_FALSE(has_snapshot_magic(std::span(bytes).first(7)));
  CHECK_FALSE(has_snapshot_magic({}));
}

TEST_CASE("a newer format version is rejected with a message naming both versions") {
  // Given a file that claims format version 8
  std::vector<std::byte> bytes = encode(make_rich_snapshot());
  put_u32(bytes, kVersionOffset, 8);
  // When decoded, then the message names 8 and ours
  std::string message;
  CHECK(decode_error(bytes, &message) == ErrorCode::newer_version);
  CHECK(message == "snapshot format version 8 is newer than this reader supports (7); upgrade cachealloc");

  // And the very next version is rejected too, even with nothing after the version
  put_u32(bytes, kVersionOffset, kFormatVersion + 1);
  CHECK(decode_error(std::span(bytes).first(12)) == ErrorCode::newer_version);
}

TEST_CASE("format version 0 never existed and is rejected") {
  std::vector<std::byte> bytes = encode(Snapshot{});
  put_u32(bytes, kVersionOffset, 0);
  CHECK(decode_error(bytes) == ErrorCode::inconsistent);
}

TEST_CASE("every prefix of a snapshot is rejected as truncated") {
  // Given a small valid file
  const std::vector<std::byte> bytes = encode(make_rich_snapshot());
  // When any proper prefix is decoded, then it throws truncated (and never crashes)
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    CAPTURE(length);
    REQUIRE(decode_error(std::span(bytes).first(length)) == ErrorCode::truncated);
  }
}

TEST_CASE("a body size that disagrees with the data is rejected") {
  std::vector<std::byte> bytes = encode(make_rich_snapshot());
  const std::uint64_t body = bytes.size() - 24;
  SUBCASE("larger than the data: truncated") {
    put_u64(bytes, kBodySizeOffset, body + 1);
    CHECK(decode_error(bytes) == ErrorCode::truncated);
    put_u64(bytes, kBodySizeOffset, UINT64_MAX);
    CHECK(decode_error(bytes) == ErrorCode::truncated);
  }
  SUBCASE("smaller than the data: inconsistent") {
    put_u64(bytes, kBodySizeOffset, body - 1);
    std::string message;
    CHECK(decode_error(bytes, &message) == ErrorCode::inconsistent);
    CHECK(message.rfind("inconsistent snapshot: ", 0) == 0);
  }
  SUBCASE("trailing garbage after a correct body: inconsistent") {
    bytes.push_back(std::byte{0});
    CHECK(decode_error(bytes) == ErrorCode::inconsistent);
  }
}

TEST_CASE("an event count that disagrees with the event columns is rejected") {
  // Given a file whose block's event count (after dropped_events, the event
  // section header, the block size and the EventColumns class version,
  // docs/FORMAT.md) says 5 where there are 3
  Snapshot original;
  original.dropped_events = 0x1122'3344'5566'7788ULL;
  original.events = {Event{}, Event{}, Event{}};
  std::vector<std::byte> bytes = encode(original);
  const std::vector<std::byte> marker = {std::byte{0x88}, std::byte{0x77}, std::byte{0x66}, std::byte{0x55},
                                         std::byte{0x44}, std::byte{0x33}, std::byte{0x22}, std::byte{0x11}};
  const auto found = std::search(bytes.begin(), bytes.end(), marker.begin(), marker.end());
  REQUIRE(found != bytes.end());
  const std::size_t count_offset = static_cast<std::size_t>(found - bytes.begin()) + 8 + 12 + 8 + 4;
  REQUIRE(bytes[count_offset] == std::byte{3});
  bytes[count_offset] = std::byte{5};
  // When decoded, then it is inconsistent, and the message says why
  std::string message;
  CHECK(decode_error(bytes, &message) == ErrorCode::inconsistent);
  CHECK(message == "inconsistent snapshot: 5 events declared but the flags column holds 3");
}

TEST_CASE("a huge container length is refused before anything is allocated") {
  // Given a file whose first string (header.writer_version, at offset 40 after
  // the framing, the head size and two class versions) claims 2^62 bytes
  Snapshot original;
  std::vector<std::byte> bytes = encode(original);
  REQUIRE(bytes[40] == std::byte{0});
  const std::vector<std::byte> huge = {std::byte{0x80}, std::byte{0x80}, std::byte{0x80}, std::byte{0x80},
                                       std::byte{0x80}, std::byte{0x80}, std::byte{0x80}, std::byte{0x80},
                                       std::byte{0x40}};
  std::uint64_t head_size = 0;
  for (std::size_t i = 0; i < 8; ++i) head_size |= std::to_integer<std::uint64_t>(bytes[24 + i]) << (8 * i);
  bytes.erase(bytes.begin() + 40);
  bytes.insert(bytes.begin() + 40, huge.begin(), huge.end());
  put_u64(bytes, 24, head_size + huge.size() - 1);
  put_u64(bytes, kBodySizeOffset, bytes.size() - 24);
  // When decoded, then it is rejected as inconsistent at once
  std::string message;
  CHECK(decode_error(bytes, &message) == ErrorCode::inconsistent);
  CHECK(message.find("exceeds") != std::string::npos);
}

TEST_CASE("references past their tables are rejected by the writer and the reader") {
  Snapshot bad = make_rich_snapshot();
  SUBCASE("an event's stack") { bad.events[2].stack = StackId{99}; }
  SUBCASE("an event's thread") { bad.events[2].thread = 3; }
  SUBCASE("an event's kind") { bad.events[2].kind = static_cast<EventKind>(kEventKindCount); }
  SUBCASE("an annotation's name") {
    bad.events.back().kind = EventKind::annotation_begin;
    bad.events.back().aux = 6;
  }
  SUBCASE("a block's stack") { bad.segments[0].blocks[1].stack = StackId{4}; }
  SUBCASE("a block's state") { bad.segments[0].blocks[1].state = static_cast<BlockState>(4); }
  SUBCASE("a segment's stack") { bad.segments[1].stack = StackId{1000}; }
  SUBCASE("a stack's frame") { bad.stacks[2].frames.push_back(FrameId{4}); }
  SUBCASE("a frame's string") { bad.frames[1].file = StringId{6}; }

  // When the writer sees it, then it refuses
  try {
    (void)encode(bad);
    FAIL("encode accepted a bad reference");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::inconsistent);
    CHECK(std::string(error.what()).rfind("inconsistent snapshot: ", 0) == 0);
  }
  // And when a file holds it anyway, then the reader refuses
  CHECK(decode_error(detail::encode_unvalidated(bad)) == ErrorCode::inconsistent);
}

namespace {

// The writer refuses `bad` with a message holding `expected`, and a file
// that holds it anyway is refused by the reader with the same words.
void check_refused_by_writer_and_reader(const Snapshot& bad, const std::string& expected) {
  try {
    (void)encode(bad);
    FAIL("encode accepted what it should refuse: " << expected);
  } catch (const SnapshotError& error) {
    CHECK_MESSAGE(std::string(error.what()).find(expected) != std::string::npos, std::string(error.what()));
  }
  std::string message;
  CHECK(decode_error(detail::encode_unvalidated(bad), &message) == ErrorCode::inconsistent);
  CHECK_MESSAGE(message.find(expected) != std::string::npos, message);
}

}  // namespace

TEST_CASE("an aux figure on a kind that has none is refused by the writer and the reader, naming the event") {
  // Given a snapshot with an aux figure on a segment_release, segment_unmap,
  // empty_cache or snapshot event, which no report reads and PyTorch's
  // trace cannot hold (convert lost it)
  for (const EventKind kind :
       {EventKind::segment_release, EventKind::segment_unmap, EventKind::empty_cache, EventKind::snapshot}) {
    CAPTURE(to_string(kind));
    Snapshot bad = make_rich_snapshot();
    const auto event = std::find_if(bad.events.begin(), bad.events.end(), [&](const Event& e) { return e.kind == kind; });
    REQUIRE(event != bad.events.end());
    event->aux = 1923072;
    const std::string expected = "event " + std::to_string(event - bad.events.begin()) + " (" + to_string(kind) +
                                 ") has an aux figure of 1923072, which its kind does not have";
    // Then the writer refuses it, and the reader a file that holds it, naming the event
    check_refused_by_writer_and_reader(bad, expected);
  }
}

namespace {
// make_rich_snapshot with a category event after each alloc, one of each code.
Snapshot with_category_events() {
  Snapshot s = make_rich_snapshot();
  std::vector<Event> events;
  std::uint64_t code = 0;
  for (const Event& e : s.events) {
    events.push_back(e);
    if (e.kind != EventKind::alloc) continue;
    Event tag = e;
    tag.kind = EventKind::category;
    tag.size = 0;
    tag.stack = StackId{};
    tag.aux = code++ % cachealloc::events::kAllocationCategoryCount;
    events.push_back(tag);
    tag.aux = cachealloc::events::kAllocationCategoryCount - 1;
    events.push_back(tag);
  }
  s.events = std::move(events);
  return s;
}
}  // namespace

TEST_CASE("category events survive every encoding the writer has") {
  // Given a snapshot whose allocations are tagged with categories
  const Snapshot tagged = with_category_events();
  REQUIRE(std::count_if(tagged.events.begin(), tagged.events.end(),
                        [](const Event& e) { return e.kind == EventKind::category; }) == 4);
  // When it is written as version 6, as version 5 (encoding 2) and streamed
  // Then it reads back as it was
  CHECK(decode(encode(tagged)) == tagged);
  Snapshot as_version5 = decode(detail::encode_as_version(tagged, 5));
  as_version5.header.format_version = kWholeFormatVersion;
  CHECK(as_version5.events == tagged.events);
}

TEST_CASE("a category event with a code past the last category is refused, naming the event") {
  // Given a category event whose code names no category
  Snapshot bad = with_category_events();
  const auto event = std::find_if(bad.events.begin(), bad.events.end(),
                                  [](const Event& e) { return e.kind == EventKind::category; });
  event->aux = 8;
  const std::string expected = "event " + std::to_string(event - bad.events.begin()) +
                               " (category) has category code 8, past the last (7, other)";
  // Then the writer refuses it, and the reader a file that holds it, naming the event
  check_refused_by_writer_and_reader(bad, expected);
}

TEST_CASE("a segment_alloc with flag bits beyond large pool and expandable is refused, naming the event") {
  // Given a segment_alloc whose flags hold other bits (a fuzz_convert finding:
  // no report reads them and a pickle brings back only the two flags)
  Snapshot bad = make_rich_snapshot();
  const auto event = std::find_if(bad.events.begin(), bad.events.end(),
                                  [](const Event& e) { return e.kind == EventKind::segment_alloc; });
  REQUIRE(event != bad.events.end());
  event->aux |= 886368;
  const std::string expected = "event " + std::to_string(event - bad.events.begin()) + " (segment_alloc) has flags " +
                               std::to_string(event->aux) + ", bits other than large pool (1) and expandable (2)";
  // Then the writer refuses it, and the reader a file that holds it, naming the event
  check_refused_by_writer_and_reader(bad, expected);
}

TEST_CASE("a negative device index is refused by the writer and the reader, naming where it is") {
  // Given a snapshot with device index -2147483648 on an event, a segment,
  // a ring start or a device (a fuzz_convert finding: a pickle cannot hold
  // it, and the analyzer's options take -1 for "every device")
  constexpr std::int32_t kNegative = std::numeric_limits<std::int32_t>::min();
  SUBCASE("an event") {
    for (const EventKind kind : {EventKind::alloc, EventKind::segment_alloc, EventKind::annotation_begin}) {
      CAPTURE(to_string(kind));
      Snapshot bad = make_rich_snapshot();
      const auto event = std::find_if(bad.events.begin(), bad.events.end(), [&](const Event& e) { return e.kind == kind; });
      REQUIRE(event != bad.events.end());
      event->device = kNegative;
      // Then the writer refuses it, and the reader a file that holds it
      check_refused_by_writer_and_reader(bad, "event " + std::to_string(event - bad.events.begin()) +
                                                  " is on device -2147483648; device indices start at 0");
    }
  }
  SUBCASE("a segment") {
    Snapshot bad = make_rich_snapshot();
    REQUIRE(bad.segments.size() >= 2);
    bad.segments[1].device = kNegative;
    check_refused_by_writer_and_reader(bad, "segment 1 is on device -2147483648; device indices start at 0");
  }
  SUBCASE("a ring start") {
    Snapshot bad = make_rich_snapshot();
    REQUIRE(!bad.ring_start.empty());
    bad.ring_start[0].device = -1;
    check_refused_by_writer_and_reader(bad, "ring start 0 is for device -1; device indices start at 0");
  }
  SUBCASE("a device") {
    Snapshot bad = make_rich_snapshot();
    REQUIRE(!bad.devices.empty());
    bad.devices[0].index = -3;
    check_refused_by_writer_and_reader(bad, "device -3 has a negative index; device indices start at 0");
  }
}

TEST_CASE("an unmapped block in a segment that is not expandable is refused by the writer and the reader") {
  // Given a segment that is not expandable whose last block is unmapped (a
  // fuzz_convert finding: the pickle writer keeps only an expandable
  // segment's mapped runs, so the segment came back shorter)
  Snapshot bad = make_rich_snapshot();
  REQUIRE(!bad.segments[0].expandable);
  bad.segments[0].blocks.back().state = BlockState::unmapped;
  check_refused_by_writer_and_reader(bad, "block 2 of segment 0 is unmapped, but its segment is not expandable");
}

TEST_CASE("an alloc or free whose block is smaller than its request is refused, naming the event") {
  // Given a free_requested of a 0-byte block that requests 1 byte (a
  // fuzz_convert finding: a pickle, which holds only the request, brings
  // back a block of 512 bytes)
  for (const EventKind kind : {EventKind::alloc, EventKind::free_requested, EventKind::free_completed}) {
    CAPTURE(to_string(kind));
    Snapshot bad = make_rich_snapshot();
    const auto event = std::find_if(bad.events.begin(), bad.events.end(), [&](const Event& e) { return e.kind == kind; });
    REQUIRE(event != bad.events.end());
    event->aux = event->size + 1;
    const std::string expected = "event " + std::to_string(event - bad.events.begin()) + " (" + to_string(kind) +
                                 ") holds " + std::to_string(event->size) + " bytes, fewer than the " +
                                 std::to_string(event->aux) + " it requests";
    // Then the writer refuses it, and the reader a file that holds it, naming the event
    check_refused_by_writer_and_reader(bad, expected);
  }
}

TEST_CASE("a block in use that requests more than it holds is refused, naming the block") {
  // Given a final layout whose active block requests 2^63-1 bytes (a
  // campaign finding: a pickle's requested_size edited; the replay's start
  // state then held an impossible requested total)
  Snapshot bad = make_rich_snapshot();
  Block* block = nullptr;
  std::size_t s = 0, b = 0;
  for (std::size_t i = 0; i < bad.segments.size() && block == nullptr; ++i) {
    for (std::size_t k = 0; k < bad.segments[i].blocks.size(); ++k) {
      if (bad.segments[i].blocks[k].state == BlockState::inactive) continue;
      block = &bad.segments[i].blocks[k], s = i, b = k;
      break;
    }
  }
  REQUIRE(block != nullptr);
  block->requested = (std::uint64_t{1} << 63) - 1;
  const std::string expected = "block " + std::to_string(b) + " of segment " + std::to_string(s) + " requests " +
                               std::to_string(block->requested) + " bytes, more than its " + std::to_string(block->size);
  // Then the writer refuses it, and the reader a file that holds it, naming the block
  check_refused_by_writer_and_reader(bad, expected);
}

TEST_CASE("random corruption is rejected with a SnapshotError or decodes, never crashes") {
  // Given a valid file, flip bytes at random
  const std::vector<std::byte> original = encode(make_rich_snapshot());
  std::mt19937_64 rng(99);
  for (int round = 0; round < 20000; ++round) {
    std::vector<std::byte> bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Keep the framing mostly intact so the body gets exercised.
      const std::size_t at = 24 + rng() % (bytes.size() - 24);
      bytes[at] = static_cast<std::byte>(rng());
    }
    // When decoded, then the only failure is a SnapshotError
    try {
      (void)decode(bytes);
    } catch (const SnapshotError&) {
    }
  }
}

TEST_CASE("random corruption of the event columns is rejected with a SnapshotError or decodes, never crashes") {
  // Given a recorder-shaped trace, whose columns use every prediction of the
  // event encoding, flip bytes among the events (the end of the file)
  const std::vector<std::byte> original = encode(make_realistic_trace(500, 5, TraceConventions{false, true}));
  const std::size_t events_from = original.size() - 2000;
  std::mt19937_64 rng(17);
  for (int round = 0; round < 20000; ++round) {
    std::vector<std::byte> bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[events_from + rng() % 2000] = static_cast<std::byte>(rng());
    // When decoded, then the only failure is a SnapshotError
    try {
      (void)decode(bytes);
    } catch (const SnapshotError&) {
    }
  }
}

namespace {

// Decodes `bytes` with the varint merge set as `pext` says: the snapshot, or
// the error's message.
// `validated`: false for figures past the readers' bounds (invariants.hpp).
std::variant<Snapshot, std::string> decode_with_merge(std::span<const std::byte> bytes, bool pext,
                                                      bool validated = true) {
  struct Restore {
    bool was = detail::varint_pext();
    ~Restore() { detail::set_varint_pext(was); }
  } restore;
  detail::set_varint_pext(pext);
  try {
    return validated ? decode(bytes) : detail::decode_unvalidated(bytes);
  } catch (const SnapshotError& error) {
    return std::string(error.what());
  }
}

}  // namespace

TEST_CASE("the PEXT varint merge decodes exactly what the portable merge does") {
  const bool pext = detail::set_varint_pext(true);
  detail::set_varint_pext(pext);
  if (!pext) MESSAGE("this CPU has no fast PEXT: only the portable merge runs here");
  // Given events whose varints take every length, 1 to 10 bytes, at each
  // length's boundaries (2^7k - 1 and 2^7k), in the time, address, size and
  // aux columns, first far from a column's end and then within its last
  // 10 bytes, where the bounds-checked path reads
  Snapshot original;
  original.header.format_version = kWholeFormatVersion;
  original.stacks.resize(3);
  std::uint64_t time = 0;
  for (unsigned bits = 0; bits < 64; ++bits) {
    for (const std::uint64_t value : {(std::uint64_t{1} << bits) - 1, std::uint64_t{1} << bits}) {
      time += value >> 2;
      original.events.push_back(Event{EventKind::alloc, 0, 0, StackId{bits % 3}, time, 7, value, value, value / 3});
      original.events.push_back(Event{EventKind::segment_alloc, 0, 0, StackId{}, time, 7, ~value, value | 1, 0});
    }
  }
  const std::vector<std::byte> bytes = detail::encode_unvalidated(original);
  // When decoded with either merge, then both give the snapshot back
  CHECK(std::get<Snapshot>(decode_with_merge(bytes, false, false)) == original);
  CHECK(std::get<Snapshot>(decode_with_merge(bytes, pext, false)) == original);

  // And given a recorder-shaped trace with bytes flipped among its events,
  // then both merges give the same snapshot or the same error
  const std::vector<std::byte> trace = encode(make_realistic_trace(2000, 11, TraceConventions{false, true}));
  CHECK(std::get<Snapshot>(decode_with_merge(trace, pext)) == std::get<Snapshot>(decode_with_merge(trace, false)));
  std::mt19937_64 rng(23);
  int agreed_errors = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::byte> bytes_flipped = trace;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      bytes_flipped[trace.size() - 6000 + rng() % 6000] = static_cast<std::byte>(rng() | 0x80);
    const auto portable = decode_with_merge(bytes_flipped, false);
    const auto fast = decode_with_merge(bytes_flipped, pext);
    REQUIRE(portable == fast);
    agreed_errors += std::holds_alternative<std::string>(portable) ? 1 : 0;
  }
  // (the flips reach the varints: some files fail, the same way in both)
  CHECK(agreed_errors > 0);
}

// --- compatibility -------------------------------------------------------------

namespace {

// The snapshot behind kVersion1File. Never edit either: they pin what a
// version 1 file looks like, for as long as readers must read version 1.
Snapshot make_version1_golden_snapshot() {
  Snapshot s;
  s.header.format_version = 1;
  s.header.writer_version = "0.1.0";
  s.header.source = "cachealloc";
  s.header.dump_time_unix_ns = 1700000000000000000ULL;
  s.header.program = "train";
  s.header.arguments = {"-n", "2"};
  s.header.pid = 321;
  s.header.host = "h";
  s.devices = {{0, "simulated", 1ULL << 30, 1ULL << 29, 1ULL << 30, {}, {}, {}}};
  s.settings = {{"max_split_size_mb", "64"}};
  s.stats = {{"num_ooms", 0}};
  s.strings = {"", "f", "a.py"};
  s.frames = {Frame{}, Frame{0x1000, StringId{1}, StringId{2}, 3, StringId{}}};
  s.stacks = {Stack{}, Stack{{FrameId{1}}}};
  s.threads = {777};
  const std::uint64_t base = 0x7f0000000000ULL;
  s.segments = {Segment{0, 0, base, 2 << 20, false, false, StackId{1},
                        {Block{base, 1024, 1000, BlockState::active_allocated, StackId{1}},
                         Block{base + 1024, (2 << 20) - 1024, 0, BlockState::inactive, StackId{}}}}};
  s.dropped_events = 2;
  s.events = {
      Event{EventKind::segment_alloc, 0, 0, StackId{1}, 1000, 0, base, 2 << 20, 0},
      Event{EventKind::split, 0, 0, StackId{1}, 1100, 0, base, 1024, (2 << 20) - 1024},
      Event{EventKind::alloc, 0, 0, StackId{1}, 1250, 0, base, 1024, 1000},
      Event{EventKind::alloc, 0, 0, StackId{1}, 1400, 0, base + 1024, 1024, 1000},
      Event{EventKind::free_requested, 0, 0, StackId{1}, 1500, 0, base + 1024, 1024, 1000},
      Event{EventKind::free_completed, 0, 0, StackId{1}, 1550, 0, base + 1024, 1024, 1000},
      Event{EventKind::merge, 0, 0, StackId{1}, 1600, 0, base + 1024, (2 << 20) - 1024, (2 << 20) - 2048},
      Event{EventKind::annotation_begin, 0, 0, StackId{}, 1700, 0, 0, 0, 1},
  };
  return s;
}

// Written by cachealloc 0.1.0, format version 1.
std::vector<std::byte> version1_file() {
  const std::vector<unsigned char> raw = {
    0x89, 0x43, 0x41, 0x53, 0x4e, 0x41, 0x50, 0x0a, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x9a, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x05, 0x30, 0x2e, 0x31, 0x2e, 0x30, 0x0a, 0x63, 0x61, 0x63, 0x68, 0x65, 0x61, 0x6c, 0x6c, 0x6f,
    0x63, 0x00, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97, 0x17, 0x05, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x02,
    0x02, 0x2d, 0x6e, 0x01, 0x32, 0x41, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x68, 0x01,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x73, 0x69, 0x6d, 0x75, 0x6c, 0x61, 0x74,
    0x65, 0x64, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x6d, 0x61, 0x78, 0x5f,
    0x73, 0x70, 0x6c, 0x69, 0x74, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x5f, 0x6d, 0x62, 0x02, 0x36, 0x34,
    0x01, 0x08, 0x6e, 0x75, 0x6d, 0x5f, 0x6f, 0x6f, 0x6d, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x03, 0x00, 0x01, 0x66, 0x04, 0x61, 0x2e, 0x70, 0x79, 0x02, 0x01, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x01, 0x09, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f, 0x00,
    0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x45, 0x03, 0x00, 0x40, 0x81,
    0x82, 0x04, 0x4b, 0x00, 0x0b, 0xe8, 0x07, 0x64, 0x96, 0x01, 0x96, 0x01, 0x64, 0x32, 0x32, 0x64,
    0x0d, 0x80, 0x80, 0x80, 0x80, 0xf0, 0x0f, 0x04, 0x83, 0x80, 0x80, 0x80, 0xf0, 0x0f, 0x06, 0x0a,
    0x69, 0x51, 0x01, 0xa9, 0x80, 0x01, 0x01, 0x05, 0x80, 0x20, 0x02, 0xfe, 0x1f, 0x04, 0xfe, 0x1f,
    0x18, 0x01
  };
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return bytes;
}

// The snapshot behind version2_file(). Never edit either, as for version 1.
// Shaped like the recorder's output, so the file holds each kind of
// prediction of encoding 2: shared times, stackless frees repeating their
// block, a split's remainder and a merge's size taken from the cached blocks,
// a change of thread.
Snapshot make_version2_golden_snapshot() {
  Snapshot s = make_version1_golden_snapshot();
  s.header.format_version = 2;
  s.header.writer_version = "0.2.0";
  s.stacks = {Stack{}, Stack{{FrameId{1}}}, Stack{{FrameId{1}, FrameId{1}}}};
  s.threads = {777, 778};
  const std::uint64_t base = 0x7f0000000000ULL;
  const std::uint64_t segment = 2 << 20;
  s.events = {
      Event{EventKind::segment_alloc, 0, 0, StackId{1}, 1000, 0, base, segment, 0},
      Event{EventKind::split, 0, 0, StackId{}, 1000, 0, base, 1024, segment - 1024},
      Event{EventKind::alloc, 0, 0, StackId{1}, 1000, 0, base, 1024, 1000},
      Event{EventKind::split, 0, 0, StackId{}, 1250, 0, base + 1024, 1024, segment - 2048},
      Event{EventKind::alloc, 0, 0, StackId{2}, 1250, 0, base + 1024, 1024, 1000},
      Event{EventKind::free_requested, 0, 0, StackId{}, 1400, 0, base, 1024, 1000},
      Event{EventKind::free_completed, 0, 0, StackId{}, 1400, 0, base, 1024, 1000},
      Event{EventKind::free_requested, 0, 1, StackId{}, 1500, 0, base + 1024, 1024, 1000},
      Event{EventKind::free_completed, 0, 1, StackId{}, 1500, 0, base + 1024, 1024, 1000},
      Event{EventKind::merge, 0, 1, StackId{}, 1500, 0, base, 2048, 1024},
      Event{EventKind::merge, 0, 1, StackId{}, 1500, 0, base, segment, segment - 2048},
      Event{EventKind::alloc, 0, 1, StackId{1}, 1550, 0, base, segment, segment - 100},
      Event{EventKind::annotation_begin, 0, 0, StackId{}, 1700, 0, 0, 0, 1},
  };
  return s;
}

// The snapshot behind version3_file(). Never edit either, as for version 1.
Snapshot make_version3_golden_snapshot() {
  Snapshot s = make_version2_golden_snapshot();
  s.header.format_version = 3;
  s.header.writer_version = "0.3.0";
  return s;
}

// The snapshot behind version4_file(). Never edit either, as for version 1.
// The version 3 snapshot without its first three events (five dropped in
// all), so that the ring starts with a block alive whose alloc was lost;
// ring_start is what the writer derives for it.
Snapshot make_version4_golden_snapshot() {
  Snapshot s = make_version3_golden_snapshot();
  s.header.format_version = 4;
  s.header.writer_version = "0.4.0";
  s.events.erase(s.events.begin(), s.events.begin() + 3);
  s.dropped_events = 5;
  const std::uint64_t base = 0x7f0000000000ULL;
  const std::uint64_t segment = 2 << 20;
  s.ring_start = {RingStart{0,
                            {Segment{0, 0, base, segment, false, false, StackId{1},
                                     {Block{base, 1024, 1000, BlockState::active_allocated, StackId{}},
                                      Block{base + 1024, segment - 1024, 0, BlockState::inactive, StackId{}}}}},
                            1, 0}};
  return s;
}

// The snapshot behind version5_file(). Never edit either, as for version 1.
// The version 4 snapshot with NVML's reading at the dump on its device.
Snapshot make_version5_golden_snapshot() {
  Snapshot s = make_version4_golden_snapshot();
  s.header.format_version = 5;
  s.header.writer_version = "0.5.0";
  DeviceInfo& device = s.devices.at(0);
  device.usage_source = UsageSource::nvml;
  device.usage_note = "driver 580.95.05";
  device.usage = {DeviceUsage{kUsageAtDump, 2000, true, 600ULL << 20, 900ULL << 20, 0, 1ULL << 30, 1, 300ULL << 20}};
  return s;
}

// The snapshot behind version6_file(). Never edit either, as for version 1.
// The version 5 snapshot: only the event encoding changed (encoding 3).
Snapshot make_version6_golden_snapshot() {
  Snapshot s = make_version5_golden_snapshot();
  s.header.format_version = 6;
  s.header.writer_version = "0.6.0";
  return s;
}

// Written by cachealloc 0.2.0, format version 2.
std::vector<std::byte> version2_file() {
  const std::vector<unsigned char> raw = {
    0x89, 0x43, 0x41, 0x53, 0x4e, 0x41, 0x50, 0x0a, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xb7, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x05, 0x30, 0x2e, 0x32, 0x2e, 0x30, 0x0a, 0x63, 0x61, 0x63, 0x68, 0x65, 0x61, 0x6c, 0x6c, 0x6f,
    0x63, 0x00, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97, 0x17, 0x05, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x02,
    0x02, 0x2d, 0x6e, 0x01, 0x32, 0x41, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x68, 0x01,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x73, 0x69, 0x6d, 0x75, 0x6c, 0x61, 0x74,
    0x65, 0x64, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x6d, 0x61, 0x78, 0x5f,
    0x73, 0x70, 0x6c, 0x69, 0x74, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x5f, 0x6d, 0x62, 0x02, 0x36, 0x34,
    0x01, 0x08, 0x6e, 0x75, 0x6d, 0x5f, 0x6f, 0x6f, 0x6d, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x03, 0x00, 0x01, 0x66, 0x04, 0x61, 0x2e, 0x70, 0x79, 0x02, 0x01, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x09, 0x03, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f,
    0x00, 0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x0d, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0d, 0x45, 0x13, 0x10, 0xc3,
    0x10, 0xc1, 0x92, 0xcf, 0x92, 0xd4, 0x94, 0x00, 0x4f, 0x04, 0x11, 0x01, 0x1b, 0x00, 0x0a, 0xe8,
    0x07, 0xfa, 0x01, 0x96, 0x01, 0x64, 0x32, 0x96, 0x01, 0x10, 0x80, 0x80, 0x80, 0x80, 0xf0, 0x0f,
    0x04, 0x03, 0x04, 0x03, 0xff, 0xff, 0xff, 0xff, 0xef, 0x0f, 0x06, 0x0b, 0x08, 0x53, 0x53, 0x53,
    0x80, 0x04, 0x01, 0x01, 0x02, 0x01, 0x03, 0x80, 0x20, 0x02, 0x04, 0x18, 0x18, 0x64, 0x01
  };
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return bytes;
}

// Written by cachealloc 0.3.0, format version 3: one block of events.
std::vector<std::byte> version3_file() {
  const std::vector<unsigned char> raw = {
    0x89, 0x43, 0x41, 0x53, 0x4e, 0x41, 0x50, 0x0a, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xd3, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x67, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x30, 0x2e, 0x33, 0x2e, 0x30, 0x0a, 0x63,
    0x61, 0x63, 0x68, 0x65, 0x61, 0x6c, 0x6c, 0x6f, 0x63, 0x00, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97,
    0x17, 0x05, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x02, 0x02, 0x2d, 0x6e, 0x01, 0x32, 0x41, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x68, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x09, 0x73, 0x69, 0x6d, 0x75, 0x6c, 0x61, 0x74, 0x65, 0x64, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x11, 0x6d, 0x61, 0x78, 0x5f, 0x73, 0x70, 0x6c, 0x69, 0x74, 0x5f, 0x73, 0x69,
    0x7a, 0x65, 0x5f, 0x6d, 0x62, 0x02, 0x36, 0x34, 0x01, 0x08, 0x6e, 0x75, 0x6d, 0x5f, 0x6f, 0x6f,
    0x6d, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x01, 0x66, 0x04, 0x61,
    0x2e, 0x70, 0x79, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x09, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x03, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00,
    0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0d, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x01, 0x00, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x0d,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0d, 0x45, 0x13, 0x10, 0xc3, 0x10, 0xc1, 0x92, 0xcf,
    0x92, 0xd4, 0x94, 0x00, 0x4f, 0x04, 0x11, 0x01, 0x1b, 0x00, 0x0a, 0xe8, 0x07, 0xfa, 0x01, 0x96,
    0x01, 0x64, 0x32, 0x96, 0x01, 0x10, 0x80, 0x80, 0x80, 0x80, 0xf0, 0x0f, 0x04, 0x03, 0x04, 0x03,
    0xff, 0xff, 0xff, 0xff, 0xef, 0x0f, 0x06, 0x0b, 0x08, 0x53, 0x53, 0x53, 0x80, 0x04, 0x01, 0x01,
    0x02, 0x01, 0x03, 0x80, 0x20, 0x02, 0x04, 0x18, 0x18, 0x64, 0x01
  };
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return bytes;
}

// Written by cachealloc 0.5.0, format version 5: NVML's reading at the dump.
std::vector<std::byte> version5_file() {
  const std::vector<unsigned char> raw = {
    0x89, 0x43, 0x41, 0x53, 0x4e, 0x41, 0x50, 0x0a, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x97, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x32, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x30, 0x2e, 0x35, 0x2e, 0x30, 0x0a, 0x63,
    0x61, 0x63, 0x68, 0x65, 0x61, 0x6c, 0x6c, 0x6f, 0x63, 0x00, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97,
    0x17, 0x05, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x02, 0x02, 0x2d, 0x6e, 0x01, 0x32, 0x41, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x68, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x09, 0x73, 0x69, 0x6d, 0x75, 0x6c, 0x61, 0x74, 0x65, 0x64, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x10, 0x64, 0x72, 0x69, 0x76, 0x65, 0x72, 0x20, 0x35, 0x38, 0x30, 0x2e, 0x39,
    0x35, 0x2e, 0x30, 0x35, 0x01, 0x01, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xd0, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x80, 0x25, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x40, 0x38, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xc0, 0x12, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x6d, 0x61, 0x78, 0x5f, 0x73, 0x70, 0x6c, 0x69,
    0x74, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x5f, 0x6d, 0x62, 0x02, 0x36, 0x34, 0x01, 0x08, 0x6e, 0x75,
    0x6d, 0x5f, 0x6f, 0x6f, 0x6d, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00,
    0x01, 0x66, 0x04, 0x61, 0x2e, 0x70, 0x79, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x09, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x0a, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f,
    0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00,
    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0xfc,
    0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00,
    0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x49, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x0a, 0x43, 0x10, 0x41, 0x12, 0xcf, 0x92, 0xd4, 0x94, 0x00, 0x4f, 0x04, 0x11, 0x01,
    0x1b, 0x00, 0x08, 0xe2, 0x09, 0x96, 0x01, 0x64, 0x32, 0x96, 0x01, 0x0f, 0x84, 0x80, 0x80, 0x80,
    0xf0, 0x0f, 0x03, 0x04, 0x03, 0xff, 0xff, 0xff, 0xff, 0xef, 0x0f, 0x06, 0x68, 0x53, 0x50, 0x50,
    0x53, 0x80, 0x02, 0x02, 0x01, 0x01, 0x02, 0x07, 0xfc, 0x1f, 0x18, 0x18, 0x18, 0x64, 0x01
  };
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return bytes;
}

// Written by cachealloc 0.6.0, format version 6: event encoding 3.
std::vector<std::byte> version6_file() {
  const std::vector<unsigned char> raw = {
    0x89, 0x43, 0x41, 0x53, 0x4e, 0x41, 0x50, 0x0a, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x9f, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x32, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x30, 0x2e, 0x36, 0x2e, 0x30, 0x0a, 0x63,
    0x61, 0x63, 0x68, 0x65, 0x61, 0x6c, 0x6c, 0x6f, 0x63, 0x00, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97,
    0x17, 0x05, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x02, 0x02, 0x2d, 0x6e, 0x01, 0x32, 0x41, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x68, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x09, 0x73, 0x69, 0x6d, 0x75, 0x6c, 0x61, 0x74, 0x65, 0x64, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x10, 0x64, 0x72, 0x69, 0x76, 0x65, 0x72, 0x20, 0x35, 0x38, 0x30, 0x2e, 0x39,
    0x35, 0x2e, 0x30, 0x35, 0x01, 0x01, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xd0, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x80, 0x25, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x40, 0x38, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xc0, 0x12, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x6d, 0x61, 0x78, 0x5f, 0x73, 0x70, 0x6c, 0x69,
    0x74, 0x5f, 0x73, 0x69, 0x7a, 0x65, 0x5f, 0x6d, 0x62, 0x02, 0x36, 0x34, 0x01, 0x08, 0x6e, 0x75,
    0x6d, 0x5f, 0x6f, 0x6f, 0x6d, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00,
    0x01, 0x66, 0x04, 0x61, 0x2e, 0x70, 0x79, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x09, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x0a, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f,
    0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00,
    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0xfc,
    0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00,
    0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
    0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x51, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x0a, 0x03, 0x10, 0x01, 0x12, 0x4f, 0x52, 0x14, 0x14, 0x40, 0x0f, 0x04, 0x11, 0x01,
    0x1b, 0x00, 0x08, 0xe2, 0x09, 0x96, 0x01, 0x64, 0x32, 0x96, 0x01, 0x0f, 0x84, 0x80, 0x80, 0x80,
    0xf0, 0x0f, 0x03, 0x04, 0x03, 0xff, 0xff, 0xff, 0xff, 0xef, 0x0f, 0x07, 0xe2, 0x8c, 0x4a, 0x40,
    0xa2, 0xa0, 0xea, 0x02, 0x02, 0x01, 0x05, 0x02, 0x04, 0x80, 0x20, 0x00, 0x0a, 0x80, 0xf0, 0x7f,
    0x18, 0x80, 0x08, 0x80, 0x10, 0x64, 0x01
  };
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return bytes;
}

// Written by cachealloc 0.4.0, format version 4: a ring start and one block of events.
std::vector<std::byte> version4_file() {
  const std::vector<unsigned char> raw = {
    0x89, 0x43, 0x41, 0x53, 0x4e, 0x41, 0x50, 0x0a, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x43, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xde, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x30, 0x2e, 0x34, 0x2e, 0x30, 0x0a, 0x63,
    0x61, 0x63, 0x68, 0x65, 0x61, 0x6c, 0x6c, 0x6f, 0x63, 0x00, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97,
    0x17, 0x05, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x02, 0x02, 0x2d, 0x6e, 0x01, 0x32, 0x41, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x68, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x09, 0x73, 0x69, 0x6d, 0x75, 0x6c, 0x61, 0x74, 0x65, 0x64, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x11, 0x6d, 0x61, 0x78, 0x5f, 0x73, 0x70, 0x6c, 0x69, 0x74, 0x5f, 0x73, 0x69,
    0x7a, 0x65, 0x5f, 0x6d, 0x62, 0x02, 0x36, 0x34, 0x01, 0x08, 0x6e, 0x75, 0x6d, 0x5f, 0x6f, 0x6f,
    0x6d, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x01, 0x66, 0x04, 0x61,
    0x2e, 0x70, 0x79, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x01, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x02, 0x09, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x03, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00,
    0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
    0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x00, 0x20,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe8, 0x03, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x7f, 0x00,
    0x00, 0x00, 0xfc, 0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x49, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x43,
    0x10, 0x41, 0x12, 0xcf, 0x92, 0xd4, 0x94, 0x00, 0x4f, 0x04, 0x11, 0x01, 0x1b, 0x00, 0x08, 0xe2,
    0x09, 0x96, 0x01, 0x64, 0x32, 0x96, 0x01, 0x0f, 0x84, 0x80, 0x80, 0x80, 0xf0, 0x0f, 0x03, 0x04,
    0x03, 0xff, 0xff, 0xff, 0xff, 0xef, 0x0f, 0x06, 0x68, 0x53, 0x50, 0x50, 0x53, 0x80, 0x02, 0x02,
    0x01, 0x01, 0x02, 0x07, 0xfc, 0x1f, 0x18, 0x18, 0x18, 0x64, 0x01
  };
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return bytes;
}

}  // namespace

TEST_CASE("a version 1 file still reads") {
  // Given a file written by format version 1
  // When today's reader decodes it, then it gets the snapshot that was written
  const Snapshot decoded = decode(version1_file());
  CHECK(decoded == make_version1_golden_snapshot());
  CHECK(decoded.header.format_version == 1);
}

TEST_CASE("a version 2 file still reads") {
  // Given a file written by format version 2
  // When today's reader decodes it, then it gets the snapshot that was written
  const Snapshot decoded = decode(version2_file());
  CHECK(decoded == make_version2_golden_snapshot());
  CHECK(decoded.header.format_version == 2);
}

TEST_CASE("a version 3 file still reads") {
  // Given a file written by format version 3
  // When today's reader decodes it, then it gets the snapshot that was written
  const Snapshot decoded = decode(version3_file());
  CHECK(decoded == make_version3_golden_snapshot());
  CHECK(decoded.header.format_version == 3);
}

TEST_CASE("a version 4 file still reads, ring start included") {
  // Given a file written by format version 4, whose ring overflowed
  // When today's reader decodes it, then it gets the snapshot that was
  // written, with the layout at the ring's start
  const Snapshot decoded = decode(version4_file());
  CHECK(decoded == make_version4_golden_snapshot());
  CHECK(decoded.header.format_version == 4);
  REQUIRE(decoded.ring_start.size() == 1);
  CHECK(decoded.ring_start[0].blocks_from_before_ring == 1);
}

TEST_CASE("a version 5 file still reads, its events in encoding 2") {
  // Given a file written by format version 5, the last with encoding 2
  // When today's reader decodes it, then it gets the snapshot that was written
  const Snapshot decoded = decode(version5_file());
  CHECK(decoded == make_version5_golden_snapshot());
  CHECK(decoded.header.format_version == 5);
}

TEST_CASE("a version 6 file reads back the snapshot it was written from") {
  const Snapshot decoded = decode(version6_file());
  CHECK(decoded == make_version6_golden_snapshot());
  CHECK(decoded.header.format_version == 6);
  // And its events are those of the version 5 file: only their encoding changed
  CHECK(decoded.events == decode(version5_file()).events);
}

TEST_CASE("every golden file in testdata/format_versions reads as the version its name says") {
  // Given the files kept in testdata (the fuzzers and the hostile-input tests
  // start from them), one per format version
  const std::vector<std::vector<std::byte>> embedded = {version1_file(), version2_file(), version3_file(),
                                                        version4_file(), version5_file(), version6_file()};
  REQUIRE(embedded.size() == kWholeFormatVersion);
  for (std::uint32_t version = 1; version <= kWholeFormatVersion; ++version) {
    CAPTURE(version);
    const fs::path path =
        fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "format_versions" / ("v" + std::to_string(version) + ".bin");
    // When read from disk, then it is the embedded golden file, and it
    // decodes to the same snapshot, of that version
    const Snapshot from_disk = read_snapshot(path);
    CHECK(from_disk == decode(embedded[version - 1]));
    CHECK(from_disk.header.format_version == version);
  }
}

namespace {

// The snapshot behind testdata/format_versions/v7.bin, a streamed recording:
// the version 6 snapshot's head (NVML's reading included) with the version
// 3 snapshot's events, which start at the start of the run (a stream never
// drops the run's start), and the final layout those events leave.
Snapshot make_version7_golden_snapshot() {
  Snapshot s = make_version6_golden_snapshot();
  s.header.format_version = kStreamFormatVersion;
  s.header.writer_version = "0.7.0";
  s.events = make_version3_golden_snapshot().events;
  s.dropped_events = 0;
  s.ring_start.clear();
  const std::uint64_t base = 0x7f0000000000ULL;
  const std::uint64_t segment = 2 << 20;
  s.segments = {Segment{0, 0, base, segment, false, false, StackId{1},
                        {Block{base, segment, segment - 100, BlockState::active_allocated, StackId{1}}}}};
  return s;
}

// Streams `s` as the recorder does: tables before the events that use them,
// in two tables chunks and three events chunks, then the trailer. So that a
// cut inside any events chunk leaves earlier ones to read.
void write_version7_file(const fs::path& path, const Snapshot& s) {
  StreamFileWriter writer(path, s);
  TableAppend first;
  first.first_string = 1;
  first.strings.assign(s.strings.begin() + 1, s.strings.end());
  first.first_frame = 1;
  first.frames.assign(s.frames.begin() + 1, s.frames.end());
  first.first_stack = 1;  // the tables start with entry 0, the empty one
  writer.append_tables(first);
  TableAppend second;
  second.first_string = s.strings.size();
  second.first_frame = s.frames.size();
  second.first_stack = 1;
  second.stacks.assign(s.stacks.begin() + 1, s.stacks.end());
  second.threads = s.threads;
  writer.append_tables(second);
  const std::span<const Event> events(s.events);
  writer.append_events(events.subspan(0, 5));
  writer.append_events(events.subspan(5, 4));
  writer.append_events(events.subspan(9));
  writer.finish(s);
}

const fs::path kVersion7Golden = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "format_versions" / "v7.bin";

}  // namespace

TEST_CASE("the version 7 golden stream is what the stream writer writes for its snapshot") {
  // Given the snapshot behind v7.bin, streamed again (CACHEALLOC_UPDATE_GOLDEN=1 rewrites the golden file)
  const char* update = std::getenv("CACHEALLOC_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") write_version7_file(kVersion7Golden, make_version7_golden_snapshot());
  const fs::path again = fs::temp_directory_path() / ("cachealloc_v7_" + std::to_string(getpid()) + ".bin");
  write_version7_file(again, make_version7_golden_snapshot());
  // When both are read, then they are the same snapshot (zstd's bytes may
  // differ between its versions; the content may not)
  const Snapshot written = read_snapshot(again);
  fs::remove(again);
  CHECK(read_snapshot(kVersion7Golden) == written);
}

TEST_CASE("a version 7 golden stream reads as the whole snapshot it was streamed from") {
  // Given the golden stream, and its snapshot written whole (version 6)
  const Snapshot expected = make_version7_golden_snapshot();
  const Snapshot whole = decode(encode(expected));
  REQUIRE(whole.header.format_version == kWholeFormatVersion);
  // When the stream is read from disk
  const Snapshot streamed = read_snapshot(kVersion7Golden);
  // Then it holds the same head, tables, events and final layout, complete, as version 7
  CHECK(streamed.header.format_version == kStreamFormatVersion);
  CHECK(streamed.settings.count(kStreamNoteSetting) == 0);
  CHECK(streamed.events == whole.events);
  CHECK(streamed.strings == whole.strings);
  CHECK(streamed.frames == whole.frames);
  CHECK(streamed.stacks == whole.stacks);
  CHECK(streamed.threads == whole.threads);
  CHECK(streamed.segments == whole.segments);
  CHECK(streamed.stats == whole.stats);
  CHECK(streamed.devices == whole.devices);
  CHECK(streamed.settings == whole.settings);
  CHECK(streamed.dropped_events == 0);
  CHECK(streamed == expected);
}

TEST_CASE("a version 7 golden stream cut inside its last events chunk reads the chunks before it, with the note") {
  // Given the golden stream without its trailer and half of its last events chunk
  std::ifstream in(kVersion7Golden, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 100);
  std::size_t offset = 24, last_events = 0, trailer = 0;
  while (offset + 32 <= bytes.size()) {
    std::uint32_t kind = 0;
    std::uint64_t stored = 0;
    std::memcpy(&kind, bytes.data() + offset, 4);
    std::memcpy(&stored, bytes.data() + offset + 8, 8);
    if (kind == 3) last_events = offset;
    if (kind == 4) trailer = offset;
    offset += 32 + stored;
  }
  REQUIRE(offset == bytes.size());
  REQUIRE(last_events > 0);
  REQUIRE(trailer > last_events);
  bytes.resize(last_events + (trailer - last_events) / 2);
  const std::span<const std::byte> cut(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  // When it is decoded
  const Snapshot s = decode(cut);
  // Then it holds the first two events chunks (9 events), a layout rebuilt
  // from them, unknown stats, and the note
  const Snapshot expected = make_version7_golden_snapshot();
  CHECK(s.events == std::vector<Event>(expected.events.begin(), expected.events.begin() + 9));
  CHECK(s.stats.empty());
  REQUIRE(s.settings.count(kStreamNoteSetting) == 1);
  CHECK(s.settings.at(kStreamNoteSetting).find("without its trailer") != std::string::npos);
  REQUIRE(s.segments.size() == 1);
  CHECK(s.segments[0].blocks.size() == 1);  // after the merges, one free block of the whole segment
}

namespace {

std::vector<std::byte> version7_file() {
  std::ifstream in(kVersion7Golden, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

struct Version7Chunk {
  std::size_t offset = 0;
  std::uint32_t kind = 0;
  std::uint64_t stored = 0;
};
// The golden stream's chunks: start, tables, tables, events x 3, trailer.
std::vector<Version7Chunk> version7_chunks(const std::vector<std::byte>& bytes) {
  std::vector<Version7Chunk> chunks;
  for (std::size_t offset = 24; offset + 32 <= bytes.size();) {
    Version7Chunk chunk{offset};
    std::memcpy(&chunk.kind, bytes.data() + offset, 4);
    std::memcpy(&chunk.stored, bytes.data() + offset + 8, 8);
    chunks.push_back(chunk);
    offset += 32 + chunk.stored;
  }
  REQUIRE(chunks.size() == 7);
  return chunks;
}

}  // namespace

TEST_CASE("a version 7 stream cut before its start chunk is complete is refused as truncated") {
  // Given the golden stream cut anywhere from the end of its framing to the end of its start chunk
  const std::vector<std::byte> whole = version7_file();
  const Version7Chunk start = version7_chunks(whole).at(0);
  for (std::size_t keep = 24; keep < start.offset + 32 + start.stored; ++keep) {
    CAPTURE(keep);
    const std::span<const std::byte> cut(whole.data(), keep);
    // When decoded, then it is refused: nothing usable was recorded
    std::string message;
    CHECK(decode_error(cut, &message) == ErrorCode::truncated);
    CHECK(message.find("before its start chunk is complete") != std::string::npos);
  }
}

TEST_CASE("a version 7 stream cut inside its first events chunk reads as no events, and its note says so") {
  // Given the golden stream cut halfway through its first events chunk
  std::vector<std::byte> bytes = version7_file();
  const Version7Chunk first_events = version7_chunks(bytes).at(3);
  bytes.resize(first_events.offset + 32 + first_events.stored / 2);
  // When decoded, then it holds no events, and the note says no chunk of them was complete
  const Snapshot s = decode(bytes);
  CHECK(s.events.empty());
  REQUIRE(s.settings.count(kStreamNoteSetting) == 1);
  CHECK(s.settings.at(kStreamNoteSetting) ==
        "the recording ended without its trailer (killed?): no chunk of events was complete (0 events); chunk 3 at "
        "offset " + std::to_string(first_events.offset) + " ends " + std::to_string(first_events.stored - first_events.stored / 2) +
        " bytes short");
}

TEST_CASE("a version 7 stream damaged before its last chunk is refused, even without its trailer") {
  // Given the golden stream with a byte of its first events chunk flipped,
  // cut inside its last events chunk
  std::vector<std::byte> bytes = version7_file();
  const std::vector<Version7Chunk> chunks = version7_chunks(bytes);
  const Version7Chunk first_events = chunks.at(3), last_events = chunks.at(5);
  bytes[first_events.offset + 32 + first_events.stored / 2] ^= std::byte{0x40};
  bytes.resize(last_events.offset + 32 + last_events.stored / 2);
  // When decoded, then the checksum failure is named, not hidden behind the cut
  std::string message;
  CHECK(decode_error(bytes, &message) == ErrorCode::inconsistent);
  CHECK(message == "inconsistent snapshot: chunk 3 at offset " + std::to_string(first_events.offset) +
                       " fails its checksum");
}

TEST_CASE("a version 7 stream whose last chunk fails its checksum reads the chunks before it, with the note") {
  // Given the golden stream ending with its last events chunk, damaged (the trailer never written)
  std::vector<std::byte> bytes = version7_file();
  const Version7Chunk last_events = version7_chunks(bytes).at(5);
  bytes.resize(last_events.offset + 32 + last_events.stored);
  bytes[last_events.offset + 32 + last_events.stored / 2] ^= std::byte{0x40};
  // When decoded, then the first two events chunks (9 events) read, and the note names the checksum
  const Snapshot s = decode(bytes);
  CHECK(s.events.size() == 9);
  REQUIRE(s.settings.count(kStreamNoteSetting) == 1);
  CHECK(s.settings.at(kStreamNoteSetting).find("chunk 5 at offset " + std::to_string(last_events.offset) +
                                               " fails its checksum") != std::string::npos);
}

TEST_CASE("a version 7 chunk header whose size a damage made absurd is refused, not read as a cut") {
  const std::vector<std::byte> whole = version7_file();
  const std::vector<Version7Chunk> chunks = version7_chunks(whole);
  // Given the complete golden stream with an events chunk's stored size
  // far past any zstd frame of its content, and with the trailer's a little
  // past the end of the file, its whole frame present
  std::vector<std::byte> absurd = whole;
  put_u64(absurd, chunks.at(4).offset + 8, 1'000'000'000'000'000);
  std::vector<std::byte> lie = whole;
  put_u64(lie, chunks.at(6).offset + 8, chunks.at(6).stored + 10);
  // When decoded, then each is refused as inconsistent
  std::string message;
  CHECK(decode_error(absurd, &message) == ErrorCode::inconsistent);
  CHECK(message.find("chunk 4 at offset " + std::to_string(chunks.at(4).offset) + " stores 1000000000000000 bytes") !=
        std::string::npos);
  CHECK(decode_error(lie, &message) == ErrorCode::inconsistent);
  CHECK(message.find("its zstd frame ends after " + std::to_string(chunks.at(6).stored)) != std::string::npos);
}

TEST_CASE("the ring start the writer stores is the one derived from the events") {
  // Given the version 4 golden snapshot without its ring start
  Snapshot unset = make_version4_golden_snapshot();
  const std::vector<RingStart> golden = unset.ring_start;
  unset.ring_start.clear();
  // When encoded, then the writer derives the same start and writes the same bytes
  CHECK(derive_ring_starts(unset) == golden);
  Snapshot unset6 = make_version6_golden_snapshot();
  unset6.ring_start.clear();
  CHECK(encode(unset6) == version6_file());
}

TEST_CASE("a ring that did not overflow stores no ring start") {
  // Given a snapshot with events but none dropped
  Snapshot s = make_version4_golden_snapshot();
  s.ring_start.clear();
  s.dropped_events = 0;
  // When it round-trips, then there is no ring start
  CHECK(derive_ring_starts(s).empty());
  CHECK(decode(encode(s)).ring_start.empty());
}

TEST_CASE("ring starts out of device order or with bad references are rejected by the writer and the reader") {
  Snapshot twice = make_rich_snapshot();
  REQUIRE(twice.ring_start.size() >= 2);
  std::swap(twice.ring_start[0], twice.ring_start[1]);
  std::string message;
  try {
    encode(twice);
    FAIL("encoded ring starts out of order");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::inconsistent);
    message = error.what();
  }
  CHECK(message.find("ring start 1 is for device") != std::string::npos);
  CHECK(decode_error(detail::encode_unvalidated(twice)) == ErrorCode::inconsistent);

  Snapshot bad_stack = make_version4_golden_snapshot();
  bad_stack.ring_start[0].segments[0].blocks[0].stack = StackId{99};
  CHECK(decode_error(detail::encode_unvalidated(bad_stack), &message) == ErrorCode::inconsistent);
  CHECK(message.find("of segment 0 of ring start 0 references stack 99") != std::string::npos);
}

TEST_CASE("a version 4 head cut short anywhere is rejected, never misread") {
  // Given the version 4 golden file with its head cut after `keep` bytes,
  // the head size and the body size fixed up to match, so that only the
  // head's own decoding can notice (the ring start is the head's tail)
  const std::vector<std::byte> whole = version4_file();
  std::uint64_t head_size = 0;
  for (std::size_t i = 0; i < 8; ++i) head_size |= std::to_integer<std::uint64_t>(whole[24 + i]) << (8 * i);
  REQUIRE(head_size < whole.size());
  for (std::size_t keep = 0; keep < head_size; ++keep) {
    std::vector<std::byte> cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(32 + keep));
    put_u64(cut, 24, keep);
    put_u64(cut, 16, 8 + keep);
    // When decoded, then it is rejected: truncated where a fixed-width
    // field runs off the end, inconsistent where a length exceeds what is left
    const ErrorCode code = decode_error(cut);
    CAPTURE(keep);
    CHECK((code == ErrorCode::truncated || code == ErrorCode::inconsistent));
  }
}

TEST_CASE("a version 1 file re-encodes as the current version and reads back equal, with its ring start") {
  // Given the version 1 golden snapshot, read from its file: 2 events
  // dropped, no ring start stored
  Snapshot upgraded = decode(version1_file());
  REQUIRE(upgraded.dropped_events == 2);
  REQUIRE(upgraded.ring_start.empty());
  // When written again
  upgraded.header.format_version = kWholeFormatVersion;
  const std::vector<std::byte> bytes = encode(upgraded);
  // Then today's version comes out and reads back equal, plus the ring
  // start the writer derived from the events
  CHECK(bytes[kVersionOffset] == std::byte{kWholeFormatVersion});
  Snapshot expected = upgraded;
  expected.ring_start = derive_ring_starts(upgraded);
  CHECK(expected.ring_start.size() == 1);
  CHECK(decode(bytes) == expected);
}

TEST_CASE("the writer still produces version 6 byte for byte") {
  // A tripwire: if this fails, the layout changed. Bump kWholeFormatVersion, keep
  // version6_file() and its test above, teach decode_body() (or the type's
  // class version) the new version, and point this test at a golden file of
  // the new version (docs/FORMAT.md).
  REQUIRE(kWholeFormatVersion == 6);
  CHECK(encode(make_version6_golden_snapshot()) == version6_file());
}

TEST_CASE("version 5 can still be written, byte for byte, for comparing the event encodings") {
  // Given the version 5 golden snapshot
  // When written as version 5, then the bytes are version5_file()'s (event
  // encoding 2, as cachealloc 0.5.0 wrote them); as version 6 they are the
  // current writer's
  CHECK(detail::encode_as_version(make_version5_golden_snapshot(), 5) == version5_file());
  CHECK(detail::encode_as_version(make_version6_golden_snapshot(), 6) == version6_file());
  // And on a trace of many blocks both read back the same events
  const Snapshot trace = make_realistic_trace(150'000, 3);
  CHECK(decode(detail::encode_as_version(trace, 5)).events == trace.events);
  CHECK(decode(detail::encode_as_version(trace, 6)).events == trace.events);
  // And no other version can be written
  for (const std::uint32_t version : {0u, 1u, 4u, 7u}) {
    CAPTURE(version);
    CHECK_THROWS_AS(detail::encode_as_version(trace, version), SnapshotError);
  }
}

TEST_CASE("a version 5 file reads back with NVML's reading; a version 4 file reads with none recorded") {
  // Given the golden files of versions 5 and 4
  const Snapshot v5 = decode(version5_file());
  const Snapshot v4 = decode(version4_file());
  // Then version 5 keeps the reading, and version 4 says none was recorded
  CHECK(v5 == make_version5_golden_snapshot());
  CHECK(v5.header.format_version == 5);
  REQUIRE(v5.devices.at(0).usage.size() == 1);
  CHECK(v5.devices[0].usage[0].process_used == 600ULL << 20);
  CHECK(v4.devices.at(0).usage_source == UsageSource::not_recorded);
  CHECK(v4.devices[0].usage.empty());
}

// --- files -------------------------------------------------------------------

TEST_CASE("a written snapshot reads back equal and leaves no temporary file") {
  ScratchDirectory dir;
  const Snapshot original = make_rich_snapshot();
  const fs::path path = dir.path() / "run.bin";
  write_snapshot(original, path);
  CHECK(read_snapshot(path) == original);
  CHECK(dir.entries() == std::vector<std::string>{"run.bin"});

  // And writing again replaces it
  Snapshot second = original;
  second.dropped_events = 1;
  write_snapshot(second, path);
  CHECK(read_snapshot(path) == second);
  CHECK(dir.entries() == std::vector<std::string>{"run.bin"});
}

TEST_CASE("an empty file is rejected as truncated") {
  ScratchDirectory dir;
  const fs::path path = dir.path() / "empty.bin";
  std::ofstream(path).close();
  try {
    (void)read_snapshot(path);
    FAIL("read an empty file");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::truncated);
  }
}

TEST_CASE("reading a directory is an io error naming the path") {
  ScratchDirectory dir;
  try {
    (void)read_snapshot(dir.path());
    FAIL("read a directory");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::io);
    CHECK(std::string(error.what()).find(dir.path().string()) != std::string::npos);
    CHECK(std::string(error.what()).find("Is a directory") != std::string::npos);
  }
}

TEST_CASE("reading a missing file is an io error naming the path and the reason") {
  ScratchDirectory dir;
  const fs::path path = dir.path() / "missing.bin";
  try {
    (void)read_snapshot(path);
    FAIL("read a missing file");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::io);
    CHECK(std::string(error.what()) == "cannot open snapshot " + path.string() + ": No such file or directory");
  }
}

TEST_CASE("a failed write leaves the existing file intact") {
  // Given an existing snapshot file
  ScratchDirectory dir;
  const fs::path path = dir.path() / "keep.bin";
  const Snapshot old = make_rich_snapshot();
  write_snapshot(old, path);
  const std::vector<std::byte> before = read_bytes(path);

  SUBCASE("the new snapshot fails validation") {
    Snapshot bad = old;
    bad.events[0].stack = StackId{500};
    try {
      write_snapshot(bad, path);
      FAIL("wrote an invalid snapshot");
    } catch (const SnapshotError& error) {
      CHECK(error.code() == ErrorCode::inconsistent);
    }
  }
  SUBCASE("the directory is not writable") {
    if (::geteuid() == 0) {
      MESSAGE("running as root: permission bits do not stop us, skipped");
      return;
    }
    fs::permissions(dir.path(), fs::perms::owner_read | fs::perms::owner_exec);
    try {
      write_snapshot(Snapshot{}, path);
      FAIL("wrote into a read-only directory");
    } catch (const SnapshotError& error) {
      CHECK(error.code() == ErrorCode::io);
      CHECK(std::string(error.what()).find(path.string()) != std::string::npos);
    }
    fs::permissions(dir.path(), fs::perms::owner_all);
  }
  SUBCASE("the rename fails because the target is a directory") {
    const fs::path directory = dir.path() / "taken";
    fs::create_directory(directory);
    fs::path inner = directory / "x";
    std::ofstream(inner).put('x');
    try {
      write_snapshot(Snapshot{}, directory);
      FAIL("replaced a directory");
    } catch (const SnapshotError& error) {
      CHECK(error.code() == ErrorCode::io);
    }
    CHECK(fs::is_directory(directory));
    CHECK(fs::exists(inner));
    fs::remove_all(directory);
  }
  // Then the old file is untouched and no temporary is left beside it
  CHECK(read_bytes(path) == before);
  CHECK(read_snapshot(path) == old);
  CHECK(dir.entries() == std::vector<std::string>{"keep.bin"});
}

TEST_CASE("a device whose segments together hold more than its bound is refused, naming the device and the figure") {
  // Given 199 segments of 2^47 bytes each (each plausible alone), no device total
  Snapshot s;
  for (std::uint64_t k = 0; k < 199; ++k) {
    const std::uint64_t address = (std::uint64_t{1} << 40) + k * (std::uint64_t{1} << 47);
    Segment segment{0, 0, address, std::uint64_t{1} << 47, true, false, {}, {}};
    segment.blocks.push_back(Block{address, std::uint64_t{1} << 47, 0, BlockState::inactive, {}});
    s.segments.push_back(segment);
  }
  // Then the layout is refused once their sum passes 2^50
  const std::optional<std::string> problem = layout_problem(s);
  REQUIRE(problem);
  CHECK(problem->starts_with("the segments of device 0 hold 1266637395197952 bytes from segment 8 on, more than 2^50"));
  // And 8 of them (2^50 in all) are not
  s.segments.resize(8);
  CHECK_FALSE(layout_problem(s));
}
