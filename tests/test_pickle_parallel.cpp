// The pickle reader's fast paths: a trace entry read whole in one step, and a
// long trace list read by several threads side by side. Each must give the
// snapshot that reading one opcode at a time gives, byte for byte, on real
// PyTorch snapshots and on long generated traces, wherever the chunks fall.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "file_bytes.hpp"

using namespace cachealloc::snapshot;

namespace {

const std::filesystem::path kData = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";
constexpr std::uint64_t MiB = 1ull << 20;

Snapshot read(std::span<const std::byte> bytes, bool whole_entries, unsigned threads, std::size_t min_chunk_bytes,
              detail::PickleReadStats* stats = nullptr) {
  detail::PickleReadOptions options;
  options.whole_entries = whole_entries;
  options.threads = threads;
  options.min_chunk_bytes = min_chunk_bytes;
  options.stats = stats;
  return detail::decode_pytorch_pickle(bytes, options);
}

// One opcode at a time, on one thread: the reference every path must equal.
Snapshot reference(std::span<const std::byte> bytes) { return read(bytes, false, 1, 4 * MiB); }

// A long single-device trace as PyTorch writes one: `allocations` tensors
// from a handful of call sites, each freed a few allocations later, all in
// one large segment; our writer batches, memoizes and shares frame lists
// the way Python's pickler does.
// `free_stream`: the stream of every free; one past 2^63 is written as a
// negative integer, which the whole-entry scanner leaves to the one-by-one
// path.
std::vector<std::byte> long_trace(std::size_t allocations, std::uint64_t free_stream = 0) {
  Snapshot s;
  s.header.source = "cachealloc";
  s.devices = {DeviceInfo{}};  // device 0, nothing known of it
  for (int site = 0; site < 6; ++site) {
    s.strings.push_back("fn_" + std::to_string(site));
    s.frames.push_back(Frame{0, StringId{static_cast<std::uint32_t>(s.strings.size() - 1)}, StringId{}, 10u + site, {}});
    Stack stack;
    stack.frames.push_back(FrameId{static_cast<std::uint32_t>(s.frames.size() - 1)});
    if (site % 2 == 0) stack.frames.push_back(FrameId{1});
    s.stacks.push_back(stack);
  }
  const std::uint64_t base = 0x7f0000000000;
  const std::uint64_t segment = 64 * MiB;
  std::uint64_t time_us = 1000;
  auto event = [&](EventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t requested, std::uint32_t stack) {
    Event e;
    e.kind = kind;
    e.time_ns = ++time_us * 1000;
    e.address = address;
    e.size = size;
    e.aux = requested;
    e.stack = StackId{stack};
    if (kind == EventKind::free_requested || kind == EventKind::free_completed) e.stream = free_stream;
    s.events.push_back(e);
  };
  event(EventKind::segment_alloc, base, segment, segment_flag_large_pool, 1);
  std::vector<std::pair<std::uint64_t, std::uint32_t>> live;
  for (std::size_t i = 0; i < allocations; ++i) {
    const std::uint64_t address = base + (i % 64) * MiB;
    for (std::size_t j = 0; j < live.size(); ++j) {
      if (live[j].first != address) continue;
      event(EventKind::free_requested, address, MiB, MiB - 100, live[j].second);
      event(EventKind::free_completed, address, MiB, MiB - 100, live[j].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(j));
      break;
    }
    const auto stack = static_cast<std::uint32_t>(1 + i % 6);
    event(EventKind::alloc, address, MiB, MiB - 100, stack);
    live.emplace_back(address, stack);
  }
  Segment final_segment{0, 0, base, segment, true, false, StackId{1}, {}};
  std::uint64_t cursor = base;
  std::sort(live.begin(), live.end());
  for (const auto& [address, stack] : live) {
    if (address > cursor) final_segment.blocks.push_back(Block{cursor, address - cursor, 0, BlockState::inactive, {}});
    final_segment.blocks.push_back(Block{address, MiB, MiB - 100, BlockState::active_allocated, StackId{stack}});
    cursor = address + MiB;
  }
  if (cursor < base + segment) final_segment.blocks.push_back(Block{cursor, base + segment - cursor, 0, BlockState::inactive, {}});
  s.segments = {final_segment};
  return encode_pytorch_pickle(s);
}

}  // namespace

