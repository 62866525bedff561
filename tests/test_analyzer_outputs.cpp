// What cachealloc-analyze prints, end to end: figures a file cannot record
// read unknown (never 0), every device of a file is shown or named, every
// --format is honoured, CSV needs no --table, compressors we do not read
// are named with the command that undoes them, ranks goes on past an
// unreadable file, convert says what it drops and reads its output back.
// Runs the built executable; skipped when it has not been built.
#include <doctest/doctest.h>

#include "child_process.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../analyzer/testing/parsers.hpp"
#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "cachealloc/snapshot/pickle.hpp"

namespace fs = std::filesystem;
using cachealloc::analyzer::testing::Json;
using cachealloc::analyzer::testing::parse_json;

namespace {
bool is_null(const Json& j) { return std::holds_alternative<std::nullptr_t>(j.value); }
const std::string& text_of(const Json& j) { return std::get<std::string>(j.value); }
}  // namespace

namespace {

const fs::path kTool = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-analyze";
const fs::path kCorpus = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "corpus";
const fs::path kStreams = kCorpus / "streams.pickle";
const fs::path kOurs = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "synthetic_2k_native.bin";

using Result = test_support::ChildRun;

fs::path scratch() { return test_support::scratch_folder("outputs"); }

using test_support::slurp;

// `arguments` as a shell would split them (some hold redirections).
Result run(const std::string& arguments) {
  return test_support::run_child({"/bin/sh", "-c", kTool.string() + " " + arguments}, scratch());
}

bool tool_built() {
  if (fs::exists(kTool)) return true;
  MESSAGE("cachealloc-analyze is not built; skipping");
  return false;
}

std::size_t lines(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

// The value after `label` on its line of a table ("  split   unknown").
std::string table_value(const std::string& text, const std::string& label) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t at = line.find("  " + label + " ");
    if (at == std::string::npos || line.find_first_not_of(' ') != at + 2) continue;
    std::string rest = line.substr(at + 2 + label.size());
    rest.erase(0, rest.find_first_not_of(' '));
    return rest;
  }
  return "(no line " + label + ")";
}

// A PyTorch pickle of two devices: the streams corpus run on device 0 and a
// small run of our TraceBuilder on device 1 (12 MiB allocated of a 20 MiB
// segment), written by the pickle writer.
fs::path two_device_pickle() {
  const fs::path path = scratch() / "two_devices.pickle";
  if (fs::exists(path)) return path;
  cachealloc::snapshot::Snapshot both = cachealloc::snapshot::load(kStreams);
  cachealloc::analyzer::testing::TraceBuilder second(1);
  const std::uint64_t base = 0x7e0000000000ull;
  second.segment(base, 20ull << 20).alloc(base, 8ull << 20, 8ull << 20).alloc(base + (8ull << 20), 4ull << 20, 4ull << 20);
  second.alloc(base + (12ull << 20), 2ull << 20, 2ull << 20).free(base + (12ull << 20));
  const cachealloc::snapshot::Snapshot one = second.build();
  std::uint64_t last = both.events.empty() ? 0 : both.events.back().time_ns;
  for (cachealloc::snapshot::Event event : one.events) {
    event.time_ns = ++last;
    both.events.push_back(event);
  }
  for (const cachealloc::snapshot::Segment& segment : one.segments) both.segments.push_back(segment);
  cachealloc::snapshot::DeviceInfo device;
  device.index = 1;
  both.devices.push_back(device);
  cachealloc::snapshot::write_pytorch_pickle(both, path);
  return path;
}

}  // namespace

TEST_CASE("given a PyTorch pickle, the counts its trace cannot record are unknown, the others numbers") {
  if (!tool_built()) return;
  const Result table = run("summary " + kStreams.string());
  REQUIRE(table.code == 0);
  // PyTorch's TraceEntry has no split, merge or empty_cache action, and its ring counts no losses.
  CHECK(table_value(table.out, "split") == "unknown");
  CHECK(table_value(table.out, "merge") == "unknown");
  CHECK(table_value(table.out, "empty_cache") == "unknown");
  CHECK(table_value(table.out, "events lost to ring overflow") == "unknown");
  CHECK(table_value(table.out, "alloc") == "105");  // recorded: a number
  CHECK(table_value(table.out, "segment_release") == "0");
  const Json json = parse_json(run("summary --format json " + kStreams.string()).out);
  CHECK(is_null(json["events"]["split"]));
  CHECK(is_null(json["events"]["empty_cache"]));
  CHECK(is_null(json["dropped_events"]));
  CHECK(json["events"]["alloc"].number() == 105);
  const Result csv = run("summary --format csv " + kStreams.string());
  CHECK(csv.out.find("\nevents.split,,") != std::string::npos);
}

TEST_CASE("given our own format, the counts it records stay numbers") {
  if (!tool_built()) return;
  const Json json = parse_json(run("summary --format json " + kOurs.string()).out);
  CHECK_FALSE(is_null(json["events"]["split"]));
  CHECK_FALSE(is_null(json["events"]["merge"]));
  CHECK_FALSE(is_null(json["events"]["empty_cache"]));
  CHECK_FALSE(is_null(json["dropped_events"]));
}

