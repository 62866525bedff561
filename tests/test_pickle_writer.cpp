// The PyTorch pickle writer: what it writes our reader reads back to the same
// layout and events, Python's pickle.load reads it, and the events PyTorch has
// no action for are left out or moved where PyTorch keeps them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "cachealloc/snapshot/pickle.hpp"

using namespace cachealloc::snapshot;

namespace {

const std::filesystem::path kData = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";
constexpr std::uint64_t MiB = 1ull << 20;

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::path(CACHEALLOC_BINARY_DIR) / ("test_pickle_writer_" + name);
}

// Builds a snapshot the way a recorder would, interning as it goes.
struct Builder {
  Snapshot s;
  StringId text(const std::string& value) {
    for (std::uint32_t i = 1; i < s.strings.size(); ++i) {
      if (s.strings[i] == value) return StringId{i};
    }
    s.strings.push_back(value);
    return StringId{static_cast<std::uint32_t>(s.strings.size() - 1)};
  }
  StackId stack(std::vector<std::tuple<std::string, std::uint32_t, std::string>> frames) {
    Stack st;
    for (const auto& [file, line, function] : frames) {
      s.frames.push_back(Frame{0, text(function), text(file), line, StringId{}});
      st.frames.push_back(FrameId{static_cast<std::uint32_t>(s.frames.size() - 1)});
    }
    s.stacks.push_back(st);
    return StackId{static_cast<std::uint32_t>(s.stacks.size() - 1)};
  }
  void event(EventKind kind, std::int32_t device, std::uint64_t time_us, std::uint64_t address, std::uint64_t size,
             std::uint64_t aux = 0, StackId stack = {}, std::uint64_t stream = 0) {
    Event e;
    e.kind = kind;
    e.device = device;
    e.time_ns = time_us * 1000;
    e.address = address;
    e.size = size;
    e.aux = aux;
    e.stack = stack;
    e.stream = stream;
    s.events.push_back(e);
  }
};

// What a stack means, independent of table order.
std::vector<std::tuple<std::string, std::uint32_t, std::string>> frames_of(const Snapshot& s, StackId id) {
  std::vector<std::tuple<std::string, std::uint32_t, std::string>> out;
  for (const FrameId f : s.stacks[id.value].frames) {
    const Frame& frame = s.frames[f.value];
    out.emplace_back(s.strings[frame.file.value], frame.line, s.strings[frame.function.value]);
  }
  return out;
}

bool has_pytorch_action(EventKind kind) {
  return kind != EventKind::split && kind != EventKind::merge && kind != EventKind::empty_cache &&
         kind != EventKind::annotation_begin && kind != EventKind::annotation_end;
}