TEST_CASE("every real PyTorch snapshot reads the same opcode by opcode, entry by entry and on threads") {
  for (const auto& file : std::filesystem::directory_iterator(kData)) {
    if (file.path().extension() != ".pickle") continue;
    CAPTURE(file.path().filename().string());
    const std::vector<std::byte> bytes = test_support::file_bytes(file.path());
    const Snapshot expected = reference(bytes);
    detail::PickleReadStats whole;
    CHECK(read(bytes, true, 1, 4 * MiB, &whole) == expected);
    CHECK(whole.entries_read_whole > 0);
    // Chunks of a few KiB: many chunk edges, wherever they fall.
    for (const std::size_t chunk : {std::size_t{1}, std::size_t{777}, std::size_t{4096}}) {
      CAPTURE(chunk);
      CHECK(read(bytes, true, 7, chunk) == expected);
    }
  }
}

// An entry read whole has no Container of its own (pickle_value.hpp,
// kWholeEntryDict): one changed later, through the memo, must read as Python
// would build it all the same.
TEST_CASE("an entry read whole and changed later through the memo reads as one opcode at a time") {
  using namespace std::string_literals;
  const auto str8 = [](const std::string& text) { return "\x8c"s + static_cast<char>(text.size()) + text; };
  const auto int1 = [](int value) { return "K"s + static_cast<char>(value); };
  const auto int2 = [](int value) { return "M"s + static_cast<char>(value & 0xff) + static_cast<char>(value >> 8); };
  for (const int change : {0, 1, 2, 3}) {
    CAPTURE(change);
    // Given a trace of two entries, the first with memoized keys (memo 3 to 8) and frames F1 = [A] (memo 9,
    // A is memo 10), the second E2 (memo 11) with keys by BINGET and frames F2 = [A] (memo 12): read whole
    std::string body = "\x80\x04}\x94"s + str8("segments") + "]s" + str8("device_traces") + "]]\x94("s;
    body += "}\x94("s + str8("action") + "\x94" + str8("alloc") + "\x94" + str8("addr") + "\x94" + int2(512) +
            str8("size") + "\x94" + int1(64) + str8("time_us") + "\x94" + int1(5) + str8("frames") + "\x94" +
            "]\x94(}\x94(" + str8("name") + str8("f") + str8("line") + int1(1) + "ueu";
    body += "}\x94(h\x03h\x04h\x05"s + int2(1024) + "h\x06"s + int1(32) + "h\x07"s + int1(6) + "h\x08]\x94h\x0a" "au"s;
    body += "eas";
    // and later E2['size'] = 4096 (its shape holds it), E2['extra'] = 'x' (it does not), F2.append({'name': 'g'})
    // or F2 read as a frame list again, in one variant each
    if (change == 1) body += str8("later") + "h\x0b"s + str8("size") + int2(4096) + "ss";
    if (change == 2) body += str8("later") + "h\x0b"s + str8("extra") + str8("x") + "s" + str8("size") + int2(4096) + "ss";
    if (change == 3) body += str8("later") + "h\x0c}("s + str8("name") + str8("g") + "uas";
    body += ".";
    std::vector<std::byte> bytes(body.size());
    std::memcpy(bytes.data(), body.data(), body.size());
    // When it is read entry by entry
    detail::PickleReadStats whole;
    const Snapshot s = read(bytes, true, 1, 4 * MiB, &whole);
    // Then the second entry was read whole, and the snapshot is the one-opcode-at-a-time one
    CHECK(whole.entries_read_whole == 1);
    CHECK(s == reference(bytes));
    REQUIRE(s.events.size() == 2);
    CHECK(s.events[1].address == 1024);
    CHECK(s.events[1].aux == (change == 1 || change == 2 ? 4096 : 32));
    REQUIRE(s.events[1].stack);
    const Stack& stack = s.stacks[s.events[1].stack.value];
    REQUIRE(stack.frames.size() == (change == 3 ? 2u : 1u));
    CHECK(s.strings[s.frames[stack.frames[0].value].function.value] == "f");
    if (change == 3) CHECK(s.strings[s.frames[stack.frames[1].value].function.value] == "g");
  }
}

