// The command-line convention of every executable in cli/, run
// end to end: for each case, the exit code and the exact first line of
// stderr. Also the bounds: a non-snapshot is refused within 1 s and 50 MB,
// and events --all-events streams in bounded memory.
#include <doctest/doctest.h>

#include "child_process.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

// Built with a sanitizer (dev.sh asan / tsan): the time and memory bounds
// are checked by the normal build only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace {

const fs::path kBin = fs::path(CACHEALLOC_BINARY_DIR) / "bin";
const fs::path kSource = CACHEALLOC_SOURCE_DIR;
const std::string kSample = (kSource / "analyzer" / "testdata" / "small_step.bin").string();
const std::string kAnalyze = "cachealloc-analyze";

using Run = test_support::ChildRun;

fs::path scratch() { return test_support::scratch_folder("conventions"); }

using test_support::slurp;

// Runs bin/`program` with `args` (no shell), stdin from `input` (or
// /dev/null), in `cwd`.
Run run(const std::string& program, const std::vector<std::string>& args, const std::string& input = "/dev/null",
        const fs::path& cwd = scratch()) {
  std::vector<std::string> argv{(kBin / program).string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return test_support::run_child(argv, scratch(), {input, cwd, {}});
}

struct Case {
  std::string program;
  std::vector<std::string> args;
  int code;
  std::string first_err_line;  // exact; "" = stderr is empty
};

void check(const Case& c) {
  std::string line = c.program;
  for (const std::string& a : c.args) line += " " + a;
  CAPTURE(line);
  const Run r = run(c.program, c.args);
  CHECK(r.code == c.code);
  CHECK(r.first_err_line() == c.first_err_line);
  if (c.code == 2) CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
}

bool have(const char* tool) { return std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0; }

const std::string kSubcommands = "summary, segments, fragmentation, timeline, peak, top, leaks, oom, events, export, convert";

}  // namespace

TEST_CASE("given a mistyped subcommand or option, the error names it and what was meant, exit 2") {
  const std::string E = "cachealloc-analyze: error: ";
  for (const Case& c : std::vector<Case>{
           {kAnalyze, {"sumary", kSample}, 2, E + "unknown subcommand 'sumary' (did you mean 'summary'?)"},
           {kAnalyze, {"stats", kSample}, 2, E + "unknown subcommand 'stats' (did you mean 'summary'?)"},
           {kAnalyze, {"leak", kSample}, 2, E + "unknown subcommand 'leak' (did you mean 'leaks'?)"},
           {kAnalyze, {"help"}, 2, E + "unknown subcommand 'help' (did you mean '--help'?)"},
           {kAnalyze, {"peak", kSample, "3", "--limt"}, 2, E + "unknown option '--limt' (did you mean '--limit'?)"},
           // peak's moment is --to; --at is the other reports' name for it, not a misspelt --all
           {kAnalyze, {"peak", kSample, "--at", "3"}, 2, E + "unknown option '--at' (did you mean '--to'?)"},
           {kAnalyze, {"peak", kSample, "3"}, 2, E + "unexpected argument '3' (see --help)"},
           {kAnalyze, {"summary", "peak", kSample}, 2, E + "one subcommand at a time: 'summary' and 'peak'"},
           {kAnalyze, {}, 2, E + "missing FILE (see --help)"},
           {kAnalyze, {"peak"}, 2, E + "missing FILE (see --help)"},
           {kAnalyze, {"peak", kSample, "--format", "xml"}, 2, E + "--format: 'xml' is not one of table, csv, json"},
           {kAnalyze, {"peak", kSample, "--format"}, 2, E + "--format needs a value"},
           {kAnalyze, {"top", kSample, "--by", "byte"}, 2, E + "--by: 'byte' is not one of bytes, count, peak (did you mean 'bytes'?)"},
           {kAnalyze, {"events", kSample, "--kind", "allocs"}, 2, E + "--kind: no event kind is named 'allocs' (did you mean 'alloc'?)"},
           {kAnalyze, {"export", kSample}, 2, E + "missing --what (see --help)"},
           {kAnalyze, {"summary", kSample, "--at", "3", "--to", "4"}, 2, E + "--to and --at cannot be used together"},
       })
    check(c);
  // A word close to no subcommand: the list of them (it grows, so only its start is held).
  const Run heatmap = run(kAnalyze, {"heatmap", kSample});
  CHECK(heatmap.code == 2);
  CHECK(heatmap.first_err_line().starts_with(E + "'heatmap' is neither a subcommand nor a file (subcommands: " + kSubcommands));
}

