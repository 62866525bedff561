// export --what perfetto: Chrome trace-event JSON for ui.perfetto.dev.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata";

// Checks the trace's shape and prints "max_allocated max_reserved counter_events phases instants".
constexpr const char* kCheck = R"PY(
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
last = {}
maxima = {}
counts = {"C": 0, "X": 0, "i": 0}
for e in ev:
    for k in ("ph", "ts", "pid", "tid", "name"):
        assert k in e, ("missing", k, e)
    assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
    ph = e["ph"]
    assert ph in ("C", "X", "i", "M"), e
    if ph == "C":
        assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        key = (e["pid"], e["name"])
        assert e["ts"] >= last.get(key, 0), ("ts decreases", e)
        last[key] = e["ts"]
        maxima[e["name"]] = max(maxima.get(e["name"], 0), e["args"]["bytes"])
    if ph == "X":
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
    if ph == "i":
        assert e["s"] in ("t", "p", "g"), e
    if ph in counts:
        counts[ph] += 1
dev = sys.argv[2]
print(maxima.get("cuda:%s allocated" % dev, -1), maxima.get("cuda:%s reserved" % dev, -1),
      counts["C"], counts["X"], counts["i"])
)PY";

bool have_python() { return std::system("command -v python3 >/dev/null 2>&1") == 0; }

struct Checked {
  long long max_allocated = -1, max_reserved = -1, counters = 0, phases = 0, instants = 0;
};

Checked check_trace(const snapshot::Snapshot& snap, std::size_t buckets, std::int32_t device) {
  analyzer::SnapshotEvents source(snap);
  std::ostringstream json;
  analyzer::write_perfetto_trace(source, analyzer::ReportOptions{}, buckets, json);
  const fs::path dir = fs::temp_directory_path();
  const fs::path trace = dir / "cachealloc_perfetto_test.json", script = dir / "cachealloc_perfetto_check.py",
                 result = dir / "cachealloc_perfetto_result.txt";
  std::ofstream(trace) << json.str();
  std::ofstream(script) << kCheck;
  const std::string command = "python3 " + script.string() + " " + trace.string() + " " + std::to_string(device) +
                              " > " + result.string();
  REQUIRE(std::system(command.c_str()) == 0);
  Checked c;
  std::ifstream(result) >> c.max_allocated >> c.max_reserved >> c.counters >> c.phases >> c.instants;
  fs::remove(trace);
  fs::remove(script);
  fs::remove(result);
  return c;
}

std::vector<fs::path> inputs() {
  std::vector<fs::path> files = {kData / "synthetic_2k_native.bin", kData / "synthetic_2k_nostacks.bin"};
  for (const char* name : {"stacks_all", "expandable", "oom_retry", "ring_overflow", "empty_cache_mid", "streams"})
    files.push_back(kData / "pytorch" / "corpus" / (std::string(name) + ".pickle"));
  return files;
}

}  // namespace

TEST_CASE("given our snapshots and PyTorch pickles, when exported for Perfetto with every change or in buckets, "
          "then the JSON holds every phase's required fields, counter timestamps never decrease, and the counter "
          "maxima are the summary's peaks") {
  if (!have_python()) return;
  for (const fs::path& file : inputs()) {
    CAPTURE(file);
    const snapshot::Snapshot snap = analyzer::load(file);
    const analyzer::Analysis a = analyzer::analyze(snap, analyzer::AnalysisOptions{});
    for (const std::size_t buckets : {std::size_t{0}, std::size_t{7}, analyzer::kDefaultPerfettoBuckets}) {
      CAPTURE(buckets);
      const Checked c = check_trace(snap, buckets, a.device);
      CHECK(c.max_allocated == static_cast<long long>(a.peak_allocated.bytes));
      CHECK(c.max_reserved == static_cast<long long>(a.peak_reserved.bytes));
      // bounded: per bucket at most two samples of each of the three counters, plus the start
      if (buckets != 0) CHECK(c.counters <= static_cast<long long>(3 * (2 * buckets + 1)));
      const auto count = [&](snapshot::EventKind kind) { return a.counts[static_cast<std::size_t>(kind)]; };
      CHECK(c.instants == static_cast<long long>(count(snapshot::EventKind::oom) +
                                                 count(snapshot::EventKind::empty_cache) +
                                                 count(snapshot::EventKind::segment_alloc) +
                                                 count(snapshot::EventKind::segment_release)));
      CHECK(c.phases >= static_cast<long long>(count(snapshot::EventKind::annotation_end)));
    }
  }
}

TEST_CASE("given a trace of thousands of events, when exported in 7 buckets, then far fewer samples are written than "
          "with every change") {
  if (!have_python()) return;
  const snapshot::Snapshot snap = analyzer::load(kData / "synthetic_2k_native.bin");
  const analyzer::Analysis a = analyzer::analyze(snap, analyzer::AnalysisOptions{});
  const Checked all = check_trace(snap, 0, a.device);
  const Checked few = check_trace(snap, 7, a.device);
  CHECK(all.counters > 1000);
  CHECK(few.counters <= 45);
  CHECK(few.max_allocated == all.max_allocated);
}

TEST_CASE("given the CLI, when export --what perfetto gets --all-events with --buckets, or --format, then it refuses "
          "with exit 2; plain, it writes JSON") {
  const std::string tool = std::string(CACHEALLOC_BINARY_DIR) + "/bin/cachealloc-analyze";
  if (!fs::exists(tool)) return;
  const std::string file = (kData / "synthetic_2k_native.bin").string();
  const std::string base = tool + " export " + file + " --what perfetto";
  CHECK(WEXITSTATUS(std::system((base + " --all-events --buckets 10 -o - >/dev/null 2>&1").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((base + " --format csv -o - >/dev/null 2>&1").c_str())) == 2);
  CHECK(WEXITSTATUS(std::system((tool + " export " + file + " --what sites --all-events >/dev/null 2>&1").c_str())) == 2);
  const fs::path out = fs::temp_directory_path() / "cachealloc_perfetto_cli.json";
  fs::remove(out);
  CHECK(std::system((base + " -o " + out.string()).c_str()) == 0);
  CHECK(WEXITSTATUS(std::system((base + " -o " + out.string() + " 2>/dev/null").c_str())) == 2);  // exists, no -f
  std::ifstream in(out);
  std::string first;
  std::getline(in, first);
  CHECK(first.find("{\"traceEvents\":[") == 0);
  fs::remove(out);
}