// Two devices, both pools, a pending free, a segment release, expandable
// mapping, an OOM, a snapshot marker, annotations and the kinds PyTorch lacks.
Snapshot sample() {
  Builder b;
  const StackId train = b.stack({{"train.py", 12, "step"}, {"train.py", 40, "<module>"}});
  const StackId eval = b.stack({{"eval.py", 7, "run"}});
  const std::uint64_t small = 0x7f0000000000, large = 0x7f0010000000, other = 0x7f0100000000, big = 0x7f0200000000;
  b.event(EventKind::annotation_begin, 0, 100, 0, 0, b.text("epoch 1").value);
  b.event(EventKind::segment_alloc, 0, 101, small, 2 * MiB, 0, train);
  b.event(EventKind::alloc, 0, 102, small, 1024, 1000, train);
  b.event(EventKind::split, 0, 102, small, 1024, 2 * MiB - 1024);
  b.event(EventKind::alloc, 0, 103, small + 1024, 512, 8, eval);
  b.event(EventKind::segment_alloc, 0, 104, large, 20 * MiB, segment_flag_large_pool, train);
  b.event(EventKind::alloc, 0, 105, large, 3 * MiB, 3 * MiB - 100, train, 7);
  b.event(EventKind::free_requested, 0, 106, large, 3 * MiB, 3 * MiB - 100, train, 7);
  b.event(EventKind::free_completed, 0, 107, large, 3 * MiB, 3 * MiB - 100, train, 7);
  b.event(EventKind::merge, 0, 107, large, 20 * MiB, 3 * MiB);
  b.event(EventKind::alloc, 0, 108, large, 5 * MiB, 5 * MiB, eval, 7);
  b.event(EventKind::free_requested, 0, 109, large, 5 * MiB, 5 * MiB, eval, 7);  // pending at dump
  b.event(EventKind::segment_alloc, 1, 110, other, 20 * MiB, segment_flag_large_pool);
  b.event(EventKind::segment_release, 1, 111, other, 20 * MiB);
  b.event(EventKind::empty_cache, 1, 111, 0, 20 * MiB);
  b.event(EventKind::segment_map, 1, 112, big, 4 * MiB, 0, eval);
  b.event(EventKind::alloc, 1, 113, big, 2 * MiB, 2 * MiB - 3, eval);
  b.event(EventKind::segment_unmap, 1, 114, big + 2 * MiB, 2 * MiB);
  b.event(EventKind::oom, 1, 115, 12345 * MiB, 80000 * MiB);
  b.event(EventKind::snapshot, 0, 116, 0, 0);
  b.event(EventKind::annotation_end, 0, 117, 0, 0, b.text("epoch 1").value);

  Segment s0{0, 0, small, 2 * MiB, false, false, train, {}};
  s0.blocks = {Block{small, 1024, 1000, BlockState::active_allocated, train},
               Block{small + 1024, 512, 8, BlockState::active_allocated, eval},
               Block{small + 1536, 2 * MiB - 1536, 0, BlockState::inactive, {}}};
  Segment s1{0, 7, large, 20 * MiB, true, false, train, {}};
  s1.blocks = {Block{large, 5 * MiB, 5 * MiB, BlockState::active_pending_free, eval},
               Block{large + 5 * MiB, 15 * MiB, 0, BlockState::inactive, {}}};
  Segment s2{1, 0, big, 2 * MiB, true, true, StackId{}, {}};
  s2.blocks = {Block{big, 2 * MiB, 2 * MiB - 3, BlockState::active_allocated, eval}};
  b.s.segments = {s0, s1, s2};
  DeviceInfo second;
  second.index = 1;
  b.s.devices = {DeviceInfo{}, second};
  b.s.settings = {{"max_split_size", "-1"},
                  {"expandable_segments", "False"},
                  {"garbage_collection_threshold", "0.0"},
                  {"PYTORCH_CUDA_ALLOC_CONF", ""},
                  {"roundup_power2_divisions.1", "0"},
                  {"roundup_power2_divisions.2", "0"}};
  b.s.header.source = "cachealloc";
  return b.s;
}

std::string run_python(const std::string& script, const std::filesystem::path& pickle) {
  const std::filesystem::path out = temp_path("python.txt");
  const std::string command = "python3 -c \"" + script + "\" '" + pickle.string() + "' > '" + out.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(out);
  return status == 0 ? text : "failed: " + text;
}

