// The setting sweep and the recommendation. The
// ground truth is the real allocator: the recommended setting is run for real
// (CachingAllocator on the simulated device, under that setting and the cap)
// and its peaks must equal the replayed ones, as test_what_if_replay's last
// case does for one hand-picked setting.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/allocator.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/pickle.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = CACHEALLOC_SOURCE_DIR;
const fs::path kCorpus = kSource / "testdata" / "pytorch" / "corpus";
constexpr std::uint64_t kCap = std::uint64_t{11} << 30;

using test_support::fragmenting_workload;

// The workload recorded through the real allocator, default settings, no
// cap, written and read back as a PyTorch pickle.
const snapshot::Snapshot& fragmenting_pickle() {
  static const snapshot::Snapshot recorded = [] {
    CachingAllocator allocator(make_simulated_device(simulated_h200_options()));
    HistoryOptions options;
    options.stacks = StackCapture::none;
    HistoryRecorder recorder(allocator, options);
    REQUIRE_FALSE(fragmenting_workload(allocator));
    return snapshot::decode_pytorch_pickle(snapshot::encode_pytorch_pickle(recorder.take_snapshot()));
  }();
  return recorded;
}

std::string json_of(const analyzer::Document& doc) {
  std::ostringstream out;
  analyzer::render(doc, analyzer::Format::json, out);
  return out.str();
}