TEST_CASE("given FILE before SUBCOMMAND, as the usage line allows, the report is the same as SUBCOMMAND FILE") {
  const Run after = run(kAnalyze, {kSample, "peak"});
  const Run before = run(kAnalyze, {"peak", kSample});
  CHECK(after.code == 0);
  CHECK(after.out == before.out);
  CHECK(after.out.starts_with("peak allocated: "));
  // and with no subcommand, the summary
  CHECK(run(kAnalyze, {kSample}).out == run(kAnalyze, {"summary", kSample}).out);
  // and a flag before an option whose value names a subcommand ("--kind oom")
  // is a flag: it takes no value, so "oom" is --kind's, not a second subcommand
  const Run flag_first = run(kAnalyze, {"events", kSample, "--all-events", "--kind", "oom"});
  CHECK(flag_first.code == 0);
  CHECK(flag_first.out == run(kAnalyze, {"events", kSample, "--kind", "oom", "--all-events"}).out);
  // and an unknown option after a flag is still named
  const Run unknown = run(kAnalyze, {"summary", kSample, "-f", "--bogus"});
  CHECK(unknown.code == 2);
  CHECK(unknown.err.find("unknown option '--bogus'") != std::string::npos);
}

TEST_CASE("given --at or --to a time, the state is the one after every event at or before it") {
  // The sample's events are 1 us apart: #7 at 7 us, #8 at 8 us.
  const std::string at_index = run(kAnalyze, {"summary", kSample, "--at", "7"}).out;
  CHECK(at_index.find("after event #7") != std::string::npos);
  for (const char* time : {"7us", "7500ns", "0.0000079s"}) {
    CAPTURE(time);
    CHECK(run(kAnalyze, {"summary", kSample, "--at", time}).out == at_index);
    CHECK(run(kAnalyze, {"segments", kSample, "--at-time", time}).out ==
          run(kAnalyze, {"segments", kSample, "--at", "7"}).out);
    CHECK(run(kAnalyze, {"flamegraph", kSample, "--at", time, "--collapsed"}).out ==
          run(kAnalyze, {"flamegraph", kSample, "--at", "7", "--collapsed"}).out);
  }
  // and a window that ends at a time lists no event after it
  const std::string listed = run(kAnalyze, {"events", kSample, "--all-events", "--to", "7500ns"}).out;
  CHECK(listed.find("#7 ") != std::string::npos);
  CHECK(listed.find("#8 ") == std::string::npos);
}

TEST_CASE("given options that make no sense for the snapshot, each is refused naming the valid range") {
  const std::string E = "cachealloc-analyze: error: ";
  for (const Case& c : std::vector<Case>{
           {kAnalyze, {kSample, "--device", "1"}, 2, E + "--device 1: device 1 is not in this snapshot (devices: 0)"},
           {kAnalyze, {kSample, "--device", "-1"}, 2, E + "--device: '-1' is not a whole number from 0 to 65535"},
           {kAnalyze, {"summary", kSample, "--at", "3", "--from", "10"}, 2,
            E + "--from 10 is after --at 3 (--at must be at or after --from)"},
           {kAnalyze, {"summary", kSample, "--from", "10", "--to", "3"}, 2,
            E + "--from 10 is after --to 3 (--to must be at or after --from)"},
           {kAnalyze, {"segments", kSample, "--at", "3", "--from", "10"}, 2,
            E + "--at 3 (event #3) is before --from (event #10)"},
           {kAnalyze, {"segments", kSample, "--at", "500"}, 2, E + "--at 500 is past the last event (events #0 to #32)"},
           {kAnalyze, {"summary", kSample, "--at", "500"}, 2, E + "--at 500 is past the last event (events #0 to #32)"},
           {kAnalyze, {"flamegraph", kSample, "--at", "33"}, 2, E + "--at 33 is past the last event (events #0 to #32)"},
           {kAnalyze, {kSample, "--from", "99999"}, 2, E + "--from 99999 is past the last event (events #0 to #32)"},
           {kAnalyze, {kSample, "--from", "99s"}, 2, E + "--from 99s is past the last event (events #0 to #32)"},
           {kAnalyze, {kSample, "--from", "1h"}, 2,
            E + "--from: '1h' is neither an event index nor a time such as 1.5s, 200ms, 10us or 5ns"},
           {kAnalyze, {"timeline", kSample, "--buckets", "-3"}, 2, E + "--buckets: '-3' is not a whole number from 1 to 10000000"},
           {kAnalyze, {"timeline", kSample, "--buckets", "0"}, 2, E + "--buckets: '0' is not a whole number from 1 to 10000000"},
           {kAnalyze, {"fragmentation", kSample, "--buckets", "x"}, 2, E + "--buckets: 'x' is not a whole number from 1 to 100000"},
           {kAnalyze, {"peak", kSample, "--limit", "-2"}, 2, E + "--limit: '-2' is not a whole number from 0 to 1000000000000"},
           {kAnalyze, {"leaks", kSample, "--min-size", "-1M"}, 2,
            E + "--min-size: '-1M' is not a byte count (a number such as 2.5G or 2900M, with K, M, G or T)"},
           {kAnalyze, {"timeline", kSample, "--buckets", "5", "--all-events"}, 2, E + "--buckets and --all-events cannot be used together"},
           {kAnalyze, {"peak", kSample, "--table", "sites"}, 2, E + "--table sites: only with --format csv"},
           // NaN passes every range comparison: refused as 0, inf or 1e9 are, not a busy loop.
           {kAnalyze, {"summary", kSample, "--follow", "--follow-interval", "nan"}, 2,
            E + "--follow-interval: 'nan' is not a number from 0.01 to 3600"},
           {kAnalyze, {"summary", kSample, "--follow", "--follow-interval", "inf"}, 2,
            E + "--follow-interval: 'inf' is not a number from 0.01 to 3600"},
           {kAnalyze, {"summary", kSample, "--follow", "--follow-interval", "0"}, 2,
            E + "--follow-interval: '0' is not a number from 0.01 to 3600"},
           {kAnalyze, {"check", kSample, "--follow-interval", "2", "--max-leaked", "0"}, 2,
            E + "--follow-interval requires --follow"},
           {kAnalyze, {"replay", kSample, "--fraction", "nan"}, 2, E + "--fraction: 'nan' is not a number from 0 to 1"},
           {kAnalyze, {"replay", kSample, "--recorded-fraction", "nan"}, 2,
            E + "--recorded-fraction: 'nan' is not a number from 0 to 1"},
           {kAnalyze, {"recommend", kSample, "--fraction", "nan"}, 2, E + "--fraction: 'nan' is not a number from 0 to 1"},
           {kAnalyze, {"replay", kSample, "--fraction", "1.5"}, 2, E + "--fraction: '1.5' is not a number from 0 to 1"},
       })
    check(c);
}