bool have_python() { return std::system("python3 -c 'import pickle' > /dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("a snapshot written as a pickle reads back to the same layout and the same PyTorch events") {
  // Given a snapshot with every kind of event
  const Snapshot original = sample();
  // When it goes through our pickle and back through our reader
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(original));
  // Then the layout is the same, stacks compared by their frames
  REQUIRE(back.segments.size() == original.segments.size());
  for (std::size_t i = 0; i < original.segments.size(); ++i) {
    const Segment& a = original.segments[i];
    const Segment& b = back.segments[i];
    CAPTURE(i);
    CHECK(std::tie(a.device, a.stream, a.address, a.total_size, a.large_pool, a.expandable) ==
          std::tie(b.device, b.stream, b.address, b.total_size, b.large_pool, b.expandable));
    CHECK(frames_of(original, a.stack) == frames_of(back, b.stack));
    REQUIRE(a.blocks.size() == b.blocks.size());
    for (std::size_t k = 0; k < a.blocks.size(); ++k) {
      CHECK(std::tie(a.blocks[k].address, a.blocks[k].size, a.blocks[k].requested, a.blocks[k].state) ==
            std::tie(b.blocks[k].address, b.blocks[k].size, b.blocks[k].requested, b.blocks[k].state));
      CHECK(frames_of(original, a.blocks[k].stack) == frames_of(back, b.blocks[k].stack));
    }
  }
  // and the events PyTorch has come back in order, with block sizes and requests
  std::vector<Event> expected;
  for (const Event& e : original.events) {
    if (has_pytorch_action(e.kind) || e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end)
      expected.push_back(e);
  }
  REQUIRE(back.events.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Event& a = expected[i];
    const Event& b = back.events[i];
    CAPTURE(i);
    CHECK(std::tie(a.kind, a.device, a.time_ns, a.stream, a.address, a.size) ==
          std::tie(b.kind, b.device, b.time_ns, b.stream, b.address, b.size));
    if (a.kind == EventKind::annotation_begin || a.kind == EventKind::annotation_end) {
      CHECK(original.strings[a.aux] == back.strings[b.aux]);
    } else if (a.kind == EventKind::segment_map) {
      // PyTorch's trace names no pool for a map; the reader supplies the flags.
      CHECK((b.aux & segment_flag_expandable) != 0);
      CHECK(frames_of(original, a.stack) == frames_of(back, b.stack));
    } else {
      CHECK(a.aux == b.aux);
      CHECK(frames_of(original, a.stack) == frames_of(back, b.stack));
    }
  }
  // The reader says how it found the block sizes; ours follow PyTorch's
  // policy, so every one is exact.
  auto settings = back.settings;
  CHECK(settings["block_sizes.inferred"] == "0");
  CHECK(settings["block_sizes.contradicted"] == "0");
  std::erase_if(settings, [](const auto& kv) { return kv.first.starts_with("block_sizes."); });
  CHECK(settings == original.settings);
}

TEST_CASE("a native frame comes back with its own name and file; its address and module are named as lost") {
  // Given a recording whose block and event share a native stack: one frame
  // with a module and no file, one unresolved (an address and a module only)
  Snapshot original = sample();
  const auto text = [&](const std::string& value) {
    original.strings.push_back(value);
    return StringId{static_cast<std::uint32_t>(original.strings.size() - 1)};
  };
  const StringId module = text("libtrain.so");
  original.frames.push_back(Frame{0x400040, text("train_step"), StringId{}, 14, module});
  original.frames.push_back(Frame{0x400050, StringId{}, StringId{}, 0, module});
  original.frames.push_back(Frame{0x400060, text("main"), text("model.py"), 15, text("python")});
  const auto last = static_cast<std::uint32_t>(original.frames.size());
  original.stacks.push_back(Stack{{FrameId{last - 3}, FrameId{last - 2}, FrameId{last - 1}}});
  const StackId native{static_cast<std::uint32_t>(original.stacks.size() - 1)};
  original.segments[0].blocks[0].stack = native;
  original.events[2].stack = native;  // its alloc
  // When it is written as a pickle and read back
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(original));
  // Then the frames are the recording's: no module in place of the file, no
  // address in place of the name
  const std::vector<std::tuple<std::string, std::uint32_t, std::string>> expected = {
      {"", 14, "train_step"}, {"", 0, ""}, {"model.py", 15, "main"}};
  CHECK(frames_of(back, back.segments[0].blocks[0].stack) == expected);
  CHECK(frames_of(back, back.events[2].stack) == expected);
  // and convert names what PyTorch's frames have no place for
  const std::vector<std::string> losses = pickle_conversion_losses(original);
  CHECK(std::count(losses.begin(), losses.end(), "the instruction address and module of 3 native frame(s)") == 1);
  for (const std::string& loss : pickle_conversion_losses(sample())) CHECK(!loss.starts_with("the instruction address"));
}

