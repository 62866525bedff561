// libFuzzer target: the HTML page (html) on whatever load() accepts. The
// page must be valid UTF-8 (the file's text reaches it only escaped) and
// end with </html>; a refusal must be a SnapshotError of one line. With a
// tiny detail budget (an option bit), as a long trace's page is made: it
// keeps at most that many events, in ordered, disjoint windows, and at most
// that many buckets.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/html_report.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace cachealloc;
  const std::optional<snapshot::Snapshot> snapshot = fuzz::load_small(fuzz::as_bytes(data, size));
  if (!snapshot) return 0;
  analyzer::SnapshotEvents source(*snapshot);
  analyzer::HtmlOptions html;
  // Small windows drawn event by event, as a long trace's would be.
  if (fuzz::option_bits(data, size) & 1u) html.exact_events = 16;
  const bool tiny = (fuzz::option_bits(data, size) & 2u) != 0;
  if (tiny) html.detail_events = 8, html.max_buckets = 4;
  std::ostringstream out;
  try {
    const analyzer::HtmlReportStats stats = analyzer::write_html_report(source, analyzer::ReportOptions{}, html, out);
    const std::string page = out.str();
    fuzz::check_utf8(page);
    if (stats.bytes != page.size()) std::abort();
    if (page.find("</html>") == std::string::npos) std::abort();
    if (stats.detail_events > stats.events) std::abort();
    if (tiny && stats.events > html.detail_events) {
      if (stats.detail_events > html.detail_events || stats.buckets > html.max_buckets) std::abort();
      for (std::size_t w = 1; w < stats.detail_windows.size(); ++w)
        if (stats.detail_windows[w].begin < stats.detail_windows[w - 1].end) std::abort();
    }
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
  }
  return 0;
}
