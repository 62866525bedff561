// Every class of hostile input, replayed from the files kept in
// testdata/hostile/ (made by testdata/hostile/make_hostile.py) and from
// endless inputs made on the spot: cachealloc-analyze either refuses the input
// with exit 2 and one line naming the problem (expected.tsv holds the line's
// end), or, for text it can show, prints it with every control character
// spelled out and JSON and CSV in valid UTF-8. Endless input ends within
// seconds in bounded memory.
#include <doctest/doctest.h>

#include "child_process.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "cachealloc/snapshot/text.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace fs = std::filesystem;
namespace snapshot = cachealloc::snapshot;
namespace analyzer = cachealloc::analyzer;

namespace {

const fs::path kAnalyze = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-analyze";
const fs::path kHostile = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "hostile";

using Run = test_support::ChildRun;

fs::path scratch() { return test_support::scratch_folder("hostile"); }

using test_support::slurp;

// Runs `args` (args[0] a path; "/bin/sh" runs a script) with `env` added.
Run run(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
  return test_support::run_child(std::move(args), scratch(), {"/dev/null", {}, env});
}

Run analyze(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kAnalyze.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

// `script` through /bin/sh, with $A the analyzer.
Run shell(const std::string& script, const std::vector<std::string>& env = {}) {
  std::vector<std::string> with = env;
  with.push_back("A=" + kAnalyze.string());
  return run({"/bin/sh", "-c", script}, with);
}

struct Expectation {
  int code = 0;
  std::string message;  // the end of the one stderr line, after "cannot read FILE: "
};

std::map<std::string, Expectation> expectations() {
  std::map<std::string, Expectation> out;
  std::ifstream in(kHostile / "expected.tsv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    REQUIRE(tab2 != std::string::npos);
    out[line.substr(0, tab1)] = Expectation{std::stoi(line.substr(tab1 + 1, tab2 - tab1 - 1)), line.substr(tab2 + 1)};
  }
  return out;
}

// No character of a terminal's control set but the line ends (CSV's are CR
// LF): no NUL, ESC, BEL, DEL, no CR of the file's, and no C1 character
// (U+0080-U+009F: CSI U+009B, NEL U+0085), which UTF-8 writes C2 80-C2 9F.
bool printable_table(std::string text) {
  for (std::size_t at; (at = text.find("\r\n")) != std::string::npos;) text.erase(at, 1);
  for (std::size_t at = 0; (at = text.find('\xc2', at)) != std::string::npos; ++at) {
    if (at + 1 < text.size() && static_cast<unsigned char>(text[at + 1]) < 0xa0) return false;
  }
  return std::none_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\n') || u == 0x7f;
  });
}

// expected.tsv's message for a file read with exit 0 is text the top table
// shows, or, starting with "note: ", the note a stream without its trailer
// prints on stderr.
bool is_note(const Expectation& expected) { return expected.message.starts_with("note: "); }
std::string expected_note(const std::string& path, const Expectation& expected) {
  return is_note(expected) ? "cachealloc-analyze: note: " + path + ": " + expected.message.substr(6) + "\n" : "";
}

const std::vector<std::string> kReports = {"summary", "segments", "fragmentation", "timeline", "peak",
                                           "top",     "leaks",    "oom",           "events"};

}  // namespace

TEST_CASE("every hostile file in testdata/hostile has an expectation, and every expectation a file") {
  // Given the folder and its expected.tsv
  const auto expected = expectations();
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kHostile)) {
    const std::string name = entry.path().filename().string();
    if (name == "expected.tsv" || name == "make_hostile.py" || name == "README.md") continue;
    ++files;
    CAPTURE(name);
    CHECK(expected.count(name) == 1);
  }
  // Then they match one for one, and each failure class is there
  CHECK(files == expected.size());
  for (const char* prefix : {"invalid_utf8", "control_chars", "wrapped_totals", "overlapping", "wrapping_segment",
                             "block_outside", "blocks_short", "truncated_v6", "reserved_flag_bit_v6",
                             "reference_before_block_v6", "implausible", "bomb", "control_chars_c1",
                             "truncated_mid_chunk_v7", "bad_crc_v7", "bad_crc_last_chunk_v7", "chunk_past_end_v7",
                             "chunk_size_wraps_v7", "zero_events_chunk_v7", "zero_length_chunk_v7",
                             "huge_raw_size_v7", "raw_size_lie_v7"}) {
    CHECK(std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.first.starts_with(prefix); }));
  }
}

