// ranks FILE... | DIR: N recordings, one per rank, with known
// per-rank differences, made by the real allocator and the recorder on
// simulated devices of known capacity. Expected figures come from the
// construction and the allocator's own stats.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "cachealloc/allocator.hpp"
#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "../analyzer/testing/parsers.hpp"
#include "allocator_support.hpp"

using namespace cachealloc;
using test_support::MiB;
namespace fs = std::filesystem;

[[gnu::noinline]] void* ranks_weights_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}
[[gnu::noinline]] void* ranks_activation_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}
[[gnu::noinline]] void* ranks_straggler_site(CachingAllocator& allocator, std::size_t bytes) {
  void* p = allocator.allocate(bytes);
  asm volatile("" ::: "memory");
  return p;
}

namespace {

constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

struct Rank {
  std::uint32_t rank;
  std::uint64_t capacity;
  std::uint64_t peak_reserved = 0;  // the allocator's own
};

// Rank r: weights 64 MiB and an activation of 16 + 2r MiB; rank 2 also a
// 100 MiB straggler buffer. Rank 10 runs on a device of 128 MiB, the others
// on 2 GiB: rank 2 has the largest peak, rank 10 the least headroom.
[[gnu::noinline]] void record_rank(Rank& r, const fs::path& path) {
  CachingAllocator allocator(test_support::simulated(r.capacity));
  HistoryRecorder recorder(allocator, HistoryOptions{});
  void* weights = ranks_weights_site(allocator, 64 * MiB);
  void* activation = ranks_activation_site(allocator, (16 + 2 * r.rank) * MiB);
  void* straggler = r.rank == 2 ? ranks_straggler_site(allocator, 100 * MiB) : nullptr;
  allocator.deallocate(activation);
  if (straggler) allocator.deallocate(straggler);
  snapshot::write_snapshot(recorder.take_snapshot(), path);
  r.peak_reserved = static_cast<std::uint64_t>(allocator.stats().reserved_bytes[stat_all].peak);
  allocator.deallocate(weights);
}

struct Fleet {
  fs::path dir;
  std::vector<Rank> ranks{{10, 128 * MiB}, {2, 2 * GiB}, {0, 2 * GiB}, {1, 2 * GiB}};
  Fleet() {
    dir = fs::temp_directory_path() / ("cachealloc-ranks-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (Rank& r : ranks) record_rank(r, dir / ("rank_" + std::to_string(r.rank) + ".bin"));
    std::ofstream(dir / "notes.txt") << "not a snapshot\n";  // side files in the folder are skipped,
    std::ofstream(dir / "rank_3.stats.json.zst") << "x";    // compressed ones too
    std::sort(ranks.begin(), ranks.end(), [](const Rank& x, const Rank& y) { return x.rank < y.rank; });
  }
  ~Fleet() { fs::remove_all(dir); }
};

const Fleet& fleet() {
  static const Fleet f;
  return f;
}

}  // namespace

TEST_CASE("given a folder of rank files, they are ordered naturally and each rank number comes from its name") {
  const std::vector<fs::path> files = analyzer::rank_files({fleet().dir.string()});
  REQUIRE(files.size() == 4);  // notes.txt and rank_3.stats.json.zst left out
  CHECK(files[0].filename() == "rank_0.bin");
  CHECK(files[1].filename() == "rank_1.bin");
  CHECK(files[2].filename() == "rank_2.bin");
  CHECK(files[3].filename() == "rank_10.bin");  // not between 1 and 2
  CHECK(analyzer::rank_from_name("snapshot_rank12_step300.pickle") == 12u);
  CHECK(analyzer::rank_from_name("gpu-3.pickle.gz") == 3u);
  CHECK(analyzer::rank_from_name("host_a_device7.bin") == 7u);
  CHECK(analyzer::rank_from_name("run5.pickle") == 5u);
  CHECK_FALSE(analyzer::rank_from_name("step_3_of_8.pickle").has_value());  // two numbers, no rank word
  CHECK_FALSE(analyzer::rank_from_name("snapshot.pickle").has_value());
}

TEST_CASE("given N ranks with known differences, their peaks, imbalance, headroom and the rank closest to OOM are exact") {
  analyzer::RanksOptions options;
  options.threads = 3;
  const std::vector<analyzer::RankSummary> ranks =
      analyzer::summarize_ranks(analyzer::rank_files({fleet().dir.string()}), options);
  REQUIRE(ranks.size() == 4);
  std::vector<std::uint64_t> peaks;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const Rank& truth = fleet().ranks[i];
    CAPTURE(truth.rank);
    REQUIRE(ranks[i].rank == truth.rank);
    CHECK(ranks[i].run.peak_reserved == truth.peak_reserved);
    // by construction: segments of exactly 64 MiB, 16 + 2r MiB and, on rank 2, 100 MiB
    CHECK(truth.peak_reserved == (64 + 16 + 2 * truth.rank + (truth.rank == 2 ? 100 : 0)) * MiB);
    REQUIRE(ranks[i].run.device_total.has_value());
    CHECK(*ranks[i].run.device_total == truth.capacity);
    peaks.push_back(truth.peak_reserved);
  }
  const analyzer::RanksFigures f = analyzer::ranks_figures(ranks);
  // Peaks 80, 82, 184, 100 MiB: median (82 + 100) / 2 = 91 MiB, imbalance 184 / 91.
  CHECK(f.median_peak_reserved == doctest::Approx(91.0 * MiB));
  CHECK(f.imbalance_reserved == doctest::Approx(184.0 / 91.0));
  // Rank 10: 128 - 100 = 28 MiB of headroom; rank 2 has the largest peak but 2 GiB.
  CHECK(f.headroom_known);
  REQUIRE(f.closest_to_oom.has_value());
  CHECK(ranks[*f.closest_to_oom].rank == 10u);
  // The site that differs most: the straggler (0 on every rank but rank 2).
  const analyzer::Document doc = analyzer::ranks_report(ranks, options);
  for (const analyzer::Section& s : doc.sections) {
    const auto* t = std::get_if<analyzer::Table>(&s);
    if (!t || t->key != "sites") continue;
    REQUIRE(t->rows.size() >= 2);
    CHECK(std::get<std::vector<std::string>>(t->rows[0].back()).front().find("ranks_straggler_site") != std::string::npos);
    CHECK(std::get<std::uint64_t>(t->rows[0][0]) == 100 * MiB);
    CHECK(std::get<std::string>(t->rows[0][4]) == "2");
    // Then the activations: 16 MiB on rank 0 to 36 MiB on rank 10.
    CHECK(std::get<std::vector<std::string>>(t->rows[1].back()).front().find("ranks_activation_site") != std::string::npos);
    CHECK(std::get<std::uint64_t>(t->rows[1][0]) == 20 * MiB);
    CHECK(std::get<std::string>(t->rows[1][2]) == "0");
    CHECK(std::get<std::string>(t->rows[1][4]) == "10");
  }
}

