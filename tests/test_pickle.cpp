// The PyTorch pickle reader: real snapshots from an H200 agree with PyTorch's
// own memory_stats() at dump time and replay to their final layout; load()
// recognizes files by content; hostile pickles get a typed SnapshotError and
// never a crash, a copy per reference or a deep recursion.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "cachealloc/snapshot/pickle.hpp"

using namespace cachealloc::snapshot;
using namespace std::string_literals;

namespace {

const std::filesystem::path kData = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";

// One integer value of PyTorch's stats.json ("key": 123).
std::int64_t stat(const std::string& name, const std::string& key) {
  std::ifstream in(kData / (name + ".stats.json"));
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string needle = "\"" + key + "\":";
  const std::size_t at = json.find(needle);
  REQUIRE_MESSAGE(at != std::string::npos, key);
  return std::stoll(json.substr(at + needle.size()));
}

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<std::byte>(text[i]);
  return out;
}

std::vector<std::byte> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes_of(text);
}

// The error decode_pytorch_pickle() throws, and its message.
ErrorCode error_of(const std::vector<std::byte>& bytes, std::string* message = nullptr) {
  try {
    decode_pytorch_pickle(bytes);
  } catch (const SnapshotError& error) {
    if (message != nullptr) *message = error.what();
    return error.code();
  }
  FAIL("the pickle was accepted");
  return ErrorCode::io;
}

std::size_t count(const Snapshot& s, EventKind kind) {
  return static_cast<std::size_t>(
      std::count_if(s.events.begin(), s.events.end(), [&](const Event& e) { return e.kind == kind; }));
}

// Protocol 4 header and a dict {'segments': [], 'device_traces': [TRACE]}
// around a hand-written fragment, for the hostile cases.
const std::string kProto4 = std::string("\x80\x04", 2);