TEST_CASE("the count of records the pickle reader skipped stays in our format and is a named loss in a pickle") {
  // Given a snapshot as the reader leaves it after skipping 2 records of
  // actions it does not know
  Snapshot original = sample();
  original.settings[kSkippedRecordsSetting] = "2";
  // When it is written in our format, then the count comes back
  CHECK(decode(encode(original)).settings.at(kSkippedRecordsSetting) == "2");
  // When it is written as a pickle, then the count is not passed off as an
  // allocator setting, and convert names it among its losses
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(original));
  CHECK(back.settings.count(kSkippedRecordsSetting) == 0);
  const std::vector<std::string> losses = pickle_conversion_losses(original);
  CHECK(std::count(losses.begin(), losses.end(), "the count of trace records skipped when the pickle was read (2)") == 1);
}

TEST_CASE("a trace entry with no stack is written as Python writes it, and is read whole") {
  // Given a snapshot whose events carry no stack (the frees of a recording)
  Snapshot original = sample();
  std::size_t entries = 0;
  for (Event& e : original.events) {
    e.stack = StackId{};
    if (has_pytorch_action(e.kind)) ++entries;
  }
  REQUIRE(entries > 0);
  // When it is written and read back on one thread
  detail::PickleReadStats stats;
  detail::PickleReadOptions options;
  options.threads = 1;
  options.stats = &stats;
  const std::vector<std::byte> bytes = encode_pytorch_pickle(original);
  const Snapshot back = detail::decode_pytorch_pickle(bytes, options);
  // Then each frames value is a memoized fresh [] (EMPTY_LIST MEMOIZE, as
  // Python's pickler memoizes every list), so the reader takes every entry
  // in one step rather than one opcode at a time (a bare [] in two entries
  // of three made a 3M-event trace read one by one, and slowly on threads).
  // Two go one by one for another reason: the first entry, where the keys
  // are written out, and the OOM, where 'device_free' is.
  CHECK(stats.entries_read_whole == entries - 2);
  CHECK(back.events.size() >= entries);
  for (const Event& e : back.events) CHECK(!e.stack);
}

TEST_CASE("split, merge and empty_cache are left out; annotations go to external_annotations") {
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(sample()));
  for (const Event& e : back.events) {
    CHECK(e.kind != EventKind::split);
    CHECK(e.kind != EventKind::merge);
    CHECK(e.kind != EventKind::empty_cache);
  }
  CHECK(back.header.source == "pytorch-pickle");
}

TEST_CASE("a real PyTorch snapshot survives our writer unchanged") {
  for (const std::string name : {"cnn_train_stacks_all", "gru_python_stacks", "ring_overflow", "no_context",
                                 "varlen_expandable_maxsplit"}) {
    CAPTURE(name);
    // Given a snapshot read from PyTorch's pickle
    const Snapshot read = read_pytorch_pickle(kData / (name + ".pickle"));
    // When we write it as a pickle and read that
    const std::filesystem::path path = temp_path(name + ".pickle");
    write_pytorch_pickle(read, path);
    // Then nothing changed, tables included
    CHECK(load(path) == read);
    std::filesystem::remove(path);
  }
}

TEST_CASE("a PyTorch snapshot without allocator_settings is written without them") {
  // Given a real snapshot whose pickle holds no allocator_settings
  const Snapshot read = read_pytorch_pickle(kData / "corpus_no_settings.pickle");
  REQUIRE(read.settings.at("block_sizes.policy") == "defaults (no allocator_settings)");
  // When we write it as a pickle and read that
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(read));
  // Then its settings are still unknown, and nothing else changed either
  CHECK(back.settings.at("block_sizes.policy") == "defaults (no allocator_settings)");
  CHECK(back == read);
}

