// SnapshotReader: the events of a file block by block, with bounded memory.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/reader.hpp"
#include "cachealloc/snapshot/ring_start.hpp"

using namespace cachealloc::snapshot;
namespace fs = std::filesystem;

namespace {

// Allocs and frees of a few sizes, enough events for several blocks.
Snapshot make_trace(std::size_t events) {
  Snapshot s;
  s.header.format_version = kWholeFormatVersion;
  s.strings = {"", "f"};
  s.frames = {Frame{}, Frame{0x1000, StringId{1}, StringId{}, 1, StringId{}}};
  s.stacks = {Stack{}, Stack{{FrameId{1}}}};
  std::mt19937_64 rng(5);
  const std::uint64_t base = 0x7f0000000000ULL;
  for (std::size_t i = 0; s.events.size() < events; ++i) {
    const std::uint64_t address = base + (rng() % 64) * 4096;
    const std::uint64_t size = 512 * (1 + rng() % 8);
    s.events.push_back(Event{EventKind::alloc, 0, 0, StackId{1}, 10 * i, 0, address, size, size - 7});
    if (s.events.size() < events)
      s.events.push_back(Event{EventKind::free_completed, 0, 0, StackId{}, 10 * i + 5, 0, address, size, size - 7});
  }
  return s;
}

fs::path scratch_file(const char* name) {
  return fs::temp_directory_path() / ("cachealloc-reader-test-" + std::to_string(::getpid()) + "-" + name);
}

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) bytes[i] = static_cast<std::byte>(chars[i]);
  return bytes;
}
void write_bytes(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

ErrorCode open_error(const fs::path& path) {
  try {
    SnapshotReader reader(path);
    std::vector<Event> block;
    while (reader.next_block(block)) {
    }
  } catch (const SnapshotError& error) {
    return error.code();
  }
  FAIL("the reader accepted the file");
  return ErrorCode::unsupported;
}

}  // namespace

TEST_CASE("a version 3 file streams in blocks that add up to the whole snapshot") {
  // Given a written trace of three and a half blocks
  const Snapshot original = make_trace(230000);
  const fs::path path = scratch_file("blocks.bin");
  write_snapshot(original, path);
  // When it is read block by block
  SnapshotReader reader(path);
  std::vector<Event> events;
  std::vector<Event> block;
  std::size_t blocks = 0;
  while (reader.next_block(block)) {
    CHECK(reader.block_first_event(blocks) == events.size());
    events.insert(events.end(), block.begin(), block.end());
    ++blocks;
  }
  // Then the head is everything but the events, and the blocks are the events
  CHECK(reader.streaming());
  CHECK(blocks == 4);
  CHECK(reader.block_count() == 4);
  CHECK(reader.event_count() == original.events.size());
  CHECK(reader.head().events.empty());
  Snapshot rebuilt = reader.head();
  rebuilt.events = events;
  CHECK(rebuilt == original);
  fs::remove(path);
}