TEST_CASE("given inputs that are not snapshots, each is refused within 1 s and 50 MB, with the reason") {
  const fs::path zeros = scratch() / "zeros-1g.bin";
  {
    std::ofstream file(zeros, std::ios::binary);
  }
  fs::resize_file(zeros, std::uintmax_t{1} << 30);  // a 1 GB file of zeros (sparse)
  const std::string E = "cachealloc-analyze: error: ";
  const std::string kNot = "not a cachealloc snapshot or PyTorch memory snapshot (it starts with ";
  struct Input {
    std::vector<std::string> args;
    std::string input;
    std::string first_line;  // "" = only its start is checked
  };
  for (const Input& in : std::vector<Input>{
           {{"/dev/zero"}, "/dev/null", E + "cannot read /dev/zero: " + kNot + "00 00 00 00)"},
           {{"/dev/urandom"}, "/dev/null", ""},
           {{zeros.string()}, "/dev/null", E + "cannot read " + zeros.string() + ": " + kNot + "00 00 00 00)"},
           {{"-"}, "/dev/zero", E + "cannot read standard input: " + kNot + "00 00 00 00)"},
           {{"/nonexistent/run.bin"}, "/dev/null", E + "cannot open snapshot /nonexistent/run.bin: No such file or directory"},
           {{"-"}, "/dev/null", E + "cannot read standard input: truncated snapshot: the input is empty"},
       }) {
    CAPTURE(in.args[0]);
    CAPTURE(in.input);
    const Run r = run(kAnalyze, in.args, in.input);
    CHECK(r.code == 2);
    if (!in.first_line.empty()) CHECK(r.first_err_line() == in.first_line);
    else CHECK(r.first_err_line().starts_with(E + "cannot read /dev/urandom: " + kNot));
    // The bounds hold for the normal build; under a sanitizer the runtime's
    // own shadow memory and checks make them meaningless.
    if (!kSanitized) {
      CHECK(r.seconds < 1.0);
      CHECK(r.max_rss_kib < 50 * 1024);
    }
    MESSAGE(in.args[0] << " < " << in.input << ": " << r.seconds << " s, " << r.max_rss_kib << " KiB peak RSS");
  }
  fs::remove(zeros);
}

TEST_CASE("given '-' or a compressed snapshot, the report is the one of the plain file") {
  const Run plain = run(kAnalyze, {"peak", kSample});
  const Run piped = run(kAnalyze, {"peak", "-"}, kSample);
  CHECK(piped.code == 0);
  CHECK(piped.out == plain.out);
  for (const char* tool : {"gzip", "zstd"}) {
    if (!have(tool)) continue;
    const fs::path packed = scratch() / (std::string("sample.") + tool);
    REQUIRE(std::system((std::string(tool) + " -c -q " + kSample + " > " + packed.string()).c_str()) == 0);
    const Run r = run(kAnalyze, {"peak", packed.string()});
    CHECK(r.code == 0);
    CHECK(r.out == plain.out);
    CHECK(run(kAnalyze, {"peak", "-"}, packed.string()).out == plain.out);
  }
}