TEST_CASE("Python's pickle.load reads what we write, as PyTorch's viewer would") {
  if (!have_python()) {
    MESSAGE("python3 not found: skipped");
    return;
  }
  // Given our pickle of a real snapshot and of the sample
  const Snapshot cnn = read_pytorch_pickle(kData / "cnn_train_stacks_all.pickle");
  const std::filesystem::path path = temp_path("python.pickle");
  write_pytorch_pickle(cnn, path);
  // When Python loads it
  const std::string script =
      "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); s=d['segments']; t=d['device_traces'];"
      "print(len(s), sum(x['total_size'] for x in s),"
      " sum(b['size'] for x in s for b in x['blocks'] if b['state']=='active_allocated'),"
      " len(t), len(t[0]), len(d['external_annotations']), d['allocator_settings']['max_split_size'],"
      " s[0]['segment_pool_id'], type(d['allocator_settings']['expandable_segments']).__name__)";
  // Then it sees PyTorch's own figures
  CHECK(run_python(script, path) ==
        std::to_string(cnn.segments.size()) + " 790626304 74532864 1 667 " +
            std::to_string(std::count_if(cnn.events.begin(), cnn.events.end(),
                                         [](const Event& e) {
                                           return e.kind == EventKind::annotation_begin ||
                                                  e.kind == EventKind::annotation_end;
                                         })) +
            " -1 (0, 0) bool\n");

  write_pytorch_pickle(sample(), path);
  const std::string sample_script =
      "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); t=d['device_traces'];"
      "print([len(x) for x in t], [e['action'] for e in t[1]], t[1][-1].get('device_free'),"
      " d['external_annotations'][0]['stage'], d['segments'][1]['blocks'][0]['state'])";
  CHECK(run_python(sample_script, path) ==
        "[10, 6] ['segment_alloc', 'segment_free', 'segment_map', 'alloc', 'segment_unmap', 'oom'] " +
            std::to_string(12345 * MiB) + " START active_pending_free\n");
  std::filesystem::remove(path);
}

TEST_CASE("addresses of 2^63 and above are written as 9-byte LONG1 and read back exactly") {
  Snapshot s;
  s.segments = {Segment{0, ~std::uint64_t{0}, 0xffffffffffe00000ull, MiB, true, false, StackId{}, {}}};
  s.segments[0].blocks = {Block{0xffffffffffe00000ull, MiB, 0, BlockState::inactive, {}}};
  const std::vector<std::byte> bytes = encode_pytorch_pickle(s);
  const Snapshot back = decode_pytorch_pickle(bytes);
  REQUIRE(back.segments.size() == 1);
  CHECK(back.segments[0].address == 0xffffffffffe00000ull);
  CHECK(back.segments[0].stream == ~std::uint64_t{0});  // written as int64 -1, as PyTorch writes streams
  if (have_python()) {
    const std::filesystem::path path = temp_path("big.pickle");
    write_pytorch_pickle(s, path);
    CHECK(run_python("import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); print(d['segments'][0]['address'])",
                     path) == "18446744073707454464\n");
    std::filesystem::remove(path);
  }
}

TEST_CASE("an expandable segment with an unmapped hole is written as one segment per mapped run") {
  Snapshot s;
  const std::uint64_t base = 0x10000000;
  s.segments = {Segment{0, 0, base, 6 * MiB, true, true, StackId{}, {}}};
  s.segments[0].blocks = {Block{base, 2 * MiB, 0, BlockState::inactive, {}},
                          Block{base + 2 * MiB, 2 * MiB, 0, BlockState::unmapped, {}},
                          Block{base + 4 * MiB, 2 * MiB, 2 * MiB, BlockState::active_allocated, {}}};
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(s));
  REQUIRE(back.segments.size() == 2);
  CHECK(back.segments[0].address == base);
  CHECK(back.segments[0].total_size == 2 * MiB);
  CHECK(back.segments[1].address == base + 4 * MiB);
  CHECK(back.segments[1].blocks[0].state == BlockState::active_allocated);
}

