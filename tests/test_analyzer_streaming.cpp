// The streaming path (FileEvents over a version 3 file, one block at a time)
// gives byte for byte the golden outputs of the in-memory path.
#include <doctest/doctest.h>

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/format.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;

namespace {

const fs::path kOwnDir = fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata";

using Builder = analyzer::Document (*)(analyzer::EventSource&, const analyzer::ReportOptions&);
analyzer::Document timeline_in_buckets(analyzer::EventSource& source, const analyzer::ReportOptions& options) {
  analyzer::ReportOptions bucketed = options;
  bucketed.buckets = 8;
  return analyzer::timeline_report(source, bucketed);
}
const std::pair<const char*, Builder> kSubcommands[] = {
    {"summary", analyzer::summary_report}, {"segments", analyzer::segments_report},
    {"fragmentation", analyzer::fragmentation_report}, {"timeline", analyzer::timeline_report},
    {"timeline-buckets", timeline_in_buckets}, {"peak", analyzer::peak_report},
    {"top", analyzer::top_report},         {"leaks", analyzer::leaks_report},
    {"oom", analyzer::oom_report},         {"events", analyzer::events_report}};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("every report over a streamed version 3 file matches the golden output") {
  for (const char* name : {"small_step", "small_overflow", "small_random"}) {
    CAPTURE(name);
    // Given a golden snapshot rewritten in today's format
    const fs::path path = fs::temp_directory_path() /
                          ("cachealloc-streaming-test-" + std::to_string(::getpid()) + "-" + name + ".bin");
    snapshot::write_snapshot(analyzer::load(kOwnDir / (std::string(name) + ".bin")), path);
    analyzer::FileEvents source(path);
    REQUIRE(source.streaming());
    for (const auto& [subcommand, build] : kSubcommands) {
      CAPTURE(subcommand);
      // When each report reads it block by block
      const analyzer::Document document = build(source, {});
      // Then the output is the golden one, in every format
      for (const auto& [extension, format] : {std::pair{"table", analyzer::Format::table},
                                              std::pair{"csv", analyzer::Format::csv},
                                              std::pair{"json", analyzer::Format::json}}) {
        std::ostringstream out;
        analyzer::render(document, format, out);
        CHECK(out.str() == read_file(kOwnDir / name / (std::string(subcommand) + "." + extension)));
      }
    }
    fs::remove(path);
  }
}

TEST_CASE("reports over several blocks match the in-memory path, with and without a derived start") {
  for (const bool overflowed : {false, true}) {
    CAPTURE(overflowed);
    // Given a random trace of four blocks, the second time missing its first events
    snapshot::Snapshot trace = analyzer::testing::random_trace(4, 200000, 3, 3);
    if (overflowed) {
      trace.events.erase(trace.events.begin(), trace.events.begin() + 1000);
      trace.dropped_events = 1000;
    }
    REQUIRE(trace.events.size() > 2 * 65536);
    const fs::path path =
        fs::temp_directory_path() / ("cachealloc-streaming-test-" + std::to_string(::getpid()) + "-blocks.bin");
    snapshot::write_snapshot(trace, path);
    analyzer::FileEvents source(path);
    analyzer::FileEvents decoded_ahead(path, 3);
    analyzer::ReportOptions window;
    window.window = {70000, 140000};
    for (const auto& [subcommand, build] : kSubcommands) {
      CAPTURE(subcommand);
      for (const analyzer::ReportOptions& options : {analyzer::ReportOptions{}, window}) {
        // When a report reads it block by block, then it says what the in-memory path says
        analyzer::SnapshotEvents in_memory(trace);
        std::ostringstream streamed, ahead, loaded;
        analyzer::render(build(source, options), analyzer::Format::json, streamed);
        analyzer::render(build(decoded_ahead, options), analyzer::Format::json, ahead);
        analyzer::render(build(in_memory, options), analyzer::Format::json, loaded);
        CHECK(streamed.str() == loaded.str());
        CHECK(ahead.str() == loaded.str());
      }
    }
    fs::remove(path);
  }
}

TEST_CASE("blocks decoded ahead on other threads are the blocks, in any order asked, and a damaged one throws") {
  // Given a file of several blocks
  const snapshot::Snapshot trace = analyzer::testing::random_trace(5, 300000, 3, 3);
  const fs::path path =
      fs::temp_directory_path() / ("cachealloc-streaming-test-" + std::to_string(::getpid()) + "-ahead.bin");
  snapshot::write_snapshot(trace, path);
  analyzer::FileEvents plain(path);
  REQUIRE(plain.block_count() >= 4);
  for (const unsigned threads : {1u, 2u, 7u}) {
    CAPTURE(threads);
    analyzer::FileEvents ahead(path, threads);
    // When blocks are asked in order, twice, then backwards, then skipping
    std::vector<std::size_t> order;
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t b = 0; b < ahead.block_count(); ++b) order.push_back(b);
    }
    for (std::size_t b = ahead.block_count(); b-- > 0;) order.push_back(b);
    order.insert(order.end(), {0, 2, 1, 3, 0, 1});
    for (const std::size_t b : order) {
      CAPTURE(b);
      // Then each is the block the one-thread reader gives
      const std::span<const snapshot::Event> got = ahead.block(b);
      const std::vector<snapshot::Event> copy(got.begin(), got.end());
      const std::span<const snapshot::Event> want = plain.block(b);
      CHECK(copy == std::vector<snapshot::Event>(want.begin(), want.end()));
    }
  }
  // Given the same file with a damaged last block
  std::string bytes = read_file(path);
  bytes[bytes.size() - 20] = static_cast<char>(bytes[bytes.size() - 20] ^ 0x5a);
  bytes[bytes.size() - 21] = static_cast<char>(bytes[bytes.size() - 21] ^ 0xa5);
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }
  analyzer::FileEvents damaged_plain(path);
  analyzer::FileEvents damaged_ahead(path, 3);
  // When both read every block in order, then both fail at the same block with the same error
  auto first_error = [](analyzer::FileEvents& source) {
    for (std::size_t b = 0; b < source.block_count(); ++b) {
      try {
        source.block(b);
      } catch (const snapshot::SnapshotError& error) {
        return std::to_string(b) + ": " + error.what();
      }
    }
    return std::string("no error");
  };
  const std::string expected = first_error(damaged_plain);
  CHECK(expected != "no error");
  CHECK(first_error(damaged_ahead) == expected);
  fs::remove(path);
}