// Regression (found by AddressSanitizer): the chunk readers' view of the memo
// and the boxed values was taken before the count pass and kept through the
// resizes before the write pass, so the write pass read freed memory
// whenever the chunks boxed more values than the vectors had room for. Under
// ./dev.sh asan this case stops on a heap-use-after-free without the fix.
TEST_CASE("a parallel read whose chunks grow the memo and the boxes reads as one thread does") {
  // given a real PyTorch pickle with a trace long enough for threads, whose
  // entries box new values in every chunk
  const std::vector<std::byte> bytes = test_support::file_bytes(kData / "varlen_expandable_maxsplit.pickle");
  const Snapshot expected = reference(bytes);
  for (const unsigned threads : {3u, 7u, 16u}) {
    CAPTURE(threads);
    // when it is read in many small chunks on threads
    detail::PickleReadStats stats;
    const Snapshot got = read(bytes, true, threads, 777, &stats);
    // then the threads did read it, and read it exactly
    CHECK(stats.entries_read_in_parallel > 0);
    CHECK(stats.parallel_restarts == 0);
    CHECK(got == expected);
  }
}

TEST_CASE("a long trace read on threads equals the one-thread read, and the threads did read it") {
  const std::vector<std::byte> bytes = long_trace(40000);
  const Snapshot expected = reference(bytes);
  REQUIRE(expected.events.size() > 100000);
  for (const unsigned threads : {2u, 5u, 16u}) {
    CAPTURE(threads);
    detail::PickleReadStats stats;
    CHECK(read(bytes, true, threads, 64 * 1024, &stats) == expected);
    CHECK(stats.parallel_restarts == 0);
    CHECK(stats.chunks >= 2);
    CHECK(stats.entries_read_in_parallel > expected.events.size() / 2);
  }
}

// Regression: a parallel read was tried again at every batch of 1000
// entries however little the last try read, and each try sized the tree's
// arrays to the rest of the file and counted ahead in every chunk, so a
// trace the threads kept stopping in (our own writer's stackless frees, a
// bare [] each) took quadratic time: 3M events 75 s on 2 cores.
TEST_CASE("a trace the threads keep stopping in is tried on threads a bounded number of times") {
  // given a long trace where two entries in three are of a shape the threads
  // leave to one thread (a negative stream)
  const std::vector<std::byte> bytes = long_trace(60000, ~std::uint64_t{0});
  const Snapshot expected = reference(bytes);
  REQUIRE(expected.events.size() > 150000);
  REQUIRE(std::count_if(expected.events.begin(), expected.events.end(),
                        [](const Event& e) { return e.stream == ~std::uint64_t{0}; }) > 100000);
  const std::size_t batches = expected.events.size() / 1000;
  for (const unsigned threads : {2u, 7u}) {
    CAPTURE(threads);
    // when it is read on threads with chunks of at least 256 KiB
    detail::PickleReadStats stats;
    const std::size_t min_chunk = 256 * 1024;
    const Snapshot got = read(bytes, true, threads, min_chunk, &stats);
    // then it reads as one thread reads it, and a parallel read was tried
    // about once per chunk's worth of bytes, not once per batch
    CHECK(got == expected);
    CHECK(stats.parallel_restarts == 0);
    CHECK(stats.parallel_tries >= 1);
    CHECK(stats.parallel_tries <= bytes.size() / min_chunk + 1);
    CHECK(stats.parallel_tries < batches / 4);
  }
}