namespace {

// The VmFlags of the mapping that holds `address` in /proc/self/smaps, or ""
// when none does.
std::string vm_flags_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &begin, &end) == 2 && line.find('-') < line.find(' ')) {
      inside = at >= begin && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("a loaded file's events are advised for transparent huge pages before their first touch") {
  // Given a kernel with transparent huge pages (the advice is a hint; without
  // them there is nothing to check)
  if (!fs::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    MESSAGE("no transparent huge pages on this kernel: nothing to check");
    return;
  }
  // And a file of 150,000 events, 8.4 MB loaded: whole 2 MiB pages lie
  // inside the array wherever the allocator puts it
  const fs::path path = scratch_file("huge.bin");
  write_snapshot(make_trace(150000), path);
  // When it is loaded whole
  const Snapshot loaded = read_snapshot(path);
  // Then the mapping under the first whole 2 MiB page inside the events
  // carries the advice (the kernel's "hg" flag), given before the reader
  // wrote them
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto first = reinterpret_cast<std::uintptr_t>(loaded.events.data());
  const auto huge = (first + kHuge - 1) & ~(kHuge - 1);
  REQUIRE(huge + kHuge <= first + loaded.events.size() * sizeof(Event));
  const std::string flags = vm_flags_at(reinterpret_cast<const void*>(huge));
  INFO(flags);
  REQUIRE_FALSE(flags.empty());
  CHECK(flags.find(" hg") != std::string::npos);
  fs::remove(path);
}

TEST_CASE("blocks read in any order decode the same") {
  const Snapshot original = make_trace(200000);
  const fs::path path = scratch_file("backward.bin");
  write_snapshot(original, path);
  SnapshotReader reader(path);
  std::vector<Event> block;
  for (std::size_t b = reader.block_count(); b-- > 0;) {
    reader.read_block(b, block);
    const auto first = original.events.begin() + static_cast<std::ptrdiff_t>(reader.block_first_event(b));
    CHECK(std::equal(block.begin(), block.end(), first));
  }
  fs::remove(path);
}

TEST_CASE("a sibling reader decodes the same blocks on another thread, with the first reader's head") {
  // Given a streamed file of several blocks
  const Snapshot original = make_trace(200000);
  const fs::path path = scratch_file("sibling.bin");
  write_snapshot(original, path);
  SnapshotReader reader(path);
  REQUIRE(reader.block_count() >= 3);
  // When a sibling opens it and each reads every block, on two threads
  SnapshotReader sibling;
  sibling.open_sibling(reader);
  CHECK(sibling.streaming());
  CHECK(&sibling.head() == &reader.head());
  CHECK(sibling.block_count() == reader.block_count());
  bool sibling_same = true;
  std::thread other([&] {
    std::vector<Event> block;
    for (std::size_t b = sibling.block_count(); b-- > 0;) {
      sibling.read_block(b, block);
      const auto first = original.events.begin() + static_cast<std::ptrdiff_t>(sibling.block_first_event(b));
      sibling_same = sibling_same && std::equal(block.begin(), block.end(), first);
    }
  });
  std::vector<Event> block;
  for (std::size_t b = 0; b < reader.block_count(); ++b) {
    reader.read_block(b, block);
    const auto first = original.events.begin() + static_cast<std::ptrdiff_t>(reader.block_first_event(b));
    CHECK(std::equal(block.begin(), block.end(), first));
  }
  other.join();
  // Then both decode the file's events
  CHECK(sibling_same);
  // And a reader that holds its file in memory has no sibling
  SnapshotReader loaded(fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata" / "small_step.bin");
  REQUIRE_FALSE(loaded.streaming());
  SnapshotReader none;
  CHECK_THROWS_AS(none.open_sibling(loaded), std::logic_error);
  fs::remove(path);
}

TEST_CASE("an older version or a pickle falls back to loading the whole file") {
  // Given a version 1 file kept for the analyzer's golden tests
  const fs::path path = fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata" / "small_step.bin";
  SnapshotReader reader(path);
  // Then the reader holds it in memory and still hands out blocks
  CHECK_FALSE(reader.streaming());
  CHECK(reader.head().header.format_version == 1);
  std::vector<Event> block;
  REQUIRE(reader.next_block(block));
  CHECK(block == read_snapshot(path).events);
  CHECK_FALSE(reader.next_block(block));
}

TEST_CASE("a version 4 file streams with the ring start in its head") {
  // Given an overflowed trace of two blocks, written with its ring start
  Snapshot original = make_trace(70000);
  original.dropped_events = 5;
  const fs::path path = scratch_file("ring-start.bin");
  write_snapshot(original, path);
  // When the reader opens it
  SnapshotReader reader(path);
  // Then it streams, and its head holds the start the writer derived
  CHECK(reader.streaming());
  CHECK(reader.head().header.format_version == kWholeFormatVersion);
  CHECK(reader.head().ring_start == derive_ring_starts(original));
  CHECK(reader.head().ring_start == read_snapshot(path).ring_start);
  fs::remove(path);
}

TEST_CASE("a version 3 file whose ring overflowed still streams, without a ring start") {
  // Given a version 3 recording kept for the golden tests, 234 events lost
  const fs::path path = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "synthetic_2k_native.bin";
  SnapshotReader reader(path);
  // Then the reader streams it, and it has no ring start to offer
  CHECK(reader.streaming());
  CHECK(reader.head().header.format_version == 3);
  CHECK(reader.head().dropped_events > 0);
  CHECK(reader.head().ring_start.empty());
  CHECK(reader.head() == [&] {
    Snapshot whole = read_snapshot(path);
    whole.events.clear();
    return whole;
  }());
}

TEST_CASE("a version 4 head cut short is rejected when opened") {
  // Given a version 4 file with a ring start, its head cut before its end
  // (inside the ring start) and the sizes fixed up to match
  Snapshot original = make_trace(1000);
  original.dropped_events = 5;
  const fs::path path = scratch_file("short-head.bin");
  write_snapshot(original, path);
  const std::vector<std::byte> bytes = read_bytes(path);
  std::uint64_t head_size = 0;
  for (std::size_t i = 0; i < 8; ++i) head_size |= std::to_integer<std::uint64_t>(bytes[24 + i]) << (8 * i);
  for (const std::uint64_t keep : {head_size - 1, head_size - 9, head_size / 2}) {
    CAPTURE(keep);
    std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(32 + keep));
    for (std::size_t i = 0; i < 8; ++i) {
      cut[16 + i] = static_cast<std::byte>(((8 + keep) >> (8 * i)) & 0xff);
      cut[24 + i] = static_cast<std::byte>((keep >> (8 * i)) & 0xff);
    }
    write_bytes(path, cut);
    // When opened, then it is rejected, as decode() rejects it
    const ErrorCode code = open_error(path);
    CHECK((code == ErrorCode::truncated || code == ErrorCode::inconsistent));
  }
  fs::remove(path);
}

TEST_CASE("a truncated file is rejected when opened") {
  const fs::path path = scratch_file("truncated.bin");
  write_snapshot(make_trace(70000), path);
  std::vector<std::byte> bytes = read_bytes(path);
  for (const std::size_t keep : {bytes.size() - 1, bytes.size() / 2, std::size_t{30}, std::size_t{13}}) {
    CAPTURE(keep);
    write_bytes(path, std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
    CHECK(open_error(path) == ErrorCode::truncated);
  }
  fs::remove(path);
}

TEST_CASE("a block size past the end of the file is rejected") {
  // Given a file whose last block claims more bytes than remain
  const fs::path path = scratch_file("block-size.bin");
  write_snapshot(make_trace(70000), path);
  std::vector<std::byte> bytes = read_bytes(path);
  SnapshotReader reader(path);
  REQUIRE(reader.block_count() == 2);
  std::size_t size_at = bytes.size();
  std::vector<Event> block;
  reader.read_block(1, block);
  // The last block's columns end at the end of the file; its size precedes them.
  std::uint64_t size = 0;
  for (std::size_t probe = bytes.size() - 9; probe > 24; --probe) {
    size = 0;
    for (std::size_t i = 0; i < 8; ++i) size |= std::to_integer<std::uint64_t>(bytes[probe + i]) << (8 * i);
    if (probe + 8 + size == bytes.size()) {
      size_at = probe;
      break;
    }
  }
  REQUIRE(size_at < bytes.size());
  for (std::size_t i = 0; i < 8; ++i) bytes[size_at + i] = static_cast<std::byte>(((size + 1) >> (8 * i)) & 0xff);
  write_bytes(path, bytes);
  // When opened, then it is inconsistent, before any block is decoded
  CHECK(open_error(path) == ErrorCode::inconsistent);
  fs::remove(path);
}

TEST_CASE("random corruption of a streamed file is rejected with a SnapshotError or decodes, never crashes") {
  const fs::path path = scratch_file("corrupt.bin");
  write_snapshot(make_trace(3000), path);
  const std::vector<std::byte> original = read_bytes(path);
  std::mt19937_64 rng(23);
  for (int round = 0; round < 500; ++round) {
    std::vector<std::byte> bytes = original;
    for (int f = 0; f < 3; ++f) bytes[24 + rng() % (bytes.size() - 24)] = static_cast<std::byte>(rng());
    write_bytes(path, bytes);
    try {
      SnapshotReader reader(path);
      std::vector<Event> block;
      while (reader.next_block(block)) {
      }
    } catch (const SnapshotError&) {
    }
  }
  fs::remove(path);
}

TEST_CASE("a missing file is an io error naming the path") {
  const fs::path path = scratch_file("missing.bin");
  try {
    SnapshotReader reader(path);
    FAIL("opened a missing file");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::io);
    CHECK(std::string(error.what()).find(path.string()) != std::string::npos);
  }
}

TEST_CASE("an event past its tables in a streamed block is refused with the message load gives") {
  // Given a trace of two blocks with annotations throughout (valid ones pass),
  // and in the second block one event that names a thread, a stack or an
  // annotation string that does not exist, or a negative device (every kind
  // the encoding can hold exists since the category event took the last one)
  Snapshot valid = make_trace(100000);
  valid.threads = {1234};
  valid.strings.push_back("phase");
  for (std::size_t i = 100; i < valid.events.size(); i += 1000) {
    valid.events[i].kind = i % 2000 == 100 ? EventKind::annotation_begin : EventKind::annotation_end;
    valid.events[i].aux = i % 3000 == 100 ? 0 : 2;
  }
  struct Case {
    const char* what;
    void (*corrupt)(Event&);
  };
  const Case cases[] = {
      {"references thread 1 but the thread table has 1 entries", [](Event& e) { e.thread = 1; }},
      {"references stack 2 but the stack table has 2 entries", [](Event& e) { e.stack = StackId{2}; }},
      {"references string 3 but the string table has 3 entries",
       [](Event& e) {
         e.kind = EventKind::annotation_end;
         e.aux = 3;
       }},
      {"names annotation string 4294967298, past 32 bits",
       [](Event& e) {
         e.kind = EventKind::annotation_begin;
         e.aux = (std::uint64_t{1} << 32) + 2;
       }},
      {"is on device -2147483648; device indices start at 0", [](Event& e) { e.device = INT32_MIN; }},
  };
  const fs::path path = scratch_file("screen.bin");
  {
    write_bytes(path, detail::encode_unvalidated(valid));
    SnapshotReader reader(path);
    std::vector<Event> block;
    std::size_t events = 0;
    while (reader.next_block(block)) events += block.size();
    CHECK(events == valid.events.size());
  }
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Snapshot bad = valid;
    c.corrupt(bad.events[70001]);
    const std::vector<std::byte> bytes = detail::encode_unvalidated(bad);
    std::string loaded;
    try {
      (void)decode(bytes);
    } catch (const SnapshotError& error) {
      loaded = error.what();
    }
    CHECK(loaded.find(std::string("event 70001 ") + c.what) != std::string::npos);
    // When it is read block by block
    write_bytes(path, bytes);
    SnapshotReader reader(path);
    std::vector<Event> block;
    reader.read_block(0, block);  // the first block is clean
    std::string streamed;
    try {
      reader.read_block(1, block);
    } catch (const SnapshotError& error) {
      CHECK(error.code() == ErrorCode::inconsistent);
      streamed = error.what();
    }
    // Then the second block is refused with the same message
    CHECK(streamed == loaded);
  }
  fs::remove(path);
}