TEST_CASE("given a segments-only PyTorch pickle, the summary says what it lacks") {
  const Run r = run(kAnalyze, {(kSource / "testdata" / "pytorch" / "segments_only" / "gru_python_stacks.pickle").string()});
  CHECK(r.code == 0);
  CHECK(r.out.find("a segments-only PyTorch snapshot (torch.cuda.memory_snapshot(), not _snapshot())") != std::string::npos);
}

TEST_CASE("given -o, an existing file is kept unless --force, - is stdout, and failures give the OS reason") {
  const std::string E = "cachealloc-analyze: error: ";
  const fs::path report = scratch() / "report.txt";
  fs::remove(report);
  CHECK(run(kAnalyze, {"peak", kSample, "-o", report.string()}).code == 0);
  const std::string first = slurp(report);
  CHECK(first.starts_with("peak allocated: "));
  check({kAnalyze, {"summary", kSample, "-o", report.string()}, 2,
         E + "-o " + report.string() + ": the file exists; add -f/--force to overwrite it"});
  CHECK(slurp(report) == first);  // untouched
  CHECK(run(kAnalyze, {"summary", kSample, "-o", report.string(), "--force"}).code == 0);
  CHECK(slurp(report).starts_with("summary: "));
  CHECK(run(kAnalyze, {"summary", kSample, "-o", report.string(), "-f"}).code == 0);

  const Run dash = run(kAnalyze, {"peak", kSample, "-o", "-"});
  CHECK(dash.code == 0);
  CHECK(dash.out == first);
  CHECK_FALSE(fs::exists(scratch() / "-"));

  check({kAnalyze, {"peak", kSample, "-o", "/nonexistent/dir/x.txt"}, 2,
         E + "cannot write /nonexistent/dir/x.txt: No such file or directory"});
  // A device is written in place, with no --force; a failed write gives the OS reason.
  CHECK(run(kAnalyze, {"peak", kSample, "-o", "/dev/null"}).code == 0);
  check({kAnalyze, {"peak", kSample, "-o", "/dev/full"}, 2, E + "cannot write /dev/full: No space left on device"});
}

TEST_CASE("given convert, the format comes from --to-format or -o's extension in any case, and losses are listed") {
  const std::string E = "cachealloc-analyze: error: ";
  const std::string kLosses = "cachealloc-analyze: note: PyTorch's pickle has no place for: 6 split events; 4 merge "
                              "events; the program's name, arguments, pid, host and dump time; the device names, "
                              "capacities and driver totals; 2 final allocator statistics; the instruction address and "
                              "module of 10 native frame(s)";
  for (const char* name : {"x.pickle", "x.PICKLE", "x.pkl", "x.Pkl"}) {
    const fs::path out = scratch() / name;
    fs::remove(out);
    check({kAnalyze, {"convert", kSample, "-o", out.string()}, 0, kLosses});
    const std::string bytes = slurp(out);
    REQUIRE(bytes.size() > 2);
    CHECK(static_cast<unsigned char>(bytes[0]) == 0x80);  // pickle PROTO
    CHECK(bytes[1] == 4);
  }
  const fs::path ours = scratch() / "back.BIN";
  fs::remove(ours);
  check({kAnalyze, {"convert", (scratch() / "x.pickle").string(), "-o", ours.string()}, 0,
         "cachealloc-analyze: note: our format has no place for: the trace entries' compile_context and "
         "user_metadata; the requested_size PyTorch leaves on inactive (cached) blocks"});
  CHECK(slurp(ours).starts_with("\x89" "CASNAP\n"));
  check({kAnalyze, {"convert", kSample, "-o", "x.json"}, 2,
         E + "-o x.json: cannot tell the format from '.json' (.pickle, .pkl: pickle; .bin, .snap, .casnap: ours); add "
             "--to-format ours|pickle"});
  check({kAnalyze, {"convert", kSample, "-o", "-"}, 2,
         E + "-o -: cannot tell the format from a name without an extension (.pickle, .pkl: pickle; .bin, .snap, "
             ".casnap: ours); add --to-format ours|pickle"});
  check({kAnalyze, {"convert", kSample, "-o", "x.json", "--to-format", "json"}, 2,
         E + "--to-format: 'json' is not one of ours, pickle"});
  const Run piped = run(kAnalyze, {"convert", kSample, "-o", "-", "--to-format", "pickle"});
  CHECK(piped.code == 0);
  CHECK(piped.out == slurp(scratch() / "x.pickle"));
  check({kAnalyze, {"convert", kSample, "-o", (scratch() / "x.pickle").string()}, 2,
         E + "-o " + (scratch() / "x.pickle").string() + ": the file exists; add -f/--force to overwrite it"});
}