TEST_CASE("given a figure a table cannot know, it reads unknown, never a dash") {
  if (!tool_built()) return;
  // The recorded run's retries: PyTorch's pickle holds none.
  const Result replay = run("replay " + kStreams.string());
  REQUIRE(replay.code == 0);
  CHECK(table_value(replay.out, "alloc_retries").rfind("unknown", 0) == 0);
  // A table says unknown, never JSON's null; and no cap is none, not unknown.
  CHECK(replay.out.find("(null)") == std::string::npos);
  CHECK(table_value(replay.out, "replay's cap") == "none");
  const Result recommend = run("recommend " + kStreams.string());
  REQUIRE(recommend.code == 0);
  CHECK(table_value(recommend.out, "capacity") == "none");
  CHECK(recommend.out.find("unknown  none") == std::string::npos);  // the ranking's headroom without a cap
  CHECK(recommend.out.find(" no cap ") != std::string::npos);
  CHECK(recommend.out.find("(null)") == std::string::npos);
}

TEST_CASE("given a pickle of two devices, ranks lists each and summary names the other") {
  if (!tool_built()) return;
  const fs::path both = two_device_pickle();
  const Json ranks = parse_json(run("ranks --format json " + both.string()).out);
  REQUIRE(ranks["ranks"].array().size() == 2);
  CHECK(ranks["ranks"].array()[0]["device"].number() == 0);
  CHECK(ranks["ranks"].array()[1]["device"].number() == 1);
  CHECK(ranks["ranks"].array()[1]["peak_allocated"].number() == 14.0 * (1 << 20));
  // The file's name carries no rank number: its rank is unknown in the fleet's
  // figures as in the table, and the note counts one file, not its devices.
  const Result table = run("ranks " + both.string());
  REQUIRE(table.code == 0);
  CHECK(table_value(table.out, "closest to OOM: rank") == "unknown");
  CHECK(table.out.find("  - 1 file name carries no rank number (rank_N, gpuN, deviceN): its rank is unknown") !=
        std::string::npos);
  CHECK(table.out.find("#position") == std::string::npos);
  const Result summary = run("summary " + both.string());
  REQUIRE(summary.code == 0);
  CHECK(summary.out.find("this shows device 0; the file also holds device 1: select one with --device 1") !=
        std::string::npos);
  const Json json = parse_json(run("summary --format json " + both.string()).out);
  CHECK(json["device"].number() == 0);
  const Json one = parse_json(run("summary --format json --device 1 " + both.string()).out);
  CHECK(one["device"].number() == 1);
  CHECK(one["allocated_at_end"].number() == 12.0 * (1 << 20));
}

TEST_CASE("given check --format json or csv, each budget's figure and verdict and the exit code come as data") {
  if (!tool_built()) return;
  const std::string file = (kCorpus / "varlen_transformer.pickle").string();
  const Result json = run("check " + file + " --max-peak-reserved 1K --max-leaked 1T --format json");
  CHECK(json.code == 1);
  const Json j = parse_json(json.out);
  CHECK(j["exit_code"].number() == 1);
  CHECK(text_of(j["verdict"]) == "exceeded");
  REQUIRE(j["budgets"].array().size() == 2);
  CHECK(text_of(j["budgets"].array()[0]["budget"]) == "peak_reserved");
  CHECK(j["budgets"].array()[0]["limit"].number() == 1024);
  CHECK(j["budgets"].array()[0]["figure"].number() > 1024);
  CHECK(std::get<bool>(j["budgets"].array()[0]["exceeded"].value));
  CHECK_FALSE(std::get<bool>(j["budgets"].array()[1]["exceeded"].value));
  const Result csv = run("check " + file + " --max-peak-reserved 1K --max-leaked 1T --format csv");
  CHECK(csv.code == 1);
  CHECK(csv.out.rfind("budget,unit,limit,figure,lower_bound,exceeded,unconfirmed\r\n", 0) == 0);
  CHECK(lines(csv.out) == 3);  // the header and one row per budget
  // The ring overflowed: a lower bound meets the budget, which stays unconfirmed (exit 3).
  const Result bound = run("check " + (kCorpus / "ring_overflow.pickle").string() + " --max-fragmentation 99% --format json");
  const Json b = parse_json(bound.out);
  CHECK(b["exit_code"].number() == bound.code);
}