// PyTorch reports each mapped run of an expandable segment as a segment of
// its own; the replay keeps one segment with unmapped blocks.
std::vector<Segment> mapped_runs(const std::vector<Segment>& segments) {
  std::vector<Segment> out;
  for (const Segment& segment : segments) {
    if (!segment.expandable) {
      out.push_back(segment);
      continue;
    }
    Segment run = segment;
    run.blocks.clear();
    for (std::size_t b = 0; b <= segment.blocks.size(); ++b) {
      if (b == segment.blocks.size() || segment.blocks[b].state == BlockState::unmapped) {
        if (!run.blocks.empty()) {
          run.address = run.blocks.front().address;
          run.total_size = run.blocks.back().address + run.blocks.back().size - run.address;
          out.push_back(run);
        }
        run.blocks.clear();
      } else {
        run.blocks.push_back(segment.blocks[b]);
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("every real PyTorch snapshot agrees with PyTorch's own stats at dump time") {
  for (const std::string name : {"cnn_train_stacks_all", "gru_python_stacks", "ring_overflow", "no_context",
                                 "varlen_expandable_maxsplit"}) {
    CAPTURE(name);
    // Given a pickle written by torch.cuda.memory._dump_snapshot on an H200
    // When it is read without Python
    const Snapshot s = read_pytorch_pickle(kData / (name + ".pickle"));
    // Then segments, reserved bytes and allocated bytes are PyTorch's
    const bool expandable = std::any_of(s.segments.begin(), s.segments.end(), [](const Segment& g) { return g.expandable; });
    if (!expandable) CHECK(static_cast<std::int64_t>(s.segments.size()) == stat(name, "segment.all.current"));
    std::int64_t reserved = 0, allocated = 0;
    for (const Segment& segment : s.segments) {
      reserved += static_cast<std::int64_t>(segment.total_size);
      for (const Block& block : segment.blocks) {
        if (block.state == BlockState::active_allocated) allocated += static_cast<std::int64_t>(block.size);
      }
    }
    CHECK(reserved == stat(name, "reserved_bytes.all.current"));
    CHECK(allocated == stat(name, "allocated_bytes.all.current"));
    CHECK(s.header.source == "pytorch-pickle");
    CHECK(s.dropped_events == 0);
    CHECK_NOTHROW(validate(s));
    // and the trace counts PyTorch's allocations and frees
    CHECK(count(s, EventKind::alloc) == 0u + static_cast<std::size_t>(name == "ring_overflow" ? 100 : stat(name, "allocation.all.allocated")));
  }
}

TEST_CASE("a trace recorded from the start replays to the layout PyTorch dumped") {
  for (const std::string name : {"cnn_train_stacks_all", "gru_python_stacks", "no_context", "varlen_expandable_maxsplit"}) {
    CAPTURE(name);
    // Given a snapshot whose history began before the first allocation
    const Snapshot s = read_pytorch_pickle(kData / (name + ".pickle"));
    CHECK(s.settings.count("trace_may_begin_mid_run") == 0);
    // When its events are replayed from an empty device
    cachealloc::analyzer::Replay replay({}, 0, s.stacks.size());
    for (const Event& event : s.events) replay.apply(event);
    // Then every inferred block size lands exactly: the layout is PyTorch's
    CHECK(replay.anomalies().total() == 0);
    std::vector<Segment> layout = mapped_runs(replay.layout());
    std::vector<Segment> expected = s.segments;
    for (auto* segments : {&layout, &expected}) {
      for (Segment& segment : *segments) {
        segment.stack = StackId{};  // PyTorch's segment frames are not always its segment_alloc's
        // segment_map says nothing of the pool, so a replayed expandable segment cannot know it
        if (segment.expandable) segment.large_pool = false;
        for (Block& block : segment.blocks) {
          if (block.state == BlockState::inactive) block.stack = StackId{};
        }
      }
    }
    CHECK(layout.size() == expected.size());
    CHECK(layout == expected);
  }
}

TEST_CASE("a ring that overflowed is read as a shorter trace that may begin mid-run") {
  // Given max_entries=300 over 2000 allocations
  const Snapshot s = read_pytorch_pickle(kData / "ring_overflow.pickle");
  // Then the 300 newest entries are there, nothing claims to count the lost ones,
  // and the settings say the trace may begin mid-run
  CHECK(s.events.size() == 300);
  CHECK(count(s, EventKind::alloc) == 100);
  CHECK(count(s, EventKind::free_requested) == 100);
  CHECK(s.dropped_events == 0);
  CHECK(s.settings.at("trace_may_begin_mid_run") == "true");
  // and the frees of blocks allocated before the ring carry rounded sizes
  for (const Event& e : s.events) {
    if (e.kind == EventKind::free_completed) CHECK(e.size % 512 == 0);
    if (e.kind == EventKind::free_completed) CHECK(e.size >= e.aux);
  }
}

TEST_CASE("a snapshot recorded with context=None has events with no stack") {
  const Snapshot s = read_pytorch_pickle(kData / "no_context.pickle");
  CHECK(s.events.size() == 61);
  CHECK(count(s, EventKind::segment_release) == 4);
  CHECK(s.stacks.size() == 1);  // only the "none" placeholder
  for (const Event& e : s.events) CHECK(e.stack == StackId{});
}

TEST_CASE("frames are interned once and stacks are shared by their frame lists") {
  const Snapshot s = read_pytorch_pickle(kData / "cnn_train_stacks_all.pickle");
  std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>> frames;
  for (std::size_t i = 1; i < s.frames.size(); ++i) {
    frames.insert({s.frames[i].file.value, s.frames[i].line, s.frames[i].function.value});
  }
  CHECK(frames.size() == s.frames.size() - 1);
  std::set<std::vector<FrameId>> stacks;
  for (const Stack& stack : s.stacks) stacks.insert(stack.frames);
  CHECK(stacks.size() == s.stacks.size());
  // The unwinder's innermost frame comes first, as in the model.
  const Event& first = s.events.front();
  REQUIRE(first.stack);
  CHECK(s.strings[s.frames[s.stacks[first.stack.value].frames.front().value].function.value] == "torch::unwind::unwind()");
}

TEST_CASE("annotations, allocator settings, expandable segments and times map onto the model") {
  const Snapshot cnn = read_pytorch_pickle(kData / "cnn_train_stacks_all.pickle");
  CHECK(count(cnn, EventKind::annotation_begin) == count(cnn, EventKind::annotation_end));
  CHECK(count(cnn, EventKind::annotation_begin) > 0);
  const auto begin = std::find_if(cnn.events.begin(), cnn.events.end(),
                                  [](const Event& e) { return e.kind == EventKind::annotation_begin; });
  CHECK(cnn.strings[begin->aux] == "Optimizer.step#SGD.step");
  CHECK(cnn.settings.at("max_split_size") == "-1");
  CHECK(cnn.settings.at("expandable_segments") == "False");
  CHECK(cnn.settings.at("garbage_collection_threshold") == "0.0");
  CHECK(cnn.settings.at("roundup_power2_divisions.1024") == "0");
  for (std::size_t i = 1; i < cnn.events.size(); ++i) CHECK(cnn.events[i - 1].time_ns <= cnn.events[i].time_ns);
  CHECK(cnn.events.front().time_ns % 1000 == 0);

  const Snapshot varlen = read_pytorch_pickle(kData / "varlen_expandable_maxsplit.pickle");
  CHECK(varlen.settings.at("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True,max_split_size_mb:64");
  CHECK(count(varlen, EventKind::segment_map) == 92);
  CHECK(count(varlen, EventKind::segment_unmap) == 9);
  CHECK(std::all_of(varlen.segments.begin(), varlen.segments.end(), [](const Segment& g) { return g.expandable; }));
  REQUIRE(varlen.devices.size() == 1);
  CHECK(varlen.devices[0].index == 0);
}

TEST_CASE("PyTorch's round_size gives 512-byte multiples, or power-of-two divisions when configured") {
  std::array<std::uint64_t, 16> none{};
  CHECK(detail::pytorch_round_size(1, none) == 512);
  CHECK(detail::pytorch_round_size(512, none) == 512);
  CHECK(detail::pytorch_round_size(513, none) == 1024);
  CHECK(detail::pytorch_round_size(1228804, none) == 1229312);
  std::array<std::uint64_t, 16> four{};
  four.fill(4);
  // 1 MiB + 1 with 4 divisions of [1 MiB, 2 MiB): the next quarter, 1.25 MiB
  CHECK(detail::pytorch_round_size((1u << 20) + 1, four) == (5u << 18));
  CHECK(detail::pytorch_round_size(1u << 21, four) == (1u << 21));
  CHECK(detail::pytorch_round_size(1500, four) == 1536);  // not above 512 * divisions: 512-byte rounding
}

// --- load() -------------------------------------------------------------

TEST_CASE("load recognizes a PyTorch pickle by its content, whatever its name") {
  const std::filesystem::path renamed = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_pickle_renamed.snap";
  std::filesystem::copy_file(kData / "no_context.pickle", renamed, std::filesystem::copy_options::overwrite_existing);
  const Snapshot s = load(renamed);
  CHECK(s.header.source == "pytorch-pickle");
  CHECK(s == read_pytorch_pickle(kData / "no_context.pickle"));
  std::filesystem::remove(renamed);
}

TEST_CASE("load reads our own format by its magic") {
  const Snapshot pytorch = read_pytorch_pickle(kData / "gru_python_stacks.pickle");
  const std::filesystem::path ours = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_pickle_ours.pickle";
  write_snapshot(pytorch, ours);
  Snapshot back = load(ours);
  back.header.format_version = 0;
  CHECK(back == pytorch);
  std::filesystem::remove(ours);
}

TEST_CASE("load rejects a file that is neither format with not_a_snapshot naming both") {
  const std::filesystem::path text = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_pickle_text.txt";
  std::ofstream(text) << "hello, world\n";
  try {
    load(text);
    FAIL("accepted");
  } catch (const SnapshotError& error) {
    CHECK(error.code() == ErrorCode::not_a_snapshot);
    CHECK(std::string(error.what()).find("not a cachealloc snapshot or PyTorch memory snapshot") != std::string::npos);
  }
  std::filesystem::remove(text);
  CHECK_THROWS_AS(load(std::filesystem::path("/nonexistent/file.pickle")), SnapshotError);
}

// --- hostile input --------------------------------------------------------

TEST_CASE("opcodes that would import or call code are rejected by name") {
  std::string message;
  // GLOBAL 'os system' then REDUCE: the classic payload
  CHECK(error_of(bytes_of("\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00ls\x85R."s), &message) ==
        ErrorCode::unsupported);
  CHECK(message.find("GLOBAL") != std::string::npos);
  CHECK(error_of(bytes_of(kProto4 + "]\x94)R."), &message) == ErrorCode::unsupported);
  CHECK(message.find("REDUCE") != std::string::npos);
  CHECK(error_of(bytes_of(kProto4 + "\x8c\x02os\x8c\x06system\x93."), &message) == ErrorCode::unsupported);
  CHECK(message.find("STACK_GLOBAL") != std::string::npos);
  for (const char op : {'b', 'i', 'o', 'P', 'Q', '\x81', '\x92', '\x82'}) {
    CHECK(error_of(bytes_of(kProto4 + "}" + std::string(1, op) + "."), &message) == ErrorCode::unsupported);
    CHECK(message.find("never executes") != std::string::npos);
  }
}

TEST_CASE("a reference to a memo entry never stored is a bad pickle") {
  std::string message;
  CHECK(error_of(bytes_of(kProto4 + "h\x05."), &message) == ErrorCode::inconsistent);
  CHECK(message.find("memo index 5") != std::string::npos);
  CHECK(error_of(bytes_of(kProto4 + "j\xff\xff\xff\x7f."), &message) == ErrorCode::inconsistent);
}

TEST_CASE("every prefix of a real pickle is a truncated pickle") {
  const std::vector<std::byte> whole = file_bytes(kData / "no_context.pickle");
  REQUIRE(whole.size() > 1000);
  for (std::size_t length = 0; length < whole.size(); ++length) {
    CAPTURE(length);
    const ErrorCode code = error_of(std::vector<std::byte>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(length)));
    CHECK(code == ErrorCode::truncated);
  }
}

TEST_CASE("100k nested lists are rejected as too deep, whichever way they nest") {
  std::string message;
  // EMPTY_LIST x 100k then APPEND x 100k: the stack would hold them all
  CHECK(error_of(bytes_of(kProto4 + std::string(100000, ']') + std::string(99999, 'a') + "."), &message) ==
        ErrorCode::inconsistent);
  CHECK(message.find("nesting") != std::string::npos);
  // MARK x 100k then LIST x 100k
  CHECK(error_of(bytes_of(kProto4 + std::string(100000, '(') + std::string(100000, 'l') + "."), &message) ==
        ErrorCode::inconsistent);
  CHECK(message.find("nesting") != std::string::npos);
}

TEST_CASE("a chain nested 100k deep through the memo costs no recursion") {
  // Given a = [b], b = [c], ... built with a bounded stack (BINGET the last
  // list, append a new one to it, append it to the root again), under 'segments'
  std::string body = kProto4 + "}\x94\x8c\x08segments]\x94";  // memo 0: dict, 1: root list
  body += "]\x94" "a";                                       // memo 2: the first link, in the root
  for (std::uint32_t i = 2; i < 100002; ++i) {
    body += "j";  // LONG_BINGET the last link
    for (int b = 0; b < 4; ++b) body += static_cast<char>((i >> (8 * b)) & 0xff);
    body += "]\x94" "aa";  // a new link inside it; the last link back into the root
  }
  body += "s.";
  // When it is read, Then the mapper says what is wrong without walking the chain
  std::string message;
  CHECK(error_of(bytes_of(body), &message) == ErrorCode::inconsistent);
  CHECK(message.find("segment 0") != std::string::npos);
}

TEST_CASE("a container that contains itself is harmless") {
  // {'segments': [], 'allocator_settings': d} where d['self'] = d
  const std::string body = kProto4 + "}\x94(\x8c\x08segments]\x8c\x12" "allocator_settings}\x94\x8c\x04selfh\x01su.";
  const Snapshot s = decode_pytorch_pickle(bytes_of(body));
  CHECK(s.segments.empty());
}

TEST_CASE("huge declared lengths are checked against the bytes left before allocating") {
  std::string message;
  CHECK(error_of(bytes_of(kProto4 + "\x8d" + "\x00\x00\x00\x00\x00\x00\x00\x10"s + "x."), &message) ==
        ErrorCode::truncated);
  CHECK(message.find("BINUNICODE8") != std::string::npos);
  CHECK(error_of(bytes_of(kProto4 + "X\xff\xff\xff\xff" "abc.")) == ErrorCode::truncated);
  CHECK(error_of(bytes_of(kProto4 + "\x8b\xff\xff\xff\x7f" "abc.")) == ErrorCode::truncated);
  CHECK(error_of(bytes_of(kProto4 + "\x8b\xff\xff\xff\xff" "abc.")) == ErrorCode::inconsistent);  // negative LONG4
  CHECK(error_of(bytes_of(kProto4 + "\x95" + std::string(8, '\xff') + "}.")) == ErrorCode::truncated);
  CHECK(error_of(bytes_of(kProto4 + "\x8e" + std::string(8, '\x7f') + ".")) == ErrorCode::truncated);
}

TEST_CASE("a container referenced many times cannot multiply the model past the file's size") {
  // Given one segment referenced 2000 times whose blocks list references one block 2000 times
  std::string body = kProto4 + "}\x94\x8c\x08segments]\x94(" + "}\x94(\x8c\x07" "address" "K\x00\x8c\x0atotal_size" "K\x00\x8c\x06" "blocks"s +
         "]\x94(" + "}\x94(\x8c\x07" "address" "K\x00\x8c\x04size" "K\x00\x8c\x05state\x8c\x08inactiveu"s;
  for (int i = 1; i < 2000; ++i) body += "h\x04";  // the block: memo 4
  body += "eu";                                    // close blocks, close the segment dict
  for (int i = 1; i < 2000; ++i) body += "h\x02";  // the segment: memo 2
  body += "es.";
  REQUIRE(body.size() < 20000);
  // When it is read (4 million blocks from 16 KB)
  std::string message;
  // Then it is refused with a message, not built
  CHECK(error_of(bytes_of(body), &message) == ErrorCode::inconsistent);
  CHECK(message.find("more blocks than the file has bytes") != std::string::npos);
}

TEST_CASE("protocols outside 2 to 5 and roots that are no snapshot are told apart") {
  CHECK(error_of(bytes_of("\x80\x06}."s)) == ErrorCode::newer_version);
  CHECK(error_of(bytes_of("(dp0\n.")) == ErrorCode::not_a_snapshot);
  CHECK(error_of(bytes_of(kProto4 + "K\x01.")) == ErrorCode::not_a_snapshot);  // an int
  CHECK(error_of(bytes_of(kProto4 + "}\x94.")) == ErrorCode::not_a_snapshot);
  // A list is torch.cuda.memory_snapshot()'s segments; [] is a device with none.
  const Snapshot empty = decode_pytorch_pickle(bytes_of(kProto4 + "]\x94."));
  CHECK(empty.segments.empty());
  CHECK(empty.settings.at(kSegmentsOnlySetting) == "true");
  std::string message;
  CHECK(error_of(bytes_of(kProto4 + "\x8c\x08segmentsa."), &message) == ErrorCode::inconsistent);  // APPEND to a str
  CHECK(error_of(bytes_of(kProto4 + "e.")) == ErrorCode::inconsistent);                           // APPENDS, no MARK
  CHECK(error_of(bytes_of(kProto4 + "(a.")) == ErrorCode::inconsistent);                          // APPEND below a MARK
  CHECK(error_of(bytes_of(kProto4 + "0.")) == ErrorCode::unsupported);                            // POP
  CHECK(error_of(bytes_of(kProto4 + "\xff.")) == ErrorCode::unsupported);                         // no such opcode
}

TEST_CASE("a field of the wrong type or an unknown block state is a bad snapshot, not a crash") {
  std::string message;
  // {'segments': [{'address': 'x'}]}
  CHECK(error_of(bytes_of(kProto4 + "}\x8c\x08segments](}(\x8c\x07" "address\x8c\x01xu" "es."), &message) ==
        ErrorCode::inconsistent);
  CHECK(message.find("'address'") != std::string::npos);
  // a block state PyTorch does not have
  CHECK(error_of(bytes_of(kProto4 + "}\x8c\x08segments](}(\x8c\x06" "blocks](}(\x8c\x05state\x8c\x03" "oddu" "eu" "es."),
                 &message) == ErrorCode::inconsistent);
  CHECK(message.find("unknown state 'odd'") != std::string::npos);
  // an address of 2^64: a 9-byte LONG1 that does not fit
  CHECK(error_of(bytes_of(kProto4 + "}\x8c\x08segments](}(\x8c\x07" "address\x8a\x09" + std::string(8, '\0') + "\x01u" "es."),
                 &message) == ErrorCode::inconsistent);
  CHECK(message.find("out of range") != std::string::npos);
}

TEST_CASE("9-byte LONG1 values up to 2^64 - 1 are read exactly") {
  // {'segments': [{'address': 2^64 - 512, 'total_size': 0}]}
  const std::string address = "\x8a\x09" + "\x00\xfe"s + std::string(6, '\xff') + std::string(1, '\0');
  const Snapshot s = decode_pytorch_pickle(
      bytes_of(kProto4 + "}\x8c\x08segments](}(\x8c\x07" "address" + address + "\x8c\x0atotal_size" "K\x00u" "es."s));
  REQUIRE(s.segments.size() == 1);
  CHECK(s.segments[0].address == 0xfffffffffffffe00ull);
}

TEST_CASE("100k devices sharing one big trace entry cost time linear in the file") {
  // Given device_traces = [L] * 100000 where L = [one alloc entry padded with 5000 extra keys]
  std::string entry = "}\x94(\x8c\x06" "action\x8c\x05" "alloc\x8c\x04" "addrK\x00\x8c\x04sizeK\x01\x8c\x07time_usK\x00"s;
  for (int i = 0; i < 5000; ++i) {
    std::string key = "k";
    key += std::to_string(10000 + i);
    entry += '\x8c';
    entry += static_cast<char>(key.size());
    entry += key;
    entry += 'N';
  }
  entry += "u";
  std::string body = kProto4 + "}\x94(\x8c\x08segments]\x8c\x0d" "device_traces](" + "]\x94(" + entry + "e";  // L is memo 1
  for (int i = 1; i < 100000; ++i) body += (i % 1000 == 0 ? "e(h\x01" : "h\x01");  // batches of 1000, as Python's
  body += "eu.";
  // When it is read
  const Snapshot s = decode_pytorch_pickle(bytes_of(body));
  // Then every device has its event, with no quadratic merge or lookup on the way
  CHECK(s.events.size() == 100000);
  CHECK(s.devices.size() == 100000);
  CHECK(s.events.back().device == 99999);
  CHECK(s.events.back().size == 512);
}

// --- shapes the reader stores compactly -------------------------------------

namespace {
// SHORT_BINUNICODE of `text`, and small ints, for hand-written pickles.
std::string str8(const std::string& text) { return "\x8c"s + static_cast<char>(text.size()) + text; }
std::string int1(int value) { return "K"s + static_cast<char>(value); }
std::string int2(int value) { return "M"s + static_cast<char>(value & 0xff) + static_cast<char>(value >> 8); }
}  // namespace

TEST_CASE("a trace entry or frame list changed after it was built reads as Python would build it") {
  for (const bool trace_is_also_annotations : {false, true}) {
    CAPTURE(trace_is_also_annotations);
    // Given a trace of one entry E = {'action': 'alloc', 'addr': 512, 'size': 64, 'time_us': 5, 'frames': F},
    // F = [{'name': 'f', 'line': 1}], and later in the file E['extra'] = 'x', E['size'] = 1024 and
    // F.append({'name': 'g'}); in one variant the trace list is also the root's 'external_annotations'
    std::string body = kProto4 + "}\x94"s;                              // memo 0: the root
    body += str8("segments") + "]s";
    body += str8("device_traces") + "]" + "]\x94"s;                     // the device list; memo 1: the trace
    body += "}\x94("s;                                                  // memo 2: E
    body += str8("action") + str8("alloc") + str8("addr") + int2(512) + str8("size") + int1(64) + str8("time_us") + int1(5);
    body += str8("frames") + "]\x94"s + "}(" + str8("name") + str8("f") + str8("line") + int1(1) + "ua";  // memo 3: F
    body += "u" "a" "a" "s";                                            // E done, in the trace, in the device list
    body += str8("later") + "h\x02"s + str8("extra") + str8("x") + "s" + str8("size") + int2(1024) + "ss";
    body += str8("more") + "h\x03"s + "}(" + str8("name") + str8("g") + "ua" + "s";
    if (trace_is_also_annotations) body += str8("external_annotations") + "h\x01"s + "s";
    body += ".";
    // When it is read
    const Snapshot s = decode_pytorch_pickle(bytes_of(body));
    // Then the event has the final size and the final frames
    REQUIRE(s.events.size() == 1);
    CHECK(s.events[0].kind == EventKind::alloc);
    CHECK(s.events[0].address == 512);
    CHECK(s.events[0].aux == 1024);
    REQUIRE(s.events[0].stack);
    const Stack& stack = s.stacks[s.events[0].stack.value];
    REQUIRE(stack.frames.size() == 2);
    CHECK(s.strings[s.frames[stack.frames[0].value].function.value] == "f");
    CHECK(s.strings[s.frames[stack.frames[1].value].function.value] == "g");
    // and a trace read again as annotations is still there to read (its entry has no 'stage')
    if (trace_is_also_annotations) CHECK(s.settings.at("pytorch_skipped_records") == "1");
  }
}

TEST_CASE("trace entries that share frame dicts through the memo share one stack") {
  // Given three entries whose frame lists are fresh lists of the same memoized frame dicts, as PyTorch writes them
  std::string body = kProto4 + "}\x94"s + str8("segments") + "]s" + str8("device_traces") + "]]\x94("s;  // memo 1: the trace
  const std::string frame_a = "}\x94(" + str8("name") + str8("a") + str8("filename") + str8("x.py") + str8("line") + int1(3) + "u";
  for (int i = 0; i < 3; ++i) {
    body += "}\x94(" + str8("action") + str8(i == 0 ? "alloc" : i == 1 ? "free_requested" : "free_completed") +
            str8("addr") + int2(512) + str8("size") + int1(64) + str8("time_us") + int1(5 + i) +
            str8("compile_context") + str8("N/A") + "\x94" + str8("frames") + "]\x94(";
    body += i == 0 ? frame_a : "h\x05"s;  // the first entry memoizes the frame dict (memo 5), the others BINGET it
    body += "eu";
  }
  body += "eas.";
  // When it is read
  const Snapshot s = decode_pytorch_pickle(bytes_of(body));
  // Then every event names the same stack of one frame
  REQUIRE(s.events.size() == 3);
  CHECK(s.events[0].stack);
  CHECK(s.events[1].stack == s.events[0].stack);
  CHECK(s.events[2].stack == s.events[0].stack);
  CHECK(s.stacks.size() == 2);
  CHECK(s.frames.size() == 2);
  CHECK(s.events[2].kind == EventKind::free_completed);
  CHECK(s.events[2].size == 512);  // the allocation's block size
}