TEST_CASE("a snapshot that fails validation is not written") {
  Snapshot s;
  s.events.push_back(Event{EventKind::alloc, 0, 0, StackId{99}, 0, 0, 0, 512, 1});
  CHECK_THROWS_AS(encode_pytorch_pickle(s), SnapshotError);
  const std::filesystem::path path = temp_path("invalid.pickle");
  CHECK_THROWS_AS(write_pytorch_pickle(s, path), SnapshotError);
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("annotations whose times go back are read in an order that a pickle written from them keeps") {
  if (!have_python()) {
    MESSAGE("python3 not found: skipped");
    return;
  }
  // Given a pickle whose annotations go back in time (an END at 50 us after a
  // START at 100 us, as a fuzz_convert input had), at the microsecond of a
  // trace entry, where the reader raises them
  const std::filesystem::path path = temp_path("back_in_time.pickle");
  const std::string script =
      "import pickle,sys; A=0x7f0000000000; M=2<<20;"
      "e=lambda a,addr,size,t: {'action':a,'addr':addr,'size':size,'stream':0,'time_us':t,'frames':[]};"
      "n=lambda st,name,t: {'stage':st,'name':name,'device':0,'time_us':t};"
      "d={'segments':[],'device_traces':[[e('segment_alloc',A,M,100),e('alloc',A,512,101),"
      "e('free_requested',A,512,102),e('free_completed',A,512,102),e('segment_free',A,M,103)]],"
      "'external_annotations':[n('START','a',100),n('END','a',50),n('START','b',60),n('END','b',101)]};"
      "pickle.dump(d,open(sys.argv[1],'wb'),protocol=4); print('ok')";
  REQUIRE(run_python(script, path) == "ok\n");
  const Snapshot read = read_pytorch_pickle(path);
  std::filesystem::remove(path);
  // When it is written as a pickle and read again
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(read));
  // Then the events come back in the same order, at the same times
  REQUIRE(back.events.size() == read.events.size());
  for (std::size_t i = 0; i < read.events.size(); ++i) {
    CAPTURE(i);
    CHECK(back.events[i].kind == read.events[i].kind);
    CHECK(back.events[i].time_ns == read.events[i].time_ns);
  }
}

TEST_CASE("a setting whose name has more dots than the reader nests dicts comes back whole") {
  // Given a setting of five dotted parts (a fuzz_convert finding: written as
  // five nested dicts, it lay past the depth the reader flattens)
  Snapshot s;
  s.settings["a.b.c.roundup_power2_divisions.1ld"] = "0.0";
  s.settings["x.y"] = "1";
  // When it goes through our pickle and back
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(s));
  // Then both settings are there, as they were
  REQUIRE(back.settings.count("a.b.c.roundup_power2_divisions.1ld") == 1);
  CHECK(back.settings.at("a.b.c.roundup_power2_divisions.1ld") == "0.0");
  CHECK(back.settings.at("x.y") == "1");
}

TEST_CASE("an expandable segment with no blocks is written, not dropped") {
  // Given an expandable segment of 0 bytes with no blocks (a fuzz_convert
  // finding: a pickle without its total_size and blocks keys reads so, and
  // the writer kept only an expandable segment's mapped runs, of which it has none)
  Snapshot s;
  s.segments.push_back(Segment{});
  s.segments[0].address = 0x7f0000000000;
  s.segments[0].expandable = true;
  s.segments[0].large_pool = true;
  // When it goes through our pickle and back
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(s));
  // Then it is still there, as it was
  REQUIRE(back.segments.size() == 1);
  CHECK(back.segments[0].address == s.segments[0].address);
  CHECK(back.segments[0].expandable);
  CHECK(back.segments[0].total_size == 0);
  CHECK(back.segments[0].blocks.empty());
}

