// flamegraph: the bytes live at one moment, by stack (collapsed text and SVG).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
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

std::vector<fs::path> inputs() {
  std::vector<fs::path> files = {kData / "synthetic_2k_native.bin", kData / "synthetic_2k_nostacks.bin"};
  for (const char* name : {"stacks_all", "stacks_python", "expandable", "oom_retry", "ring_overflow", "streams",
                           "varlen_transformer", "empty_cache_mid"})
    files.push_back(kData / "pytorch" / "corpus" / (std::string(name) + ".pickle"));
  return files;
}

std::uint64_t collapsed_sum(const std::string& text, std::size_t& lines) {
  std::istringstream in(text);
  std::string line;
  std::uint64_t sum = 0;
  lines = 0;
  while (std::getline(in, line)) {
    const auto space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    REQUIRE(space > 0);  // a stack before the count
    sum += std::stoull(line.substr(space + 1));
    ++lines;
  }
  return sum;
}

std::uint64_t of(const analyzer::Totals& t, analyzer::FlameMetric m) {
  return m == analyzer::FlameMetric::allocated ? t.allocated
         : m == analyzer::FlameMetric::requested ? t.requested
                                                 : t.reserved;
}

bool have_python() { return std::system("command -v python3 >/dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("given our snapshots and PyTorch pickles, when flamegraph --collapsed is written at the peak and at the end, "
          "then its numbers sum to the live bytes of each metric then") {
  for (const fs::path& file : inputs()) {
    CAPTURE(file);
    const snapshot::Snapshot snap = analyzer::load(file);
    const analyzer::Analysis a = analyzer::analyze(snap, analyzer::AnalysisOptions{});
    for (const auto metric :
         {analyzer::FlameMetric::allocated, analyzer::FlameMetric::requested, analyzer::FlameMetric::reserved}) {
      const std::uint64_t peak = metric == analyzer::FlameMetric::allocated   ? a.peak_allocated.bytes
                                 : metric == analyzer::FlameMetric::requested ? a.peak_requested.bytes
                                                                              : a.peak_reserved.bytes;
      for (const auto at : {analyzer::FlameOptions::At::peak, analyzer::FlameOptions::At::end}) {
        CAPTURE(static_cast<int>(metric));
        CAPTURE(static_cast<int>(at));
        analyzer::SnapshotEvents source(snap);
        analyzer::FlameOptions flame;
        flame.metric = metric;
        flame.at = at;
        const analyzer::FlameGraph graph = analyzer::flame_graph(source, analyzer::ReportOptions{}, flame);
        std::ostringstream text;
        analyzer::write_collapsed(graph, text);
        std::size_t lines = 0;
        const std::uint64_t expected = at == analyzer::FlameOptions::At::peak ? peak : of(a.totals_at_end, metric);
        CHECK(collapsed_sum(text.str(), lines) == expected);
        CHECK(graph.total == expected);
        CHECK((lines > 0) == (expected > 0));
      }
    }
  }
}

TEST_CASE("given a PyTorch pickle with Python and C++ frames, when its collapsed stacks are written, then each line "
          "runs root first to the site, with the user's Python frames kept") {
  const snapshot::Snapshot snap = analyzer::load(kData / "pytorch" / "corpus" / "stacks_all.pickle");
  analyzer::SnapshotEvents source(snap);
  const analyzer::FlameGraph graph = analyzer::flame_graph(source, analyzer::ReportOptions{}, {});
  REQUIRE(!graph.stacks.empty());
  analyzer::SiteNamer names(snap, analyzer::SiteFilter{});
  bool python = false;
  for (const analyzer::FlameStack& stack : graph.stacks) {
    // the leaf (last frame) is a site as the other reports name it
    python = python || stack.frames.back().find("make_corpus.py") != std::string::npos;
    for (const std::string& frame : stack.frames) CHECK(frame.find("torch::unwind") == std::string::npos);
  }
  CHECK(python);
  // --all-frames keeps frames the filter drops: deeper stacks
  analyzer::ReportOptions all;
  all.sites.all_frames = true;
  all.sites.frames = 0;
  analyzer::SnapshotEvents again(snap);
  const analyzer::FlameGraph full = analyzer::flame_graph(again, all, {});
  std::size_t depth = 0, full_depth = 0;
  for (const auto& s : graph.stacks) depth = std::max(depth, s.frames.size());
  for (const auto& s : full.stacks) full_depth = std::max(full_depth, s.frames.size());
  CHECK(full_depth > depth);
  CHECK(full.total == graph.total);
}

TEST_CASE("given a flame graph SVG, then it is well-formed XML with no external reference, and its root frame's "
          "width is the live bytes") {
  for (const fs::path& file : inputs()) {
    CAPTURE(file);
    const snapshot::Snapshot snap = analyzer::load(file);
    for (const auto metric : {analyzer::FlameMetric::allocated, analyzer::FlameMetric::reserved}) {
      analyzer::SnapshotEvents source(snap);
      analyzer::FlameOptions flame;
      flame.metric = metric;
      const analyzer::FlameGraph graph = analyzer::flame_graph(source, analyzer::ReportOptions{}, flame);
      std::ostringstream svg;
      analyzer::write_flame_svg(graph, svg);
      const std::string text = svg.str();
      // no external references: the one http is the SVG namespace's name
      std::string rest = text;
      const std::string ns = "xmlns=\"http://www.w3.org/2000/svg\"";
      REQUIRE(rest.find(ns) != std::string::npos);
      rest.erase(rest.find(ns), ns.size());
      CHECK(rest.find("http") == std::string::npos);
      CHECK(rest.find("src=") == std::string::npos);
      CHECK(rest.find("href") == std::string::npos);
      CHECK(text.find("<script") != std::string::npos);  // interactive
      // the root frame (depth 0) spans the live bytes
      std::smatch root;
      REQUIRE(std::regex_search(text, root, std::regex("<g class=\"f\" data-x=\"0\" data-w=\"([0-9]+)\" data-d=\"0\"")));
      CHECK(std::stoull(root[1].str()) == graph.total);
      // children of the root add up to it
      std::uint64_t depth1 = 0;
      const std::regex child("data-w=\"([0-9]+)\" data-d=\"1\"");
      for (auto it = std::sregex_iterator(text.begin(), text.end(), child); it != std::sregex_iterator(); ++it)
        depth1 += std::stoull((*it)[1].str());
      CHECK(depth1 == graph.total);
      if (have_python()) {
        const fs::path out = fs::temp_directory_path() / ("cachealloc_flame_" + file.stem().string() + ".svg");
        std::ofstream(out) << text;
        const std::string command = "python3 -c \"import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1])"
                                    ".getroot(); sys.exit(0 if r.tag.endswith('svg') else 1)\" " + out.string();
        CHECK(std::system(command.c_str()) == 0);
        fs::remove(out);
      }
    }
  }
}

TEST_CASE("given frames with XML's special characters and bytes that are not UTF-8, when the SVG is written, then "
          "it is still well-formed") {
  analyzer::FlameGraph graph;
  graph.title = "a <title> & \"quotes\"";
  graph.metric = "allocated";
  graph.total = 30;
  graph.stacks = {{{"main", "f<int>(std::vector<T> const&) ]]> 'x'"}, 20}, {{"main", std::string("bad \xff\xfe utf8")}, 10}};
  std::ostringstream svg;
  analyzer::write_flame_svg(graph, svg);
  const std::string text = svg.str();
  CHECK(text.find("f&lt;int&gt;") != std::string::npos);
  CHECK(text.find("\xff") == std::string::npos);
  if (have_python()) {
    const fs::path out = fs::temp_directory_path() / "cachealloc_flame_escape.svg";
    std::ofstream(out) << text;
    CHECK(std::system(("python3 -c \"import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])\" " + out.string()).c_str()) == 0);
    fs::remove(out);
  }
  std::ostringstream collapsed;
  analyzer::write_collapsed(graph, collapsed);
  CHECK(collapsed.str().find("main;f<int>") == 0);
}

TEST_CASE("given the CLI, when flamegraph is asked for an event past the end or -o an existing file, then it "
          "refuses with exit 2") {
  const std::string tool = std::string(CACHEALLOC_BINARY_DIR) + "/bin/cachealloc-analyze";
  if (!fs::exists(tool)) return;
  const std::string file = (kData / "synthetic_2k_native.bin").string();
  CHECK(WEXITSTATUS(std::system((tool + " flamegraph " + file + " --at 99999999 --collapsed >/dev/null 2>&1").c_str())) == 2);
  const fs::path out = fs::temp_directory_path() / "cachealloc_flame_exists.svg";
  std::ofstream(out) << "x";
  CHECK(WEXITSTATUS(std::system((tool + " flamegraph " + file + " -o " + out.string() + " 2>/dev/null").c_str())) == 2);
  CHECK(std::system((tool + " flamegraph " + file + " --at end --metric requested -f -o " + out.string()).c_str()) == 0);
  std::ifstream in(out);
  std::string first;
  std::getline(in, first);
  CHECK(first.find("<?xml") == 0);
  fs::remove(out);
}