TEST_CASE("given the ranks as jsonl, each line is one JSON object per rank with the same figures") {
  analyzer::RanksOptions options;
  const std::vector<analyzer::RankSummary> ranks =
      analyzer::summarize_ranks(analyzer::rank_files({fleet().dir.string()}), options);
  std::ostringstream out;
  analyzer::write_ranks_jsonl(ranks, options, out);
  std::istringstream lines(out.str());
  std::string line;
  std::size_t n = 0;
  while (std::getline(lines, line)) {
    const analyzer::testing::Json j = analyzer::testing::parse_json(line);  // throws on bad JSON
    const Rank& truth = fleet().ranks[n];
    CHECK(j["rank"].number() == truth.rank);
    CHECK(j["peak_reserved"].number() == static_cast<double>(truth.peak_reserved));
    CHECK(j["headroom"].number() == static_cast<double>(truth.capacity - truth.peak_reserved));
    CHECK(std::get<bool>(j["closest_to_oom"].value) == (truth.rank == 10));
    ++n;
  }
  CHECK(n == 4);
}

TEST_CASE("given 1, 2 or 8 threads, the summaries are the same") {
  std::vector<std::uint64_t> first;
  for (const unsigned threads : {1u, 2u, 8u}) {
    analyzer::RanksOptions options;
    options.threads = threads;
    std::vector<std::uint64_t> peaks;
    for (const auto& r : analyzer::summarize_ranks(analyzer::rank_files({fleet().dir.string()}), options))
      peaks.push_back(r.run.peak_reserved);
    if (first.empty()) first = peaks;
    CHECK(peaks == first);
  }
}

TEST_CASE("given a bad path among the ranks, one line names it") {
  CHECK_THROWS_WITH_AS(analyzer::rank_files({(fleet().dir / "rank_99.bin").string()}),
                       doctest::Contains("rank_99.bin: no such file or folder"), std::invalid_argument);
  const fs::path empty = fleet().dir / "empty";
  fs::create_directories(empty);
  CHECK_THROWS_WITH_AS(analyzer::rank_files({empty.string()}), doctest::Contains("holds no snapshot"),
                       std::invalid_argument);
  const fs::path junk = fleet().dir / "junk" / "rank_5.bin";
  fs::create_directories(junk.parent_path());
  std::ofstream(junk) << "garbage, not a snapshot";
}