TEST_CASE("given a report of several tables in CSV, its main one is written, another chosen with --table, each to -o DIR/") {
  const std::string E = "cachealloc-analyze: error: ";
  check({kAnalyze, {"peak", kSample, "--format", "csv"}, 0,
         "cachealloc-analyze: peak: wrote the 'sites' table; also: categories, allocations (--table NAME, or -o DIR/ for all)"});
  check({kAnalyze, {"peak", kSample, "--format", "csv", "--table", "site"}, 2,
         E + "--table: 'site' is not a table of the peak report (tables: categories, sites, allocations) (did you mean 'sites'?)"});
  const Run sites = run(kAnalyze, {"peak", kSample, "--format", "csv", "--table", "sites"});
  CHECK(sites.code == 0);
  CHECK(sites.out.starts_with("rank,bytes,share,allocations,requested,largest,stack\r\n"));
  const fs::path dir = scratch() / "tables";
  fs::remove_all(dir);
  const Run all = run(kAnalyze, {"peak", kSample, "--format", "csv", "-o", dir.string() + "/"});
  CHECK(all.code == 0);
  CHECK(slurp(dir / "peak-sites.csv") == sites.out);
  CHECK(fs::exists(dir / "peak-allocations.csv"));
  check({kAnalyze, {"peak", kSample, "-o", dir.string() + "/"}, 2,
         E + "-o " + dir.string() + "/: a folder takes only --format csv (one file per table)"});
  // One table: CSV as before.
  CHECK(run(kAnalyze, {"timeline", kSample, "--format", "csv"}).code == 0);
}

TEST_CASE("given timeline or events, rows are slices by default and every event with --all-events") {
  const std::string big = (kSource / "testdata" / "synthetic_2k_native.bin").string();
  const Run timeline = run(kAnalyze, {"timeline", big, "--format", "csv"});
  CHECK(timeline.code == 0);
  CHECK(std::count(timeline.out.begin(), timeline.out.end(), '\n') == 1 + 1 + 100);  // header, start, 100 slices
  const Run every = run(kAnalyze, {"timeline", big, "--format", "csv", "--all-events"});
  CHECK(std::count(every.out.begin(), every.out.end(), '\n') > 2000);
  // The streamed rows are the ones the library builds in memory (the golden files).
  // (The table format aligns a stream to its first 1,000 rows, so only its
  // line count is the golden file's.)
  const fs::path golden = kSource / "testdata" / "synthetic_2k_native";
  for (const char* report : {"timeline", "events"}) {
    for (const char* format : {"csv", "json"}) {
      CAPTURE(report);
      CAPTURE(format);
      CHECK(run(kAnalyze, {report, big, "--all-events", "--format", format}).out ==
            slurp(golden / (std::string(report) + "." + format)));
    }
    const std::string table = run(kAnalyze, {report, big, "--all-events"}).out;
    const std::string expected = slurp(golden / (std::string(report) + ".table"));
    CHECK(std::count(table.begin(), table.end(), '\n') == std::count(expected.begin(), expected.end(), '\n'));
  }
  const Run events = run(kAnalyze, {"events", big, "--format", "csv"});
  CHECK(events.code == 0);
  CHECK(events.out.starts_with("first_event,event,time_ns,events,alloc,free,"));
  CHECK(std::count(events.out.begin(), events.out.end(), '\n') == 1 + 100);
  const Run listed = run(kAnalyze, {"events", big, "--format", "csv", "--all-events"});
  CHECK(listed.out.starts_with("event,time_ns,kind,address,size,aux,stream,thread,site\r\n"));
  CHECK(std::count(listed.out.begin(), listed.out.end(), '\n') > 2000);
  const Run limited = run(kAnalyze, {"events", big, "--all-events", "--limit", "5", "--format", "csv"});
  CHECK(std::count(limited.out.begin(), limited.out.end(), '\n') == 6);
  check({kAnalyze, {"events", big, "--limit", "5"}, 2, "cachealloc-analyze: error: --limit requires --all-events"});
}