TEST_CASE("given --format csv of a report of several tables without --table, its main table is written") {
  if (!tool_built()) return;
  const fs::path out = scratch() / "seg.csv";
  fs::remove(out);
  const Result segments = run("export --what segments " + kStreams.string() + " -o " + out.string());
  CHECK(segments.code == 0);
  CHECK(slurp(out).rfind("segment,address,offset,state,size,requested,site\r\n", 0) == 0);  // one row per block
  CHECK(segments.err.find("wrote the 'blocks' table; also: segments") != std::string::npos);
  const Result summary = run("summary --format csv " + kStreams.string());
  CHECK(summary.code == 0);
  CHECK(summary.out.rfind("key,value,lower_bound\r\n", 0) == 0);
  // --table still chooses.
  const Result peaks = run("summary --format csv --table peaks " + kStreams.string());
  CHECK(peaks.code == 0);
  CHECK(peaks.out.rfind("metric,bytes,event,time_ns,phase\r\n", 0) == 0);
}

TEST_CASE("given a file compressed by xz, bzip2 or lz4, one line names the compressor and how to decompress it") {
  if (!tool_built()) return;
  const fs::path dir = scratch();
  const std::vector<std::pair<std::string, std::string>> magics = {
      {std::string("\xfd" "7zXZ\0\0\x04", 8), "xz-compressed"},
      {std::string("BZh91AY&SY", 10), "bzip2-compressed"},
      {std::string("\x04\x22\x4d\x18\x64\x40", 6), "lz4-compressed"}};
  for (const auto& [magic, name] : magics) {
    CAPTURE(name);
    const fs::path file = dir / "compressed.pickle.x";
    std::ofstream(file, std::ios::binary) << magic << std::string(64, '\x5a');
    const Result r = run("summary " + file.string());
    CHECK(r.code == 2);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find(name) != std::string::npos);
    CHECK(r.err.find(" -d FILE") != std::string::npos);
  }
}

TEST_CASE("given ranks over files of which one is unreadable, the others are summarized and it is named") {
  if (!tool_built()) return;
  const fs::path dir = scratch() / "ranks";
  fs::create_directories(dir);
  fs::copy_file(kStreams, dir / "rank_0.pickle", fs::copy_options::overwrite_existing);
  fs::copy_file(kCorpus / "expandable.pickle", dir / "rank_1.pickle", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "rank_2.pickle") << "garbage, not a snapshot";
  const Result r = run("ranks --format json " + dir.string());
  CHECK(r.code == 0);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("rank_2.pickle") != std::string::npos);
  const Json j = parse_json(r.out);
  CHECK(j["rank_count"].number() == 2);
  CHECK(j["unreadable_files"].number() == 1);
  REQUIRE(j["ranks"].array().size() == 3);
  CHECK(is_null(j["ranks"].array()[2]["peak_reserved"]));
  const Result jsonl = run("ranks --format jsonl " + dir.string());
  CHECK(jsonl.code == 0);
  CHECK(lines(jsonl.out) == 3);
  CHECK(jsonl.out.find("\"error\":\"cannot read ") != std::string::npos);
  // None readable: exit 2, one line with the first file's reason.
  const fs::path bad = scratch() / "bad";
  fs::create_directories(bad);
  std::ofstream(bad / "rank_0.pickle") << "garbage";
  std::ofstream(bad / "rank_1.pickle") << "garbage";
  const Result none = run("ranks " + bad.string());
  CHECK(none.code == 2);
  CHECK(std::count(none.err.begin(), none.err.end(), '\n') == 1);
  CHECK(none.err.find("error: cannot read ") != std::string::npos);
  CHECK(none.err.find("(and the other 1 file(s) could not be read either)") != std::string::npos);
}

TEST_CASE("given convert from a pickle to our format, the losses are named and the output reads back") {
  if (!tool_built()) return;
  const fs::path out = scratch() / "streams.bin";
  fs::remove(out);
  const Result r = run("convert " + kStreams.string() + " -o " + out.string());
  CHECK(r.code == 0);
  CHECK(r.err.find("our format has no place for") != std::string::npos);
  CHECK(r.err.find("compile_context") != std::string::npos);
  CHECK(r.err.find("requested_size") != std::string::npos);
  const cachealloc::snapshot::Snapshot back = cachealloc::snapshot::load(out);
  CHECK(back.events.size() == cachealloc::snapshot::load(kStreams).events.size());
  // Back to a pickle, through stdout: read back in memory.
  const Result again = run("convert " + out.string() + " -o - --to-format pickle");
  CHECK(again.code == 0);
}

TEST_CASE("given a state ending between a free_requested and its free_completed with no stream use, no free is pending") {
  if (!tool_built()) return;
  // streams.pickle: #15 free_requested and #16 free_completed of one 64 MiB block, one call in PyTorch.
  const Json frag = parse_json(run("fragmentation --to 15 --format json " + kStreams.string()).out);
  CHECK(frag["pending_free"].number() == 0);
  CHECK(frag["requested"].number() <= frag["allocated"].number());
  const Json summary = parse_json(run("summary --at 15 --format json " + kStreams.string()).out);
  CHECK(summary["gap"]["pending_free"].number() == 0);
  CHECK(summary["at_event"].number() == 16);
  // A free that waited for another stream stays pending until its completion.
  const Json end = parse_json(run("summary --format json " + kStreams.string()).out);
  CHECK(end["gap"]["pending_free"].number() > 0);
}
