// Report builders: the figures agree with each other (peaks with the
// timeline, the identities at every sample, one-pass and two-pass site
// figures), exactness after a ring overflow, OOM verdicts, and the output of
// every report in every format parses.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "../analyzer/testing/parsers.hpp"
#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/stream.hpp"

using namespace cachealloc;
using analyzer::Document;
using analyzer::Format;
using analyzer::ReportOptions;
using analyzer::testing::TraceBuilder;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kBase = 0x7f0000000000ull;

std::string rendered(const Document& document, Format format) {
  std::ostringstream out;
  analyzer::render(document, format, out);
  return out.str();
}

analyzer::testing::Json json_of(const Document& document) {
  return analyzer::testing::parse_json(rendered(document, Format::json));
}

const analyzer::Table& table_of(const Document& document, const std::string& key) {
  for (const auto& section : document.sections) {
    if (const auto* table = std::get_if<analyzer::Table>(&section); table && table->key == key) return *table;
  }
  throw std::runtime_error("no table " + key);
}
// A table of a temporary document would dangle: keep the document in a variable.
const analyzer::Table& table_of(Document&& document, const std::string& key) = delete;

std::uint64_t cell(const analyzer::Table& table, std::size_t row, const std::string& column) {
  for (std::size_t c = 0; c < table.columns.size(); ++c) {
    if (table.columns[c].key == column) {
      const auto* value = std::get_if<std::uint64_t>(&table.rows[row][c]);
      return value ? *value : 0;
    }
  }
  throw std::runtime_error("no column " + column);
}

using Builder = Document (*)(const snapshot::Snapshot&, const ReportOptions&);
const std::pair<const char*, Builder> kReports[] = {
    {"summary", analyzer::summary_report}, {"segments", analyzer::segments_report},
    {"fragmentation", analyzer::fragmentation_report}, {"timeline", analyzer::timeline_report},
    {"peak", analyzer::peak_report},       {"top", analyzer::top_report},
    {"leaks", analyzer::leaks_report},     {"oom", analyzer::oom_report},
    {"events", analyzer::events_report}};

}  // namespace

TEST_CASE("summary --format json has every documented key") {
  // given a random trace
  const auto snap = analyzer::testing::random_trace(1, 3000);
  // when the summary is rendered as JSON
  const auto json = json_of(analyzer::summary_report(snap, {}));
  // then it parses and has the keys users script against
  for (const char* key : {"events", "dropped_events", "segments_at_end", "reserved_at_end", "allocated_at_end",
                          "peak_allocated", "peak_reserved", "peak_requested", "peak_allocated_event", "driver_total",
                          "at_event", "gap"}) {
    CAPTURE(key);
    CHECK(json.has(key));
  }
  CHECK(json["events"].is_object());
  CHECK(json["events"]["alloc"].number() > 0);
  CHECK(json["segments_at_end"].number() == static_cast<double>(snap.segments.size()));
}

TEST_CASE("every report parses as JSON and writes CSV with a header and one column count") {
  const auto snap = analyzer::testing::random_trace(2, 2000, 6, 4);
  for (const auto& [name, build] : kReports) {
    CAPTURE(name);
    // given a report of a random trace
    ReportOptions options;
    options.buckets = 7;
    const Document document = build(snap, options);
    // when it is rendered as JSON and CSV
    // then the JSON is one object and the CSV rectangular
    CHECK(json_of(document).is_object());
    const auto rows = analyzer::testing::parse_csv(rendered(document, Format::csv));
    REQUIRE(!rows.empty());
    for (const auto& row : rows) CHECK(row.size() == rows.front().size());
    CHECK(!rendered(document, Format::table).empty());
  }
}