TEST_CASE("decoding threads count the cores this process may run on, not every online core") {
  // Given the calling thread confined to one CPU, then to two where there are two
  cpu_set_t saved;
  CPU_ZERO(&saved);
  REQUIRE(::sched_getaffinity(0, sizeof(saved), &saved) == 0);
  int first = -1, second = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && second < 0; ++cpu) {
    if (!CPU_ISSET(cpu, &saved)) continue;
    (first < 0 ? first : second) = cpu;
  }
  REQUIRE(first >= 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(::sched_setaffinity(0, sizeof(one), &one) == 0);
  // When the default is asked, then one CPU leaves no core to decode on
  const unsigned on_one = cachealloc::analyzer::FileEvents::default_decode_threads();
  unsigned on_two = 1;
  if (second >= 0) {
    cpu_set_t two = one;
    CPU_SET(second, &two);
    REQUIRE(::sched_setaffinity(0, sizeof(two), &two) == 0);
    on_two = cachealloc::analyzer::FileEvents::default_decode_threads();
  } else {
    MESSAGE("one CPU only: the two-CPU case is not checked");
  }
  REQUIRE(::sched_setaffinity(0, sizeof(saved), &saved) == 0);
  CHECK(on_one == 0);
  // And two leave one
  CHECK(on_two == 1);
}