TEST_CASE("given a hostile file, every report refuses it with exit 2 and the same one line, or shows it safely") {
  for (const auto& [name, expected] : expectations()) {
    const std::string path = (kHostile / name).string();
    CAPTURE(name);
    for (const std::string& report : kReports) {
      for (const char* format : {"table", "json", "csv"}) {
        // CSV of a report of several tables needs --table; those of one suffice here.
        if (std::string(format) == "csv" && report != "timeline" && report != "events") continue;
        CAPTURE(report);
        const std::string format_name = format;
        CAPTURE(format_name);
        // When it is analyzed
        const Run r = analyze({report, path, "--format", std::string(format)});
        // Then the exit code is the expected one
        CHECK(r.code == expected.code);
        if (expected.code == 2) {
          // and stderr is one line naming the input and the problem, stdout empty
          CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
          CHECK(r.err == "cachealloc-analyze: error: cannot read " + path + ": " + expected.message + "\n");
          CHECK(printable_table(r.err));
          CHECK(r.out.empty());
        } else {
          // or the output is well formed: valid UTF-8, no control character,
          // stderr empty but for a stream's note on its missing trailer
          CHECK(r.err == expected_note(path, expected));
          CHECK(snapshot::invalid_utf8_bytes(r.out) == 0);
          CHECK(printable_table(r.out));
          if (!expected.message.empty() && !is_note(expected) && std::string(format) == "table" && report == "top")
            CHECK(r.out.find(expected.message) != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("the library refuses the hostile files as the command line does: a SnapshotError, never a crash") {
  for (const auto& [name, expected] : expectations()) {
    CAPTURE(name);
    if (expected.code != 2) continue;
    CHECK_THROWS_AS(snapshot::load(kHostile / name), snapshot::SnapshotError);
  }
}

// The subcommands that write their own text (not a rendered report), each
// with the arguments that make it write.
const std::vector<std::vector<std::string>> kWriters = {
    {"flamegraph"},      {"flamegraph", "--collapsed"}, {"export", "--what", "sites"},
    {"export", "--what", "sites", "--format", "json"},  {"export", "--what", "events"},
    {"export", "--what", "perfetto"},                   {"html"},
    {"convert", "-o", "-", "--to-format", "pickle"},    {"check", "--max-peak-reserved", "1T"}};

TEST_CASE("given a refused file, no subcommand writes anything to stdout before its error") {
  for (const auto& [name, expected] : expectations()) {
    if (expected.code != 2) continue;
    const std::string path = (kHostile / name).string();
    CAPTURE(name);
    for (std::vector<std::string> args : kWriters) {
      args.insert(args.begin() + 1, path);
      std::string line;
      for (const std::string& a : args) line += a + " ";
      CAPTURE(line);
      // When it is refused
      const Run r = analyze(args);
      // Then stdout is empty, and stderr the one line
      CHECK(r.code == 2);
      CHECK(r.out.empty());
      CHECK(r.err == "cachealloc-analyze: error: cannot read " + path + ": " + expected.message + "\n");
    }
  }
}

TEST_CASE("given a stream that lost its trailer, a command that then fails prints its error line alone; one that "
          "succeeds prints the note") {
  const std::string path = (kHostile / "truncated_mid_chunk_v7.bin").string();
  // When a command reads it and then fails (an event past the last)
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"summary", path, "--from", "999999"}, {"segments", path, "--at", "99999"}}) {
    std::string line;
    for (const std::string& a : args) line += a + " ";
    CAPTURE(line);
    const Run r = analyze(args);
    // Then stderr is the one error line, without the note before it
    CHECK(r.code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.starts_with("cachealloc-analyze: error: "));
  }
  // And a command that succeeds says the file ended early, after its report
  const Run ok = analyze({"summary", path});
  CHECK(ok.code == 0);
  CHECK(ok.err.find("cachealloc-analyze: note: " + path + ": the recording ended without its trailer") == 0);
}

TEST_CASE("given control characters in frame names, collapsed stacks, CSV, JSON and the Perfetto trace spell them out") {
  for (const auto& [name, expected] : expectations()) {
    if (expected.code != 0) continue;
    const std::string path = (kHostile / name).string();
    CAPTURE(name);
    for (std::vector<std::string> args : kWriters) {
      if (args[0] == "html" || args[0] == "convert") continue;  // a page's script and a pickle carry their own encodings
      args.insert(args.begin() + 1, path);
      std::string line;
      for (const std::string& a : args) line += a + " ";
      CAPTURE(line);
      // When it is written
      const Run r = analyze(args);
      // Then no control character of the file reaches the output
      CHECK((r.code == 0 || (args[0] == "check" && r.code == 3)));  // check: 3 when a budget is unconfirmed
      CHECK(r.err == expected_note(path, expected));
      CHECK(snapshot::invalid_utf8_bytes(r.out) == 0);
      CHECK(printable_table(r.out));
    }
  }
  // and the collapsed stacks and CSV show each one as the tables do
  const std::string c1 = (kHostile / "control_chars_c1.pickle").string();
  const std::string spelled = "c1\\x00\\x1b\\x07\\x7f\\xc2\\x9b\\xc2\\x85step";
  CHECK(analyze({"flamegraph", c1, "--collapsed"}).out.find(spelled) != std::string::npos);
  CHECK(analyze({"export", c1, "--what", "sites"}).out.find(spelled) != std::string::npos);
  CHECK(analyze({"top", c1}).out.find(spelled) != std::string::npos);
  // and JSON keeps the value, escaped
  CHECK(analyze({"export", c1, "--what", "sites", "--format", "json"}).out.find("c1\\u0000\\u001b\\u0007\\u007f\\u009b\\u0085step") !=
        std::string::npos);
}

TEST_CASE("given a decompression bomb, every subcommand refuses it within 1 s and 150 MiB, unless --max-inflate allows it") {
  const double seconds = kSanitized ? 30 : 1;
  const long max_rss_kib = kSanitized ? 1 << 20 : 150 << 10;
  const std::string good = (fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata" / "small_step.bin").string();
  std::vector<std::vector<std::string>> commands;
  for (const std::string& report : kReports) commands.push_back({report});
  for (const std::vector<std::string>& writer : kWriters) commands.push_back(writer);
  for (const char* other : {"recommend", "replay", "diff", "ranks"}) commands.push_back({other});
  for (const char* bomb : {"bomb.pickle.zst", "bomb.pickle.gz"}) {
    const std::string path = (kHostile / bomb).string();
    const Expectation expected = expectations().at(bomb);
    CAPTURE(path);
    for (std::vector<std::string> args : commands) {
      args.insert(args.begin() + 1, path);
      if (args[0] == "diff") args.push_back(good);
      std::string line;
      for (const std::string& a : args) line += a + " ";
      CAPTURE(line);
      // When it is read
      const Run r = analyze(args);
      // Then it is refused quickly, in bounded memory, with one line
      CHECK(r.code == 2);
      CHECK(r.out.empty());
      CHECK(r.err == "cachealloc-analyze: error: cannot read " + path + ": " + expected.message + "\n");
      CHECK(r.seconds < seconds);
      CHECK(r.max_rss_kib < max_rss_kib);
      if (args[0] == "summary") MESSAGE(std::string(bomb) << ": " << r.seconds << " s, " << r.max_rss_kib / 1024 << " MiB");
    }
    // and --max-inflate 0 lifts the bound: the stream limit then stops it
    const Run lifted = shell("exec \"$A\" summary --max-inflate 0 " + path, {"CACHEALLOC_MAX_STREAM_BYTES=67108864"});
    CHECK(lifted.code == 2);
    CHECK(lifted.err.find("goes on past 67108864 bytes") != std::string::npos);
  }
  // A real compressed snapshot (about 22:1) reads under the default bound
  const std::string real = (fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "long" / "long_ring_overflow.pickle.zst").string();
  CHECK(analyze({"summary", real}).code == 0);
  // and a bound below its ratio refuses it, naming the flag
  const Run strict = analyze({"summary", real, "--max-inflate", "4"});
  CHECK(strict.code == 2);
  CHECK(strict.err.find("--max-inflate") != std::string::npos);
}

TEST_CASE("given endless input, the analyzer ends within seconds with one line and exit 2, in bounded memory") {
  const double seconds = kSanitized ? 60 : 5;
  const long max_rss_kib = kSanitized ? 1 << 20 : 150 << 10;
  struct Case {
    std::string what;
    std::string script;
    std::string message;  // the end of the line
    std::vector<std::string> env;
  };
  const std::vector<Case> cases = {
      {"/dev/zero as the file", "exec \"$A\" /dev/zero",
       "cannot read /dev/zero: not a cachealloc snapshot or PyTorch memory snapshot (it starts with 00 00 00 00)", {}},
      {"yes on standard input", "yes | \"$A\" -",
       "cannot read standard input: not a cachealloc snapshot or PyTorch memory snapshot (it starts with 79 0a 79 0a)", {}},
      {"our magic and endless zeros", "(printf '\\211CASNAP\\n'; cat /dev/zero) | \"$A\" -",
       "cannot read standard input: inconsistent snapshot: more bytes follow the 0-byte body the header announces", {}},
      {"our framing announcing 2^62 bytes, then zeros",
       "(printf '\\211CASNAP\\n\\005\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\0\\100'; cat /dev/zero) | \"$A\" -",
       "cannot read standard input: the header announces a body of 4611686018427387904 bytes, more than the "
       "67108864 bytes a stream may hold; read it from a file",
       {"CACHEALLOC_MAX_STREAM_BYTES=67108864"}},
      {"a pickle's PROTO, then endless opcodes", "(printf '\\200\\004'; yes N | tr -d '\\n') | \"$A\" -",
       "cannot read standard input: the stream goes on past 67108864 bytes (half this machine's memory, or "
       "CACHEALLOC_MAX_STREAM_BYTES) without ending; read it from a file",
       {"CACHEALLOC_MAX_STREAM_BYTES=67108864"}},
      {"gzip of a pickle's PROTO and endless zeros, with no bound on inflation",
       "(printf '\\200\\004'; cat /dev/zero) | gzip -1 | \"$A\" - --max-inflate 0",
       "cannot read standard input: the gzip-compressed stream goes on past 67108864 bytes (half this machine's "
       "memory, or CACHEALLOC_MAX_STREAM_BYTES) without ending; read it from a file",
       {"CACHEALLOC_MAX_STREAM_BYTES=67108864"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    // When the analyzer reads it
    const Run r = shell(c.script, c.env);
    // Then it stops with exit 2 and one line, quickly and in bounded memory
    CHECK(r.code == 2);
    CHECK(r.err == "cachealloc-analyze: error: " + c.message + "\n");
    CHECK(r.seconds < seconds);
    CHECK(r.max_rss_kib < max_rss_kib);
    MESSAGE(c.what << ": " << r.seconds << " s, " << r.max_rss_kib / 1024 << " MiB");
  }
}

TEST_CASE("random corruptions of every format version and of PyTorch pickles: every report refuses or prints well-formed output") {
  // Given the golden files of format versions 1-7, a recorder file and two PyTorch pickles
  const fs::path data = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata";
  const std::vector<fs::path> inputs = {data / "format_versions" / "v1.bin", data / "format_versions" / "v2.bin",
                                        data / "format_versions" / "v3.bin", data / "format_versions" / "v4.bin",
                                        data / "format_versions" / "v5.bin", data / "format_versions" / "v6.bin",
                                        data / "format_versions" / "v7.bin", data / "synthetic_2k_nostacks.bin",
                                        data / "pytorch" / "no_context.pickle", data / "pytorch" / "corpus" / "oom_retry.pickle"};
  const int kCorruptions = kSanitized ? 60 : 300;
  using Report = analyzer::Document (*)(const snapshot::Snapshot&, const analyzer::ReportOptions&);
  const std::vector<Report> reports = {analyzer::summary_report, analyzer::segments_report, analyzer::fragmentation_report,
                                       analyzer::timeline_report, analyzer::peak_report, analyzer::top_report,
                                       analyzer::leaks_report, analyzer::oom_report, analyzer::events_report};
  std::mt19937 random(18);
  std::size_t refused = 0, read = 0, reports_refused = 0, reports_printed = 0;
  for (const fs::path& input : inputs) {
    const std::string original = slurp(input);
    REQUIRE(!original.empty());
    for (int round = 0; round < kCorruptions; ++round) {
      // When 1 to 8 bytes are overwritten (or the file is cut short, one round in 8)
      std::string bytes = original;
      if (round % 8 == 7) {
        bytes.resize(random() % bytes.size());
      } else {
        for (unsigned f = 0, n = 1 + random() % 8; f < n; ++f) bytes[random() % bytes.size()] = static_cast<char>(random());
      }
      const std::span<const std::byte> view(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
      snapshot::Snapshot s;
      try {
        s = snapshot::load(view);
      } catch (const snapshot::SnapshotError& error) {
        // Then it is refused with one printable line
        CHECK(snapshot::printable(error.what()).find('\n') == std::string::npos);
        ++refused;
        continue;
      }
      ++read;
      // or every report refuses it (an impossible replay) or renders valid UTF-8
      for (const Report report : reports) {
        try {
          const analyzer::Document document = report(s, analyzer::ReportOptions{});
          for (const analyzer::Format format : {analyzer::Format::table, analyzer::Format::json}) {
            std::ostringstream out;
            analyzer::render(document, format, out);
            CHECK(snapshot::invalid_utf8_bytes(out.str()) == 0);
            if (format == analyzer::Format::table) CHECK(printable_table(out.str()));
          }
          ++reports_printed;
        } catch (const snapshot::SnapshotError& error) {
          CHECK(std::string(error.what()).find("impossible state") != std::string::npos);
          ++reports_refused;
        }
      }
    }
  }
  MESSAGE(inputs.size() << " inputs x " << kCorruptions << " corruptions: " << refused << " refused by the reader, "
                        << read << " read; of their " << read * reports.size() << " reports " << reports_printed
                        << " printed, " << reports_refused << " refused (impossible state)");
  CHECK(refused + read == inputs.size() * kCorruptions);
}

TEST_CASE("given a hostile file as diff's A or B, or among ranks' files, it is refused with the same one line, or shown safely") {
  const std::string good = (fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata" / "small_step.bin").string();
  for (const auto& [name, expected] : expectations()) {
    const std::string path = (kHostile / name).string();
    CAPTURE(name);
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"diff", path, good}, {"diff", good, path, "--format", "json"}, {"ranks", path}, {"ranks", good, path, "--format", "jsonl"}}) {
      std::string line;
      for (const std::string& a : args) line += a + " ";
      CAPTURE(line);
      const Run r = analyze(args);
      // ranks goes on with the files it can read: the hostile one is one
      // line on stderr and a row marked unreadable
      const bool skipped = args[0] == "ranks" && args.size() > 2 && expected.code == 2;
      CHECK(r.code == (skipped ? 0 : expected.code));
      if (skipped) {
        CHECK(r.err == "cachealloc-analyze: ranks: skipped: cannot read " + path + ": " + expected.message + "\n");
        CHECK(r.out.find("\"error\":\"cannot read ") != std::string::npos);
        CHECK(snapshot::invalid_utf8_bytes(r.out) == 0);
      } else if (expected.code == 2) {
        CHECK(r.err == "cachealloc-analyze: error: cannot read " + path + ": " + expected.message + "\n");
        CHECK(r.out.empty());
      } else {
        if (!is_note(expected)) CHECK(r.err.empty());
        CHECK(snapshot::invalid_utf8_bytes(r.out) == 0);
        CHECK(printable_table(r.out));
      }
    }
  }
}

TEST_CASE("given a hostile stream, the analyzer ends within a second in bounded memory, whatever its chunks declare") {
  // Given each damaged streamed recording (format version 7)
  const long max_rss_kib = kSanitized ? 1 << 20 : 64 << 10;
  std::size_t streams = 0;
  for (const auto& [name, expected] : expectations()) {
    if (!name.ends_with("_v7.bin")) continue;
    ++streams;
    CAPTURE(name);
    // When it is summarized
    const Run r = analyze({"summary", (kHostile / name).string()});
    // Then it is refused or read to its last good chunk, quickly, without
    // allocating what a chunk header claims
    CHECK(r.code == expected.code);
    CHECK(r.seconds < (kSanitized ? 30 : 1));
    CHECK(r.max_rss_kib < max_rss_kib);
  }
  CHECK(streams >= 10);
}