TEST_CASE("the reported peak equals the maximum of the timeline") {
  const auto snap = analyzer::testing::random_trace(3, 4000);
  for (std::size_t buckets : {0ul, 1ul, 13ul, 100ul}) {
    CAPTURE(buckets);
    // given the summary and a timeline, per event or bucketed
    ReportOptions options;
    options.buckets = buckets;
    const auto summary = json_of(analyzer::summary_report(snap, {}));
    const Document timeline = analyzer::timeline_report(snap, options);
    const auto& table = table_of(timeline, "timeline");
    // when the largest value of each column is taken
    std::uint64_t allocated = 0;
    std::uint64_t reserved = 0;
    std::uint64_t requested = 0;
    for (std::size_t r = 0; r < table.rows.size(); ++r) {
      allocated = std::max(allocated, cell(table, r, "allocated"));
      reserved = std::max(reserved, cell(table, r, "reserved"));
      requested = std::max(requested, cell(table, r, "requested"));
    }
    // then it is the peak the summary reports
    CHECK(static_cast<double>(allocated) == summary["peak_allocated"].number());
    CHECK(static_cast<double>(reserved) == summary["peak_reserved"].number());
    CHECK(static_cast<double>(requested) == summary["peak_requested"].number());
  }
}

TEST_CASE("allocated + pending + cached free = reserved and allocated + pending = requested + rounding at every sampled event") {
  // given the fragmentation figures over time
  const auto snap = analyzer::testing::random_trace(4, 6000);
  ReportOptions options;
  options.buckets = 50;
  const Document report = analyzer::fragmentation_report(snap, options);
  const auto& table = table_of(report, "over_time");
  REQUIRE(table.rows.size() == 51);
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    CAPTURE(r);
    // when each sample is read
    // then the identities hold
    CHECK(cell(table, r, "allocated") + cell(table, r, "pending_free") + cell(table, r, "cached_free") ==
          cell(table, r, "reserved"));
    CHECK(cell(table, r, "requested") + cell(table, r, "rounding_waste") ==
          cell(table, r, "allocated") + cell(table, r, "pending_free"));
    CHECK(cell(table, r, "largest_free") <= cell(table, r, "cached_free"));
  }
}

TEST_CASE("the sites at the peak from the one-pass analysis equal a replay to the peak") {
  // given a random trace
  const auto snap = analyzer::testing::random_trace(5, 8000, 16, 8);
  // when the one-pass per-site bytes at the peak and the peak report's listing are compared
  const analyzer::Analysis a = analyzer::analyze(snap, {});
  const Document peak = analyzer::peak_report(snap, {});
  const auto json = json_of(peak);
  // then they agree site by site, and add up to the peak
  std::uint64_t one_pass_total = 0;
  for (const auto& site : a.sites) one_pass_total += site.bytes_at_peak_allocated;
  CHECK(one_pass_total == a.peak_allocated.bytes);
  CHECK(json["allocated_bytes"].number() == static_cast<double>(a.peak_allocated.bytes));
  const auto& sites = table_of(peak, "sites");
  std::uint64_t listed = 0;
  for (std::size_t r = 0; r < sites.rows.size(); ++r) listed += cell(sites, r, "bytes");
  CHECK(listed == a.peak_allocated.bytes);
}

TEST_CASE("after a ring overflow the layout at the end is exact and peaks are marked lower bounds") {
  // given a trace whose first 2000 events were lost
  auto snap = analyzer::testing::random_trace(6, 6000);
  snap.events.erase(snap.events.begin(), snap.events.begin() + 2000);
  snap.dropped_events = 2000;
  // when it is summarised
  const Document summary = analyzer::summary_report(snap, {});
  const auto json = json_of(summary);
  // then the end figures match the stored layout, the peaks are lower bounds, and the notes say so
  std::uint64_t reserved = 0;
  for (const auto& segment : snap.segments) reserved += segment.total_size;
  CHECK(json["reserved_at_end"].number() == static_cast<double>(reserved));
  std::vector<std::string> lower;
  for (const auto& key : json["lower_bounds"].array()) lower.push_back(std::get<std::string>(key.value));
  CHECK(std::find(lower.begin(), lower.end(), "peak_allocated") != lower.end());
  CHECK(std::find(lower.begin(), lower.end(), "reserved_at_end") == lower.end());
  const std::string text = rendered(summary, Format::table);
  CHECK(text.find("ring overflowed") != std::string::npos);
  CHECK(text.find("differs from the stored") == std::string::npos);
}