TEST_CASE("given an unreadable file among the ranks, the others are summarized and its row says why") {
  const fs::path junk = fleet().dir / "rank_5.bin";
  std::ofstream(junk) << "garbage, not a snapshot";
  const std::vector<analyzer::RankSummary> ranks =
      analyzer::summarize_ranks(analyzer::rank_files({fleet().dir.string()}), {});
  fs::remove(junk);
  REQUIRE(ranks.size() == 5);
  const auto bad = std::find_if(ranks.begin(), ranks.end(), [](const auto& r) { return !r.readable(); });
  REQUIRE(bad != ranks.end());
  CHECK(bad->rank == 5u);
  CHECK(bad->error.find("cannot read " + junk.string()) == 0);
  // The fleet's figures are the readable ranks': rank 10 is still closest to OOM.
  const analyzer::RanksFigures f = analyzer::ranks_figures(ranks);
  CHECK(f.median_peak_reserved == doctest::Approx(91.0 * MiB));
  REQUIRE(f.closest_to_oom.has_value());
  CHECK(ranks[*f.closest_to_oom].rank == 10u);
  // And its row keeps the file's name as it is, with a column that says it is unreadable
  const analyzer::Document doc = analyzer::ranks_report(ranks, {});
  bool found = false;
  for (const analyzer::Section& section : doc.sections) {
    const auto* t = std::get_if<analyzer::Table>(&section);
    if (!t || t->key != "ranks") continue;
    REQUIRE(t->columns.back().key == "unreadable");
    for (const auto& row : t->rows) {
      const bool unreadable = std::get<bool>(row.back());
      CHECK(unreadable == (std::get<std::string>(row[1]) == "rank_5.bin"));
      found = found || unreadable;
    }
  }
  CHECK(found);
}

TEST_CASE("given a rank whose OOM recorded a memory-fraction cap, its headroom is to that cap, and it is closest to "
          "OOM before a rank with a larger peak on the same device") {
  const fs::path dir = fs::temp_directory_path() / ("cachealloc-ranks-cap-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    // Rank 0: capped at 96 MiB of 2 GiB; holds 64 MiB and asks 64 MiB more: an OOM that records the cap
    CachingAllocator allocator(test_support::simulated(2 * GiB));
    allocator.set_memory_fraction(96.0 / 2048.0);
    HistoryRecorder recorder(allocator, HistoryOptions{});
    void* weights = ranks_weights_site(allocator, 64 * MiB);
    CHECK_THROWS_AS(ranks_activation_site(allocator, 64 * MiB), OutOfMemoryError);
    snapshot::write_snapshot(recorder.take_snapshot(), dir / "rank_0.bin");
    allocator.deallocate(weights);
  }
  {
    // Rank 1: no cap, 120 MiB at its peak, on the same 2 GiB
    CachingAllocator allocator(test_support::simulated(2 * GiB));
    HistoryRecorder recorder(allocator, HistoryOptions{});
    void* weights = ranks_weights_site(allocator, 120 * MiB);
    snapshot::write_snapshot(recorder.take_snapshot(), dir / "rank_1.bin");
    allocator.deallocate(weights);
  }
  const std::vector<analyzer::RankSummary> ranks = analyzer::summarize_ranks(analyzer::rank_files({dir.string()}), {});
  fs::remove_all(dir);
  REQUIRE(ranks.size() == 2);
  REQUIRE(ranks[0].run.cap.has_value());
  CHECK(*ranks[0].run.cap == 96 * MiB);
  CHECK(ranks[0].run.peak_reserved == 64 * MiB);
  CHECK_FALSE(ranks[1].run.cap.has_value());
  const analyzer::RanksFigures f = analyzer::ranks_figures(ranks);
  REQUIRE(f.closest_to_oom.has_value());
  CHECK(*f.closest_to_oom == 0u);  // 32 MiB to its cap, against 1.88 GiB
  const analyzer::Document doc = analyzer::ranks_report(ranks, {});
  for (const analyzer::Section& section : doc.sections) {
    const auto* g = std::get_if<analyzer::FieldGroup>(&section);
    if (!g) continue;
    for (const analyzer::Field& field : g->fields)
      if (field.key == "closest_to_oom_headroom") CHECK(std::get<std::uint64_t>(field.value) == 32 * MiB);
  }
}

TEST_CASE("given two files whose names give the same rank number, neither takes it, and a note says why") {
  // Given rank 0's recording under two names whose only number is 200
  const fs::path dir = fleet().dir / "shared";
  fs::create_directories(dir);
  fs::copy_file(fleet().dir / "rank_0.bin", dir / "s200k_a.bin", fs::copy_options::overwrite_existing);
  fs::copy_file(fleet().dir / "rank_0.bin", dir / "s200k_b.bin", fs::copy_options::overwrite_existing);
  fs::copy_file(fleet().dir / "rank_1.bin", dir / "rank_1.bin", fs::copy_options::overwrite_existing);
  // When the folder is summarized
  const std::vector<analyzer::RankSummary> ranks = analyzer::summarize_ranks(analyzer::rank_files({dir.string()}), {});
  REQUIRE(ranks.size() == 3);
  // Then the two are of unknown rank, and rank_1.bin keeps its number
  for (const analyzer::RankSummary& r : ranks) {
    CAPTURE(r.run.file);
    const bool named = r.run.file.ends_with("rank_1.bin");
    CHECK(r.rank.has_value() == named);
    CHECK(r.rank_shared == !named);
  }
  const analyzer::Document doc = analyzer::ranks_report(ranks, {});
  CHECK(std::any_of(doc.notes.begin(), doc.notes.end(), [](const std::string& note) {
    return note.starts_with("2 file names give a rank number another file's name gives too");
  }));
  CHECK(std::none_of(doc.notes.begin(), doc.notes.end(),
                     [](const std::string& note) { return note.find("carry no rank number") != std::string::npos; }));
  fs::remove_all(dir);
}