TEST_CASE("a trace cut short reads the same on threads: every prefix is rejected or read alike") {
  const std::vector<std::byte> bytes = long_trace(3000);
  // Prefixes end inside entries, batches and chunk edges alike; the one-thread
  // reader decides what each is, and the threads must agree.
  for (std::size_t length = bytes.size() / 3; length < bytes.size(); length += bytes.size() / 97) {
    CAPTURE(length);
    const std::span<const std::byte> prefix(bytes.data(), length);
    std::string expected_error;
    try {
      reference(prefix);
    } catch (const SnapshotError& error) {
      expected_error = error.what();
    }
    std::string error;
    try {
      read(prefix, true, 6, 512);
    } catch (const SnapshotError& e) {
      error = e.what();
    }
    CHECK(error == expected_error);
    CHECK_FALSE(error.empty());  // no prefix before STOP is a pickle
  }
}

// The opcodes our writer emits, walked with the memo counted: for each
// opcode, its offset and the memo size before it.
struct Opcode {
  std::size_t offset;
  unsigned char op;
  std::uint32_t memo_before;
};
std::vector<Opcode> walk(const std::vector<std::byte>& bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::vector<Opcode> ops;
  std::uint32_t memo = 0;
  std::size_t at = 2;  // after PROTO
  auto le = [&](std::size_t from, int width) {
    std::uint64_t value = 0;
    std::memcpy(&value, data + from, static_cast<std::size_t>(width));
    return value;
  };
  while (at < bytes.size()) {
    const unsigned char op = data[at];
    ops.push_back(Opcode{at, op, memo});
    ++at;
    switch (op) {
      case 0x94: ++memo; break;                        // MEMOIZE
      case 0x68: case 0x4b: at += 1; break;           // BINGET, BININT1
      case 0x4d: at += 2; break;                      // BININT2
      case 0x6a: case 0x4a: at += 4; break;           // LONG_BINGET, BININT
      case 0x47: at += 8; break;                      // BINFLOAT
      case 0x95: at += 8; break;                      // FRAME
      case 0x8a: case 0x8c: at += 1 + data[at]; break;  // LONG1, SHORT_BINUNICODE
      case 0x58: at += 4 + le(at, 4); break;          // BINUNICODE
      case 0x2e: return ops;                          // STOP
      default: break;                                 // no argument
    }
  }
  return ops;
}

TEST_CASE("a memo reference the threads cannot vouch for sends the whole read back to one thread") {
  // Given a long trace in which a late entry's frames name, through the memo,
  // the dict of the entry before it (a dict, not a list: not a frames list
  // one-by-one reading would accept),
  std::vector<std::byte> bytes = long_trace(20000);
  const std::vector<Opcode> ops = walk(bytes);
  REQUIRE(ops.size() > 1000);
  std::uint32_t previous_dict = 0;
  std::uint32_t last_dict = 0;
  std::size_t frames_ref = 0;
  for (std::size_t i = 0; i + 2 < ops.size(); ++i) {
    if (ops[i].op == 0x7d && ops[i + 1].op == 0x94) {  // EMPTY_DICT MEMOIZE: an entry's dict
      previous_dict = last_dict;
      last_dict = ops[i + 1].memo_before;
    }
    // BINGET then SETITEMS: the entry's last value, its frames list.
    if (ops[i].op == 0x68 && ops[i + 1].op == 0x75 && ops[i].offset > bytes.size() * 3 / 4 && previous_dict != 0) {
      frames_ref = ops[i].offset;
      break;
    }
  }
  REQUIRE(frames_ref != 0);
  // BINGET n becomes LONG_BINGET of the dict (our writer emits no FRAME
  // opcodes, so nothing after needs its offsets).
  unsigned char long_binget[5] = {0x6a, 0, 0, 0, 0};
  std::memcpy(long_binget + 1, &previous_dict, 4);
  bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(frames_ref),
              bytes.begin() + static_cast<std::ptrdiff_t>(frames_ref + 2));
  bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(frames_ref), reinterpret_cast<std::byte*>(long_binget),
               reinterpret_cast<std::byte*>(long_binget) + 5);
  // when it is read on threads, the result is the one-thread read's, and
  // the read says it started over.
  const Snapshot expected = reference(bytes);
  detail::PickleReadStats stats;
  CHECK(read(bytes, true, 8, 32 * 1024, &stats) == expected);
  CHECK(stats.parallel_restarts == 1);
}