TEST_CASE("an OOM with enough memory but no large enough free block is blamed on fragmentation") {
  // given a 20 MiB segment with every other MiB allocated and a 4 MiB request that finds no room
  TraceBuilder b;
  b.segment(kBase, 20 * kMiB);
  for (std::uint64_t i = 0; i < 20; ++i) b.alloc(kBase + i * kMiB, kMiB, kMiB, b.stack({"f"}));
  for (std::uint64_t i = 0; i < 20; i += 2) b.free(kBase + i * kMiB);
  b.oom(4 * kMiB, 2 * kMiB, 0);
  // when the OOM report is built
  const auto json = json_of(analyzer::oom_report(b.build(), {}));
  // then the verdict is fragmentation and emptying the cache would not have helped
  REQUIRE(json["ooms"].array().size() == 1);
  const auto& oom = json["ooms"].array()[0];
  CHECK(std::get<std::string>(oom["verdict"].value) == "fragmentation");
  CHECK(std::get<bool>(oom["empty_cache_helps"].value) == false);
  CHECK(oom["largest_free"].number() == static_cast<double>(kMiB));
}

TEST_CASE("an OOM above the allocator cap with room on the device is blamed on the cap") {
  // given 10 MiB live under a 12 MiB cap and a 4 MiB request, with the device mostly free
  TraceBuilder b;
  b.segment(kBase, 10 * kMiB).alloc(kBase, 10 * kMiB, 10 * kMiB).oom(4 * kMiB, 1ull << 30, 12 * kMiB);
  // when the OOM report is built
  const auto json = json_of(analyzer::oom_report(b.build(), {}));
  // then the verdict names the cap
  CHECK(std::get<std::string>(json["ooms"].array()[0]["verdict"].value) == "the cap");
}

TEST_CASE("an OOM whose live data does not fit on the device is real demand, and a releasable cache is noticed") {
  // given an idle cached segment of 8 MiB, 10 MiB live, 1 MiB device free and a 6 MiB request
  TraceBuilder b;
  b.segment(kBase, 10 * kMiB).alloc(kBase, 10 * kMiB, 10 * kMiB);
  b.segment(kBase + 64 * kMiB, 8 * kMiB).oom(6 * kMiB, kMiB, 0);
  b.oom(40 * kMiB, kMiB, 0);
  // when the OOM report is built
  const auto json = json_of(analyzer::oom_report(b.build(), {}));
  // then the first could have been saved by empty_cache, the second is real demand
  const auto& ooms = json["ooms"].array();
  REQUIRE(ooms.size() == 2);
  CHECK(std::get<bool>(ooms[0]["empty_cache_helps"].value) == true);
  CHECK(std::get<std::string>(ooms[1]["verdict"].value) == "real demand");
}

TEST_CASE("leaks lists only live allocations of at least --min-size, with their sites") {
  // given three allocations, one freed, one small and one large
  TraceBuilder b;
  const auto big = b.stack({"cachealloc::malloc", "make_big"});
  b.segment(kBase, 20 * kMiB).alloc(kBase, kMiB, kMiB).alloc(kBase + kMiB, 512, 500).alloc(kBase + 2 * kMiB, 4 * kMiB, 4 * kMiB, big);
  b.free(kBase);
  ReportOptions options;
  options.min_size = kMiB;
  // when the leaks report is built
  const Document leaks = analyzer::leaks_report(b.build(), options);
  // then only the large one is listed, under its first non-cachealloc frame
  const auto& list = table_of(leaks, "allocations");
  REQUIRE(list.rows.size() == 1);
  CHECK(cell(list, 0, "size") == 4 * kMiB);
  CHECK(std::get<std::string>(list.rows[0][3]).rfind("make_big", 0) == 0);
}

