// html: the self-contained report's page as the analyzer writes it. What the
// page draws is checked in Chromium against the CLI by test_browser_report
// (tests/browser/report_test.cjs); this suite checks the file itself.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/html_report.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "../analyzer/testing/trace_builder.hpp"
#include "counting_events.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata";

struct Page {
  std::string text;
  analyzer::HtmlReportStats stats;
};

Page page_of(const fs::path& file) {
  analyzer::FileEvents source(file);
  std::ostringstream out;
  Page page;
  page.stats = analyzer::write_html_report(source, analyzer::ReportOptions{}, analyzer::HtmlOptions{}, out);
  page.text = out.str();
  return page;
}

}  // namespace

TEST_CASE("given a snapshot and a PyTorch pickle, when the html report is written, then it is one page that "
          "references nothing outside itself") {
  for (const fs::path& file : {kData / "synthetic_2k_native.bin", kData / "pytorch" / "corpus" / "expandable.pickle"}) {
    CAPTURE(file);
    const Page page = page_of(file);
    CHECK(page.stats.bytes == page.text.size());
    CHECK(page.text.starts_with("<!DOCTYPE html>"));
    CHECK(page.text.find("</html>") != std::string::npos);
    // No external script, style, image or frame: no src= or href= attribute, no <link>.
    CHECK_FALSE(std::regex_search(page.text, std::regex(R"(<(script|img|iframe|link)[^>]*\s(src|href)\s*=)", std::regex::icase)));
    CHECK(page.text.find("<link") == std::string::npos);
    // The content security policy forbids any request the page might still try.
    CHECK(page.text.find("default-src 'none'") != std::string::npos);
    // uPlot is inlined, and every payload the page script reads is there.
    CHECK(page.text.find("uPlot") != std::string::npos);
    for (const char* id : {"data-meta", "data-summary", "data-oom", "data-kinds", "data-addresses", "data-keyframes",
                           "data-buckets", "data-fragmentation"})
      CHECK(page.text.find(std::string("id=\"") + id + "\"") != std::string::npos);
  }
}

TEST_CASE("given a trace, when the html report is written, then it holds one bucket per 64 events, a keyframe at "
          "the start, and the kinds column has one byte per event") {
  const fs::path file = kData / "pytorch" / "corpus" / "varlen_transformer.pickle";
  analyzer::FileEvents source(file);
  const std::size_t n = source.event_count();
  REQUIRE(n > analyzer::kHtmlBucketEvents);
  const Page page = page_of(file);
  CHECK(page.stats.events == n);
  CHECK(page.stats.buckets == (n + analyzer::kHtmlBucketEvents - 1) / analyzer::kHtmlBucketEvents);
  CHECK(page.stats.keyframes >= 1);
  CHECK(page.stats.keyframes <= n / analyzer::kHtmlMinKeyframeGap + 1);
  const std::regex kinds(R"re(id="data-kinds" data-bytes="(\d+)")re");
  std::smatch match;
  REQUIRE(std::regex_search(page.text, match, kinds));
  CHECK(std::stoull(match[1]) == n);
}

