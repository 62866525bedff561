// Text from a file is made safe to print: JSON stays valid UTF-8 whatever
// the file holds, and tables and error messages carry no control character
// of the file (docs/RELIABILITY.md, "The promise").
#include <doctest/doctest.h>

#include <sstream>

#include "../analyzer/testing/parsers.hpp"
#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/text.hpp"

using namespace cachealloc;
using snapshot::invalid_utf8_bytes;
using snapshot::printable;
using snapshot::to_valid_utf8;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kBase = 0x7f0000000000ull;

std::string rendered(const analyzer::Document& document, analyzer::Format format) {
  std::ostringstream out;
  analyzer::render(document, format, out);
  return out.str();
}

// A trace whose program name, phase and frame names hold what a damaged or
// hostile file may: invalid UTF-8, an escape sequence, CR, BEL and a newline.
snapshot::Snapshot hostile_snapshot() {
  analyzer::testing::TraceBuilder b;
  const auto stack = b.stack({"bad\xff\xfe name\x1b[31m", "user_fn\r\x07"});
  b.segment(kBase, 2 * kMiB).begin("step\n1\xc0\xaf").alloc(kBase, kMiB, kMiB - 100, stack).end("step\n1\xc0\xaf");
  snapshot::Snapshot snap = b.build();
  snap.header.program = "train\xe2\x28\xa1.py\x1b]0;title\x07";
  return snap;
}

bool has_control_byte(const std::string& text) {
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n') || u == 0x7f) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("UTF-8 is checked as RFC 3629 says: overlongs, surrogates and values past U+10FFFF are invalid") {
  CHECK(invalid_utf8_bytes("plain ascii") == 0);
  CHECK(invalid_utf8_bytes("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == 0);  // é € 😀
  CHECK(invalid_utf8_bytes("\xc0\xaf") == 2);           // overlong '/'
  CHECK(invalid_utf8_bytes("\xe0\x80\xaf") == 3);       // overlong, 3 bytes
  CHECK(invalid_utf8_bytes("\xed\xa0\x80") == 3);       // a surrogate
  CHECK(invalid_utf8_bytes("\xf4\x90\x80\x80") == 4);   // past U+10FFFF
  CHECK(invalid_utf8_bytes("\xe2\x82") == 2);           // cut short
  CHECK(invalid_utf8_bytes("\x80 x \xff") == 2);        // stray bytes
  std::size_t replaced = 0;
  CHECK(to_valid_utf8("a\xff" "b", &replaced) == "a\xef\xbf\xbd" "b");
  CHECK(replaced == 1);
}

TEST_CASE("printable() keeps UTF-8 and spells out control characters and invalid bytes") {
  CHECK(printable("caf\xc3\xa9") == "caf\xc3\xa9");
  CHECK(printable("a\nb\rc\td") == "a\\nb\\rc\\td");
  CHECK(printable("\x1b[31mred\x07") == "\\x1b[31mred\\x07");
  CHECK(printable("\xc2\x9b" "2J") == "\\xc2\\x9b2J");  // C1 CSI
  CHECK(printable("x\xff") == "x\\xff");
  CHECK(printable("\x7f") == "\\x7f");
}

TEST_CASE("every report's JSON is valid UTF-8 and says how many bytes it replaced, whatever text the file holds") {
  // given a snapshot whose strings hold invalid UTF-8 and control characters
  const snapshot::Snapshot snap = hostile_snapshot();
  // when each report is rendered as JSON
  for (const auto& [name, document] : std::vector<std::pair<std::string, analyzer::Document>>{
           {"summary", analyzer::summary_report(snap, {})},
           {"peak", analyzer::peak_report(snap, {})},
           {"top", analyzer::top_report(snap, {})},
           {"leaks", analyzer::leaks_report(snap, {})},
           {"events", analyzer::events_report(snap, {})}}) {
    CAPTURE(name);
    const std::string json = rendered(document, analyzer::Format::json);
    // then it is valid UTF-8, parses, and a note counts the replacements
    CHECK(invalid_utf8_bytes(json) == 0);
    const auto parsed = analyzer::testing::parse_json(json);
    bool noted = false;
    for (const auto& note : parsed["notes"].array())
      noted = noted || std::get<std::string>(note.value).find("not valid UTF-8 and are shown as U+FFFD") != std::string::npos;
    CHECK(noted);
    // and CSV is valid UTF-8 too
    CHECK(invalid_utf8_bytes(rendered(document, analyzer::Format::csv)) == 0);
  }
}

TEST_CASE("tables carry no control character of the file: no escape code, CR, BEL or extra line") {
  // given the same hostile snapshot
  const snapshot::Snapshot snap = hostile_snapshot();
  // when reports are rendered as tables
  for (const auto& document : {analyzer::summary_report(snap, {}), analyzer::peak_report(snap, {}),
                               analyzer::top_report(snap, {}), analyzer::events_report(snap, {})}) {
    const std::string table = rendered(document, analyzer::Format::table);
    CAPTURE(table);
    // then no control byte but the line ends is written, and the title stays one line
    CHECK_FALSE(has_control_byte(table));
    CHECK(invalid_utf8_bytes(table) == 0);
    CHECK(table.substr(0, table.find('\n')).find("train\\xe2(\\xa1.py\\x1b]0;title\\x07") != std::string::npos);
  }
}