TEST_CASE("given --help, the defaults shown are the real ones, and every executable answers --help, --version and -V") {
  const Run help = run(kAnalyze, {"export", "--help"});
  CHECK(help.code == 0);
  CHECK(help.out.find("--format TEXT:{table,csv,json}=csv") != std::string::npos);
  for (const std::string program : {"cachealloc-analyze", "cachealloc-synthetic", "cachealloc-seed-example",
                                    "cachealloc-conformance"}) {
    for (const std::string flag : {"--help", "--version", "-V"}) {
      CAPTURE(program);
      CAPTURE(flag);
      const Run r = run(program, {flag});
      CHECK(r.code == 0);
      CHECK(r.err.empty());
      if (flag != "--help") CHECK(r.out == program + " 0.1.0\n");
      else CHECK(r.out.find("Usage: ") != std::string::npos);
    }
  }
}

TEST_CASE("given the other executables, usage errors follow the same convention") {
  for (const Case& c : std::vector<Case>{
           {"cachealloc-synthetic", {}, 2, "cachealloc-synthetic: error: missing --output (see --help)"},
           {"cachealloc-synthetic", {"--evnts", "3", "-o", "a.bin"}, 2,
            "cachealloc-synthetic: error: unknown option '--evnts' (did you mean '--events'?)"},
           {"cachealloc-synthetic", {"--events", "0", "-o", "a.bin"}, 2,
            "cachealloc-synthetic: error: --events: '0' is not a whole number from 1 to 1000000000"},
           {"cachealloc-synthetic", {"--stacks", "python", "-o", "a.bin"}, 2,
            "cachealloc-synthetic: error: --stacks: 'python' is not one of none, native"},
           {"cachealloc-synthetic", {"--events", "10", "-o", "/nonexistent/a.bin"}, 2,
            "cachealloc-synthetic: error: cannot write /nonexistent/a.bin: No such file or directory"},
           {"cachealloc-seed-example", {"--snapshot"}, 2, "cachealloc-seed-example: error: --snapshot needs a value"},
           {"cachealloc-seed-example", {"--snap", "x"}, 2,
            "cachealloc-seed-example: error: unknown option '--snap' (did you mean '--snapshot'?)"},
           {"cachealloc-seed-example", {"extra"}, 2, "cachealloc-seed-example: error: unexpected argument 'extra' (see --help)"},
           {"cachealloc-conformance", {}, 2, "cachealloc-conformance: error: missing files (see --help)"},
           {"cachealloc-conformance", {"--devise", "cuda", "x.csv"}, 2,
            "cachealloc-conformance: error: unknown option '--devise' (did you mean '--device'?)"},
           {"cachealloc-conformance", {"--device", "gpu", "x.csv"}, 2,
            "cachealloc-conformance: error: --device: 'gpu' is not one of simulated, cuda"},
       })
    check(c);
  // An existing -o is kept without --force, as for cachealloc-analyze.
  const fs::path existing = scratch() / "existing.bin";
  std::ofstream(existing) << "keep";
  check({"cachealloc-synthetic", {"--events", "10", "-o", existing.string()}, 2,
         "cachealloc-synthetic: error: -o " + existing.string() + ": the file exists; add -f/--force to overwrite it"});
  CHECK(slurp(existing) == "keep");
  CHECK(run("cachealloc-synthetic", {"--events", "10", "-o", existing.string(), "-f"}).code == 0);
}