TEST_CASE("given a 200k-event trace, when the html report is written, then the keyframes hold no more blocks than "
          "the events they save replaying, and the page stays near 4 bytes per event") {
  const fs::path file = kData / "pytorch" / "cnn_train_stacks_all.pickle";
  const Page page = page_of(file);
  // Keyframes come every max(4096, 4 x blocks) events: their blocks are at most a quarter of the events, plus the first.
  CHECK(page.stats.keyframe_blocks <= page.stats.events / 4 + page.stats.keyframe_blocks / std::max<std::size_t>(page.stats.keyframes, 1));
  // The fixed part (uPlot, the script, the style) is ~100 KB.
  CHECK(page.stats.bytes < 200'000 + 8 * page.stats.events);
}

namespace {

Page page_of(const fs::path& file, const analyzer::HtmlOptions& html) {
  analyzer::FileEvents source(file);
  std::ostringstream out;
  Page page;
  page.stats = analyzer::write_html_report(source, analyzer::ReportOptions{}, html, out);
  page.text = out.str();
  return page;
}

std::size_t decoded_bytes(const std::string& text, const char* id) {
  const std::regex column(std::string("id=\"") + id + R"re(" data-bytes="(\d+)")re");
  std::smatch match;
  REQUIRE(std::regex_search(text, match, column));
  return std::stoull(match[1]);
}

bool covers(const std::vector<analyzer::EventWindow>& windows, std::size_t event) {
  for (const analyzer::EventWindow& w : windows)
    if (w.begin <= event && event < w.end) return true;
  return false;
}

}  // namespace

TEST_CASE("given a trace longer than the detail budget, when the html report is written, then it keeps events "
          "only in windows around the peaks and the last events, within the budget, and the page shrinks with them") {
  const fs::path file = kData / "pytorch" / "long" / "long_train.pickle.zst";
  analyzer::FileEvents source(file);
  const std::size_t n = source.event_count();
  REQUIRE(n > 100'000);
  analyzer::AnalysisOptions whole;
  const analyzer::Analysis analysis = analyzer::analyze(source, whole);

  analyzer::HtmlOptions small;
  small.detail_events = 20'000;
  const Page page = page_of(file, small);
  const Page full = page_of(file, analyzer::HtmlOptions{});

  CHECK(page.stats.events == n);
  CHECK(page.stats.detail_events <= small.detail_events);
  // Windows that overlap merge: at least one anchor's share is kept.
  CHECK(page.stats.detail_events >= small.detail_events / 4);
  // One kind byte per event kept, none for the others.
  CHECK(decoded_bytes(page.text, "data-kinds") == page.stats.detail_events);
  // Windows in order, disjoint, never adjacent; each opens with a keyframe.
  REQUIRE_FALSE(page.stats.detail_windows.empty());
  for (std::size_t k = 1; k < page.stats.detail_windows.size(); ++k)
    CHECK(page.stats.detail_windows[k - 1].end < page.stats.detail_windows[k].begin);
  CHECK(page.stats.keyframes >= page.stats.detail_windows.size());
  // The moments the first screen opens on: the state after each peak (and the
  // event after it, where a free settles) and the last events.
  for (const analyzer::Peak* peak : {&analysis.peak_allocated, &analysis.peak_reserved}) {
    REQUIRE(peak->event != analyzer::kNoEvent);
    CHECK(covers(page.stats.detail_windows, peak->event));
    CHECK(covers(page.stats.detail_windows, peak->event + 1));
  }
  CHECK(covers(page.stats.detail_windows, n - 1));
  // The timeline still covers every event, bucket by bucket.
  CHECK(page.stats.buckets == full.stats.buckets);
  // Size: the fixed part (~100 KB), ~4-6 bytes per event kept, the buckets.
  CHECK(page.stats.bytes < 200'000 + 8 * page.stats.detail_events + 40 * page.stats.buckets);
  // Each event left out saves at least a byte of the page.
  CHECK(full.stats.bytes - page.stats.bytes > n - page.stats.detail_events);
  // Within the budget, nothing changes: one window, the whole trace.
  CHECK(full.stats.detail_events == n);
  REQUIRE(full.stats.detail_windows.size() == 1);
  CHECK(full.stats.detail_windows[0].begin == 0);
  CHECK(full.stats.detail_windows[0].end == n);
  CHECK(decoded_bytes(full.text, "data-kinds") == n);
}

TEST_CASE("given a bucket limit, when the html report is written, then the buckets grow to stay within it") {
  const fs::path file = kData / "pytorch" / "long" / "long_train.pickle.zst";
  analyzer::HtmlOptions few;
  few.max_buckets = 1000;
  const Page page = page_of(file, few);
  CHECK(page.stats.buckets <= 1000);
  CHECK(page.stats.bucket_events == (page.stats.events + 999) / 1000);
  CHECK(page.stats.buckets == (page.stats.events + page.stats.bucket_events - 1) / page.stats.bucket_events);
}

TEST_CASE("given a tiny detail budget and few buckets, when the html report is written, then the windows stay "
          "within the budget, hold the peaks and the OOM, and the kinds column holds just their events") {
  const fs::path file = kData / "synthetic_2k_native.bin";
  analyzer::FileEvents source(file);
  analyzer::AnalysisOptions whole;
  const analyzer::Analysis analysis = analyzer::analyze(source, whole);
  REQUIRE_FALSE(analysis.ooms.empty());
  analyzer::HtmlOptions tiny;
  tiny.detail_events = 100;
  tiny.max_buckets = 4;
  const Page page = page_of(file, tiny);
  CHECK(page.stats.detail_events <= 100);
  CHECK(decoded_bytes(page.text, "data-kinds") == page.stats.detail_events);
  CHECK(page.stats.buckets <= 4);
  CHECK(covers(page.stats.detail_windows, analysis.peak_allocated.event));
  CHECK(covers(page.stats.detail_windows, analysis.peak_reserved.event));
  CHECK(covers(page.stats.detail_windows, analysis.ooms.front().event));
  CHECK(covers(page.stats.detail_windows, page.stats.events - 1));
}

TEST_CASE("given a trace whose start needs no backward pass, when the html report is written, then it finds that "
          "start once") {
  const snapshot::Snapshot trace = analyzer::testing::random_trace(5, 200000, 1, 3);
  analyzer::SnapshotEvents events(trace);
  REQUIRE(events.block_count() > 1);
  test_support::CountingEvents counted(events);
  std::ostringstream out;
  analyzer::ReportOptions options;
  options.threads = 1;
  analyzer::write_html_report(counted, options, analyzer::HtmlOptions{}, out);
  // summary (one read, categories included), oom, the start, the categories
  // walk and the page's own replay: five reads of every block, no more
  CHECK(counted.reads == 5 * events.block_count());
}