TEST_CASE("segments --at shows the layout just after that event") {
  // given a segment split in two by the second event
  const auto snap = TraceBuilder().segment(kBase, 20 * kMiB).alloc(kBase, 2 * kMiB, 2 * kMiB).build();
  for (auto [at, blocks] : {std::pair{0ul, 1ul}, std::pair{2ul, 2ul}}) {
    ReportOptions options;
    options.at = at;
    // when the segments report is built at event `at`
    const Document report = analyzer::segments_report(snap, options);
    const auto& table = table_of(report, "blocks");
    // then it shows the blocks of that moment
    CAPTURE(at);
    CHECK(table.rows.size() == blocks);
  }
}

TEST_CASE("events --kind lists only those kinds") {
  const auto snap = analyzer::testing::random_trace(8, 1000);
  ReportOptions options;
  options.kinds = {snapshot::EventKind::segment_alloc};
  const Document report = analyzer::events_report(snap, options);
  const auto& table = table_of(report, "events");
  CHECK(table.rows.size() == static_cast<std::size_t>(std::count_if(snap.events.begin(), snap.events.end(), [](const auto& e) {
          return e.kind == snapshot::EventKind::segment_alloc;
        })));
}

TEST_CASE("--kind takes PyTorch's name of a segment release, segment_free") {
  snapshot::EventKind kind = snapshot::EventKind::alloc;
  CHECK(snapshot::parse_event_kind("segment_free", kind));
  CHECK(kind == snapshot::EventKind::segment_release);
  CHECK(snapshot::parse_event_kind("segment_release", kind));
  CHECK_FALSE(snapshot::parse_event_kind("segment_frees", kind));
}

TEST_CASE("each events slice counts exactly the events from its first to its last, and carries its last event's time") {
  const auto snap = analyzer::testing::random_trace(9, 3300);
  for (std::size_t buckets : {7ul, 100ul, 1000ul}) {
    CAPTURE(buckets);
    ReportOptions options;
    options.buckets = buckets;
    const Document report = analyzer::events_report(snap, options);
    const auto& table = table_of(report, "events");
    std::uint64_t total = 0, expected_first = 0;
    for (std::size_t row = 0; row < table.rows.size(); ++row) {
      const std::uint64_t first = cell(table, row, "first_event"), last = cell(table, row, "event");
      CHECK(first == expected_first);
      CHECK(cell(table, row, "events") == last - first + 1);
      const std::uint64_t allocs = static_cast<std::uint64_t>(std::count_if(
          snap.events.begin() + static_cast<std::ptrdiff_t>(first), snap.events.begin() + static_cast<std::ptrdiff_t>(last) + 1,
          [](const auto& e) { return e.kind == snapshot::EventKind::alloc; }));
      CHECK(cell(table, row, "alloc") == allocs);
      CHECK(cell(table, row, "time_ns") == snap.events[last].time_ns - snap.events.front().time_ns);
      total += cell(table, row, "events");
      expected_first = last + 1;
    }
    CHECK(total == snap.events.size());
  }
}

TEST_CASE("an event point is an index or a time since the first event") {
  const auto snap = TraceBuilder().segment(kBase, 2 * kMiB).alloc(kBase, kMiB, kMiB).free(kBase).build();
  std::string error;
  CHECK(analyzer::parse_event_point(snap, "2", error) == 2u);
  CHECK(analyzer::parse_event_point(snap, "1us", error) == 1u);   // events are 1 us apart
  CHECK(analyzer::parse_event_point(snap, "0.0000015s", error) == 2u);
  CHECK(analyzer::parse_event_point(snap, "99", error) == snap.events.size());
  CHECK_FALSE(analyzer::parse_event_point(snap, "soon", error).has_value());
  CHECK(!error.empty());
}