TEST_CASE("given a benchmark with a bad argument or a file that is not a snapshot, one line names it, exit 2") {
  // The benchmarks are built in a top-level build (CACHEALLOC_BUILD_BENCH).
  if (!fs::exists(kBin / "bench_mixed")) {
    MESSAGE("the benchmarks are not built: skipped");
    return;
  }
  const fs::path text = scratch() / "notes.txt";
  std::ofstream(text) << "hello, this is not a snapshot\n";
  const std::string foreign = "error: not a cachealloc snapshot or PyTorch memory snapshot (it starts with 68 65 6c 6c)";
  for (const Case& c : std::vector<Case>{
           {"bench_mixed", {"5x"}, 2,
            "bench_mixed: error: steps must be a whole number from 1 to 1000000000, not '5x' (see --help)"},
           {"bench_mixed", {"1000", "2", "python"}, 2,
            "bench_mixed: error: history must be one of off, none, native, not 'python' (see --help)"},
           {"bench_history_overhead", {"0"}, 2,
            "bench_history_overhead: error: pairs per round must be a whole number from 1 to 10000000000, not '0' "
            "(see --help)"},
           {"bench_history_overhead", {"10", "-1"}, 2,
            "bench_history_overhead: error: rounds must be a whole number from 1 to 1000, not '-1' (see --help)"},
           {"bench_threads", {"2", "10", "none", "own", "extra"}, 2,
            "bench_threads: error: expected at most 4 arguments, got 5 (see --help)"},
           {"bench_clock_read", {""}, 2,
            "bench_clock_read: error: sections per round must be a whole number from 1 to 10000000000, not '' "
            "(see --help)"},
           {"bench_ranks_scaling", {"--thread", "2"}, 2, "bench_ranks_scaling: error: unknown option '--thread' (see --help)"},
           {"bench_ranks_scaling", {"--threads", "1,x"}, 2,
            "bench_ranks_scaling: error: --threads takes counts from 1 to 1024, not 'x' (see --help)"},
           {"bench_analyze_throughput", {"--rewrite", "7", kSample, "out.bin"}, 2,
            "bench_analyze_throughput: error: the format version must be a whole number from 5 to 6, not '7' (see --help)"},
           {"bench_analyze_throughput", {text.string()}, 2, "bench_analyze_throughput: " + foreign},
           {"bench_pickle_phases", {text.string()}, 2, "bench_pickle_phases: " + foreign},
           {"bench_sweep_scaling", {text.string()}, 2, "bench_sweep_scaling: " + foreign},
           {"bench_replay_throughput", {"missing.bin"}, 2,
            "bench_replay_throughput: error: cannot open snapshot missing.bin: No such file or directory"},
           {"bench_stream_scale", {"/tmp/x.bin", "0"}, 2,
            "bench_stream_scale: error: EVENTS must be a whole number from 1 to 1099511627776, not '0' (see --help)"},
           {"bench_stream_scale", {"--analyze", text.string()}, 2, "bench_stream_scale: " + foreign},
           {"bench_replay_throughput", {kSample, "many"}, 2,
            "bench_replay_throughput: error: REPEATS must be a whole number from 1 to 1000, not 'many' (see --help)"},
       })
    check(c);
  for (const std::string program :
       {"bench_analyze_throughput", "bench_clock_read", "bench_dump_time", "bench_history_overhead", "bench_mixed",
        "bench_page_faults", "bench_pickle_phases", "bench_ranks_scaling", "bench_replay_throughput",
        "bench_snapshot_size", "bench_stream_scale", "bench_sweep_scaling", "bench_threads"}) {
    CAPTURE(program);
    const Run help = run(program, {"--help"});
    CHECK(help.code == 0);
    CHECK(help.err.empty());
    CHECK(help.out.rfind("usage: " + program + " ", 0) == 0);
  }
}

TEST_CASE("given a large trace, events and timeline --all-events stream: peak RSS stays far below the listing's size") {
  // 1M events here (the 5M measurement is in docs/PERFORMANCE.md). Under a
  // sanitizer, whose memory is not held to the bound, 200k: the listings
  // still stream through many chunks, in a fifth of the time.
  const std::string events = kSanitized ? "200000" : "1000000";
  const std::uintmax_t least_bytes = kSanitized ? 10'000'000 : 50'000'000;
  const fs::path trace = scratch() / "trace-1m.bin";
  const Run made = run("cachealloc-synthetic", {"--events", events, "--seed", "1", "--stacks", "none", "-o", trace.string()});
  REQUIRE(made.code == 0);
  CHECK(made.err.empty());  // no ring overflow note
  // Its ring held the whole run: no figure of the summary is a lower bound.
  const Run summary = run(kAnalyze, {trace.string(), "--format", "json"});
  CHECK(summary.code == 0);
  CHECK(summary.out.find("\"lower_bounds\":[]") != std::string::npos);
  CHECK(summary.out.find("\"dropped_events\":0") != std::string::npos);
  const fs::path listing = scratch() / "events.csv";
  const Run r = run(kAnalyze, {"events", trace.string(), "--all-events", "--format", "csv", "-o", listing.string()});
  CHECK(r.code == 0);
  const std::uintmax_t size = fs::file_size(listing);
  MESSAGE("events --all-events, " << events << " events: " << size / 1000000 << " MB of CSV, " << r.max_rss_kib / 1024
                                             << " MiB peak RSS, " << r.seconds << " s");
  CHECK(size > least_bytes);
  if (!kSanitized) CHECK(r.max_rss_kib < 100 * 1024);
  const Run timeline = run(kAnalyze, {"timeline", trace.string(), "--all-events", "--format", "csv", "-o", listing.string(), "-f"});
  CHECK(timeline.code == 0);
  MESSAGE("timeline --all-events, " << events << " events: " << fs::file_size(listing) / 1000000 << " MB of CSV, "
                                               << timeline.max_rss_kib / 1024 << " MiB peak RSS, " << timeline.seconds << " s");
  if (!kSanitized) CHECK(timeline.max_rss_kib < 100 * 1024);
  // and export, every event in CSV and JSON, streams as well (it held the
  // whole table before: 267 MB for 600k events)
  for (const char* what : {"events", "timeline"}) {
    for (const char* format : {"csv", "json"}) {
      const Run exported = run(kAnalyze, {"export", trace.string(), "--what", what, "--format", format, "-o", listing.string(), "-f"});
      CHECK(exported.code == 0);
      CHECK(fs::file_size(listing) > least_bytes);
      MESSAGE("export --what " << std::string(what) << " --format " << std::string(format) << ", " << events << " events: " << fs::file_size(listing) / 1000000
                               << " MB, " << exported.max_rss_kib / 1024 << " MiB peak RSS");
      if (!kSanitized) CHECK(exported.max_rss_kib < 100 * 1024);
    }
  }
  fs::remove(trace), fs::remove(listing);
}