TEST_CASE("a segment on a negative device is refused, not written as a pickle PyTorch's reader refuses") {
  // Given a segment on device -2147483648 (a fuzz_convert finding: the
  // writer wrote it, and reading it back failed)
  Snapshot s;
  s.segments.push_back(Segment{});
  s.segments[0].device = std::numeric_limits<std::int32_t>::min();
  s.segments[0].address = 0x7f0000000000;
  s.segments[0].total_size = 2 << 20;
  s.segments[0].blocks.push_back(Block{0x7f0000000000, 2 << 20, 0, BlockState::inactive, StackId{}});
  // Then the writer refuses it in one line naming the segment
  try {
    (void)encode_pytorch_pickle(s);
    FAIL("wrote a segment on a negative device");
  } catch (const SnapshotError& error) {
    CHECK(std::string(error.what()).find("segment 0 is on device -2147483648") != std::string::npos);
  }
}

TEST_CASE("a recording's allocator settings are written as PyTorch 2.11's allocator_settings, and read back as such") {
  // Given a snapshot of ours: the recorder keeps its canonical CACHEALLOC_CONF pairs
  Snapshot s = sample();
  s.settings = {{"config", "max_split_size_mb:40,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"},
                {"max_split_size_mb", "40"},
                {"roundup_power2_divisions", "[1:0,2:0,4:0,8:0,16:0,32:0,64:0,128:0,256:1,512:2,1024:4,2048:8,"
                                             "4096:8,8192:8,16384:8,32768:8]"},
                {"device.backend", "simulated"}};
  // When written as a pickle and read back
  const Snapshot back = decode_pytorch_pickle(encode_pytorch_pickle(s));
  // Then PyTorch's names hold the parsed values, which the block sizes and the what-if replay read
  CHECK(back.settings.at("PYTORCH_CUDA_ALLOC_CONF") == s.settings.at("config"));
  CHECK(back.settings.at("max_split_size") == std::to_string(40 * MiB));
  CHECK(back.settings.at("expandable_segments") == "False");
  CHECK(back.settings.at("garbage_collection_threshold") == "0.0");
  CHECK(back.settings.at("roundup_power2_divisions.128") == "0");
  CHECK(back.settings.at("roundup_power2_divisions.512") == "2");
  CHECK(back.settings.at("roundup_power2_divisions.32768") == "8");
  CHECK(back.settings.count("roundup_power2_divisions") == 0);
  CHECK(back.settings.at("device.backend") == "simulated");
  // and Python sees the shape PyTorch writes: integers, a nested dict of divisions
  if (have_python()) {
    const std::filesystem::path path = temp_path("settings.pickle");
    write_pytorch_pickle(s, path);
    CHECK(run_python("import pickle,sys; a=pickle.load(open(sys.argv[1],'rb'))['allocator_settings'];"
                     " print(a['max_split_size'], a['expandable_segments'], a['roundup_power2_divisions']['1024'])",
                     path) == std::to_string(40 * MiB) + " False 4\n");
    std::filesystem::remove(path);
  }
  // A PyTorch snapshot's own settings are written as they are
  Snapshot pytorch = sample();
  CHECK(decode_pytorch_pickle(encode_pytorch_pickle(pytorch)).settings.count("config") == 0);
}

TEST_CASE("a segment_alloc whose pool its size does not imply is a named loss in a pickle") {
  // Given the sample, whose segments' pools follow from their sizes
  Snapshot original = sample();
  for (const std::string& loss : pickle_conversion_losses(original)) CHECK(!loss.starts_with("the pool flags of"));
  // When one segment_alloc of 2 MiB (a small-pool size) is flagged large pool
  // and expandable, and no segment of the final layout says so
  std::size_t flagged = 0;
  for (Event& e : original.events) {
    if (e.kind == EventKind::segment_alloc && e.size == 2 * MiB) {
      e.aux = segment_flag_large_pool | segment_flag_expandable;
      e.address += 64 * MiB;  // a segment released before the end
      ++flagged;
      break;
    }
  }
  REQUIRE(flagged == 1);
  // Then PyTorch's trace cannot carry the flags: convert names them
  const std::vector<std::string> losses = pickle_conversion_losses(original);
  CHECK(std::count(losses.begin(), losses.end(),
                   "the pool flags of 1 segment_alloc event(s) whose size and final layout do not imply them") == 1);
}