TEST_CASE("a state or window that ends at a time takes every event at or before it, and none after") {
  // Given events 1 us apart, at 0, 1, 2 us...
  const auto snap = TraceBuilder().segment(kBase, 2 * kMiB).alloc(kBase, kMiB, kMiB).free(kBase).build();
  REQUIRE(snap.events.size() >= 3);
  REQUIRE(snap.events[1].time_ns - snap.events[0].time_ns == 1000);
  REQUIRE(snap.events[2].time_ns - snap.events[1].time_ns == 1000);
  analyzer::SnapshotEvents source(snap);
  std::string error;
  // then an index takes that event, and a time every event up to it
  CHECK(analyzer::parse_state_end(source, "1", error) == 2u);
  CHECK(analyzer::parse_state_end(source, "0ns", error) == 1u);      // the event at exactly that time is in
  CHECK(analyzer::parse_state_end(source, "1us", error) == 2u);
  CHECK(analyzer::parse_state_end(source, "1500ns", error) == 2u);   // between events: the one after is out
  CHECK(analyzer::parse_state_end(source, "99s", error) == snap.events.size());
  CHECK(analyzer::parse_state_end(source, "99", error) == snap.events.size());
  CHECK_FALSE(analyzer::parse_state_end(source, "later", error).has_value());
  // while a window that begins at a time begins at the first event at or after it
  CHECK(analyzer::parse_event_point(source, "1500ns", error) == 2u);
}

TEST_CASE("the top frame skips cachealloc's own frames, and a stack of ours alone names none of them") {
  TraceBuilder b;
  const auto stack = b.stack({"cachealloc::CachingAllocator::malloc", "cachealloc::record", "user_fn", "main"});
  const auto own_only = b.stack({"cachealloc::record"});
  const auto snap = b.build();
  CHECK(analyzer::top_frame(snap, stack).rfind("user_fn (", 0) == 0);
  CHECK(analyzer::top_frame(snap, own_only).starts_with("inside cachealloc: no frame of your program"));
  CHECK(analyzer::top_frame(snap, {}) == "<unknown site>");
  CHECK(analyzer::stack_lines(snap, stack).size() == 2);
}

TEST_CASE("the gap is numbers with one name each, and adds up: allocated + pending + cached free = reserved") {
  // given a snapshot of our recorder on the simulated device, with the driver read at the dump
  const auto snap = analyzer::load(std::string(CACHEALLOC_SOURCE_DIR) + "/testdata/synthetic_2k_native.bin");
  // when the summary is rendered as JSON
  const auto json = json_of(analyzer::summary_report(snap, {}));
  const auto& gap = json["gap"];
  // then every figure of the chain is a number, and the chain adds up
  for (const char* key : {"allocated", "rounding_waste", "pending_free", "cached_free", "inactive_split",
                          "releasable_by_empty_cache", "reserved", "outside_allocator", "driver_used"}) {
    CAPTURE(key);
    CHECK(gap[key].is_number());
  }
  CHECK(gap["allocated"].number() + gap["pending_free"].number() + gap["cached_free"].number() ==
        gap["reserved"].number());
  CHECK(gap["reserved"].number() + gap["outside_allocator"].number() == gap["driver_used"].number());
  CHECK(gap["inactive_split"].number() <= gap["cached_free"].number());
}