TEST_CASE("an annotation string carried over from the event before is screened in a streamed block") {
  // Given a two-block trace where, in the second block, an annotation's
  // string id past the table equals the aux of the alloc before it, so the
  // encoder can repeat that event's aux instead of storing one (the decoder
  // screens a thread or stack id only where the columns store one, and an
  // annotation's string on every event)
  Snapshot bad = make_trace(100000);
  bad.strings.push_back("phase");
  REQUIRE(bad.events[70000].kind == EventKind::alloc);
  bad.events[70000].aux = 3;
  bad.events[70001].kind = EventKind::annotation_end;
  bad.events[70001].stack = StackId{};
  bad.events[70001].aux = 3;
  const std::vector<std::byte> bytes = detail::encode_unvalidated(bad);
  std::string loaded;
  try {
    (void)decode(bytes);
  } catch (const SnapshotError& error) {
    loaded = error.what();
  }
  CHECK(loaded.find("event 70001 references string 3 but the string table has 3 entries") != std::string::npos);
  // When it is read block by block
  const fs::path path = scratch_file("carried.bin");
  write_bytes(path, bytes);
  SnapshotReader reader(path);
  std::vector<Event> block;
  reader.read_block(0, block);
  std::string streamed;
  try {
    reader.read_block(1, block);
  } catch (const SnapshotError& error) {
    streamed = error.what();
  }
  // Then the second block is refused with the message load gives
  CHECK(streamed == loaded);
  fs::remove(path);
}