struct Run {
  int code = -1;
  std::string out, err;
  std::size_t err_lines() const { return static_cast<std::size_t>(std::count(err.begin(), err.end(), '\n')); }
  std::string first_err_line() const { return err.substr(0, err.find('\n')); }
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// bin/cachealloc-analyze with `args`, no shell.
Run analyze(const std::vector<std::string>& args) {
  const fs::path dir = fs::temp_directory_path() / ("cachealloc-sweep-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path out = dir / "stdout", err = dir / "stderr";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen("/dev/null", "r", stdin) || !std::freopen(out.c_str(), "w", stdout) ||
        !std::freopen(err.c_str(), "w", stderr))
      ::_exit(126);
    const std::string path = (fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-analyze").string();
    std::vector<char*> argv{const_cast<char*>(path.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(path.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Run r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove_all(dir);
  return r;
}

}  // namespace

TEST_CASE("given the fragmenting workload and a cap where the recorded settings run out of memory, when recommend "
          "runs, then its setting does not, and the real allocator under it and the cap peaks exactly as replayed") {
  // Given the recorded run and a cap below its peak
  analyzer::SnapshotEvents source(fragmenting_pickle());
  analyzer::SweepOptions options;
  options.capacity = kCap;
  // When the sweep runs and the recommendation is drawn
  const analyzer::SweepResult sweep = analyzer::sweep(source, options);
  const analyzer::Recommendation rec = analyzer::recommend(sweep);
  // Then the recorded settings run out of memory at the cap, and the recommended one does not
  REQUIRE(sweep.baseline.replayed.first_oom.has_value());
  CHECK(sweep.baseline.recorded.peak_reserved > kCap);
  REQUIRE(rec.helps);
  REQUIRE(rec.best.has_value());
  CHECK(rec.best->fits);
  CHECK(rec.best->changed >= 1);
  CHECK(rec.best->figures.peak_reserved <= kCap);
  CHECK(rec.verdict.find("with " + rec.best->changes + " the run fits in") == 0);
  CHECK(rec.verdict.find("at event " + std::to_string(sweep.baseline.replayed.first_oom->event)) != std::string::npos);
  MESSAGE("verdict: " << rec.verdict);
  // And the real allocator, under the recorded settings and the cap, runs out of memory as the replay said
  const double fraction = static_cast<double>(kCap) / static_cast<double>(simulated_h200_options().capacity);
  {
    CachingAllocator allocator(make_simulated_device(simulated_h200_options()));
    allocator.set_memory_fraction(fraction);
    CHECK(fragmenting_workload(allocator));
  }
  // and under the recommended setting it does not, with the replayed peaks exactly
  CachingAllocator allocator(make_simulated_device(simulated_h200_options()), parse_config(rec.best->config));
  allocator.set_memory_fraction(fraction);
  CHECK_FALSE(fragmenting_workload(allocator));
  const MemoryStats stats = allocator.stats();
  CHECK(static_cast<std::uint64_t>(stats.reserved_bytes[stat_all].peak) == rec.best->figures.peak_reserved);
  CHECK(static_cast<std::uint64_t>(stats.allocated_bytes[stat_all].peak) == rec.best->figures.peak_allocated);
  CHECK(static_cast<std::uint64_t>(stats.num_device_alloc) == rec.best->figures.device_allocs);
  CHECK(static_cast<std::uint64_t>(stats.num_alloc_retries) == rec.best->figures.retries.value_or(~0ull));
}

TEST_CASE("given a sweep under a cap, then the ranking follows the figures: fitting points by peak reserved, then "
          "the OOMs, latest first, and each point's figures are those of a replay under its settings") {
  analyzer::SnapshotEvents source(fragmenting_pickle());
  analyzer::SweepOptions options;
  options.capacity = kCap;
  options.threads = 2;
  const analyzer::SweepResult r = analyzer::sweep(source, options);
  // The default grid: 2 x (unlimited + sizes from the trace) x 3 x 2 under a cap
  REQUIRE(r.axes.size() == 4);
  CHECK(r.axes[1].values.size() >= 2);
  CHECK(r.ranked.size() == 2 * r.axes[1].values.size() * 3 * 2);
  bool some_fit = false, some_oom = false;
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    const auto& p = r.ranked[i];
    CAPTURE(p.config);
    some_fit |= p.fits;
    some_oom |= !p.fits;
    CHECK(p.fits == !p.figures.first_oom.has_value());
    REQUIRE(p.headroom.has_value());
    CHECK(*p.headroom == static_cast<std::int64_t>(r.cap) - static_cast<std::int64_t>(p.figures.peak_reserved));
    if (i == 0) continue;
    const auto& q = r.ranked[i - 1];
    CHECK((q.fits || !p.fits));  // no fit after an OOM
    if (q.fits && p.fits) CHECK(q.figures.peak_reserved <= p.figures.peak_reserved);
    if (!q.fits && !p.fits) CHECK(q.figures.first_oom->event >= p.figures.first_oom->event);
  }
  CHECK(some_fit);
  CHECK(some_oom);
  // Each point's figures are a replay's under its settings (the first, a middle and the last)
  for (const std::size_t i : {std::size_t{0}, r.ranked.size() / 2, r.ranked.size() - 1}) {
    analyzer::AllocatorReplayOptions replay;
    replay.capacity = kCap;
    replay.config = parse_config(r.ranked[i].config);
    const analyzer::ReplayResult one = analyzer::replay_allocator(source, replay);
    CHECK(one.replayed.peak_reserved == r.ranked[i].figures.peak_reserved);
    CHECK(one.replayed.first_oom.has_value() == !r.ranked[i].fits);
  }
}

TEST_CASE("given --largest-batch under a cap, then each point's request scale fits and 1/64 more does not, and "
          "the ranking follows the scale") {
  analyzer::SnapshotEvents source(fragmenting_pickle());
  analyzer::SweepOptions options;
  options.capacity = kCap;
  options.largest_scale = true;
  options.axes = {analyzer::sweep_axis("max_split_size_mb=unlimited"), analyzer::sweep_axis("roundup_power2_divisions=0"),
                  analyzer::sweep_axis("garbage_collection_threshold=off")};
  const analyzer::SweepResult r = analyzer::sweep(source, options);
  REQUIRE(r.ranked.size() == 2);
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    const auto& p = r.ranked[i];
    CAPTURE(p.config);
    REQUIRE(p.largest_scale.has_value());
    if (i > 0) CHECK(*r.ranked[i - 1].largest_scale >= *p.largest_scale);
    analyzer::AllocatorReplayOptions replay;
    replay.capacity = kCap;
    replay.config = parse_config(p.config);
    replay.scale = *p.largest_scale + 1.0 / 64;
    CHECK(analyzer::replay_allocator(source, replay).replayed.first_oom.has_value());
    if (*p.largest_scale > 0) {
      replay.scale = *p.largest_scale;
      CHECK_FALSE(analyzer::replay_allocator(source, replay).replayed.first_oom.has_value());
    }
  }
  // Expandable segments fit the workload at the cap, the recorded settings do not: a larger scale
  CHECK(r.ranked.front().settings[0].second == "True");
  CHECK(*r.ranked.front().largest_scale >= 1.0);
  CHECK(*r.ranked.back().largest_scale < 1.0);
}

TEST_CASE("given a sweep without a cap, then it ranks by peak reserved and tries no garbage collection") {
  const snapshot::Snapshot snap = analyzer::load(kCorpus / "varlen_transformer.pickle");
  analyzer::SnapshotEvents source(snap);
  const analyzer::SweepResult r = analyzer::sweep(source, {});
  CHECK(r.cap == 0);
  REQUIRE(r.axes.size() == 4);
  CHECK(r.axes[3].values == std::vector<std::string>{"off"});
  for (std::size_t i = 1; i < r.ranked.size(); ++i)
    CHECK(r.ranked[i - 1].figures.peak_reserved <= r.ranked[i].figures.peak_reserved);
  // The recorded settings are in the grid, and replay as recorded
  const auto recorded = std::find_if(r.ranked.begin(), r.ranked.end(), [](const auto& p) { return p.changed == 0; });
  REQUIRE(recorded != r.ranked.end());
  CHECK(recorded->figures.peak_reserved == r.baseline.recorded.peak_reserved);
  CHECK(recorded->figures.peak_reserved == r.baseline.replayed.peak_reserved);
  // and the recorded settings' point names the recorded peak's event, the reservation
  CHECK(r.baseline.replayed.peak_reserved_event == r.baseline.recorded.peak_reserved_event);
  CHECK(recorded->figures.peak_reserved_event == r.baseline.recorded.peak_reserved_event);
}

TEST_CASE("given the same sweep on 1 and on 4 threads, then the results are identical") {
  analyzer::SnapshotEvents source(fragmenting_pickle());
  analyzer::SweepOptions options;
  options.capacity = kCap;
  options.threads = 1;
  const analyzer::SweepResult one = analyzer::sweep(source, options);
  options.threads = 4;
  const analyzer::SweepResult four = analyzer::sweep(source, options);
  CHECK(one.threads == 1);
  CHECK(four.threads == 4);
  REQUIRE(one.ranked.size() == four.ranked.size());
  for (std::size_t i = 0; i < one.ranked.size(); ++i) {
    CHECK(one.ranked[i].index == four.ranked[i].index);
    CHECK(one.ranked[i].figures.peak_reserved == four.ranked[i].figures.peak_reserved);
    CHECK(one.ranked[i].figures.device_allocs == four.ranked[i].figures.device_allocs);
  }
  CHECK(json_of(analyzer::sweep_report(one)) == json_of(analyzer::sweep_report(four)));
  CHECK(analyzer::recommend(one).verdict == analyzer::recommend(four).verdict);
}

TEST_CASE("given a sweep axis, then only its values are tried; nonsense values and keys are refused with one line") {
  analyzer::SnapshotEvents source(fragmenting_pickle());
  analyzer::SweepOptions options;
  options.axes = {analyzer::sweep_axis("max_split_size_mb=unlimited,300"), analyzer::sweep_axis("expandable_segments=True")};
  const analyzer::SweepResult r = analyzer::sweep(source, options);
  CHECK(r.ranked.size() == 1 * 2 * 3 * 1);
  for (const auto& p : r.ranked) CHECK(p.settings[0].second == "True");
  for (const char* bad : {"max_split_size_mb=banana", "max_split_size_mb=20", "roundup_power2_divisions=3",
                          "expandable_segments=maybe", "garbage_collection_threshold=1.5", "no_such_key=1",
                          "expandable_segments=True,True", "max_split_size_mb=", "max_split_size_mb"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(analyzer::sweep_axis(bad), InvalidArgument);
  }
  // Conflicts: a swept key in --set, garbage collection without a cap, an axis twice
  analyzer::SweepOptions conflict;
  conflict.set = {"expandable_segments=True"};
  CHECK_THROWS_AS(analyzer::sweep(source, conflict), InvalidArgument);
  conflict = {};
  conflict.axes = {analyzer::sweep_axis("garbage_collection_threshold=0.6")};
  CHECK_THROWS_AS(analyzer::sweep(source, conflict), InvalidArgument);
  conflict.axes = {analyzer::sweep_axis("roundup_power2_divisions=4"), analyzer::sweep_axis("roundup_power2_divisions=8")};
  CHECK_THROWS_AS(analyzer::sweep(source, conflict), InvalidArgument);
}

TEST_CASE("given a setting that cannot matter, when nothing beats the recorded settings, then recommend says so") {
  // Given one point only: the recorded settings themselves
  analyzer::SnapshotEvents source(fragmenting_pickle());
  analyzer::SweepOptions options;
  options.axes = {analyzer::sweep_axis("expandable_segments=False"), analyzer::sweep_axis("max_split_size_mb=unlimited"),
                  analyzer::sweep_axis("roundup_power2_divisions=0")};
  const analyzer::Recommendation rec = analyzer::recommend(analyzer::sweep(source, options));
  CHECK_FALSE(rec.helps);
  CHECK(rec.verdict.starts_with("nothing helps"));
  // And at a cap below the live allocations' peak, nothing fits
  options = {};
  options.capacity = std::uint64_t{6} << 30;
  const analyzer::Recommendation none = analyzer::recommend(analyzer::sweep(source, options));
  CHECK_FALSE(none.helps);
  CHECK(none.verdict.starts_with("nothing helps: no setting of the"));
  CHECK(none.verdict.find("the live allocations alone peak at") != std::string::npos);
}

TEST_CASE("given a trace with an OOM, the oom report adds the recommendation at the recorded cap, or at the device "
          "total when the OOM recorded none; without an OOM, nothing") {
  // Given our snapshot, whose OOM records its cap
  const snapshot::Snapshot snap = analyzer::load(kSource / "testdata" / "synthetic_2k_native.bin");
  std::uint64_t recorded_cap = 0;
  for (const auto& e : snap.events)
    if (e.kind == snapshot::EventKind::oom && recorded_cap == 0) recorded_cap = e.aux;
  REQUIRE(recorded_cap != 0);
  analyzer::SnapshotEvents source(snap);
  const std::string json = json_of(analyzer::oom_report_with_recommendation(source, {}, 2));
  CHECK(json.find("\"recommendation\":{") != std::string::npos);
  CHECK(json.find("\"cap\":" + std::to_string(recorded_cap)) != std::string::npos);
  CHECK(json.find("the recorded cap (from its OOM)") != std::string::npos);
  // Bounded: above max_events it only points at recommend
  const std::string skipped = json_of(analyzer::oom_report_with_recommendation(source, {}, 2, 10));
  CHECK(skipped.find("run cachealloc-analyze recommend FILE") != std::string::npos);
  // A PyTorch pickle's OOM does not store the cap: the lowest cap the OOM allows is used, and said
  const snapshot::Snapshot pickle = analyzer::load(kCorpus / "oom_retry.pickle");
  analyzer::SnapshotEvents pickle_source(pickle);
  const std::string bound = json_of(analyzer::oom_report_with_recommendation(pickle_source, {}, 2));
  CHECK(bound.find("the run stopped at a cap the file does not hold") != std::string::npos);
  CHECK(bound.find("its cap is not in the file") == std::string::npos);
  // No OOM: the oom report as it was
  const snapshot::Snapshot clean = analyzer::load(kCorpus / "stacks_python.pickle");
  analyzer::SnapshotEvents clean_source(clean);
  CHECK(json_of(analyzer::oom_report_with_recommendation(clean_source, {})) == json_of(analyzer::oom_report(clean_source, {})));
}

TEST_CASE("given bad sweep or recommend options on the command line, then one line on stderr and exit 2") {
  const std::string file = (kCorpus / "stacks_python.pickle").string();
  const std::string E = "cachealloc-analyze: error: ";
  struct Case {
    std::vector<std::string> args;
    std::string line;
  };
  for (const Case& c : std::vector<Case>{
           {{"replay", file, "--sweep", "--sweep-axis", "max_split_size_mb=banana"},
            E + "--sweep-axis max_split_size_mb: 'banana' is not 'unlimited' or a whole number of MiB above 20"},
           {{"replay", file, "--sweep", "--sweep-axis", "roundup_power2_divisions=3"},
            E + "--sweep-axis roundup_power2_divisions: '3' is not 0 or a power of two"},
           {{"replay", file, "--sweep", "--sweep-axis", "colour=red"},
            E + "--sweep-axis: 'colour' is not a key the sweep can vary (keys: expandable_segments, max_split_size_mb, "
                "roundup_power2_divisions, garbage_collection_threshold)"},
           {{"replay", file, "--sweep", "--set", "expandable_segments=True"},
            E + "--set expandable_segments=True: the sweep varies expandable_segments (fix it with --sweep-axis "
                "expandable_segments=VALUE instead)"},
           {{"replay", file, "--sweep", "--sweep-axis", "garbage_collection_threshold=0.6"},
            E + "--sweep-axis garbage_collection_threshold: garbage collection acts only under a cap; add --capacity "
                "or --fraction"},
           {{"replay", file, "--sweep", "--threads", "0"}, ""},
           {{"replay", file, "--sweep", "--largest-batch"},
            E + "--largest-batch needs a capacity to fit in: add --capacity or --fraction"},
           {{"replay", file, "--sweep-axis", "expandable_segments=True"}, ""},
           {{"recommend", file, "--capacity", "20GiB", "--fraction", "0.5"}, ""},
           {{"recommend", file, "--capacity", "lots"},
            E + "--capacity: 'lots' is not a byte count (a number such as 2.5G or 2900M, with K, M, G or T)"},
           {{"recommend", file, "--capacity", "99999999999T"},
            E + "--capacity: '99999999999T' is not a byte count (a number such as 2.5G or 2900M, with K, M, G or T): "
                "too large"},
           {{"recommend", file, "--to", "5"},
            E + "recommend: the verdict replays the whole trace: every request from the first event to the dump"},
       }) {
    std::string line;
    for (const std::string& a : c.args) line += a + " ";
    CAPTURE(line);
    const Run r = analyze(c.args);
    CHECK(r.code == 2);
    CHECK(r.err_lines() == 1);
    CHECK(r.out.empty());
    if (!c.line.empty()) CHECK(r.first_err_line() == c.line);
    else CHECK(r.first_err_line().starts_with(E));
  }
  // And a good one: exit 0, the verdict on stdout; a capacity may be a decimal
  const Run ok = analyze({"recommend", (kCorpus / "oom_retry.pickle").string(), "--threads", "2"});
  CHECK(ok.code == 0);
  CHECK(ok.err.empty());
  CHECK(ok.out.find("Verdict") != std::string::npos);
  const Run decimal =
      analyze({"recommend", (kCorpus / "oom_retry.pickle").string(), "--capacity", "2.9G", "--format", "json"});
  CHECK(decimal.code == 0);
  CHECK(decimal.out.find("\"cap\":3113851289") != std::string::npos);
}

TEST_CASE("given a PyTorch pickle that ran out of memory under a cap it does not store, when recommend runs, then it "
          "replays at the lowest cap the OOM allows, reproduces the OOM there, and says why nothing can fit") {
  // Given the run of a 2 GiB cap (make_corpus.py, oom_retry): a 3 GiB request with 1 GiB live
  const snapshot::Snapshot pickle = analyzer::load(kCorpus / "oom_retry.pickle");
  analyzer::SnapshotEvents source(pickle);
  // When recommend runs without a capacity
  analyzer::SweepOptions options;
  options.threads = 2;
  const analyzer::SweepResult r = analyzer::sweep(source, options);
  // Then the cap is the OOM's lowest bound: the peak reserved before it,
  // below the real cap, and the real cap lies within the bounds
  REQUIRE(r.oom_bounds);
  CHECK(r.cap_source == analyzer::CapSource::oom_bound);
  CHECK(r.cap == r.oom_bounds->lowest);
  CHECK(r.oom_bounds->lowest <= (std::uint64_t{2} << 30));
  CHECK(r.oom_bounds->highest > (std::uint64_t{2} << 30));
  CHECK(r.oom_bounds->lowest > r.oom_bounds->reserved);  // the cache released before the OOM counted
  // and the recorded settings reproduce the recorded OOM at that cap
  REQUIRE(r.baseline.recorded.first_oom);
  REQUIRE(r.baseline.replayed.first_oom);
  CHECK(r.baseline.replayed.first_oom->event == r.baseline.recorded.first_oom->event);
  // and the verdict says why nothing fits: live + request exceed the cap
  const analyzer::Recommendation rec = analyzer::recommend(r);
  CHECK_FALSE(rec.helps);
  CHECK(rec.verdict.find("no setting can") != std::string::npos);
  CHECK(rec.verdict.find("4.00 GiB in all") != std::string::npos);

  // Given a capacity of 2.9 GiB, the verdict's baseline is again the recorded
  // settings replayed at that cap, and the reason is the same
  options.capacity = std::uint64_t{29} * (std::uint64_t{1} << 30) / 10;
  const analyzer::SweepResult at = analyzer::sweep(source, options);
  CHECK(at.cap == *options.capacity);
  CHECK(at.cap_source == analyzer::CapSource::asked);
  CHECK(analyzer::recommend(at).verdict.find("no setting can") != std::string::npos);
}

TEST_CASE("given expandable segments passing the cap without an OOM, as PyTorch allows, then the point does not fit "
          "and the report says why") {
  const snapshot::Snapshot pickle = analyzer::load(kCorpus / "expandable_maxsplit.pickle");
  analyzer::SnapshotEvents source(pickle);
  analyzer::SweepOptions options;
  options.threads = 2;
  options.capacity = std::uint64_t{1} << 30;
  const analyzer::SweepResult r = analyzer::sweep(source, options);
  std::size_t over = 0;
  for (const analyzer::SweepPoint& p : r.ranked) {
    REQUIRE(p.headroom);
    CHECK(p.fits == (!p.figures.first_oom && *p.headroom >= 0));
    if (!p.figures.first_oom && *p.headroom < 0) ++over;
  }
  CHECK(over > 0);
  CHECK(json_of(analyzer::sweep_report(r)).find("passed the cap without running out of memory") != std::string::npos);
}