TEST_CASE("a range reports the state after its last event and leaves the driver's figures unmeasured there") {
  // given a recorded snapshot whose driver figures were read at the dump
  const auto snap = analyzer::load(std::string(CACHEALLOC_SOURCE_DIR) + "/testdata/synthetic_2k_native.bin");
  ReportOptions options;
  options.window = {0, 201};
  // when the summary covers events 0 to 200
  const Document report = analyzer::summary_report(snap, options);
  const auto json = json_of(report);
  const std::string table = rendered(report, Format::table);
  // then it says which event, the device figures are null and "unknown", and a note says why
  CHECK(json["at_event"].number() == 200);
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["outside_allocator"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["driver_used"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["device_used"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["process_used"].value));
  CHECK(table.find("after event #200") != std::string::npos);
  CHECK(table.find("outside the allocator") != std::string::npos);
  CHECK(table.find("not measured at event #200") != std::string::npos);
  CHECK(table.find("outside the allocator (CUDA context, other allocators and processes)  unknown") !=
        std::string::npos);
  // and the reserved figure is the one of that moment, never below allocated
  CHECK(json["gap"]["reserved"].number() >= json["gap"]["allocated"].number());
}

TEST_CASE("PyTorch snapshots hold no driver figures: null in JSON, unknown in tables, empty in CSV, never 0") {
  // given a real PyTorch snapshot
  const auto snap =
      analyzer::load(std::string(CACHEALLOC_SOURCE_DIR) + "/testdata/pytorch/corpus/empty_cache_mid.pickle");
  // when the summary is rendered in every format
  const Document report = analyzer::summary_report(snap, {});
  const auto json = json_of(report);
  const std::string table = rendered(report, Format::table);
  const std::string csv = rendered(report, Format::csv);
  // then the device figures are unknown, not zero
  CHECK(std::holds_alternative<std::nullptr_t>(json["driver_total"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["driver_used"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["device_used"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["process_used"].value));
  CHECK(table.find("device total (torch.cuda.mem_get_info())  unknown") != std::string::npos);
  CHECK(table.find("mem_get_info())  0 B") == std::string::npos);
  CHECK(csv.find("driver_total,,") != std::string::npos);
  CHECK(csv.find("gap.process_used,,") != std::string::npos);
}

TEST_CASE("block sizes the reader inferred or saw contradicted make the peaks lower bounds") {
  for (const char* key : {"block_sizes.inferred", "block_sizes.contradicted"}) {
    CAPTURE(key);
    // given a whole trace whose reader reports one size it could not replay
    auto snap = analyzer::testing::random_trace(2, 500);
    snap.settings[key] = "1";
    // when it is summarized
    const auto json = json_of(analyzer::summary_report(snap, {}));
    // then the peaks are listed as lower bounds
    bool peak_is_bound = false;
    for (const auto& k : json["lower_bounds"].array()) peak_is_bound |= std::get<std::string>(k.value) == "peak_allocated";
    CHECK(peak_is_bound);
  }
  // and without either the same trace has none
  const auto json = json_of(analyzer::summary_report(analyzer::testing::random_trace(2, 500), {}));
  CHECK(json["lower_bounds"].array().empty());
}

TEST_CASE("summary of a stream that lost its trailer: the dropped count and the driver's reading at the end are unknown") {
  // Given a stream whose start carries the driver's reading when the
  // recording began (the whole device free), killed after 512 MiB were reserved
  using snapshot::Event;
  using snapshot::EventKind;
  const std::uint64_t total = 80ull << 30, size = 512 * kMiB;
  const auto path = std::filesystem::temp_directory_path() /
                    ("cachealloc_reports_cut_" + std::to_string(::getpid()) + ".bin");
  {
    snapshot::Snapshot start;
    snapshot::DeviceInfo device;
    device.total_bytes = total;
    device.driver_total_at_dump = total;
    device.driver_free_at_dump = total;
    start.devices.push_back(device);
    snapshot::StreamFileWriter writer(path, start);
    writer.append_events(std::vector<Event>{
        Event{EventKind::segment_alloc, 0, 0, {}, 10, 0, kBase, size, snapshot::segment_flag_large_pool},
        Event{EventKind::alloc, 0, 0, {}, 11, 0, kBase, size, size},
    });
  }  // no finish(): no trailer
  // When summarized
  const Document document = analyzer::summary_report(analyzer::load(path.string()), {});
  std::filesystem::remove(path);
  const auto json = json_of(document);
  // Then what only the trailer holds is null, never 0 (docs/GLOSSARY.md)
  CHECK(json["reserved_at_end"].number() == static_cast<double>(size));
  CHECK(std::holds_alternative<std::nullptr_t>(json["dropped_events"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["driver_used"].value));
  CHECK(std::holds_alternative<std::nullptr_t>(json["gap"]["driver_free"].value));
  CHECK(json["driver_total"].number() == static_cast<double>(total));
  // and 'unknown' in the table
  const std::string table = rendered(document, Format::table);
  CAPTURE(table);
  for (const char* label : {"events lost to ring overflow", "used on the device"}) {
    const std::size_t at = table.find(label);
    REQUIRE(at != std::string::npos);
    CHECK(table.substr(at, table.find('\n', at) - at).find("unknown") != std::string::npos);
  }
}