TEST_CASE("given diff or ranks with the wrong files or options, one line names the problem, exit 2") {
  const std::string E = "cachealloc-analyze: error: ";
  const fs::path empty = scratch() / "no-snapshots";
  fs::create_directories(empty);
  std::ofstream(empty / "README.md") << "notes, not a snapshot\n";
  const std::string missing = (scratch() / "rank_7.bin").string();
  for (const Case& c : std::vector<Case>{
           {kAnalyze, {"diff", kSample}, 2, E + "diff takes two snapshots, A and B (got 1)"},
           {kAnalyze, {"diff", kSample, kSample, kSample}, 2, E + "diff takes two snapshots, A and B (got 3)"},
           {kAnalyze, {"diff"}, 2, E + "missing FILES (see --help)"},
           {kAnalyze, {"diff", kSample, missing}, 2, E + "cannot open snapshot " + missing + ": No such file or directory"},
           {kAnalyze, {"diff", kSample, kSample, "--by", "peaks"}, 2,
            E + "--by: 'peaks' is not one of peak, allocated_over_run, end (did you mean 'peak'?)"},
           {kAnalyze, {"diff", kSample, kSample, "--format", "jsonl"}, 2,
            E + "--format: 'jsonl' is not one of table, csv, json (did you mean 'json'?)"},
           {kAnalyze, {"diff", kSample, kSample, "--device", "3"}, 2, E + "--device 3: device 3 is not in " + kSample},
           {kAnalyze, {"diff", kSample, kSample, "--format", "csv", "--table", "site"}, 2,
            E + "--table: 'site' is not a table of the diff report (tables: peaks, categories, counts, fragmentation, sites, phases) "
                "(did you mean 'sites'?)"},
           {kAnalyze, {"ranks", empty.string()}, 2,
            E + empty.string() +
                ": the folder holds no snapshot (a .pickle, .bin or any file that is not .json, .txt, .log, .csv, .md or .html)"},
           {kAnalyze, {"ranks", missing}, 2, E + missing + ": no such file or folder"},
           {kAnalyze, {"ranks", kSample, "--threads", "-1"}, 2, E + "--threads: '-1' is not a whole number from 0 to 4096"},
           {kAnalyze, {"ranks", kSample, "--format", "xml"}, 2, E + "--format: 'xml' is not one of table, csv, json, jsonl"},
           {kAnalyze, {"ranks", "-"}, 2, E + "ranks: standard input is not one of the files (name them)"},
           {kAnalyze, {"ranks", kSample, "--format", "jsonl", "-o", (scratch() / "dir").string() + "/"}, 2,
            E + "-o " + (scratch() / "dir").string() + "/: a folder takes only --format csv (one file per table)"},
       })
    check(c);
}

TEST_CASE("given diff and ranks, every format is written: table, json, csv per table, and jsonl one object a line") {
  const Run table = run(kAnalyze, {"diff", kSample, kSample});
  CHECK(table.code == 0);
  CHECK(table.out.starts_with("diff: A " + kSample + " -> B " + kSample));
  const Run json = run(kAnalyze, {"diff", kSample, kSample, "--format", "json"});
  CHECK(json.code == 0);
  CHECK(json.out.find("\"report\":\"diff\"") != std::string::npos);
  const Run csv = run(kAnalyze, {"diff", kSample, kSample, "--format", "csv", "--table", "peaks"});
  CHECK(csv.code == 0);
  CHECK(csv.out.starts_with("metric,a,b,change,change_ratio\r\n"));
  const Run ranks = run(kAnalyze, {"ranks", kSample, kSample, "--format", "jsonl"});
  CHECK(ranks.code == 0);
  CHECK(std::count(ranks.out.begin(), ranks.out.end(), '\n') == 2);
  CHECK(ranks.out.starts_with("{\"rank\":"));
  const Run ranks_table = run(kAnalyze, {"ranks", kSample, "--threads", "1"});
  CHECK(ranks_table.code == 0);
  CHECK(ranks_table.out.starts_with("ranks: 1 snapshot(s)"));
}
